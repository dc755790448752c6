"""The guest agent: PID 1 inside the VM.

Boot: mount proc/sys/dev, load the kernel modules in order, find the mux port,
read the boot config on port 1026 (once), reseed the kernel's random generator
from the host's randomness in it, mount the root image read-only under
a tmpfs overlay and `/workspace` as an overlay of the lower and upper disks,
set the clock from the host's, bring up `lo`, start the egress forwarder on
127.0.0.1:3128, then serve RPC on port 1024 (`tkbox.guest.rpc`). As PID 1 it
reaps every orphan.

Template boot (`tkbox.template=1` on the kernel command line, see
`tkbox.vm.template`): the agent loads every module but `virtio_blk`, so no
disk is probed or read, writes `PARKED` on the mux port and blocks until the
host writes `WAKE`. The host saves the VM there once; each box is restored from
that state and woken, then the agent loads `virtio_blk` (the disks are probed
fresh, at the box's own sizes) and boots on as above. The boot config's
`seed` (host randomness) is credited to the kernel and the generator reseeded
before anything else, so boxes restored from one template share no random state
from that point on; a template boot without a seed refuses to start.

Trust: this code runs in the VM and is not trusted by the host. It trusts the
host completely (the host built this initramfs). Standard library, `msgpack`,
and `tkbox.protocol`/`tkbox.errors`/`tkbox.guest` only; commands are started
through `tkbox-spawn` (`spawn.c`, built into the initramfs), by vfork+exec, so
this process's image is never forked.

Why one module (about 930 lines): it is PID 1's whole life in order (mounts,
disks, the boot config, the RPC verbs, shutdown), and the guest build lists
what the agent imports; the parts that stand alone are their own modules
(`rpc` the schemas, `diff` the patch, `oomwatch` the memory watch).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

from tkbox._tasks import TaskOwner
from tkbox.guest import oomwatch, rpc
from tkbox.protocol.budget import Budget
from tkbox.protocol.framing import FramedStream, FrameError
from tkbox.protocol.mux import MAX_STREAMS, MuxPorts
from tkbox.protocol.ports import PORT_BOOT, PORT_EGRESS, PORT_RPC, Ports
from tkbox.protocol.streams import ByteStream, StreamClosed
from tkbox.protocol.vsock import GuestVsockPorts

RUN = Path("/run/tkbox")
ROOT = RUN / "root"
LOWER = RUN / "lower"
WSDISK = RUN / "wsdisk"
UPPER = WSDISK / "upper"
MUX_PORT_NAME = "tkbox.mux"
#: Kernel arguments from the launcher: the ports' transport, and disk roles by order.
PORTS_ARG, DISKS_ARG = "tkbox.ports", "tkbox.disks"
PROXY_ADDR = ("127.0.0.1", 3128)
TEMPLATE_FLAG = "tkbox.template=1"
#: Template handshake on the raw mux port, before the mux starts (tkbox.vm.template).
PARKED, WAKE = b"tkbox-parked\n", b"W"
BLOCK_MODULE = "virtio_blk"
RNDADDENTROPY, RNDRESEEDCRNG = 0x40085203, 0x5207  # linux/random.h
MIN_SEED = 32


def log(msg: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"tkbox-guest: {msg}\n".encode())


# ---- boot steps -----------------------------------------------------------


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount(source: str, target: str | Path, fstype: str, flags: int = 0, data: str = "") -> None:
    Path(target).mkdir(parents=True, exist_ok=True)
    libc = _libc()
    if libc.mount(source.encode(), str(target).encode(), fstype.encode(), flags,
                  data.encode() if data else None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {fstype} on {target}: {os.strerror(e)}")


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC = 1, 2, 4, 8, 4096, 16384


def early_mounts() -> None:
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID)
    mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")


def load_modules(directory: Path = Path("/tkbox/modules"),
                 want: Any = lambda name: True) -> None:
    """Load the modules named in `order` (those `want(modname)` accepts), in order."""
    order = directory / "order"
    if not order.exists():
        return
    libc = _libc()
    # As modprobe does: `module.param=value` words of the kernel command line
    # become that module's parameters (QEMU's microvm passes virtio_mmio.device=).
    params: dict[str, list[str]] = {}
    for word in Path("/proc/cmdline").read_text().split():
        mod, dot, rest = word.partition(".")
        if dot and "=" in rest:
            params.setdefault(mod.replace("-", "_"), []).append(rest)
    for name in order.read_text().split():
        modname = name.split("-", 1)[-1].removesuffix(".ko").replace("-", "_")
        if not want(modname):
            continue
        args = " ".join(params.get(modname, [])).encode()
        fd = os.open(directory / name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            # finit_module(fd, params, flags): syscall 313 on x86-64
            if libc.syscall(313, fd, args, 0) != 0:
                e = ctypes.get_errno()
                if e != errno.EEXIST:
                    log(f"module {name}: {os.strerror(e)}")
        finally:
            os.close(fd)


def wait_for(pred: Any, what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def find_mux_port() -> str:
    def look() -> str | None:
        base = Path("/sys/class/virtio-ports")
        if not base.is_dir():
            return None
        for p in base.iterdir():
            with contextlib.suppress(OSError):
                if (p / "name").read_text().strip() == MUX_PORT_NAME:
                    return f"/dev/{p.name}"
        return None

    dev: str = wait_for(look, "the mux port")
    wait_for(lambda: os.path.exists(dev), dev)
    return dev


def kernel_arg(name: str) -> str | None:
    """The value of `name=value` on the kernel command line, or None."""
    with contextlib.suppress(OSError):
        for word in Path("/proc/cmdline").read_text().split():
            key, eq, value = word.partition("=")
            if eq and key == name:
                return value
    return None


def find_disk(serial: str) -> str:
    # Under Firecracker the drives carry no readable serial: the host names each
    # disk's role by its order instead (tkbox.disks=root,lower,upper -> vda, vdb, vdc).
    order = (kernel_arg(DISKS_ARG) or "").split(",")
    if serial in order and order.index(serial) < 26:
        by_order = f"/dev/vd{chr(ord('a') + order.index(serial))}"
        wait_for(lambda: os.path.exists(by_order), by_order)
        return by_order

    def look() -> str | None:
        for p in Path("/sys/block").iterdir():
            with contextlib.suppress(OSError):
                if (p / "serial").read_text().strip() == serial:
                    return f"/dev/{p.name}"
        return None

    dev: str = wait_for(look, f"the {serial} disk")
    wait_for(lambda: os.path.exists(dev), dev)
    return dev


def template_boot() -> bool:
    with contextlib.suppress(OSError):
        return TEMPLATE_FLAG in Path("/proc/cmdline").read_text().split()
    return False


def park(fd: int) -> None:
    """Tell the host this guest is ready to be saved, then block until woken.

    The port reads as EOF while no host is connected (between the template's
    save and a box's restore), so EOF is waited out, not taken as an end.
    """
    os.write(fd, PARKED)
    while True:
        b = os.read(fd, 1)
        if b == WAKE:
            return
        if not b:
            time.sleep(0.005)
        # anything else is not ours to read before the mux: wait for the wake byte


def reseed(seed: object, required: bool) -> None:
    """Credit the host's randomness to the kernel's pool and reseed the generator now.

    A box restored from a template shares the template's generator state until
    this runs; nothing in the guest draws randomness before it.
    """
    if not isinstance(seed, bytes) or len(seed) < MIN_SEED:
        if required:
            raise RuntimeError("the boot config has no entropy seed; a box restored from "
                               "a template cannot start without one")
        return
    try:
        fd = os.open("/dev/urandom", os.O_WRONLY | os.O_CLOEXEC)
        try:
            # struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
            fcntl.ioctl(fd, RNDADDENTROPY, struct.pack("ii", len(seed) * 8, len(seed)) + seed)
            fcntl.ioctl(fd, RNDRESEEDCRNG)
        finally:
            os.close(fd)
    except OSError as exc:
        if required:  # a restored guest must not run on the template's generator state
            raise RuntimeError(f"cannot reseed the kernel's generator: {exc}") from None
        log(f"reseed: {exc} (cold boot: the kernel's own entropy stands)")


def lo_up() -> None:
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s, siocgifflags, ifr)[:18])[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


def setup_disks(cfg: dict[str, Any]) -> None:
    disks = cfg.get("disks", {})
    ro, rw = RUN / "ro", RUN / "rw"
    mount(find_disk(disks.get("root", "root")), ro, "squashfs", MS_RDONLY)
    mem = cfg.get("tmpfs_size", "50%")
    mount("tmpfs", rw, "tmpfs", 0, f"mode=0755,size={mem}")
    (rw / "upper").mkdir()
    (rw / "work").mkdir()
    mount("overlay", ROOT, "overlay", 0, f"lowerdir={ro},upperdir={rw}/upper,workdir={rw}/work")
    for d in ("proc", "sys", "dev", "tmp", "workspace", "run"):
        (ROOT / d).mkdir(exist_ok=True)
    os.chmod(ROOT / "tmp", 0o1777)  # noqa: S103 - /tmp is sticky and world-writable
    mount("proc", ROOT / "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("sysfs", ROOT / "sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
    mount("/dev", ROOT / "dev", "", MS_BIND | MS_REC)
    with contextlib.suppress(OSError):
        mount("devpts", ROOT / "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "ptmxmode=0666")
    mount("tmpfs", ROOT / "run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    # The workspace: lower (read-only copy of the checkout) + upper (ext4).
    # No redirect_dir/metacopy/index: the upper layer then holds exactly the
    # changes, as plain files, whiteouts and opaque directories.
    mount(find_disk(disks.get("lower", "lower")), LOWER, "squashfs", MS_RDONLY)
    mount(find_disk(disks.get("upper", "upper")), WSDISK, "ext4", MS_NOSUID)
    tools = cfg.get("tools_mount")
    if "tools" in disks and isinstance(tools, str) and tools.startswith("/") \
            and ".." not in tools.split("/"):
        # an agent's program (tkbox.image.tools), read-only, over whatever the image had
        target = ROOT / tools.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        mount(find_disk(disks["tools"]), target, "squashfs", MS_RDONLY | MS_NODEV | MS_NOSUID)
    UPPER.mkdir(exist_ok=True)
    (WSDISK / "work").mkdir(exist_ok=True)
    mount("overlay", ROOT / "workspace", "overlay", 0,
          f"lowerdir={LOWER},upperdir={UPPER},workdir={WSDISK}/work,"
          "redirect_dir=off,index=off,metacopy=off,xino=off")


def install_ca(cfg: dict[str, Any]) -> None:
    pems = [p for p in cfg.get("ca_pems", []) if isinstance(p, str)]
    if not pems:
        return
    certs = ROOT / "etc/ssl/certs"
    certs.mkdir(parents=True, exist_ok=True)
    extra = "".join(p if p.endswith("\n") else p + "\n" for p in pems)
    (certs / "tkbox-ca.pem").write_text(extra)
    bundle = certs / "ca-certificates.crt"
    old = bundle.read_text() if bundle.is_file() else ""
    bundle.write_text(old + ("" if not old or old.endswith("\n") else "\n") + extra)


def write_etc(cfg: dict[str, Any]) -> None:
    name = str(cfg.get("hostname", "tkbox"))[:63]
    with contextlib.suppress(OSError):
        socket.sethostname(name)
    with contextlib.suppress(OSError):
        (ROOT / "etc").mkdir(exist_ok=True)
        (ROOT / "etc/hostname").write_text(name + "\n")
        hosts = ROOT / "etc/hosts"
        old = hosts.read_text() if hosts.is_file() else ""
        if "localhost" not in old:
            hosts.write_text(old + "127.0.0.1 localhost\n::1 localhost\n")
        hosts.write_text(hosts.read_text() + f"127.0.1.1 {name}\n")


# ---- the link ----------------------------------------------------------------


class FdStream(ByteStream):
    """A ByteStream over a non-blocking character device (the virtio-serial port).

    The port carries no EOF, so `send_eof` does nothing (the mux above delimits its
    streams). After `aclose` the fd number is never used again: it may already name
    another file."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._closed = False
        self._waiting: set[asyncio.Future[None]] = set()  # woken by aclose
        os.set_blocking(fd, False)

    async def _wait(self, writer: bool) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        add = loop.add_writer if writer else loop.add_reader
        rm = loop.remove_writer if writer else loop.remove_reader
        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        add(self.fd, ready)
        self._waiting.add(fut)
        try:
            await fut
        finally:
            self._waiting.discard(fut)
            if not self._closed:  # else aclose removed it before closing the fd
                rm(self.fd)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._closed:
            try:
                return os.read(self.fd, max_bytes)
            except BlockingIOError:
                await self._wait(False)
        return b""

    async def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._closed:
                raise StreamClosed("stream is closed")
            try:
                n = os.write(self.fd, view)
                view = view[n:]
            except BlockingIOError:
                await self._wait(True)
            except OSError as exc:
                raise StreamClosed(str(exc)) from None

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.fd)
        loop.remove_writer(self.fd)
        for fut in self._waiting:
            if not fut.done():
                fut.set_result(None)
        with contextlib.suppress(OSError):
            os.close(self.fd)


