"""Each VMM's cgroup: its memory, pids and CPU limits, and why the kernel ended it.

The daemon keeps one subtree, `tkbox-vmm`, and puts each VMM in a child of it named
for the VMM's uid (`vmm-61042`: unique on the host while that VMM runs, see
`tkbox.vm.jail`). Where the subtree goes, decided once from facts (`find_root`):

- `--vmm-cgroup DIR`: `DIR`, a cgroup v2 directory delegated to the daemon (systemd:
  a unit with `Delegate=yes`);
- cgroup v2 (unified), daemon as root: `/sys/fs/cgroup/tkbox-vmm` (v2 lets no
  process sit in a cgroup whose children have controllers, so the subtree cannot
  go under the daemon's own cgroup);
- cgroup v1 (legacy or hybrid), root: `<controller mount>/<the daemon's own
  cgroup>/tkbox-vmm` for each of memory, pids and cpu (v1 nests under the daemon's
  own cgroup, so the limits of whatever runs the daemon still hold);
- neither, or not writable: none, and the reason says why.

Limits, written before the VMM starts (the jailer joins the cgroup before it
forks the VMM, through a `cgroup.procs` file the daemon opened):

| limit    | v2                                   | v1                                    |
| -------- | ------------------------------------ | ------------------------------------- |
| memory   | `memory.max`, `memory.swap.max` 0    | `memory.limit_in_bytes`, `.memsw.`    |
| pids     | `pids.max`                           | `pids.max`                            |
| CPU      | `cpu.max` = "QUOTA 100000"           | `cpu.cfs_quota_us` / `cpu.cfs_period_us` |

Why it ended (`BoxCgroup.verdict`, read once the VMM has ended, before the cgroup is
removed): the kernel's own counters, `oom_kill` (v2 `memory.events`, v1
`memory.oom_control`) and the pids limit's `max` (`pids.events`, both). A
counter is read as `NAME DIGITS` lines, every line bounded: cgroupfs is the
kernel's, but nothing here trusts a file's size.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tkbox.errors import HostError

CGROUP_FS = Path("/sys/fs/cgroup")
SUBTREE = "tkbox-vmm"
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
#: Bytes read of a cgroup file (the kernel's counters are a few hundred).
MAX_READ = 8192


@dataclass(frozen=True)
class Limits:
    """What a VMM may use: memory (MiB, the guest's and the VMM's own), tasks, CPUs."""

    memory_mib: int
    pids: int
    cpus: int


@dataclass(frozen=True)
class Verdict:
    """Why the kernel ended a VMM, from its cgroup's counters ("" when it did not)."""

    limit: str  # "memory", "pids" or ""
    reason: str


