"""Ends the largest command when the commands' memory group thrashes at its limit.

The kernel kills inside a memory cgroup only when reclaim makes no progress. A
command at `memory.max` whose own code pages are reclaimed and read back again
makes "progress" on every round, so the OOM killer can wait for minutes (under
software emulation, more than ten) while the whole group is stalled: what the
kernel's pressure-stall information calls a *full* memory stall
(Documentation/accounting/psi.rst). This watcher asks the kernel to wake it
when every task of the group has been stalled on memory for `STALL_US` of
`WINDOW_US`; if the group is then at its limit, it ends the group's largest
process with SIGKILL, the choice the OOM killer would make. systemd-oomd does
the same on a desktop. The kernel's own killer still acts first when it can:
this only bounds how long a thrash lasts.

It runs in a thread of the guest agent because a PSI trigger signals POLLPRI,
which asyncio's selector does not watch. Standard library only (it runs in the
guest).
"""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Callable
from pathlib import Path

#: a full stall of 0.4 s within 2 s: well past any ordinary burst of reclaim
STALL_US = 400_000
WINDOW_US = 2_000_000
#: the group counts as at its limit from this share of `memory.max`
AT_LIMIT = 0.9

Log = Callable[[str], None]


def trigger(stall_us: int = STALL_US, window_us: int = WINDOW_US) -> bytes:
    """The line written to `memory.pressure` to arm the trigger."""
    if not 0 < stall_us < window_us or not 500_000 <= window_us <= 10_000_000:
        raise ValueError("a PSI window is 0.5-10 s and the stall is shorter than it")
    return f"full {stall_us} {window_us}".encode() + b"\0"


def at_limit(cgroup: Path) -> bool:
    """Whether the group uses at least AT_LIMIT of its `memory.max`."""
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        current = int((cgroup / "memory.current").read_text())
    except (OSError, ValueError):
        return False
    return limit != "max" and limit.isdigit() and current >= AT_LIMIT * int(limit)


def largest(cgroup: Path, proc: Path = Path("/proc")) -> tuple[int, int] | None:
    """(pid, resident bytes) of the group's largest process, or None if it is empty.
    Processes that end while being read are skipped."""
    try:
        pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    best: tuple[int, int] | None = None
    for pid in pids:
        try:
            resident = int((proc / str(pid) / "statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
        if best is None or resident > best[1]:
            best = (pid, resident)
    return best


def relieve(cgroup: Path, log: Log, kill: Callable[[int, int], None] = os.kill,
            proc: Path = Path("/proc")) -> int | None:
    """One wake-up: if the group is at its limit, SIGKILL its largest process.
    Returns the pid ended, if any."""
    if not at_limit(cgroup):
        return None
    victim = largest(cgroup, proc)
    if victim is None:
        return None
    pid, resident = victim
    try:
        kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    log(f"commands thrashed at their memory limit: killed pid {pid} "
        f"({resident >> 20} MiB resident)")
    return pid


def start(cgroup: Path, log: Log) -> threading.Thread | None:
    """Arm the trigger on `cgroup` and watch it in a daemon thread (it lives as long
    as the agent). None, with a log line, where the kernel has no PSI."""
    try:
        fd = os.open(cgroup / "memory.pressure", os.O_RDWR | os.O_NONBLOCK)
    except OSError as exc:
        log(f"no memory-pressure watch ({exc})")
        return None
    try:
        os.write(fd, trigger())
    except OSError as exc:
        os.close(fd)
        log(f"no memory-pressure watch ({exc})")
        return None

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, select.POLLPRI)
        while True:
            for _, events in poller.poll():
                if events & (select.POLLERR | select.POLLNVAL):
                    log("the memory-pressure watch ended: the kernel dropped the trigger")
                    return
                if events & select.POLLPRI:
                    relieve(cgroup, log)

    thread = threading.Thread(target=watch, name="oomwatch", daemon=True)
    thread.start()
    log(f"a command group stalled on memory for {STALL_US // 1000} ms of every "
        f"{WINDOW_US // 1000} ms at its limit loses its largest process")
    return thread