# ---- processes -----------------------------------------------------------------


class Reaper:
    """PID 1's duty: reap every child, hand exit statuses to those waiting."""

    def __init__(self) -> None:
        self.waiting: dict[int, asyncio.Future[int]] = {}

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_signal_handler(signal.SIGCHLD, self.reap)

    def watch(self, pid: int) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.waiting[pid] = fut
        self.reap()
        return fut

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fut = self.waiting.pop(pid, None)
            if fut is not None and not fut.done():
                fut.set_result(status)


def _id_ok(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**32 - 1


def run_user(cfg: dict[str, Any]) -> tuple[int, int, list[int]] | None:
    """The uid, gid and groups commands run as (the image's User), if the host gave one."""
    u = cfg.get("user")
    if not isinstance(u, dict):
        return None
    uid, gid, groups = u.get("uid"), u.get("gid"), u.get("groups") or []
    if not (isinstance(uid, int) and _id_ok(uid)) or not isinstance(gid, int) \
            or not (_id_ok(gid) or gid == 0) or not isinstance(groups, list):
        return None
    return uid, gid, [int(g) for g in groups[:64] if _id_ok(g) or g == 0]


def prepare_user(cfg: dict[str, Any]) -> None:
    """Give the image's user (or the workspace's owner, where the host named one) the
    workspace's top directory, and the image's user its home (the rest of the image is
    as the image made it; the files below were copied in owned by them already)."""
    owner = cfg.get("workspace_owner")
    if isinstance(owner, list) and len(owner) == 2 \
            and all(isinstance(i, int) and (_id_ok(i) or i == 0) for i in owner):
        os.chown(ROOT / "workspace", owner[0], owner[1])
    user = run_user(cfg)
    if user is None:
        return
    uid, gid, _ = user
    if not isinstance(owner, list):
        os.chown(ROOT / "workspace", uid, gid)
    home = str(cfg.get("env", {}).get("HOME", ""))
    if home.startswith("/") and ".." not in home.split("/"):
        h = ROOT / home.lstrip("/")
        if not h.exists():
            h.mkdir(parents=True, mode=0o755)
            os.chown(h, uid, gid)


def _winsize(tty: Any) -> bytes | None:
    """The TIOCSWINSZ argument for a {rows, cols} the host sent, if it is sane."""
    if not isinstance(tty, dict):
        return None
    rows, cols = tty.get("rows"), tty.get("cols")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1000
               for v in (rows, cols)):
        return None
    return struct.pack("HHHH", rows, cols, 0, 0)


