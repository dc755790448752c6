"""The Firecracker launcher's jailer command line and its chroot's paths, checked
against Firecracker's own documentation of its jailer (tests/testdata/firecracker/
jailer-v1.16.1.md, read by `fc_jailer_doc`), as its requests are checked against the
OpenAPI description. No binary is needed: `jailer_argv` and `build_requests` are pure.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import fc_jailer_doc  # noqa: E402
import fc_openapi  # noqa: E402

from tkbox.vm.base import Disk, VMSpec  # noqa: E402
from tkbox.vm.firecracker import (  # noqa: E402
    JAIL_API,
    JAIL_INITRD,
    JAIL_KERNEL,
    JAIL_VSOCK,
    FirecrackerJailer,
    build_requests,
    jail_disk,
    jail_id,
    jailer_argv,
)


def spec(tmp_path: Path) -> VMSpec:
    return VMSpec(name="demo_box.1", kernel=tmp_path / "vmlinux", initramfs=tmp_path / "initrd",
                  workdir=tmp_path / "vm",
                  disks=(Disk(tmp_path / "root.sqfs", True, "root"),
                         Disk(tmp_path / "upper.ext4", False, "upper")),
                  memory_mib=1024, vcpus=2)


@pytest.mark.parametrize("version", [1, 2])
def test_the_jailer_command_line_is_what_its_documentation_allows(tmp_path: Path,
                                                                   version: int) -> None:
    jailer = FirecrackerJailer(Path("/usr/bin/jailer"), Path("/srv/tkbox-jail"),
                               (61000, 61183), cgroup_version=version)
    argv = jailer_argv(jailer, "/usr/bin/firecracker", 61042, spec(tmp_path))
    assert fc_jailer_doc.check(argv) == []
    assert argv[argv.index("--id") + 1] == jail_id(61042) == "tkbox-61042"
    assert argv[argv.index("--uid") + 1] == argv[argv.index("--gid") + 1] == "61042"
    cgroups = [argv[i + 1] for i, a in enumerate(argv) if a == "--cgroup"]
    memory = (1024 + jailer.overhead_mib) << 20
    if version == 2:
        assert cgroups == [f"memory.max={memory}", "pids.max=256", "cpu.max=300000 100000"]
    else:
        assert cgroups == [f"memory.limit_in_bytes={memory}", "pids.max=256",
                           "cpu.cfs_quota_us=300000"]
    # Firecracker keeps the process tkbox started: no --daemonize, no --new-pid-ns.
    assert "--daemonize" not in argv and "--new-pid-ns" not in argv
    assert argv[argv.index("--") + 1:] == ["--api-sock", JAIL_API]


def test_the_chroot_is_where_the_documentation_says() -> None:
    jailer = FirecrackerJailer(Path("/usr/bin/jailer"), Path("/srv/tkbox-jail"), (61000, 61183))
    assert jailer.chroot("/opt/fc/firecracker", "tkbox-61042") == \
        fc_jailer_doc.chroot_dir("/srv/tkbox-jail", "/opt/fc/firecracker", "tkbox-61042") == \
        Path("/srv/tkbox-jail/firecracker/tkbox-61042/root")


@pytest.mark.parametrize("spec_file", fc_openapi.SPECS, ids=lambda p: p.name)
def test_jailed_requests_name_files_inside_the_chroot(tmp_path: Path, spec_file: Path) -> None:
    """A chrooted Firecracker resolves every path in its chroot: the requests name the
    files where the launcher places them, and still match the OpenAPI description."""
    calls = build_requests(spec(tmp_path), jailed=True)
    for call in calls:
        assert fc_openapi.check_request(call.method, call.path, call.body, spec_file) == []
    bodies = {c.path: c.body for c in calls}
    assert bodies["/boot-source"]["kernel_image_path"] == JAIL_KERNEL
    assert bodies["/boot-source"]["initrd_path"] == JAIL_INITRD
    assert [bodies[f"/drives/disk{i}"]["path_on_host"] for i in range(2)] == \
        [jail_disk(0), jail_disk(1)]
    assert bodies["/vsock"]["uds_path"] == JAIL_VSOCK
    assert not any(str(tmp_path) in str(c.body) for c in calls)


@pytest.mark.parametrize(("change", "problem"), [
    (lambda a: a[:1] + ["--bogus"] + a[1:], "unknown option '--bogus'"),
    (lambda a: [w for i, w in enumerate(a) if i not in (a.index("--uid"), a.index("--uid") + 1)],
     "--uid is required"),
    (lambda a: [("x_y" if w == "tkbox-61042" else w) for w in a], "--id 'x_y'"),
    (lambda a: [("tk" + "x" * 63 if w == "tkbox-61042" else w) for w in a], "at most 64"),
    (lambda a: [("stack=9" if w.startswith("no-file=") else w) for w in a], "--resource-limit"),
    (lambda a: [("memory.max" if w.startswith("memory.max=") else w) for w in a], "--cgroup"),
    (lambda a: [("3" if w == "2" else w) for w in a], "--cgroup-version '3'"),
    (lambda a: [("../up" if w == "tkbox-vmm" else w) for w in a], "--parent-cgroup"),
    (lambda a: a + ["--id", "tkbox-61042"], "the jailer passes it"),
    (lambda a: a[:1] + ["--id", "a"] + a[1:], "more than once"),
])
def test_the_check_itself_refuses_what_the_documentation_does_not_allow(
        tmp_path: Path, change: object, problem: str) -> None:
    """So that the check above can fail: each departure from the doc is named."""
    jailer = FirecrackerJailer(Path("/usr/bin/jailer"), Path("/srv/tkbox-jail"), (61000, 61183))
    argv = jailer_argv(jailer, "/usr/bin/firecracker", 61042, spec(tmp_path))
    bad = change(argv)  # type: ignore[operator]
    problems = fc_jailer_doc.check(bad)
    assert any(problem in p for p in problems), problems


def test_the_daemon_jails_firecracker_where_it_can_and_says_why_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root, a jailer beside firecracker, a cgroup hierarchy: jailed. Each missing part
    is named; `--vmm-jail on` makes it a refusal; `off` is off."""
    from tkbox.errors import HostError
    from tkbox.vm import firecracker
    from tkbox.vm.cgroup import CgroupRoot
    from tkbox.vm.jail import JailConfig

    fc = tmp_path / "bin" / "firecracker"
    fc.parent.mkdir()
    fc.write_text("#!/bin/sh\n")
    fc.chmod(0o755)
    monkeypatch.setattr(firecracker.shutil, "which", lambda name: None)
    monkeypatch.setattr(firecracker, "vms", lambda: tmp_path / "run" / "vms")
    monkeypatch.setattr(firecracker, "find_root",
                        lambda operator=None: CgroupRoot(2, {"": tmp_path / "cg"}))
    monkeypatch.setattr(firecracker.os, "geteuid", lambda: 0)
    assert firecracker.firecracker_jail(JailConfig(mode="off"), str(fc)) == \
        (None, "not jailed: --vmm-jail off")
    none, why = firecracker.firecracker_jail(JailConfig(), str(fc))
    assert none is None and "no Firecracker `jailer` beside" in why
    with pytest.raises(HostError, match="--vmm-jail on, but no Firecracker `jailer`"):
        firecracker.firecracker_jail(JailConfig(mode="on"), str(fc))
    (fc.parent / "jailer").write_text("#!/bin/sh\n")
    (fc.parent / "jailer").chmod(0o755)
    jailer, said = firecracker.firecracker_jail(JailConfig(), str(fc))
    assert jailer is not None and jailer.binary == fc.parent / "jailer"
    assert jailer.cgroup_version == 2 and jailer.chroot_base == tmp_path / "run" / "jail"
    assert said.startswith("jailed by Firecracker's jailer")
    monkeypatch.setattr(firecracker.os, "geteuid", lambda: 1000)
    assert firecracker.firecracker_jail(JailConfig(), str(fc)) == \
        (None, "not jailed: Firecracker's jailer runs as root only")
