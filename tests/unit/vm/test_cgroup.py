"""Each VMM's cgroup (`tkbox.vm.cgroup`): where the subtree goes on each kind of host,
the limits written, and the kernel's counters read back as why a VMM ended. Run
against directory trees shaped as cgroupfs is (no real cgroup is touched)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tkbox.errors import HostError
from tkbox.vm import cgroup
from tkbox.vm.cgroup import Limits, counter, find_root, parse_mountinfo, parse_proc_cgroup

HYBRID_MOUNTS = """\
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
32 30 0:28 / {root}/memory rw,nosuid - cgroup cgroup rw,memory
33 30 0:29 / {root}/pids rw,nosuid - cgroup cgroup rw,pids
34 30 0:30 / {root}/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
"""
HYBRID_OWN = "5:pids:/\n4:memory:/svc/job-1\n2:cpu,cpuacct:/\n0::/\n"


def v1_tree(tmp_path: Path) -> str:
    for d in ("memory/svc/job-1", "pids", "cpu,cpuacct"):
        (tmp_path / d / "tkbox-vmm").mkdir(parents=True)
        (tmp_path / d / "tkbox-vmm" / "cgroup.procs").write_text("")
    return HYBRID_MOUNTS.format(root=tmp_path)


@pytest.fixture(autouse=True)
def plain_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """cgroupfs makes a cgroup's files itself; a plain directory needs them made."""

    def write(path: Path, value: str) -> None:
        path.write_text(value)

    monkeypatch.setattr(cgroup, "_write", write)


def test_mountinfo_and_proc_cgroup_are_read_as_the_kernel_writes_them() -> None:
    mounts = parse_mountinfo(HYBRID_MOUNTS.format(root="/x") + "garbage line\n")
    assert ("/x/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct") in mounts
    assert ("/sys/fs/cgroup/unified", "cgroup2", "rw") in mounts
    assert parse_proc_cgroup(HYBRID_OWN) == {"pids": "/", "memory": "/svc/job-1", "cpu": "/",
                                             "cpuacct": "/", "": "/"}


def test_on_cgroup_v1_the_subtree_nests_under_the_daemons_own_cgroup(tmp_path: Path) -> None:
    """So the limits of whatever runs the daemon (a CI job's cgroup) still hold."""
    root = find_root(mountinfo=v1_tree(tmp_path), own=HYBRID_OWN)
    assert not isinstance(root, str), root
    assert root.version == 1
    assert root.dirs == {"memory": tmp_path / "memory/svc/job-1/tkbox-vmm",
                         "pids": tmp_path / "pids/tkbox-vmm",
                         "cpu": tmp_path / "cpu,cpuacct/tkbox-vmm"}


def test_a_host_without_the_controllers_says_which_are_missing(tmp_path: Path) -> None:
    mounts = "31 30 0:27 / /nowhere rw - cgroup2 cgroup2 rw\n"
    why = find_root(mountinfo=mounts, own="0::/\n")
    assert isinstance(why, str)
    assert "cgroup v1 has no memory, pids, cpu" in why


def test_limits_are_written_and_the_kernels_counters_say_why_a_vmm_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = find_root(mountinfo=v1_tree(tmp_path), own=HYBRID_OWN)
    assert not isinstance(root, str)
    box = root.create("vmm-61042", Limits(memory_mib=1152, pids=256, cpus=2))
    mem, pids, cpu = box.dirs["memory"], box.dirs["pids"], box.dirs["cpu"]
    assert (mem / "memory.limit_in_bytes").read_text() == str(1152 << 20)
    assert (mem / "memory.memsw.limit_in_bytes").read_text() == str(1152 << 20)
    assert (pids / "pids.max").read_text() == "256"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "200000"
    assert box.verdict().limit == ""  # no counter file: nothing ended it
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    verdict = box.verdict()
    assert verdict.limit == "memory"
    assert "reached its memory limit of 1152 MiB" in verdict.reason
    (mem / "memory.oom_control").write_text("oom_kill 0\n")
    (pids / "pids.events").write_text("max 3\n")
    assert box.verdict().limit == "pids"
    for d in box.dirs.values():  # what the kernel's files would be: gone with the dir
        for f in d.iterdir():
            f.unlink()
    assert box.remove(wait=0)
    assert not mem.exists() and not pids.exists()


def test_v2_limits(tmp_path: Path) -> None:
    d = tmp_path / "vmm-1"
    d.mkdir()
    box = cgroup.BoxCgroup(2, {"": d}, Limits(512, 64, 3))
    cgroup._set_limits(box, box.limits)
    assert (d / "memory.max").read_text() == str(512 << 20)
    assert (d / "memory.swap.max").read_text() == "0"
    assert (d / "pids.max").read_text() == "64"
    assert (d / "cpu.max").read_text() == "300000 100000"
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    assert box.verdict().limit == "memory"


@pytest.mark.parametrize("text", ["oom_kill 1x", "oom_kill", "oom_kill -1", "x" * 100000,
                                  "oom_kill 99999999999999999999999"])
def test_a_counter_that_is_not_a_plain_number_counts_as_none(text: str) -> None:
    assert counter(text, "oom_kill") == 0


def test_a_cgroup_that_cannot_be_made_is_a_host_error_naming_it(tmp_path: Path) -> None:
    root = cgroup.CgroupRoot(2, {"": tmp_path / "missing"})
    with pytest.raises(HostError, match="cannot make the VMM's cgroup vmm-1 under cgroup v2"):
        root.create("vmm-1", Limits(1, 1, 1))


def test_the_firecracker_jailers_cgroup_is_where_its_doc_says(tmp_path: Path) -> None:
    box = cgroup.jailer_cgroup(1, "tkbox-vmm", "tkbox-61042", Limits(1, 1, 1),
                               mountinfo=HYBRID_MOUNTS.format(root="/cg"))
    assert box is not None and box.dirs == {
        "memory": Path("/cg/memory/tkbox-vmm/tkbox-61042"),
        "pids": Path("/cg/pids/tkbox-vmm/tkbox-61042"),
        "cpu": Path("/cg/cpu,cpuacct/tkbox-vmm/tkbox-61042")}
    box2 = cgroup.jailer_cgroup(2, "tkbox-vmm", "tkbox-61042", Limits(1, 1, 1),
                                mountinfo=HYBRID_MOUNTS.format(root="/cg"))
    assert box2 is not None and box2.dirs == {
        "": Path("/sys/fs/cgroup/unified/tkbox-vmm/tkbox-61042")}


def test_a_delegated_cgroup_is_used_below_where_the_operator_points(tmp_path: Path) -> None:
    """systemd `Delegate=yes` (with `DelegateSubgroup=` keeping the daemon out of the
    unit's own cgroup): `--vmm-cgroup <unit>/vmm` is made if missing, its controllers
    enabled for the VMMs' cgroups below it."""
    unit = tmp_path / "system.slice" / "tkbox.service"
    unit.mkdir(parents=True)
    (unit / "cgroup.controllers").write_text("cpu io memory pids\n")
    vmm = unit / "vmm"
    # cgroupfs would fill the new directory itself; a plain one is told what it offers
    root = find_root(vmm, mountinfo="", own="0::/\n")
    assert isinstance(root, str) and "offers no memory, pids and cpu" in root
    (vmm / "cgroup.controllers").write_text("cpu memory pids\n")
    (vmm / "cgroup.subtree_control").write_text("")
    (vmm / "cgroup.procs").write_text("")
    ready = find_root(vmm, mountinfo="", own="0::/\n")
    assert not isinstance(ready, str) and ready.version == 2 and ready.dirs == {"": vmm}
    assert (vmm / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