#: <asm-generic/ioctls.h>: _IOR('T', 0x30, unsigned int) and _IOW('T', 0x31, int)
TIOCGPTN, TIOCSPTLCK = 0x80045430, 0x40045431


def open_pty(root: str) -> tuple[int, int]:
    """A pty pair from the devpts the box's commands see (`ROOT/dev/pts`).

    `os.openpty()` would open the agent's own `/dev/ptmx`, which has no devpts
    instance behind it here (it is mounted only inside the box's root): ENODEV.
    """
    master = os.open(f"{root}/dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(master, TIOCSPTLCK, struct.pack("i", 0))  # unlock the slave
        (n,) = struct.unpack("I", fcntl.ioctl(master, TIOCGPTN, b"\0" * 4))
        slave = os.open(f"{root}/dev/pts/{n}", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except BaseException:
        os.close(master)
        raise
    return master, slave


CGROUP = Path("/sys/fs/cgroup")
COMMANDS_CGROUP = CGROUP / "commands"


def confine_commands() -> str:
    """Run every command in a memory cgroup that leaves the agent room to work.

    Without it, a command that eats the guest's memory pushes the kernel into
    reclaiming file pages (the agent's own code among them) instead of killing
    anything: under emulation the box then stalls for many minutes. With it,
    the commands' group hits `memory.max` first and the kernel's OOM killer
    ends the largest command; the agent (and the record) carry on. Where the
    kernel lets the group thrash instead, `oomwatch` ends it.
    Returns what was done, for the log; a kernel without memory cgroups is
    left as it was.
    """
    try:
        total = next(int(line.split()[1]) * 1024 for line in
                     Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemTotal:"))
        CGROUP.mkdir(parents=True, exist_ok=True)
        # favordynmods: moving a process into a cgroup (every command joins one) no
        # longer waits for an RCU grace period, 10-30 ms under emulation (Linux 6.0+).
        how = " (favordynmods)"
        try:
            mount("cgroup2", CGROUP, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, "favordynmods")
        except OSError:
            how = ""
            mount("cgroup2", CGROUP, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        (CGROUP / "cgroup.subtree_control").write_text("+memory")
        COMMANDS_CGROUP.mkdir(exist_ok=True)
        reserve = max(48 << 20, total // 8)  # the agent, the kernel, the mux buffers
        (COMMANDS_CGROUP / "memory.max").write_text(str(max(64 << 20, total - reserve)))
        return f"commands are limited to {max(64 << 20, total - reserve) >> 20} MiB{how}"
    except (OSError, StopIteration, ValueError) as exc:
        return f"commands are not memory-confined ({exc})"


SPAWN = "/tkbox/bin/tkbox-spawn"  # built from spawn.c into the initramfs
MAX_SPAWN_ERROR = 96


def spawn_argv(argv: list[str], env: dict[str, str], errfd: int, root: str, cwd: str,
               user: tuple[int, int, list[int]] | None = None, tty: bool = False,
               procs: str = "") -> list[str]:
    """The `tkbox-spawn` command line that starts `argv` (see spawn.c for each step).

    The agent starts it with vfork+exec (no preexec_fn), so its own image is never
    forked; the helper joins the cgroup `procs` names, takes the terminal, chroots,
    changes user and directory, and execs `argv` with `env`, in that order.
    """
    env_list = []
    for k, v in env.items():
        if "=" in k or not k:
            raise ValueError(f"illegal environment variable name {k[:64]!r}")
        env_list.append(f"{k}={v}")
    uid, gid, groups = ("", "", "") if user is None else (
        str(user[0]), str(user[1]), ",".join(str(g) for g in user[2]))
    return [SPAWN, str(errfd), procs, root, cwd, uid, gid, groups, "1" if tty else "0",
            str(len(env_list)), *env_list, "--", *argv]


def spawn_error(argv0: str, report: bytes) -> str | None:
    """What `tkbox-spawn` wrote on its error pipe ("<errno> <step>"), for a person."""
    if not report:
        return None
    errno_s, _, step = report[:MAX_SPAWN_ERROR].decode("ascii", "replace").partition(" ")
    try:
        why = os.strerror(int(errno_s))
    except ValueError:
        why = "failed"
    where = {"exec": "", "chdir": " (entering the working directory)",
             "chroot": " (entering the box's root)", "cgroup": " (joining the commands' cgroup)",
             "tty": " (taking the terminal)"}.get(step, f" ({step})")
    return f"cannot start {argv0!r}: {why}{where}"


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        loop.remove_reader(fd)


async def wait_started(errfd: int) -> bytes:
    """Read `tkbox-spawn`'s error pipe to its end: empty once the command is exec'd."""
    os.set_blocking(errfd, False)
    data = b""
    while len(data) <= MAX_SPAWN_ERROR:
        try:
            chunk = os.read(errfd, MAX_SPAWN_ERROR + 1)
        except BlockingIOError:
            await _readable(errfd)
            continue
        if not chunk:
            break
        data += chunk
    return data


class Agent:
    def __init__(self, ports: Ports, cfg: dict[str, Any], reaper: Reaper) -> None:
        self.ports = ports
        self.cfg = cfg
        self.reaper = reaper
        self.env = {str(k): str(v) for k, v in cfg.get("env", {}).items()}
        self.root = str(cfg.get("root", ROOT))
        self.user = run_user(cfg)
        procs = COMMANDS_CGROUP / "cgroup.procs"
        self.procs = str(procs) if procs.exists() else ""  # confine_commands ran first
        self.started = time.monotonic()
        self.shutting_down = asyncio.Event()

    # -- egress forwarder --------------------------------------------------

    async def forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            stream = await self.ports.connect(PORT_EGRESS)
        except Exception:  # noqa: BLE001 - host gone or refusing: close the client
            writer.close()
            return

        async def up() -> None:
            try:
                while data := await reader.read(65536):
                    await stream.send_all(data)
                await stream.send_eof()
            except (StreamClosed, OSError):
                pass

        async def down() -> None:
            try:
                while data := await stream.receive(65536):
                    writer.write(data)
                    await writer.drain()
                if writer.can_write_eof():
                    writer.write_eof()
            except OSError:
                pass

        owner = TaskOwner("egress up")
        try:
            owner.spawn(up())
            await down()
        finally:
            await owner.aclose()  # up ends with down; a cancellation of ours goes on
            await stream.aclose()
            writer.close()

    # -- RPC ------------------------------------------------------------------

    async def handle_rpc(self, stream: ByteStream) -> None:
        fs = FramedStream(stream)
        try:
            req = await fs.receive()
            if req is None:
                return
            op = req.get("op")
            handler = getattr(self, f"op_{op}", None) if op in rpc.OPS else None
            if handler is None:
                await fs.send({"ev": "error", "message": f"unknown op {op!r}"})
                return
            await handler(fs, req)
        except (FrameError, StreamClosed, EOFError):
            pass
        except Exception as exc:  # noqa: BLE001 - report, never die
            with contextlib.suppress(Exception):
                await fs.send({"ev": "error", "message": f"{exc.__class__.__name__}: {exc}"})

    async def op_ping(self, fs: FramedStream, req: dict[str, Any]) -> None:
        await fs.send({"ev": "ok", "uptime": time.monotonic() - self.started})

    async def op_exec(self, fs: FramedStream, req: dict[str, Any]) -> None:
        argv = req.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            await fs.send({"ev": "error", "message": "argv must be a non-empty list of strings"})
            return
        cwd = str(req.get("cwd") or "/workspace")
        env = dict(self.env)
        env.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})
        want_stdin = bool(req.get("stdin"))
        winsize = _winsize(req.get("tty"))
        master = -1
        errr, errw = os.pipe2(os.O_CLOEXEC)
        try:
            if winsize is not None:
                # A terminal: one pty for stdin, stdout and stderr, sized as the host's.
                master, slave = open_pty(self.root)
                fcntl.ioctl(slave, termios.TIOCSWINSZ, winsize)
                try:
                    proc = subprocess.Popen(  # noqa: S603 - the host decided this command
                        spawn_argv(argv, env, errw, self.root, cwd, self.user, tty=True,
                                   procs=self.procs),
                        executable=SPAWN, env={}, stdin=slave, stdout=slave, stderr=slave,
                        start_new_session=True, close_fds=True, pass_fds=(errw,),
                    )
                finally:
                    os.close(slave)
            else:
                proc = subprocess.Popen(  # noqa: S603 - the host decided this command
                    spawn_argv(argv, env, errw, self.root, cwd, self.user, procs=self.procs),
                    executable=SPAWN, env={},
                    stdin=subprocess.PIPE if want_stdin else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                    close_fds=True, pass_fds=(errw,),
                )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            os.close(errr)
            if master >= 0:
                os.close(master)
            await fs.send({"ev": "exit", "status": 127, "signal": 0,
                           "error": f"cannot start {argv[0]!r}: {exc}"})
            return
        finally:
            os.close(errw)
        # Watched before the first await: the SIGCHLD handler must not reap it unseen.
        exited = self.reaper.watch(proc.pid)
        try:
            failed = spawn_error(argv[0], await wait_started(errr))
        finally:
            os.close(errr)
        if failed is not None:
            # The command never ran (the helper exits 127; the reaper collects it).
            proc.returncode = 127
            for pipe in (proc.stdout, proc.stderr, proc.stdin):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            if master >= 0:
                os.close(master)
            await fs.send({"ev": "exit", "status": 127, "signal": 0, "error": failed})
            return
        await fs.send({"ev": "started", "pid": proc.pid})
        loop = asyncio.get_running_loop()
        lock = asyncio.Lock()

        async def pump(fd: int, pipe: Any) -> None:
            raw = pipe if isinstance(pipe, int) else pipe.fileno()
            os.set_blocking(raw, False)
            while True:
                try:
                    data = os.read(raw, rpc.CHUNK)
                except OSError as exc:
                    if not isinstance(exc, BlockingIOError):
                        return  # EIO: the terminal's last user is gone
                    await _readable(raw)
                    continue
                if not data:
                    return
                async with lock:
                    await fs.send({"ev": "out", "fd": fd, "data": data})

        async def feed() -> None:
            # stdin frames and signals from the host
            stdin = proc.stdin
            while True:
                msg = await fs.receive()
                if msg is None:
                    # The host went away (client gone): stop the command.
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    return
                kind = msg.get("op")
                if master >= 0:
                    # A terminal: keystrokes (^C, ^D included) go to the pty as they are;
                    # the line discipline turns them into signals and end-of-file.
                    data = msg.get("data")
                    if kind == "stdin" and isinstance(data, bytes):
                        with contextlib.suppress(OSError):
                            await loop.run_in_executor(None, os.write, master, data)
                    elif kind == "resize" and (ws := _winsize(msg)) is not None:
                        with contextlib.suppress(OSError):
                            fcntl.ioctl(master, termios.TIOCSWINSZ, ws)
                    elif kind == "signal" and isinstance(msg.get("sig"), int) \
                            and 0 < msg["sig"] < 65:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, msg["sig"])
                    continue
                if kind == "stdin" and stdin is not None:
                    data = msg.get("data", b"")
                    if isinstance(data, bytes):
                        with contextlib.suppress(BrokenPipeError):
                            await loop.run_in_executor(None, stdin.write, data)
                            await loop.run_in_executor(None, stdin.flush)
                elif kind == "stdin_eof" and stdin is not None:
                    with contextlib.suppress(OSError):
                        stdin.close()
                    stdin = None
                elif kind == "signal":
                    sig = msg.get("sig")
                    if isinstance(sig, int) and 0 < sig < 65:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, sig)

        owner = TaskOwner("exec")  # the pumps and the feeder end with this call
        pumps = ([owner.spawn(pump(1, master))] if master >= 0 else
                 [owner.spawn(pump(1, proc.stdout)), owner.spawn(pump(2, proc.stderr))])
        owner.spawn(feed())
        try:
            status = await exited
            proc.returncode = os.waitstatus_to_exitcode(status)
            # Give the pipes a moment to drain; a background child may hold them open.
            await asyncio.wait(pumps, timeout=1.0)
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            for p in pumps:
                p.cancel()
            async with lock:
                await fs.send({"ev": "exit", "status": code, "signal": sig})
        finally:
            await owner.aclose()
            for pipe in (proc.stdout, proc.stderr, proc.stdin):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            if master >= 0:
                with contextlib.suppress(OSError):
                    os.close(master)

    def _path(self, req: dict[str, Any]) -> Path:
        path = req.get("path")
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            raise ValueError("path must be absolute")
        return Path(self.root) / path.lstrip("/")

    async def op_read(self, fs: FramedStream, req: dict[str, Any]) -> None:
        path = self._path(req)
        size = 0
        with open(path, "rb") as f:  # noqa: ASYNC230 - guest-local tmpfs/disk
            while chunk := f.read(rpc.CHUNK):
                size += len(chunk)
                if size > rpc.MAX_FILE:
                    raise ValueError(f"file exceeds {rpc.MAX_FILE} bytes")
                await fs.send({"ev": "data", "data": chunk})
        await fs.send({"ev": "end", "size": size})

    async def op_write(self, fs: FramedStream, req: dict[str, Any]) -> None:
        path = self._path(req)
        mode = req.get("mode", 0o644)
        path.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        with open(path, "wb") as f:  # noqa: ASYNC230
            while True:
                msg = await fs.receive()
                if msg is None:
                    raise ValueError("stream ended before the end of the file")
                if msg.get("ev") == "end":
                    break
                data = msg.get("data")
                if isinstance(data, bytes):
                    size += len(data)
                    f.write(data)
        if isinstance(mode, int):
            os.chmod(path, mode & 0o777)
        if self.user is not None:
            os.chown(path, self.user[0], self.user[1])  # the box's user may change it
        await fs.send({"ev": "ok", "size": size})

    async def op_diff(self, fs: FramedStream, req: dict[str, Any]) -> None:
        from tkbox.guest.diff import WorkspaceDiff

        if req.get("kill"):
            # Stop: no process may change the workspace while it is read.
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)
            await asyncio.sleep(0.05)
            self.reaper.reap()
        os.sync()
        loop = asyncio.get_running_loop()
        # The walk, the comparisons and the hashes read the disks: off the loop, so
        # the transport keeps moving.
        with WorkspaceDiff(LOWER, UPPER, max_bytes=rpc.MAX_PATCH,
                           max_file=rpc.MAX_PATCH_FILE, max_listed=rpc.MAX_APART) as d:
            paths = await loop.run_in_executor(None, d.changes)
            ignored = await _ask_ignored(fs, paths) if req.get("ask_ignored") else set()
            for a in await loop.run_in_executor(None, d.plan, ignored):
                await fs.send({"ev": "apart", "path": a.path, "change": a.change,
                               "size": a.size, "sha256": a.sha256, "why": a.why})
            sections = d.sections()
            while (section := await loop.run_in_executor(None, next, sections, None)) \
                    is not None:
                for i in range(0, len(section), rpc.CHUNK):
                    await fs.send({"ev": "data", "data": section[i:i + rpc.CHUNK]})
                await fs.send({"ev": "mark"})  # a whole file: a cut here still applies
            await fs.send({"ev": "end", "stats": d.stats.to_dict()})

    async def op_shutdown(self, fs: FramedStream, req: dict[str, Any]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        os.sync()
        await fs.send({"ev": "ok"})
        self.shutting_down.set()


async def _ask_ignored(fs: FramedStream, paths: list[bytes]) -> set[bytes]:
    """Which of `paths` the checkout's git ignores: the host decides, with the same
    check `tkbox apply` makes (docs/changes.md). At most `rpc.MAX_ASKED` paths are
    asked about, in frames of NUL-separated paths; the host answers with one bit per
    path asked. Paths past the bound go on as not ignored (apply sets them apart)."""
    asked: list[bytes] = []
    chunk: list[bytes] = []
    size = total = 0
    for p in paths:
        if len(asked) >= rpc.MAX_ASKED or total + len(p) + 1 > rpc.MAX_ASKED_BYTES:
            break
        asked.append(p)
        chunk.append(p)
        size += len(p) + 1
        total += len(p) + 1
        if size >= rpc.CHUNK:
            await fs.send({"ev": "paths", "data": b"\x00".join(chunk) + b"\x00"})
            chunk, size = [], 0
    if chunk:
        await fs.send({"ev": "paths", "data": b"\x00".join(chunk) + b"\x00"})
    await fs.send({"ev": "paths_end", "count": len(asked)})
    answer = await fs.receive()
    bits = answer.get("bits") if isinstance(answer, dict) else None
    if not isinstance(bits, bytes) or len(bits) != (len(asked) + 7) // 8:
        raise ValueError("the host's answer about ignored paths is malformed")
    return {p for i, p in enumerate(asked) if bits[i >> 3] & (1 << (i & 7))}


def power_off() -> None:
    os.sync()
    libc = _libc()
    # The VMM runs with -no-reboot (QEMU) or treats reboot as exit (Firecracker):
    # a reboot ends the VM everywhere, where power-off needs ACPI.
    libc.reboot(0x01234567)  # RB_AUTOBOOT
    libc.reboot(0x4321FEDC)  # RB_POWER_OFF
    os._exit(0)


async def amain(fd: int | None, templated: bool) -> None:
    """Boot and serve; `fd` is the mux port, or None where the ports are AF_VSOCK."""
    loop = asyncio.get_running_loop()
    reaper = Reaper()
    reaper.install(loop)
    ports: Ports
    owner = TaskOwner("agent")  # the transport and the shutdown wait, for the agent's life
    mux_task: asyncio.Future[Any]
    if fd is None:
        ports = GuestVsockPorts()
        mux_task = owner.spawn(ports.wait_closed(), "transport")
    else:
        # the guest opens one stream per proxied connection: as many as the host accepts
        mux = MuxPorts(FdStream(fd), initiator=False, max_own=MAX_STREAMS,
                       budget=Budget.unlimited())
        ports = mux
        mux_task = owner.spawn(mux.run(), "transport")
    boot = FramedStream(await ports.connect(PORT_BOOT))
    cfg = await boot.receive()
    if not isinstance(cfg, dict):
        raise RuntimeError("no boot config from the host")
    try:
        reseed(cfg.get("seed"), required=templated)
    except Exception as exc:
        with contextlib.suppress(Exception):
            await boot.send({"ev": "error", "message": f"{exc.__class__.__name__}: {exc}"})
        raise
    if isinstance(cfg.get("time"), (int, float)):
        with contextlib.suppress(OSError):
            time.clock_settime(time.CLOCK_REALTIME, float(cfg["time"]))
    try:
        setup_disks(cfg)
        prepare_user(cfg)
        install_ca(cfg)
        write_etc(cfg)
        lo_up()
        log(confine_commands())
        if (COMMANDS_CGROUP / "memory.max").exists():
            oomwatch.start(COMMANDS_CGROUP, log)
        agent = Agent(ports, cfg, reaper)
        server = await asyncio.start_server(agent.forward, *PROXY_ADDR)
        ports.serve(PORT_RPC, agent.handle_rpc)
    except Exception as exc:
        # The host learns why the box cannot start, on the stream it is waiting on.
        with contextlib.suppress(Exception):
            await boot.send({"ev": "error", "message": f"{exc.__class__.__name__}: {exc}"})
        raise
    # Readiness goes back on the boot stream itself, which is then closed for good.
    await boot.send({"ev": "ready", "uptime": time.monotonic() - agent.started})
    await boot.aclose()
    await asyncio.wait([mux_task, owner.spawn(agent.shutting_down.wait(), "shutdown")],
                       return_when=asyncio.FIRST_COMPLETED)
    await asyncio.sleep(0.1)  # let the last answer leave
    server.close()
    await owner.aclose()


def main() -> None:
    try:
        early_mounts()
        templated = template_boot()
        load_modules(want=(lambda m: m != BLOCK_MODULE) if templated else (lambda m: True))
        if kernel_arg(PORTS_ARG) == "vsock":  # vhost vsock (QEMU) or Firecracker's
            wait_for(lambda: os.path.exists("/dev/vsock"), "/dev/vsock")
            asyncio.run(amain(None, templated=False))
            return
        dev = find_mux_port()
        fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
        if templated:
            park(fd)
            load_modules(want=lambda m: m == BLOCK_MODULE)
        asyncio.run(amain(fd, templated))
    except BaseException as exc:  # noqa: BLE001 - PID 1 must never just die
        log(f"fatal: {exc.__class__.__name__}: {exc}")
    finally:
        power_off()


if __name__ == "__main__":
    main()
    sys.exit(0)