def _read(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(MAX_READ).decode("ascii", "replace")


def counter(text: str, name: str) -> int:
    """The value of `name` in a cgroup "key value" file (0 if absent or malformed)."""
    for line in text.splitlines()[:64]:
        parts = line.split()
        if len(parts) == 2 and parts[0] == name and parts[1].isdigit() and len(parts[1]) < 20:
            return int(parts[1])
    return 0


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


@dataclass
class BoxCgroup:
    """One VMM's cgroup (a directory per hierarchy: one on v2, one per controller on v1)."""

    version: int
    dirs: dict[str, Path]  # controller -> directory ("" on v2)
    limits: Limits
    _procs: list[int] = field(default_factory=list)

    def procs_fds(self) -> list[int]:
        """`cgroup.procs` of each directory, open for writing: the jailer writes its own
        pid there before it forks the VMM. The caller closes them once it has started."""
        if not self._procs:
            for d in sorted(set(self.dirs.values())):
                self._procs.append(os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        return list(self._procs)

    def close_fds(self) -> None:
        for fd in self._procs:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._procs.clear()

    def _dir(self, controller: str) -> Path | None:
        return self.dirs.get("" if self.version == 2 else controller)

    def verdict(self) -> Verdict:
        """What the counters say ended the VMM (read before `remove`)."""
        ooms = maxed = 0
        mem, pids = self._dir("memory"), self._dir("pids")
        with contextlib.suppress(OSError):
            if mem is not None:
                ooms = counter(_read(mem / ("memory.events" if self.version == 2
                                            else "memory.oom_control")), "oom_kill")
        with contextlib.suppress(OSError):
            if pids is not None:
                maxed = counter(_read(pids / "pids.events"), "max")
        if ooms:
            return Verdict("memory", f"the kernel killed the VMM: it reached its memory limit "
                                     f"of {self.limits.memory_mib} MiB (the guest's RAM and "
                                     f"the VMM's own; oom_kill {ooms})")
        if maxed:
            return Verdict("pids", f"the VMM reached its limit of {self.limits.pids} "
                                   f"processes and threads (pids.max; refused {maxed} "
                                   "times) and could not go on")
        return Verdict("", "")

    def remove(self, wait: float = 5.0) -> bool:
        """Remove the directories, waiting up to `wait` seconds for the last of the
        VMM's tasks to leave them (a VMM killed with its jailer may be reaped a moment
        after it); whether they are gone."""
        self.close_fds()
        deadline = time.monotonic() + wait
        left = sorted(set(self.dirs.values()))
        while left:
            for d in list(left):
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        return False
                    continue
                left.remove(d)
            if left:
                time.sleep(0.01)
        return True


@dataclass(frozen=True)
class CgroupRoot:
    """Where this daemon's VMM cgroups go: `dirs` per controller ("" on v2)."""

    version: int
    dirs: dict[str, Path]

    def describe(self) -> str:
        where = ", ".join(sorted({str(d) for d in self.dirs.values()}))
        return f"cgroup v{self.version} ({where})"

    def sweep(self, names: list[str]) -> None:
        """Remove the cgroups `names` where they are empty: leftovers of VMMs whose
        daemon ended before it could (the caller holds each name's uid lease)."""
        for name in names:
            for parent in self.dirs.values():
                with contextlib.suppress(OSError):
                    (parent / name).rmdir()

    def children(self) -> list[str]:
        names: set[str] = set()
        for parent in self.dirs.values():
            with contextlib.suppress(OSError):
                names |= {p.name for p in parent.iterdir() if p.is_dir()}
        return sorted(names)

    def create(self, name: str, limits: Limits) -> BoxCgroup:
        """A fresh cgroup `name` under the subtree with `limits` written (HostError if not).

        A leftover of the same name (a daemon that died with a VMM in it) is removed
        first if it is empty, so its counters do not carry over."""
        dirs: dict[str, Path] = {}
        try:
            for key, parent in self.dirs.items():
                d = parent / name
                with contextlib.suppress(FileNotFoundError):
                    d.rmdir()
                d.mkdir(mode=0o755)
                dirs[key] = d
            box = BoxCgroup(self.version, dirs, limits)
            _set_limits(box, limits)
        except OSError as exc:
            for d in dirs.values():
                with contextlib.suppress(OSError):
                    d.rmdir()
            why = "it still holds a process" if exc.errno == errno.EBUSY else exc.strerror
            raise HostError(f"cannot make the VMM's cgroup {name} under "
                            f"{self.describe()}: {why}") from None
        return box


def _set_limits(box: BoxCgroup, limits: Limits) -> None:
    mem = limits.memory_mib << 20
    quota = f"{limits.cpus * CPU_PERIOD_US} {CPU_PERIOD_US}"
    if box.version == 2:
        d = box.dirs[""]
        _write(d / "memory.max", str(mem))
        with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to cap
            _write(d / "memory.swap.max", "0")
        _write(d / "pids.max", str(limits.pids))
        _write(d / "cpu.max", quota)
        return
    _write(box.dirs["memory"] / "memory.limit_in_bytes", str(mem))
    with contextlib.suppress(FileNotFoundError):  # swap accounting off
        _write(box.dirs["memory"] / "memory.memsw.limit_in_bytes", str(mem))
    _write(box.dirs["pids"] / "pids.max", str(limits.pids))
    _write(box.dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
    _write(box.dirs["cpu"] / "cpu.cfs_quota_us", str(limits.cpus * CPU_PERIOD_US))


# --- where the subtree goes --------------------------------------------------------


def parse_mountinfo(text: str) -> list[tuple[str, str, str]]:
    """(mount point, file system type, super options) of each line of mountinfo."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        out.append((point, tail[0], tail[2]))
    return out


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """controller -> this process's cgroup path, from /proc/self/cgroup ("" for v2)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, names, path = parts
        for name in names.split(",") if names else [""]:
            out[name] = path
    return out


def find_root(operator: Path | None = None, *, mountinfo: str | None = None,
              own: str | None = None) -> CgroupRoot | str:
    """The subtree this daemon's VMM cgroups go in, made ready; or why there is none.

    `operator`: a cgroup v2 directory delegated to the daemon (`--vmm-cgroup`).
    `mountinfo` and `own` (the texts of /proc/self/mountinfo and /proc/self/cgroup)
    are read from this process when not given (tests give them)."""
    try:
        mounts = parse_mountinfo(mountinfo if mountinfo is not None
                                 else _read_all("/proc/self/mountinfo"))
        groups = parse_proc_cgroup(own if own is not None else _read_all("/proc/self/cgroup"))
    except OSError as exc:
        return f"cannot read this process's cgroups ({exc.strerror})"
    if operator is not None:
        return _ready_v2(operator, own_subtree=False)
    unified = [p for p, fs, _ in mounts if fs == "cgroup2"]
    v2 = Path(unified[0]) if unified else None
    if v2 is not None and _v2_has(v2, CONTROLLERS):
        return _ready_v2(v2 / SUBTREE, own_subtree=True)
    v1: dict[str, Path] = {}
    for point, fs, opts in mounts:
        if fs != "cgroup":
            continue
        for c in CONTROLLERS:
            if c in opts.split(",") and c not in v1:
                v1[c] = Path(point)
    missing = [c for c in CONTROLLERS if c not in v1]
    if missing:
        where = "cgroup v2 has no " + ", ".join(c for c in CONTROLLERS if v2 is None
                                                 or not _v2_has(v2, (c,)))
        return f"{where} controller, and cgroup v1 has no {', '.join(missing)}"
    dirs = {}
    for c, mount in v1.items():
        inside = groups.get(c, "/").lstrip("/")
        dirs[c] = mount / inside / SUBTREE if inside else mount / SUBTREE
    for d in dirs.values():
        try:
            d.mkdir(mode=0o755, exist_ok=True)
        except OSError as exc:
            return f"cannot make {d}: {exc.strerror}"
        if not os.access(d / "cgroup.procs", os.W_OK):
            return f"cannot write {d}/cgroup.procs"
    return CgroupRoot(1, dirs)


def jailer_cgroup(version: int, parent: str, name: str, limits: Limits,
                  mountinfo: str | None = None) -> BoxCgroup | None:
    """The cgroup Firecracker's jailer makes for VM `name` (docs/jailer.md:
    `<cgroup_base>/<parent_cgroup>/<id>`, the base being the controller's mount on v1
    and the unified mount on v2), for its verdict and removal; None without one."""
    try:
        mounts = parse_mountinfo(mountinfo if mountinfo is not None
                                 else _read_all("/proc/self/mountinfo"))
    except OSError:
        return None
    if version == 2:
        unified = [p for p, fs, _ in mounts if fs == "cgroup2"]
        return BoxCgroup(2, {"": Path(unified[0]) / parent / name}, limits) if unified else None
    dirs: dict[str, Path] = {}
    for point, fs, opts in mounts:
        for c in CONTROLLERS:
            if fs == "cgroup" and c in opts.split(",") and c not in dirs:
                dirs[c] = Path(point) / parent / name
    return BoxCgroup(1, dirs, limits) if set(dirs) == set(CONTROLLERS) else None


def _read_all(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(1 << 20)


def _v2_has(d: Path, wanted: tuple[str, ...]) -> bool:
    try:
        have = set(_read(d / "cgroup.controllers").split())
    except OSError:
        return False
    return set(wanted) <= have


def _ready_v2(d: Path, *, own_subtree: bool) -> CgroupRoot | str:
    """`d` with memory, pids and cpu enabled for its children (v2's subtree_control)."""
    parent = d.parent
    try:
        if own_subtree:
            if not _v2_has(parent, CONTROLLERS):
                return f"{parent} offers no memory, pids and cpu controllers"
            _enable(parent)
            d.mkdir(mode=0o755, exist_ok=True)
        elif not d.exists() and (parent / "cgroup.controllers").is_file():
            d.mkdir(mode=0o755)  # a child of the delegated cgroup, made for the VMMs
        if not d.is_dir():
            return f"{d} is not a cgroup directory"
        if not _v2_has(d, CONTROLLERS):
            return (f"{d} offers no memory, pids and cpu controllers (its parent must enable "
                    "them in cgroup.subtree_control; systemd: Delegate=yes)")
        _enable(d)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return (f"{d} holds processes of its own, so cgroup v2 lets none of its children "
                    "have limits: give a cgroup with no process in it")
        return f"cannot set up {d}: {exc.strerror}"
    if not os.access(d / "cgroup.procs", os.W_OK):
        return f"cannot write {d}/cgroup.procs"
    return CgroupRoot(2, {"": d})


def _enable(d: Path) -> None:
    have = set(_read(d / "cgroup.subtree_control").split())
    missing = [c for c in CONTROLLERS if c not in have]
    if missing:
        _write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
