"""The QEMU command line: no network card, the right devices, the TCG workarounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tkbox.vm import qemu, qemuargv
from tkbox.vm.base import Disk, VMSpec


def spec(tmp_path: Path) -> VMSpec:
    return VMSpec(name="t", kernel=tmp_path / "vmlinux", initramfs=tmp_path / "initrd",
                  workdir=tmp_path, disks=(Disk(tmp_path / "r", True, "root"),
                                           Disk(tmp_path / "u", False, "upper")))


def test_argv_has_no_network_card_and_no_defaults(tmp_path: Path) -> None:
    argv = qemu.build_argv(spec(tmp_path), "tcg")
    assert argv[argv.index("-nic") + 1] == "none"
    assert "-nodefaults" in argv and "-no-reboot" in argv
    assert not any("netdev" in a or "virtio-net" in a for a in argv)
    assert argv[argv.index("-M") + 1].startswith("microvm,")


def test_disks_are_identified_by_serial_and_read_only_where_asked(tmp_path: Path) -> None:
    argv = qemu.build_argv(spec(tmp_path), "tcg")
    drives = [argv[i + 1] for i, a in enumerate(argv) if a == "-drive"]
    assert "readonly=on" in drives[0] and "readonly=on" not in drives[1]
    assert "virtio-blk-device,drive=d0,serial=root" in argv
    assert "virtio-blk-device,drive=d1,serial=upper" in argv


def test_tcg_gets_the_host_tsc_rate_and_a_fixed_lpj(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qemu, "host_tsc_khz", lambda: 2_000_000)
    tcg = qemu.build_argv(spec(tmp_path), "tcg")
    kvm = qemu.build_argv(spec(tmp_path), "kvm")
    cmd_tcg = tcg[tcg.index("-append") + 1]
    cmd_kvm = kvm[kvm.index("-append") + 1]
    assert "tsc_early_khz=2000000" in cmd_tcg and "lpj=" in cmd_tcg
    assert "lpj=" not in cmd_kvm and "tsc_early_khz" not in cmd_kvm
    assert kvm[kvm.index("-accel") + 1] == "kvm" and tcg[tcg.index("-accel") + 1] == "tcg"


def test_the_pure_argv_is_given_the_host_facts_the_launcher_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`qemuargv.build_argv` reads nothing of the host: the TSC rate and the debug
    switch are arguments; `qemu.build_argv` reads them and gives the same line."""
    s = spec(tmp_path)
    tcg = qemuargv.build_argv(s, "tcg", tsc_khz=2_000_000)
    cmd = tcg[tcg.index("-append") + 1]
    assert cmd.startswith("quiet loglevel=1 ") and "tsc_early_khz=2000000 tsc=reliable" in cmd
    bare = qemuargv.build_argv(s, "tcg", guest_debug=True)
    cmd = bare[bare.index("-append") + 1]
    assert "quiet" not in cmd.split() and "tsc_early_khz" not in cmd and "lpj=578048" in cmd
    monkeypatch.setattr(qemu, "host_tsc_khz", lambda: 2_000_000)
    monkeypatch.delenv("TKBOX_GUEST_DEBUG", raising=False)
    assert qemu.build_argv(s, "tcg") == tcg
    monkeypatch.setenv("TKBOX_GUEST_DEBUG", "1")
    assert qemu.build_argv(s, "kvm") == qemuargv.build_argv(s, "kvm", guest_debug=True)
    monkeypatch.setattr(qemu, "host_tsc_khz", lambda: None)
    assert qemu.build_argv(s, "tcg") == bare


def test_user_address_randomization_is_off_under_tcg_only(tmp_path: Path) -> None:
    """Under emulation the guest runs without ASLR (TCG re-translates randomized code at
    every exec); with KVM, where it costs nothing, the guest keeps it."""
    tcg = qemu.build_argv(spec(tmp_path), "tcg")
    kvm = qemu.build_argv(spec(tmp_path), "kvm")
    assert "norandmaps" in tcg[tcg.index("-append") + 1].split()
    assert "norandmaps" not in kvm[kvm.index("-append") + 1].split()


