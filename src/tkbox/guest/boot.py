"""PID 1's duties in the guest: everything the agent does to the VM before it serves.

Mount proc/sys/dev, load the kernel modules in order, find the mux port, reseed
the kernel's random generator from the host's randomness, mount the root image
read-only under a tmpfs overlay and `/workspace` as an overlay of the lower and
upper disks, give the image's user its home and the workspace, install the
door's CA, name the host, bring up `lo`, confine the commands' memory, reap
every orphan (`Reaper`), and power the VM off at the end. The template handshake
(`park`) is here too. `tkbox.guest.agent` calls these in order.

Runs in the VM, as root: standard library only.
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
import time
from pathlib import Path
from typing import Any

RUN = Path("/run/tkbox")
ROOT = RUN / "root"
LOWER = RUN / "lower"
WSDISK = RUN / "wsdisk"
UPPER = WSDISK / "upper"
MUX_PORT_NAME = "tkbox.mux"
#: Kernel arguments from the launcher: the ports' transport, and disk roles by order.
PORTS_ARG, DISKS_ARG = "tkbox.ports", "tkbox.disks"
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


def power_off() -> None:
    os.sync()
    libc = _libc()
    # The VMM runs with -no-reboot (QEMU) or treats reboot as exit (Firecracker):
    # a reboot ends the VM everywhere, where power-off needs ACPI.
    libc.reboot(0x01234567)  # RB_AUTOBOOT
    libc.reboot(0x4321FEDC)  # RB_POWER_OFF
    os._exit(0)

