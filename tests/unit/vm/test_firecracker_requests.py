"""Every request the Firecracker launcher makes, checked against Firecracker's
OpenAPI description (tests/testdata/firecracker/: main and v1.16.1).

No binary is needed: the requests come from the pure `build_requests`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import fc_openapi  # noqa: E402

from tkbox.errors import HostError, InternalError, UserError  # noqa: E402
from tkbox.vm.base import Disk, VMSpec  # noqa: E402
from tkbox.vm.firecracker import (  # noqa: E402
    BOOT_ARGS,
    build_requests,
    check_kernel,
    fault_message,
    firecracker_available,
    firecracker_problem,
    vm_state_call,
    vmm_id,
)


def spec_with(tmp_path: Path, **overrides: object) -> VMSpec:
    fields: dict[str, object] = dict(
        name="demo",
        kernel=Path("/var/lib/tkbox/guest/vmlinux"),
        initramfs=Path("/var/lib/tkbox/guest/initramfs.cpio"),
        workdir=tmp_path / "vm",
        disks=(
            Disk(Path("/images/root.sqfs"), True, "root"),
            Disk(Path("/boxes/demo/lower.sqfs"), True, "lower"),
            Disk(Path("/boxes/demo/upper.ext4"), False, "upper"),
        ),
        memory_mib=1024,
        vcpus=2,
        cmdline="tkbox.debug=0",
    )
    fields.update(overrides)
    return VMSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("spec_file", fc_openapi.SPECS, ids=lambda p: p.name)
def test_every_request_matches_the_openapi_description(tmp_path: Path, spec_file: Path) -> None:
    calls = build_requests(spec_with(tmp_path)) + [
        vm_state_call("Paused"),
        vm_state_call("Resumed"),
    ]
    for call in calls:
        assert fc_openapi.check_request(call.method, call.path, call.body, spec_file) == []


def test_requests_in_boot_order(tmp_path: Path) -> None:
    calls = build_requests(spec_with(tmp_path))
    assert [(c.method, c.path) for c in calls] == [
        ("PUT", "/machine-config"),
        ("PUT", "/boot-source"),
        ("PUT", "/drives/disk0"),
        ("PUT", "/drives/disk1"),
        ("PUT", "/drives/disk2"),
        ("PUT", "/vsock"),
        ("PUT", "/actions"),
    ]
    assert calls[-1].body == {"action_type": "InstanceStart"}


def test_no_network_interface_is_ever_configured(tmp_path: Path) -> None:
    """The box has no network card: the only way out is a port through a door.
    No request may add a NIC (or MMDS, which is reached over one)."""
    for spec in (spec_with(tmp_path), spec_with(tmp_path, disks=(), cmdline="")):
        paths = [c.path for c in build_requests(spec)]
        assert not any(p.startswith(("/network-interfaces", "/mmds")) for p in paths)


def test_machine_and_boot_source_bodies(tmp_path: Path) -> None:
    spec = spec_with(tmp_path, kernel=Path("rel/vmlinux"))
    calls = {c.path: c.body for c in build_requests(spec)}
    assert calls["/machine-config"] == {"vcpu_count": 2, "mem_size_mib": 1024}
    boot = calls["/boot-source"]
    assert boot["kernel_image_path"] == str(Path("rel/vmlinux").absolute())
    assert boot["initrd_path"] == "/var/lib/tkbox/guest/initramfs.cpio"
    # The guest agent learns its transport (vsock) and, since Firecracker's drives carry
    # no serial the guest can read, each disk's role by its order (vda, vdb, vdc).
    assert boot["boot_args"] == ("console=ttyS0 reboot=k panic=1 pci=off tkbox.ports=vsock "
                                 "tkbox.disks=root,lower,upper tkbox.debug=0")
    assert BOOT_ARGS == "console=ttyS0 reboot=k panic=1 pci=off"


def test_drives_are_never_root_and_keep_read_only(tmp_path: Path) -> None:
    calls = [c for c in build_requests(spec_with(tmp_path)) if c.path.startswith("/drives/")]
    assert [c.body for c in calls] == [
        {"drive_id": "disk0", "path_on_host": "/images/root.sqfs",
         "is_root_device": False, "is_read_only": True},
        {"drive_id": "disk1", "path_on_host": "/boxes/demo/lower.sqfs",
         "is_root_device": False, "is_read_only": True},
        {"drive_id": "disk2", "path_on_host": "/boxes/demo/upper.ext4",
         "is_root_device": False, "is_read_only": False},
    ]
    # Firecracker refuses a body whose drive_id differs from the path's.
    assert all(c.path == f"/drives/{c.body['drive_id']}" for c in calls)


def test_vsock_is_guest_cid_3_on_a_socket_in_the_private_workdir(tmp_path: Path) -> None:
    spec = spec_with(tmp_path)
    (vsock,) = [c.body for c in build_requests(spec) if c.path == "/vsock"]
    assert vsock == {"guest_cid": 3, "uds_path": str(spec.workdir.absolute() / "v.sock")}


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"vcpus": 0}, UserError, "1 to 32 vCPUs"),
        ({"vcpus": 33}, UserError, "1 to 32 vCPUs"),
        ({"vcpus": True}, UserError, "1 to 32 vCPUs"),
        ({"memory_mib": 0}, UserError, "positive number of MiB"),
        ({"cmdline": "a\nb"}, UserError, "one line"),
        ({"workdir": Path("/" + "d" * 100)}, HostError, "shorter path"),
    ],
)
def test_bad_specs_are_refused_before_any_request(
    tmp_path: Path, overrides: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        build_requests(spec_with(tmp_path, **overrides))


def test_vm_state_is_paused_or_resumed_only() -> None:
    assert vm_state_call("Paused").body == {"state": "Paused"}
    with pytest.raises(InternalError):
        vm_state_call("Stopped")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"fault_message": "Invalid kernel path"}', "Invalid kernel path"),
        (b'{"fault_message": "two\\nlines  here"}', "two lines here"),
        (b'{"fault_message": ""}', "an error without a fault_message"),
        (b'{"error": "x"}', "an error without a fault_message"),
        (b'["fault_message"]', "an error without a fault_message"),
        (b"<html>502</html>", "an unreadable answer (16 bytes)"),
        (b"\xff\xfe", "an unreadable answer (2 bytes)"),
    ],
)
def test_fault_message_is_one_bounded_line(body: bytes, expected: str) -> None:
    assert fault_message(body) == expected


def test_long_fault_message_is_cut() -> None:
    message = fault_message(b'{"fault_message": "%s"}' % (b"x" * 5000))
    assert len(message) == 300 and message.endswith("...")


def test_kernel_must_be_an_elf_vmlinux(tmp_path: Path) -> None:
    elf = tmp_path / "vmlinux"
    elf.write_bytes(b"\x7fELF" + bytes(60))
    check_kernel(elf)
    bz = tmp_path / "vmlinuz"
    bz.write_bytes(b"MZ" + bytes(510))
    with pytest.raises(HostError, match="not an ELF vmlinux"):
        check_kernel(bz)
    with pytest.raises(HostError, match="tkbox guest build"):
        check_kernel(tmp_path / "missing")


def test_vmm_id_is_what_firecracker_accepts() -> None:
    assert vmm_id("demo") == "demo"
    assert vmm_id("my box/../x") == "my-box----x"
    assert vmm_id("a" * 100) == "a" * 64
    assert vmm_id("") == "tkbox"


def test_firecracker_problem_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "not on PATH" in (firecracker_problem() or "")
    assert firecracker_available() is False
    fake = tmp_path / "firecracker"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    kvm_ok = os.access("/dev/kvm", os.R_OK | os.W_OK)
    problem = firecracker_problem()
    if kvm_ok:
        assert problem is None and firecracker_available()
    else:
        assert problem is not None and "/dev/kvm" in problem


# --- the checker itself must be able to fail ------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "error"),
    [
        ("PUT", "/machine-config", {"vcpu_count": 1}, "missing required field 'mem_size_mib'"),
        ("PUT", "/machine-config", {"vcpu_count": 1, "mem_size_mib": 1, "x": 1},
         "unknown field 'x'"),
        ("PUT", "/machine-config", {"vcpu_count": "1", "mem_size_mib": 1},
         "expected an integer"),
        ("PUT", "/machine-config", {"vcpu_count": 64, "mem_size_mib": 1}, "above the maximum"),
        ("PUT", "/vsock", {"guest_cid": 2, "uds_path": "/v"}, "below the minimum 3"),
        ("PUT", "/actions", {"action_type": "Reboot"}, "is not one of"),
        ("PUT", "/drives/d0", {"drive_id": "d0", "is_root_device": "no"}, "expected a boolean"),
        ("PUT", "/drives/d0", {"drive_id": "d0", "is_root_device": False,
                               "rate_limiter": {"ops": {"size": 1}}},
         "missing required field 'refill_time'"),  # through two $refs
        ("PUT", "/vm", {"state": "Paused"}, "no such operation"),
        ("PUT", "/vsock", None, "body is required"),
    ],
)
def test_openapi_checker_catches_bad_requests(
    method: str, path: str, body: object, error: str
) -> None:
    errors = fc_openapi.check_request(method, path, body)
    assert any(error in e for e in errors), errors
