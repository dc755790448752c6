"""Which VMM and transport a box gets, and the per-box vsock CID claim."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import pytest

from tkbox.errors import HostError, UserError
from tkbox.protocol import vsock
from tkbox.vm import choice
from tkbox.vm.base import VMSpec
from tkbox.vm.cid import VHOST_VSOCK_SET_GUEST_CID, claim_cid
from tkbox.vm.qemu import AccelDecision, QemuLauncher, build_argv


def test_the_set_guest_cid_ioctl_number_is_linuxs() -> None:
    # linux/vhost.h: _IOW(VHOST_VIRTIO=0xAF, 0x60, __u64)
    assert VHOST_VSOCK_SET_GUEST_CID == 0x4008AF60


class FakeVhost:
    """The kernel's side of VHOST_VSOCK_SET_GUEST_CID: CIDs held host-wide."""

    def __init__(self, held: set[int]) -> None:
        self.held = held
        self.asked: list[int] = []

    def ioctl(self, fd: int, request: int, arg: bytes) -> object:
        assert request == VHOST_VSOCK_SET_GUEST_CID
        (cid,) = struct.unpack("=Q", arg)
        self.asked.append(cid)
        if cid in self.held:
            raise OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
        self.held.add(cid)
        return 0


def test_a_cid_held_elsewhere_is_skipped_and_the_fd_kept(tmp_path: Path) -> None:
    """Two boxes (or another daemon, or another user's VM) never share a CID: the
    kernel refuses one in use and the next candidate is tried."""
    device = tmp_path / "vhost-vsock"
    device.write_bytes(b"")
    kernel = FakeVhost(held={3, 4})
    seq = iter([3, 4, 5, 6])
    claimed = claim_cid(str(device), ioctl=kernel.ioctl, candidates=lambda: next(seq))
    try:
        assert claimed.cid == 5 and kernel.asked == [3, 4, 5]
        assert os.fstat(claimed.fd)  # the fd holds the CID until QEMU has its copy
        second = claim_cid(str(device), ioctl=kernel.ioctl, candidates=lambda: next(seq))
        assert second.cid == 6
        second.close()
    finally:
        claimed.close()
    claimed.close()  # idempotent


def test_no_free_cid_is_a_host_error_and_closes_the_device(tmp_path: Path) -> None:
    device = tmp_path / "vhost-vsock"
    device.write_bytes(b"")
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(HostError, match="no free vsock guest CID after 4 tries"):
        claim_cid(str(device), ioctl=FakeVhost(held={7}).ioctl, candidates=lambda: 7, tries=4)
    assert len(os.listdir("/proc/self/fd")) == before


def test_reserved_cids_are_never_asked_for(tmp_path: Path) -> None:
    device = tmp_path / "vhost-vsock"
    device.write_bytes(b"")
    kernel = FakeVhost(held=set())
    seq = iter([0, 1, 2, (1 << 32) - 1, 1 << 40, 9])
    claimed = claim_cid(str(device), ioctl=kernel.ioctl, candidates=lambda: next(seq))
    claimed.close()
    assert kernel.asked == [9]


def test_missing_device_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(HostError, match="modprobe vhost_vsock"):
        claim_cid(str(tmp_path / "absent"))


def test_firecracker_gets_hybrid_vsock_and_refuses_others() -> None:
    assert choice.transport_for("firecracker", forced=None).kind == choice.HYBRID_VSOCK
    with pytest.raises(UserError, match="hybrid vsock only"):
        choice.transport_for("firecracker", forced="serial-mux")


def test_qemu_gets_vhost_vsock_only_where_the_host_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TKBOX_TRANSPORT", raising=False)
    monkeypatch.setattr(choice, "vhost_vsock_problem", lambda: None)
    assert choice.transport_for("qemu").kind == choice.VHOST_VSOCK
    assert choice.transport_for("qemu", forced="serial-mux").kind == choice.SERIAL_MUX
    monkeypatch.setattr(choice, "vhost_vsock_problem", lambda: "no /dev/vhost-vsock")
    got = choice.transport_for("qemu")
    assert got.kind == choice.SERIAL_MUX and "no /dev/vhost-vsock" in got.reason
    with pytest.raises(UserError, match="but no /dev/vhost-vsock"):
        choice.transport_for("qemu", forced="vhost-vsock")
    with pytest.raises(UserError, match="not a transport"):
        choice.transport_for("qemu", forced="carrier-pigeon")


def test_this_hosts_decision_matches_the_device() -> None:
    """What doctor shows is what the daemon would do, from the same fact."""
    expected = choice.VHOST_VSOCK if vsock.vhost_vsock_problem() is None else choice.SERIAL_MUX
    if os.environ.get("TKBOX_TRANSPORT"):
        pytest.skip("TKBOX_TRANSPORT is set")
    assert choice.transport_for("qemu").kind == expected
    assert choice.describe("qemu")["transport"] == expected


def test_unknown_vmm_is_a_user_error_and_missing_firecracker_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(UserError, match="unknown VMM"):
        choice.check_vmm("xen")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(HostError, match="--vmm firecracker: firecracker is not on PATH"):
        choice.check_vmm("firecracker")


def test_qemu_argv_for_vhost_vsock_passes_the_claimed_device(tmp_path: Path) -> None:
    spec = VMSpec(name="v", kernel=tmp_path / "k", initramfs=tmp_path / "i", workdir=tmp_path)
    argv = build_argv(spec, "tcg", vsock=(1234, 17))
    assert "vhost-vsock-device,guest-cid=1234,vhostfd=17" in argv
    assert not any("virtserialport" in a or "id=mux" in a for a in argv)
    assert "tkbox.ports=vsock" in argv[argv.index("-append") + 1]
    mux = build_argv(spec, "tcg")
    assert "virtserialport,chardev=mux,name=tkbox.mux" in mux
    assert "tkbox.ports=vsock" not in mux[mux.index("-append") + 1]


def test_qemu_launcher_refuses_a_transport_it_does_not_have() -> None:
    with pytest.raises(Exception, match="no 'hybrid-vsock' transport"):
        QemuLauncher(AccelDecision("tcg", "test"), templates=None, transport="hybrid-vsock")


def test_doctor_shows_each_vmm_its_transport_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from tkbox.cli.doctor import vmm_checks

    monkeypatch.delenv("TKBOX_TRANSPORT", raising=False)
    monkeypatch.setattr(choice, "vhost_vsock_problem", lambda: "no /dev/vhost-vsock")
    rows = {r["vmm"]: r for r in vmm_checks() if "vmm" in r}
    assert rows["qemu"]["transport"] == choice.SERIAL_MUX and not rows["qemu"]["optional"]
    assert "no /dev/vhost-vsock" in rows["qemu"]["detail"]
    assert rows["firecracker"]["transport"] == choice.HYBRID_VSOCK
    assert rows["firecracker"]["optional"]
    hint = [r for r in vmm_checks() if r["what"] == "vhost vsock for QEMU"]
    assert hint and "modprobe vhost_vsock" in hint[0]["fix"]
    monkeypatch.setattr(choice, "vhost_vsock_problem", lambda: None)
    rows = {r["vmm"]: r for r in vmm_checks() if "vmm" in r}
    assert rows["qemu"]["transport"] == choice.VHOST_VSOCK
    assert not [r for r in vmm_checks() if r["what"] == "vhost vsock for QEMU"]