@pytest.mark.parametrize("accel", ["tcg", "kvm"])
def test_doctor_says_what_emulation_turns_off_in_the_guest(
        accel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A person choosing to run on a host without KVM learns, from `tkbox doctor`, that the
    boxes' programs run without address randomization there, and why; with KVM it says
    nothing of it (the guest keeps it)."""
    from tkbox.cli import doctor

    monkeypatch.setenv("TKBOX_ACCEL", accel)
    rows = {r["what"]: r for r in doctor.checks()}
    if "acceleration" not in rows:
        pytest.skip("no guest kernel on this host: doctor has no acceleration row")
    detail = rows["acceleration"]["detail"]
    assert ("norandmaps" in detail and "address randomization" in detail) is (accel == "tcg")
    assert detail.startswith("KVM" if accel == "kvm" else "software emulation (TCG)")


@pytest.fixture
def pvm_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A host whose /dev/kvm opens and whose KVM is PVM; kernel configs in a tmp /boot."""
    monkeypatch.delenv("TKBOX_ACCEL", raising=False)
    real_exists = qemu.os.path.exists
    monkeypatch.setattr(qemu.os.path, "exists",
                        lambda p: True if p in ("/dev/kvm", "/sys/module/kvm_pvm")
                        else real_exists(p))
    monkeypatch.setattr(qemu.os, "open", lambda *a, **k: 99)
    monkeypatch.setattr(qemu.os, "close", lambda fd: None)
    boot = tmp_path / "boot"
    boot.mkdir()
    monkeypatch.setattr(qemu, "BOOT", boot)
    return boot


def test_pvm_host_runs_a_guest_kernel_built_for_pvm_under_kvm(pvm_host: Path) -> None:
    (pvm_host / "config-6.1.0-pvm").write_text("CONFIG_KVM_GUEST=y\nCONFIG_PVM_GUEST=y\n")
    d = qemu._decide("6.1.0-pvm")
    assert d.accel == "kvm" and "built for PVM" in d.reason


def test_pvm_host_runs_other_guest_kernels_under_tcg_and_says_why(pvm_host: Path) -> None:
    (pvm_host / "config-6.1.0-plain").write_text("CONFIG_KVM_GUEST=y\n"
                                                 "# CONFIG_PVM_GUEST is not set\n")
    d = qemu._decide("6.1.0-plain")
    assert d.accel == "tcg" and "PVM" in d.reason and "6.1.0-plain" in d.reason
    # a kernel whose config is missing cannot be shown to be built for PVM: TCG too
    d = qemu._decide("0.0-no-such-kernel")
    assert d.accel == "tcg" and "0.0-no-such-kernel" in d.reason


def test_the_accel_decision_is_cached_per_kernel(pvm_host: Path, tmp_path: Path) -> None:
    (pvm_host / "config-6.1.0-pvm").write_text("CONFIG_PVM_GUEST=y\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    assert qemu.decide_accel("6.1.0-pvm", cache).accel == "kvm"
    (pvm_host / "config-6.1.0-pvm").write_text("")  # the cache answers, not the file
    assert qemu.decide_accel("6.1.0-pvm", cache).accel == "kvm"
    assert qemu.decide_accel("6.1.0-other", cache).accel == "tcg"


def qemu_opts(text: str) -> list[tuple[str, str]]:
    """QEMU's option syntax (util/qemu-option.c): key=value pairs split at each single
    comma; a doubled comma is one comma inside a value."""
    pairs, key, value, i = [], "", "", 0
    part, in_value = "", False
    while i <= len(text):
        c = text[i] if i < len(text) else ","
        if c == "," and text[i + 1:i + 2] == ",":
            if in_value:
                value += ","
            else:
                part += ","
            i += 2
            continue
        if c == ",":
            pairs.append((key, value) if in_value else ("", part))
            key, value, part, in_value = "", "", "", False
        elif c == "=" and not in_value:
            key, in_value = part, True
        elif in_value:
            value += c
        else:
            part += c
        i += 1
    return pairs


def test_paths_with_commas_cannot_add_qemu_options(tmp_path: Path) -> None:
    """Attack: a path on QEMU's command line with a comma in it (a TKBOX_HOME such as
    '/srv/tk,file=/etc') split its option in two: the rest of the path became QEMU
    options of their own. No path of the daemon's reaches an option list now: the
    sockets and disks are descriptors (`fd=N`, `/dev/fdset/N`), the memory file is
    `/proc/self/fd/N`, and the kernel and initramfs are arguments of their own."""
    odd = tmp_path / "a,file=x,readonly=off,b=c"
    s = VMSpec(name="t", kernel=odd / "vmlinux", initramfs=odd / "initrd", workdir=odd,
               disks=(Disk(odd / "r", True, "root"), Disk(odd / "u", False, "upper")))
    wiring = qemu.Wiring(3, 4, 5, ((6,), (7,)), str(s.kernel), str(s.initramfs),
                         "/proc/self/fd/9")
    argv = qemu.build_argv(s, "tcg", wiring=wiring)
    assert argv[argv.index("-kernel") + 1] == str(s.kernel)  # a whole argument: no options
    assert argv[argv.index("-initrd") + 1] == str(s.initramfs)
    lists = [argv[i + 1] for i, a in enumerate(argv)
             if a in ("-drive", "-chardev", "-add-fd", "-object", "-device", "-M", "-mon")]
    assert not any(str(odd) in opt or "path=" in opt.replace("mem-path=", "") for opt in lists)
    drives = [dict(qemu_opts(argv[i + 1])) for i, a in enumerate(argv) if a == "-drive"]
    assert [d["file"] for d in drives] == ["/dev/fdset/1", "/dev/fdset/2"]
    assert drives[0]["readonly"] == "on" and "readonly" not in drives[1]
    fdsets = [dict(qemu_opts(argv[i + 1])) for i, a in enumerate(argv) if a == "-add-fd"]
    assert fdsets == [{"fd": "6", "set": "1"}, {"fd": "7", "set": "2"}]
    # The writable disk is opened read-write at once (one descriptor, no second open
    # whose lock a restored VM would collide with).
    assert drives[1]["auto-read-only"] == "off"
    chardevs = [dict(qemu_opts(argv[i + 1])) for i, a in enumerate(argv) if a == "-chardev"]
    assert [(c["id"], c["fd"]) for c in chardevs] == [("con", "3"), ("mux", "5"), ("qmp", "4")]
    assert "-qmp" not in argv
    ram = dict(qemu_opts(argv[argv.index("-object") + 1]))
    assert ram["mem-path"] == "/proc/self/fd/9"
