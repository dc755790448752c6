"""The VMM's cell: each box's QEMU in a uid, namespaces, root and cgroup of its own.

QEMU's seccomp sandbox and empty environment bound what a guest that exploits a
device model can *do*; the cell bounds what it can *reach*. Each VMM is started by
`tkbox-jailer` (`jailer.c`, beside this file: why C, and each step in order, are in
its header), which the daemon compiles with the host's C compiler the first time it
needs it (`build_jailer`, cached by the source's digest):

- **its own uid and gid** (root mode), leased from a range the operator sets
  (`--vmm-uids`, default 61000-61183: systemd's docs/UIDS-GIDS.md leaves
  60578-61183 unused). A lease is a `flock` on `/run/tkbox/vmm-uids/<uid>` taken by
  the daemon and handed to the jailer, which holds it until the VMM has ended: two
  daemons, or a restart while an old VMM dies, never give one uid to two VMMs. A
  uid of the range that names an account on the host refuses the range.
- **its own mount, PID, IPC, UTS, network and cgroup namespaces**: a network with
  no interface but a loopback left down; the VMM is PID 1 of its PID namespace, and
  its /proc (`subset=pid`) shows only itself.
- **a root of its own** (`pivot_root`, the old root detached): a read-only tmpfs
  holding only the VMM's binary, its shared libraries and modules and data files
  (`RootPlan`, read from the binary once per daemon), the guest kernel and
  initramfs (`/vm/kernel`, `/vm/initrd`), `/dev/{null,zero,random,urandom}` (and
  `/dev/kvm` under KVM), each a read-only bind mount where it can be. No socket,
  no disk, no state of the daemon's is in it: QEMU is handed **open descriptors**
  (chardevs on socketpairs, `-add-fd` and `/dev/fdset/N` for the disks, its
  memory file as `/proc/self/fd/N`, templates over QMP `getfd`).
- **no privilege**: every capability dropped (bounding set included),
  `no_new_privs`, then QEMU's own `-sandbox`.
- **its own cgroup** (`tkbox.vm.cgroup`): memory (the guest's RAM plus the VMM's
  own overhead), pids and CPU limits; a VMM the kernel kills at a limit is reported
  as its box's containment, with the limit named (`Cell.verdict`).

Where it can, by default (`decide`, once per daemon, from facts; `--vmm-jail
auto`):

- `root` (the daemon runs as root): a uid of its own, namespaces, root, cgroup;
- `userns` (unprivileged, user namespaces allowed): namespaces and root inside a
  user namespace that maps only the daemon's own uid (so on the host the VMM is
  still that uid); a cgroup only where one is delegated (`--vmm-cgroup`);
- `off` (neither, or `--vmm-jail off`): the seccomp sandbox and the empty
  environment only.

Each part that cannot be had is named, with why, in `Jail.summary()` (the daemon's
start line, `tkbox doctor`, `/v1/info`) and in each box's ready record
(`Cell.isolation`: `jailed uid 61042, namespaces, cgroup`). `--vmm-jail on`
refuses to start a daemon that cannot give every part.

A template's memory is shared by every box restored from it: inside a cell it is a
sealed memfd (`F_SEAL_WRITE`, loaded once per template by `TemplateRam`), which
each VMM maps privately; no VMM, escaped or not, can write it (see
`docs/threat-model.md`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import pwd
import random
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tkbox.errors import HostError, UserError
from tkbox.vm.cgroup import BoxCgroup, CgroupRoot, Limits, Verdict, find_root

log = logging.getLogger("tkbox.vm.jail")

JAILER_SRC = Path(__file__).with_name("jailer.c")
JAILER_FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-D_FORTIFY_SOURCE=2",
                "-fstack-protector-strong"]
MODES = ("auto", "on", "off")
DEFAULT_UIDS = (61000, 61183)
LEASES = Path("/run/tkbox/vmm-uids")
#: The cell's paths for the guest kernel and initramfs.
CELL_KERNEL, CELL_INITRD = "/vm/kernel", "/vm/initrd"
#: Devices every cell has; /dev/kvm is added under KVM.
DEVICES = ("null", "zero", "random", "urandom")
#: QEMU's own memory beyond the guest's RAM, MiB (its code, heap, device buffers and,
#: under software emulation, the translated code; measured in docs/limits.md).
OVERHEAD_MIB = {"kvm": 256, "tcg": 640}
DEFAULT_PIDS = 256
JAIL_FAILED = 125  # the jailer's own exit status when a step fails


@dataclass(frozen=True)
class JailConfig:
    """What the operator set (`tkbox daemon --vmm-jail/--vmm-uids/--vmm-cgroup/...`)."""

    mode: str = "auto"
    uids: tuple[int, int] = DEFAULT_UIDS
    cgroup: Path | None = None
    overhead_mib: int | None = None  # None: OVERHEAD_MIB for the accelerator
    pids: int = DEFAULT_PIDS


def parse_uids(text: str) -> tuple[int, int]:
    """`FIRST-LAST`, both in 1000..2^31-2, at least 2 uids (UserError otherwise)."""
    m = re.fullmatch(r"([0-9]{1,10})-([0-9]{1,10})", text.strip())
    if m is None:
        raise UserError(f"--vmm-uids {text!r}: give a range FIRST-LAST, e.g. 61000-61183")
    first, last = int(m.group(1)), int(m.group(2))
    if not 1000 <= first < last <= 2**31 - 2:
        raise UserError(f"--vmm-uids {text!r}: FIRST < LAST, from 1000 to {2**31 - 2}")
    return first, last


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UserError(f"--vmm-jail {mode!r}: use one of {', '.join(MODES)}")
    return mode


# --- the jailer binary -----------------------------------------------------------------


def build_jailer(cache: Path, src: Path = JAILER_SRC) -> Path:
    """`tkbox-jailer` compiled from `src` into `cache` (reused while the source is the
    same); HostError naming what to install when there is no compiler."""
    digest = hashlib.sha256(src.read_bytes() + " ".join(JAILER_FLAGS).encode()).hexdigest()
    out = cache / f"tkbox-jailer-{digest[:16]}"
    if out.is_file() and os.access(out, os.X_OK):
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise HostError("no C compiler to build tkbox-jailer from jailer.c; install gcc and "
                        "libc6-dev (apt-get install gcc libc6-dev)")
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=".tkbox-jailer-")
    os.close(fd)
    try:
        proc = subprocess.run([cc, *JAILER_FLAGS, "-o", tmp, str(src)], capture_output=True,
                              text=True, check=False, timeout=120)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if "error" in ln] or \
                proc.stderr.splitlines() or [f"exit status {proc.returncode}"]
            raise HostError(f"cannot build tkbox-jailer with {cc}: {lines[0][:300]}; "
                            "it needs libc6-dev (apt-get install gcc libc6-dev)")
        os.chmod(tmp, 0o700)
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return out


# --- the cell's root -------------------------------------------------------------------


@dataclass(frozen=True)
class RootPlan:
    """What a cell's root holds for one VMM binary: read-only binds (host source,
    path in the cell) and the symlinks met on the way to them (path, target)."""

    binds: tuple[tuple[str, str], ...]
    links: tuple[tuple[str, str], ...]

    def args(self) -> list[str]:
        out: list[str] = []
        for src, dst in self.binds:
            out += ["--bind", src, dst]
        for path, target in self.links:
            out += ["--symlink", path, target]
        return out


def resolve(path: str, links: dict[str, str], depth: int = 0) -> str:
    """`path`'s real location; each symlink met on the way is added to `links` (at its
    real parent, with its own target), so the cell can rebuild the same walk."""
    if depth > 32:
        raise HostError(f"too many symbolic links on the way to {path}")
    cur = "/"
    for comp in PurePosixPath(os.path.normpath(path)).parts[1:]:
        p = os.path.join(cur, comp)
        if os.path.islink(p):
            target = os.readlink(p)
            links[p] = target
            cur = resolve(os.path.normpath(os.path.join(cur, target)), links, depth + 1)
        else:
            cur = p
    return cur


def shared_libraries(binary: str) -> list[str]:
    """The shared libraries `binary` loads, as the dynamic loader finds them (ldd)."""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False,
                             timeout=60, env={"PATH": os.defpath, "LC_ALL": "C"}).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    libs = []
    for line in out.splitlines():
        m = re.search(r"(/\S+) \(0x[0-9a-f]+\)$", line.strip())
        if m:
            libs.append(m.group(1))
    return libs


def plan_for(binary: str, data_dirs: Iterable[str] = (), module_dirs: Iterable[str] = (),
             extra_files: Iterable[str] = ()) -> RootPlan:
    """The root a cell needs to run `binary`: the binary, every shared library it and
    its modules load (and the loader's cache), its module and data directories."""
    links: dict[str, str] = {}
    files: set[str] = {resolve(binary, links)}
    dirs: set[str] = set()
    for lib in shared_libraries(binary):
        files.add(resolve(lib, links))
    for d in module_dirs:
        if not os.path.isdir(d):
            continue
        real = resolve(d, links)
        dirs.add(real)
        for name in sorted(os.listdir(real)):
            if name.endswith(".so"):
                for lib in shared_libraries(os.path.join(real, name)):
                    files.add(resolve(lib, links))
    for d in data_dirs:
        if os.path.isdir(d):
            dirs.add(resolve(d, links))
    for f in extra_files:
        if os.path.isfile(f):
            files.add(resolve(f, links))
    binds = [(d, d) for d in sorted(dirs)]
    binds += [(f, f) for f in sorted(files) if not any(f.startswith(d + "/") for d in dirs)]
    # A link whose parent lies in a bound directory is there already.
    kept = [(p, t) for p, t in sorted(links.items())
            if not any(p.startswith(d + "/") for d in dirs)]
    return RootPlan(tuple(binds), tuple(kept))


_plans: dict[tuple[str, int, int], RootPlan] = {}


def qemu_plan(qemu: str) -> RootPlan:
    """The root plan for this QEMU binary (remembered per path, inode and mtime)."""
    st = os.stat(qemu)
    ident = (qemu, st.st_ino, st.st_mtime_ns)
    if ident not in _plans:
        prefix = Path(os.path.realpath(qemu)).parent.parent  # /usr
        arch = [str(p / "qemu") for p in sorted((prefix / "lib").glob("*-linux-gnu*"))]
        _plans[ident] = plan_for(qemu, data_dirs=[str(prefix / "share" / "qemu"),
                                                  str(prefix / "share" / "seabios")],
                                 module_dirs=[*arch, str(prefix / "lib" / "qemu")],
                                 extra_files=["/etc/ld.so.cache"])
    return _plans[ident]


# --- uid leases ------------------------------------------------------------------------


@dataclass
class UidLease:
    """A uid of the range held for one VMM: an flock on its lease file."""

    uid: int
    fd: int

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def check_range(uids: tuple[int, int]) -> None:
    """Refuse a range that holds an account of this host (HostError, what to do)."""
    first, last = uids
    taken = sorted(e.pw_uid for e in pwd.getpwall() if first <= e.pw_uid <= last)
    if taken:
        raise HostError(f"--vmm-uids {first}-{last} holds uid {taken[0]} of account "
                        f"{pwd.getpwuid(taken[0]).pw_name!r}; pick a range no account uses")


def uid_in_use(uid: int) -> bool:
    """Whether any process on the host runs as `uid` (read from /proc)."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if d.stat().st_uid == uid:
                    return True
    return False


def lease_uid(uids: tuple[int, int], leases: Path = LEASES, *,
              unused: bool = False) -> UidLease:
    """Lease a uid of the range no other VMM on this host holds (HostError if none).

    `unused`: also pass over a uid some process runs as (for a VMM the lease cannot
    follow: Firecracker's jailer closes every descriptor, so its VMM could outlive
    a daemon that died, and with it the lease)."""
    leases.mkdir(parents=True, exist_ok=True, mode=0o700)
    first, last = uids
    n = last - first + 1
    start = random.randrange(n)  # noqa: S311 - spreading, not secrecy
    for i in range(n):
        uid = first + (start + i) % n
        fd = os.open(leases / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if unused and uid_in_use(uid):
            os.close(fd)
            continue
        return UidLease(uid, fd)
    raise HostError(f"every uid of --vmm-uids {first}-{last} holds a running VMM ({n}); "
                    "give the daemon a wider range")


# --- the decision ----------------------------------------------------------------------


@dataclass
class Jail:
    """How this daemon puts VMMs in cells (`decide`); `cell` makes one per VMM."""

    mode: str  # "root", "userns" or "off"
    config: JailConfig
    jailer: Path | None = None
    cgroups: CgroupRoot | None = None
    missing: list[str] = field(default_factory=list)  # what a cell lacks, and why

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def summary(self) -> str:
        """One line for a person: what each VMM gets here, and what not and why."""
        if self.mode == "off":
            return "not jailed: " + "; ".join(self.missing)
        first, last = self.config.uids
        parts = [f"jailed: a uid of its own from {first}-{last}" if self.mode == "root"
                 else "jailed in a user namespace (on the host it keeps the daemon's "
                      f"uid {os.getuid()})",
                 "its own mount, PID, IPC, UTS and network namespaces and root, "
                 "no capabilities"]
        parts.append(self.cgroups.describe() + ": memory, pids and CPU limits"
                     if self.cgroups else "no cgroup")
        return ", ".join(parts) + ("; " + "; ".join(self.missing) if self.missing else "")

    def overhead_mib(self, accel: str) -> int:
        if self.config.overhead_mib is not None:
            return self.config.overhead_mib
        return OVERHEAD_MIB.get(accel, OVERHEAD_MIB["tcg"])

    def limits(self, memory_mib: int, vcpus: int, accel: str) -> Limits:
        return Limits(memory_mib + self.overhead_mib(accel), self.config.pids, vcpus + 1)

    def cell(self, name: str, *, memory_mib: int, vcpus: int, accel: str,
             binds: Sequence[tuple[Path, str]] = (), plan: RootPlan | None = None) -> Cell:
        """A cell for one VMM (its uid leased and its cgroup made now); `close` it once
        the VMM has ended. `binds`: per-VM files (host path, path in the cell)."""
        if not self.on:
            return Cell(self, None, None, (), ())
        lease = lease_uid(self.config.uids) if self.mode == "root" else None
        cgroup: BoxCgroup | None = None
        try:
            if self.cgroups is not None:
                tag = f"vmm-{lease.uid}" if lease else f"vmm-{os.getpid()}-{name}"[:200]
                cgroup = self.cgroups.create(tag, self.limits(memory_mib, vcpus, accel))
            devs = (*DEVICES, "kvm") if accel == "kvm" else DEVICES
            extra = tuple((str(src), dst) for src, dst in binds)
            if lease is not None:
                for src, _ in extra:
                    readable_by_all(Path(src))
            return Cell(self, lease, cgroup, extra, devs, plan)
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            if lease is not None:
                lease.close()
            raise


def readable_by_all(path: Path) -> None:
    """A file a cell binds in (the guest kernel, the initramfs) must be readable by its
    uid: their contents are public (the distribution's kernel, tkbox's own initramfs);
    the directory above stays 0700, so no other user reaches them."""
    st = path.stat()
    if st.st_mode & 0o004 == 0:
        if st.st_uid != os.getuid():
            raise HostError(f"{path} is not readable by a VMM's uid and not ours to open up")
        os.chmod(path, stat.S_IMODE(st.st_mode) | 0o444)


@dataclass
class Cell:
    """One VMM's cell: its uid lease, its cgroup, its per-VM files."""

    jail: Jail
    lease: UidLease | None
    cgroup: BoxCgroup | None
    binds: tuple[tuple[str, str], ...]
    devices: tuple[str, ...]
    plan: RootPlan | None = None
    _closed: bool = False

    @property
    def on(self) -> bool:
        return self.jail.on

    @property
    def uid(self) -> int:
        """The VMM's uid as the host sees it."""
        return self.lease.uid if self.lease is not None else os.getuid()

    @property
    def isolation(self) -> str:
        """For the box's ready record: `jailed uid 61042, namespaces, cgroup`, or what
        is missing and why."""
        if not self.on:
            return "not jailed: " + "; ".join(self.jail.missing)
        who = (f"jailed uid {self.uid}" if self.lease is not None else
               f"jailed in a user namespace (host uid {self.uid}, the daemon's)")
        cg = "cgroup" if self.cgroup is not None else "no cgroup"
        out = f"{who}, namespaces, {cg}"
        return out + ("; " + "; ".join(self.jail.missing) if self.jail.missing else "")

    def command(self, argv: list[str], fds: Sequence[int], root: Path) -> tuple[list[str],
                                                                                tuple[int, ...]]:
        """The command that runs `argv` in this cell, and the descriptors it inherits.

        `fds`: what the VMM is handed (its disks, sockets, memory file); `root`: an
        empty directory the jailer mounts the cell's root on (the VM's own)."""
        if not self.on:
            return argv, tuple(fds)
        assert self.jail.jailer is not None
        out = [str(self.jail.jailer), "--root", str(root)]
        if self.lease is not None:
            out += ["--uid", str(self.lease.uid), "--gid", str(self.lease.uid),
                    "--hold-fd", str(self.lease.fd)]
        else:
            out += ["--userns"]
        procs = self.cgroup.procs_fds() if self.cgroup is not None else []
        for fd in procs:
            out += ["--cgroup-fd", str(fd)]
        for fd in fds:
            out += ["--fd", str(fd)]
        plan = self.plan or qemu_plan(argv[0])
        out += plan.args()
        for src, dst in self.binds:
            out += ["--bind", src, dst]
        for dev in self.devices:
            out += ["--dev", dev]
        held = (self.lease.fd,) if self.lease is not None else ()
        return [*out, "--", *argv], (*fds, *procs, *held)

    def started(self) -> None:
        """The VMM runs: the daemon's copies of what the jailer took are closed."""
        if self.cgroup is not None:
            self.cgroup.close_fds()
        if self.lease is not None:
            self.lease.close()  # the jailer holds the lease until the VMM has ended

    def verdict(self) -> Verdict:
        """Why the kernel ended the VMM, if it did (call once it has ended)."""
        return self.cgroup.verdict() if self.cgroup is not None else Verdict("", "")

    def close(self) -> None:
        """The VMM has ended: its cgroup goes, and the uid lease with it."""
        if self._closed:
            return
        self._closed = True
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.lease is not None:
            self.lease.close()


def _probe(jail: Jail, vmm: str, work: Path) -> str | None:
    """Set up a whole cell for `vmm` and exit before the exec; why not, or None."""
    assert jail.jailer is not None
    cell = jail.cell("probe", memory_mib=128, vcpus=1, accel="tcg")
    try:
        argv, fds = cell.command([vmm, "-version"], (), work)
        argv.insert(1, "--no-exec")
        try:
            r = subprocess.run(argv, capture_output=True, text=True, env={}, timeout=30,
                               check=False, pass_fds=fds, close_fds=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"cannot run tkbox-jailer: {exc.__class__.__name__}"
        if r.returncode != 0:
            last = [ln for ln in r.stderr.splitlines() if ln.strip()]
            return (last[-1] if last else f"exit status {r.returncode}")[:300]
        return None
    finally:
        cell.started()
        cell.close()


def userns_problem() -> str | None:
    """Why this kernel refuses unprivileged user namespaces (a sysctl names it), or None."""
    for path, bad in (("/proc/sys/kernel/unprivileged_userns_clone", "0"),
                      ("/proc/sys/user/max_user_namespaces", "0"),
                      ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1")):
        with contextlib.suppress(OSError):
            if Path(path).read_text().strip() == bad:
                return f"this kernel refuses unprivileged user namespaces ({path} is {bad})"
    return None


def chroot_problem(mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    """Why no cell can be made from here when this process's `/` is not a mount point
    (it runs in a chroot), or None: the kernel then refuses it a user namespace, and
    neither a mount's propagation nor `pivot_root` can be changed from such a root.
    Read from `mountinfo`: a chrooted process sees no mount at `/` (field 5)."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None  # no /proc: try, and say what fails
    if any(len(f := line.split(" ", 5)) > 4 and f[4] == "/" for line in lines):
        return None
    return ("this daemon runs in a chroot (its / is not a mount point): the kernel gives "
            "it no user namespace and no pivot_root (run it in a container or on the host)")


def decide(config: JailConfig, vmm: str, cache: Path) -> Jail:
    """This host's answer for `config`: the most of a cell it can give each VMM, and
    what it cannot and why. `--vmm-jail on` makes anything missing a HostError."""
    check_mode(config.mode)
    if config.mode == "off":
        return Jail("off", config, missing=["--vmm-jail off"])
    if (why := chroot_problem()) is not None:
        return _settle(config, Jail("off", config, missing=[why]))
    try:
        jailer = build_jailer(cache)
    except HostError as exc:
        return _settle(config, Jail("off", config, missing=[str(exc)]))
    root = os.geteuid() == 0
    tried: list[str] = []
    for mode in (("root", "userns") if root else ("userns",)):
        if mode == "root":
            try:
                check_range(config.uids)
            except HostError as exc:
                if config.mode == "on":
                    raise
                tried.append(str(exc))  # the operator's range is wrong: say so, go on
                continue
        elif (why := userns_problem()) is not None:
            tried.append(why)
            continue
        cgroups = find_root(config.cgroup) if (root or config.cgroup) else \
            "not root: give a delegated cgroup v2 directory (--vmm-cgroup)"
        jail = Jail(mode, config, jailer, cgroups if isinstance(cgroups, CgroupRoot) else None)
        if isinstance(cgroups, CgroupRoot) and mode == "root":
            _sweep(cgroups, config.uids)
        if isinstance(cgroups, str):
            jail.missing.append(f"no cgroup: {cgroups}")
        if mode == "userns" and root:
            jail.missing.append("no uid of its own: the root mode's cell could not be made "
                                f"({tried[-1] if tried else '?'})")
        elif mode == "userns":
            jail.missing.append("no uid of its own: only root can give one")
        with tempfile.TemporaryDirectory(prefix="tkbox-cell-") as work:
            why = _probe(jail, vmm, Path(work))
        if why is None:
            return _settle(config, jail)
        tried.append(f"{mode}: {why}")
    return _settle(config, Jail("off", config, missing=[
        "this host would not let tkbox-jailer make a cell (" + "; ".join(tried) + ")"]))


def _sweep(cgroups: CgroupRoot, uids: tuple[int, int], leases: Path = LEASES) -> None:
    """Remove the empty cgroups of VMM uids nobody leases now (a daemon that ended
    before it removed its VMMs'), each while holding that uid's lease."""
    for name in cgroups.children():
        m = re.fullmatch(r"vmm-([0-9]{1,10})", name)
        if m is None or not uids[0] <= int(m.group(1)) <= uids[1]:
            continue
        try:
            fd = os.open(leases / m.group(1), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
                         | os.O_NOFOLLOW, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            cgroups.sweep([name])
        except BlockingIOError:
            pass  # a VMM holds it
        finally:
            os.close(fd)


def _settle(config: JailConfig, jail: Jail) -> Jail:
    if config.mode == "on" and (jail.mode != "root" or jail.missing):
        raise HostError("--vmm-jail on, but " + ("; ".join(jail.missing) or
                                                 f"only the {jail.mode} mode is possible"))
    return jail


# --- a template's memory inside cells --------------------------------------------------


class TemplateRam:
    """Each template's RAM file as a sealed memfd, loaded once (per template file).

    A box restored from a template maps its memory privately; QEMU 7.2 opens a
    memory-backend file read-write even so. Inside a cell it is given a memfd with
    the file's contents, sealed against writes, growth and shrinking: QEMU can map
    it privately, and no VMM can change what other boxes restore from."""

    def __init__(self) -> None:
        self._fds: dict[tuple[str, int, int], int] = {}

    def fd(self, path: Path) -> int:
        """The sealed memfd of `path` (the caller must not close it)."""
        st = path.stat()
        ident = (str(path), st.st_ino, st.st_mtime_ns)
        if ident in self._fds:
            return self._fds[ident]
        for old in [k for k in self._fds if k[0] == str(path)]:
            os.close(self._fds.pop(old))  # the template was rebuilt
        mfd = os.memfd_create("tkbox-template-ram", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            with open(path, "rb") as src:
                _copy_sparse(src.fileno(), mfd, st.st_size)
            fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK
                        | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        except BaseException:
            os.close(mfd)
            raise
        self._fds[ident] = mfd
        return mfd

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


def _copy_sparse(src: int, dst: int, size: int) -> None:
    """Copy `size` bytes from `src` to `dst`, leaving `src`'s holes as holes."""
    os.ftruncate(dst, size)
    pos = 0
    while pos < size:
        try:
            data = os.lseek(src, pos, os.SEEK_DATA)
        except OSError:
            return  # no data past pos
        hole = os.lseek(src, data, os.SEEK_HOLE)
        off = data
        while off < hole:
            n = _copy_range(src, dst, off, min(hole - off, 8 << 20))
            if n <= 0:
                raise HostError("the template's memory file ended early")
            off += n
        pos = hole


def _copy_range(src: int, dst: int, off: int, count: int) -> int:
    data = os.pread(src, count, off)
    if not data:
        return 0
    view = memoryview(data)
    done = 0
    while done < len(data):
        done += os.pwrite(dst, view[done:], off + done)
    return len(data)
