"""The VMM's cell (`tkbox.vm.jail`): the operator's settings, the root plan, uid
leases, what a box is told about its cell, and a template's memory sealed."""

from __future__ import annotations

import fcntl
import mmap
import os
from pathlib import Path

import pytest

from tkbox.errors import HostError, UserError
from tkbox.vm import jail
from tkbox.vm.jail import (
    Cell,
    Jail,
    JailConfig,
    TemplateRam,
    UidLease,
    check_range,
    lease_uid,
    parse_uids,
    resolve,
)


@pytest.mark.parametrize("text", ["61000-61183", " 1000-1001 "])
def test_a_uid_range_is_first_dash_last(text: str) -> None:
    first, last = parse_uids(text)
    assert first < last


@pytest.mark.parametrize("text", ["61000", "61183-61000", "0-100", "999-2000", "1000-1000",
                                  "1000-99999999999", "a-b", "1000 - 2000", "-1-5"])
def test_a_bad_uid_range_is_a_user_error(text: str) -> None:
    with pytest.raises(UserError, match="--vmm-uids"):
        parse_uids(text)


def test_a_range_holding_an_account_of_the_host_is_refused() -> None:
    """A VMM must never run as a uid something else on the host is (nobody, 65534)."""
    with pytest.raises(HostError, match="holds uid 65534 of account"):
        check_range((65000, 65535))
    check_range(jail.DEFAULT_UIDS)


def test_each_lease_is_a_uid_no_other_vmm_holds(tmp_path: Path) -> None:
    a = lease_uid((61000, 61001), tmp_path)
    b = lease_uid((61000, 61001), tmp_path)
    assert {a.uid, b.uid} == {61000, 61001}
    with pytest.raises(HostError, match="every uid of --vmm-uids 61000-61001 holds a running VMM"):
        lease_uid((61000, 61001), tmp_path)
    a.close()
    c = lease_uid((61000, 61001), tmp_path)
    assert c.uid == a.uid
    b.close()
    c.close()


def test_a_path_is_resolved_through_every_symlink_and_each_is_kept(tmp_path: Path) -> None:
    """The cell rebuilds the walk QEMU's loader takes: each link at its real place."""
    (tmp_path / "usr" / "lib" / "x").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "x" / "libz.so.1.2").write_text("")
    (tmp_path / "usr" / "lib" / "x" / "libz.so.1").symlink_to("libz.so.1.2")
    (tmp_path / "lib").symlink_to("usr/lib")
    links: dict[str, str] = {}
    real = resolve(str(tmp_path / "lib" / "x" / "libz.so.1"), links)
    assert real == str(tmp_path / "usr" / "lib" / "x" / "libz.so.1.2")
    assert links == {str(tmp_path / "lib"): "usr/lib",
                     str(tmp_path / "usr" / "lib" / "x" / "libz.so.1"): "libz.so.1.2"}
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(HostError, match="too many symbolic links"):
        resolve(str(tmp_path / "loop"), {})


def test_the_plan_binds_real_files_and_keeps_the_links_on_the_way() -> None:
    plan = jail.plan_for("/bin/sh")
    binds = dict(plan.binds)
    assert all(src == dst for src, dst in plan.binds)  # each file at its own path
    assert all(os.path.exists(src) and not os.path.islink(src) for src in binds)
    libc = [p for p in binds if "/libc.so" in p]
    assert libc, plan.binds
    if os.path.islink("/lib64"):
        assert ("/lib64", os.readlink("/lib64")) in plan.links


def cell(mode: str, lease: UidLease | None) -> Cell:
    j = Jail(mode, JailConfig(), Path("/x/tkbox-jailer"),
             missing=[] if mode == "root" else ["no cgroup: not root"])
    return Cell(j, lease, None, (("/k", "/vm/kernel"),), ("null",),
                jail.RootPlan((("/usr/bin/qemu", "/usr/bin/qemu"),), (("/lib", "usr/lib"),)))


