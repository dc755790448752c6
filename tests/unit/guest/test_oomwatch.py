"""The guest's memory-pressure watch: it ends the largest command of a group that
thrashes at its limit (the kernel's OOM killer can wait minutes), and only then."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tkbox.guest import oomwatch


def _group(tmp_path: Path, limit: str, current: int, pids: list[int]) -> Path:
    g = tmp_path / "commands"
    g.mkdir()
    (g / "memory.max").write_text(limit + "\n")
    (g / "memory.current").write_text(f"{current}\n")
    (g / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    return g


def _proc(tmp_path: Path, pages: dict[int, int]) -> Path:
    proc = tmp_path / "proc"
    for pid, resident in pages.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "statm").write_text(f"9999 {resident} 10 1 0 100 0\n")
    return proc


def test_the_trigger_is_a_full_stall_within_the_kernels_window_bounds() -> None:
    assert oomwatch.trigger() == b"full 400000 2000000\0"
    for stall, window in [(0, 2_000_000), (2_000_000, 2_000_000), (100, 400_000),
                          (1, 11_000_000)]:
        with pytest.raises(ValueError):
            oomwatch.trigger(stall, window)


def test_a_group_thrashing_at_its_limit_loses_its_largest_process(tmp_path: Path) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    g = _group(tmp_path, str(100 << 20), 95 << 20, [11, 12, 13, 14])
    # 14 ended between reading the group and reading /proc: skipped, not fatal
    proc = _proc(tmp_path, {11: 100, 12: (90 << 20) // page, 13: 5})
    killed: list[tuple[int, int]] = []
    logged: list[str] = []
    pid = oomwatch.relieve(g, logged.append, lambda p, s: killed.append((p, s)), proc)
    assert pid == 12 and killed == [(12, signal.SIGKILL)]
    assert logged == ["commands thrashed at their memory limit: killed pid 12 (90 MiB resident)"]


@pytest.mark.parametrize("limit,current", [(str(100 << 20), 50 << 20), ("max", 1 << 40)])
def test_a_stall_below_the_limit_kills_nothing(tmp_path: Path, limit: str,
                                               current: int) -> None:
    """A full stall can come from a large read too; without the group at its limit
    (or with no limit at all) nothing is killed."""
    g = _group(tmp_path, limit, current, [11])
    proc = _proc(tmp_path, {11: 1000})
    killed: list[int] = []
    assert oomwatch.relieve(g, lambda m: None, lambda p, s: killed.append(p), proc) is None
    assert killed == []


def test_an_empty_or_unreadable_group_kills_nothing(tmp_path: Path) -> None:
    g = _group(tmp_path, "100", 100, [])
    assert oomwatch.relieve(g, lambda m: None, lambda p, s: pytest.fail("killed"),
                            _proc(tmp_path, {})) is None
    (g / "memory.current").write_text("garbage")
    assert not oomwatch.at_limit(g)


def test_a_process_that_ends_before_the_kill_is_not_reported(tmp_path: Path) -> None:
    g = _group(tmp_path, "100", 100, [11])

    def gone(pid: int, sig: int) -> None:
        raise ProcessLookupError(pid)
    logged: list[str] = []
    assert oomwatch.relieve(g, logged.append, gone, _proc(tmp_path, {11: 1})) is None
    assert logged == []


def _cgroup2() -> Path | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2" and os.access(Path(fields[1]) / "memory.pressure", os.W_OK):
            return Path(fields[1])
    return None


@pytest.mark.skipif(_cgroup2() is None, reason="no writable cgroup2 hierarchy with PSI here")
def test_a_real_kernel_accepts_the_trigger_and_the_watch_runs() -> None:
    """The same kernel line as the guest's (Debian 12's 6.1): the trigger is accepted
    and the watching thread waits on it."""
    root = _cgroup2()
    assert root is not None
    logged: list[str] = []
    thread = oomwatch.start(root, logged.append)
    assert thread is not None and thread.is_alive() and thread.daemon, logged
    assert len(logged) == 1 and "loses its largest process" in logged[0]


def test_no_psi_is_a_log_line_not_a_failure(tmp_path: Path) -> None:
    logged: list[str] = []
    assert oomwatch.start(tmp_path / "missing", logged.append) is None
    assert logged and logged[0].startswith("no memory-pressure watch (")