def test_what_a_box_is_told_of_its_cell() -> None:
    """The ready record's words: the uid in root mode, and what is missing and why."""
    root = cell("root", UidLease(61042, -1))
    assert root.isolation == "jailed uid 61042, namespaces, no cgroup"
    userns = cell("userns", None)
    assert userns.isolation == (f"jailed in a user namespace (host uid {os.getuid()}, the "
                                "daemon's), namespaces, no cgroup; no cgroup: not root")
    off = Jail("off", JailConfig(mode="off"), missing=["--vmm-jail off"])
    assert off.cell("b", memory_mib=1, vcpus=1, accel="tcg").isolation == \
        "not jailed: --vmm-jail off"


def test_the_jailers_command_line_hands_over_only_what_it_names(tmp_path: Path) -> None:
    c = cell("root", UidLease(61042, 9))
    argv, fds = c.command(["/usr/bin/qemu", "-x"], (3, 4), tmp_path)
    assert argv[:3] == ["/x/tkbox-jailer", "--root", str(tmp_path)]
    assert argv[argv.index("--uid") + 1] == argv[argv.index("--gid") + 1] == "61042"
    assert argv[argv.index("--hold-fd") + 1] == "9"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--fd"] == ["3", "4"]
    assert ["--bind", "/k", "/vm/kernel"] == argv[argv.index("/k") - 1:argv.index("/k") + 2]
    assert argv[-3:] == ["--", "/usr/bin/qemu", "-x"]
    assert fds == (3, 4, 9)
    u_argv, u_fds = cell("userns", None).command(["/usr/bin/qemu"], (3,), tmp_path)
    assert "--userns" in u_argv and "--uid" not in u_argv and u_fds == (3,)


def test_a_template_memory_in_cells_cannot_be_written(tmp_path: Path) -> None:
    """Attack: an escaped VMM writes the template's memory it maps, to reach every box
    restored from it later (or the pages other running boxes have not copied yet).
    It is given a memfd sealed against writes: it can map it privately, no more."""
    ram = tmp_path / "ram"
    with open(ram, "wb") as f:
        f.truncate(64 << 20)  # sparse, as a template's RAM file is
        f.seek(4096)
        f.write(b"guest page")
        f.seek(32 << 20)
        f.write(b"another")
    store = TemplateRam()
    try:
        fd = store.fd(ram)
        assert store.fd(ram) == fd  # loaded once
        assert os.pread(fd, 10, 4096) == b"guest page"
        assert os.pread(fd, 7, 32 << 20) == b"another"
        assert os.fstat(fd).st_size == 64 << 20
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SEAL
        reopened = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)  # as QEMU opens it
        try:
            with pytest.raises(PermissionError):
                os.pwrite(reopened, b"x", 4096)
            with pytest.raises(PermissionError):
                mmap.mmap(reopened, 1 << 20, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            with pytest.raises(PermissionError):
                os.ftruncate(reopened, 1 << 20)
            private = mmap.mmap(reopened, 1 << 20, mmap.MAP_PRIVATE,
                                mmap.PROT_READ | mmap.PROT_WRITE)
            private[4096:4106] = b"box writes"  # its own copy of the page
            private.close()
        finally:
            os.close(reopened)
        assert os.pread(fd, 10, 4096) == b"guest page"
    finally:
        store.close()


def test_in_a_chroot_no_cell_is_tried_and_the_reason_is_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = tmp_path / "host"
    host.write_text("22 27 0:21 / /proc rw,relatime - proc proc rw\n"
                    "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n")
    chrooted = tmp_path / "chrooted"  # as a chroot sees it: no mount at /
    chrooted.write_text("22 27 0:21 / /proc rw,relatime - proc proc rw\n"
                        "23 27 0:22 / /sys rw,relatime - sysfs sysfs rw\n")
    assert jail.chroot_problem(host) is None
    assert jail.chroot_problem(tmp_path / "no-proc") is None
    why = jail.chroot_problem(chrooted)
    assert why is not None and "chroot" in why
    monkeypatch.setattr(jail, "chroot_problem", lambda: why)
    decided = jail.decide(jail.JailConfig(), "/bin/true", tmp_path / "cache")
    assert decided.mode == "off" and decided.missing == [why]
    assert "chroot" in decided.summary()
    with pytest.raises(HostError, match="chroot"):
        jail.decide(jail.JailConfig(mode="on"), "/bin/true", tmp_path / "cache")
