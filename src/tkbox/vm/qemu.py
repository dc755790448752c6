"""The QEMU launcher: `qemu-system-x86_64 -M microvm`, no network card.

Disks are virtio-mmio block devices, identified in the guest by their serial
(`root`, `lower`, `upper`); the three ports ride one virtio-serial port
(`tkbox.mux`) through the serial mux. Pause, resume and quit go through QMP.

Acceleration is decided from facts and cached (`decide_accel`): KVM only where
`/dev/kvm` is usable *and* the host's KVM can run this guest kernel. A host
whose KVM is a paravirtual nested hypervisor (PVM, seen as
`/sys/module/kvm_pvm`) runs only kernels built for it, which we read from the
guest kernel's config; otherwise we use software emulation (TCG) and say so.

The VMM process gets a private 0700 working directory, an empty environment
(the daemon's may hold the values the secrets door keeps out of the box), no
inherited file descriptors, its own session, QEMU's seccomp sandbox (`SANDBOX`),
and `PR_SET_PDEATHSIG` so that it cannot outlive the daemon; it is reaped
however it ends. Its stdout and stderr are a pipe
drained into `qemu.log`, capped at `QEMU_LOG_CAP`: QEMU reports a guest's
device errors there (`Guest says index 5 is available`, one line per fault,
as often as a guest kernel that drives a virtio device's registers makes
them), so a file it wrote itself would grow without bound.

Booted templates (`tkbox.vm.template`): where a template matches the VM's key,
the VM starts with `-incoming` from it and is woken on the mux port; where none
does, it boots cold and one is built in the background (single flight), so
later boxes restore. The template's memory is a RAM file (written through while
it is saved, mapped private by each box); migration with `x-ignore-shared`
carries only device state, saved and restored through a file the daemon
opens and passes to QEMU over QMP (`getfd`, then `fd:` URIs; QEMU 7.2 has no
`file:` URI, and its sandbox forbids `exec:`).

Transports: the serial mux by default; with `transport="vhost-vsock"` a
`vhost-vsock-device` whose guest CID the kernel gave to an fd QEMU inherits
(`tkbox.vm.cid`), and the ports are `VhostVsockHostPorts` served before QEMU
starts. Every task a VM starts belongs to it (`TaskOwner`) and has ended once
`wait` returns.

Why one module (about 680 lines): the command line, the process, the QMP
client and the template save/restore are one machine's life and share its
private helpers (`_spawn`, `_Listeners`, the sockets' names); the pure
parts (`decide_accel`, `build_argv`) are tested without QEMU, and the
template store itself is `tkbox.vm.template`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tkbox import paths
from tkbox._process import pdeathsig
from tkbox.errors import HostError, InternalError
from tkbox.protocol.mux import MuxPorts
from tkbox.protocol.ports import Ports
from tkbox.protocol.streams import AsyncioStream
from tkbox.protocol.tasks import TaskOwner
from tkbox.protocol.vsock import VhostVsockHostPorts
from tkbox.vm import template as tpl
from tkbox.vm.base import (
    LOG_CAP,
    BeforeBoot,
    Disk,
    Launcher,
    ProcessVM,
    VMSpec,
    check_boot_files,
    drain_to_file,
    last_line,
    last_words,
)
from tkbox.vm.choice import SERIAL_MUX, VHOST_VSOCK
from tkbox.vm.cid import claim_cid
from tkbox.vm.errors import VMEnded, VMError, VMExitedAtStart

if TYPE_CHECKING:
    from qemu.qmp import QMPClient

log = logging.getLogger("tkbox.vm.qemu")

QEMU = "qemu-system-x86_64"
CONSOLE_CAP = 16 * 1024 * 1024
#: Bytes kept of QEMU's own output (stdout and stderr) in qemu.log; the rest is dropped.
QEMU_LOG_CAP = LOG_CAP
#: Seconds to wait, once QEMU has ended, for the last of its output to reach qemu.log.
LOG_SETTLE = 2.0
TEMPLATE_BOOT_TIMEOUT = 300.0
#: The guest agent's side of the template handshake (tkbox.guest.agent).
PARKED, WAKE = b"tkbox-parked\n", b"W"
TEMPLATE_CMDLINE = "tkbox.template=1"
#: Tells the guest agent its ports are AF_VSOCK, not the serial mux.
VSOCK_CMDLINE = "tkbox.ports=vsock"
#: QEMU's own seccomp filter: no exec or fork (`spawn`), no setuid (`elevateprivileges`),
#: no scheduler or priority calls (`resourcecontrol`), no obsolete syscalls. A guest
#: that exploits a device model runs inside it. Templates are saved and restored
#: through files the daemon opens and passes over QMP (`getfd`), not `exec:cat`.
SANDBOX = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"


BOOT = Path("/boot")  # where a kernel's build config is read from: config-VERSION

#: Under software emulation only, the guest kernel runs with user-space address
#: randomization off. TCG caches translated code by virtual address: with the
#: randomization on, every exec re-translated the loader and libc (`true` took
#: 80-130 ms, 27 ms without). The guest is the agent's own domain; nothing of
#: the host's depends on it (docs/threat-model.md). With KVM it stays on.
TCG_GUEST_CMDLINE = "norandmaps"
#: What that costs, in the words `tkbox doctor` and the daemon's notice use.
TCG_TRADEOFF = ("inside each box, programs run without address randomization "
                f"({TCG_GUEST_CMDLINE}, so that emulated execs are fast; with KVM they "
                "keep it): an exploit of a program in the box gains only what the agent "
                "already has (docs/threat-model.md)")


@dataclass(frozen=True)
class AccelDecision:
    accel: str  # "kvm" or "tcg"
    reason: str


def decide_accel(kernel_version: str, cache: Path | None = None) -> AccelDecision:
    """KVM or TCG for this host and guest kernel, from facts; cached per kernel."""
    forced = os.environ.get("TKBOX_ACCEL")
    if forced in ("kvm", "tcg"):
        return AccelDecision(forced, f"TKBOX_ACCEL={forced}")
    key = f"{kernel_version}:{os.path.exists('/sys/module/kvm_pvm')}"
    cache_file = cache / "accel.json" if cache else None
    if cache_file and cache_file.is_file():
        with contextlib.suppress(ValueError, KeyError, OSError):
            data = json.loads(cache_file.read_text())
            if data["key"] == key:
                return AccelDecision(data["accel"], data["reason"])
    decision = _decide(kernel_version)
    if cache_file:
        with contextlib.suppress(OSError):
            cache_file.write_text(json.dumps({"key": key, **decision.__dict__}))
    return decision


def _decide(kernel_version: str) -> AccelDecision:
    if not os.path.exists("/dev/kvm"):
        return AccelDecision("tcg", "no /dev/kvm on this host")
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
    except OSError as exc:
        return AccelDecision("tcg", f"/dev/kvm is not usable ({exc.strerror}); "
                                    "add yourself to the 'kvm' group")
    if os.path.exists("/sys/module/kvm_pvm"):
        config = BOOT / f"config-{kernel_version}"
        text = config.read_text() if config.is_file() else ""
        if "CONFIG_PVM_GUEST=y" in text:
            return AccelDecision("kvm", "KVM is PVM and the guest kernel is built for PVM")
        return AccelDecision("tcg", "this host's KVM is a paravirtual nested hypervisor (PVM) "
                                    f"and guest kernel {kernel_version} is not built for it")
    return AccelDecision("kvm", "/dev/kvm is usable")


def host_tsc_khz() -> int | None:
    """The host's TSC frequency in kHz, where the CPU's TSC is constant."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    if "constant_tsc" not in info:
        return None
    for line in info.splitlines():
        if line.startswith("cpu MHz"):
            with contextlib.suppress(ValueError):
                return int(float(line.split(":", 1)[1]) * 1000)
    return None


def qemu_binary() -> str:
    path = shutil.which(QEMU)
    if not path:
        raise HostError(f"{QEMU} is not installed; run 'sudo apt-get install qemu-system-x86'")
    return path


def sandbox_refusal(qemu: str) -> str | None:
    """Why `qemu` cannot start in its seccomp sandbox (`SANDBOX`), in its own words;
    None when it can. A QEMU built without seccomp refuses the option while it
    reads its command line, before `-version` would print and exit."""
    try:
        r = subprocess.run([qemu, "-sandbox", SANDBOX, "-version"], capture_output=True,
                           env={}, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {qemu}: {exc.__class__.__name__}"
    if r.returncode == 0:
        return None
    return last_line(r.stderr.decode("utf-8", "replace")) or f"exit status {r.returncode}"


def qemu_value(path: Path | str) -> str:
    """`path` as one value in QEMU's option syntax (`key=value,key=value`): each comma
    doubled, so no part of it can become an option of its own."""
    return str(path).replace(",", ",,")


def build_argv(spec: VMSpec, accel: str, qemu: str = QEMU, *, template: bool = False,
               ram: Path | None = None, share_ram: bool = False,
               incoming: bool = False, vsock: tuple[int, int] | None = None) -> list[str]:
    """The exact QEMU command line for `spec` (pure: tested without QEMU).

    `template`: the guest parks before its disks and boot config (the machine a
    template is saved from and restored into). `ram`: guest memory is that file,
    written through (`share_ram`, the template being saved) or mapped private
    (a box restored from it: its writes are its own, the file is only read).
    `incoming`: wait for the state to load (`migrate-incoming` over QMP).
    `vsock`: (guest CID, vhost fd): the ports are a vhost-vsock device whose
    CID the fd already holds (`tkbox.vm.cid`), instead of the serial mux.
    Every path inside an option goes through `qemu_value`.
    """
    d = spec.workdir
    if template:
        spec = replace(spec, cmdline=(spec.cmdline + " " + TEMPLATE_CMDLINE).strip())
    if vsock is not None:
        if template or incoming or ram is not None:
            raise InternalError("templates are parked over the serial mux, not vsock")
        spec = replace(spec, cmdline=(spec.cmdline + " " + VSOCK_CMDLINE).strip())
    machine = "microvm,x-option-roms=off,pit=on,pic=on,rtc=on,isa-serial=on"
    cmdline = ("console=ttyS0 panic=-1 reboot=t random.trust_cpu=on "
               "i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd "
               + spec.cmdline).strip()
    if accel != "kvm":
        # Under TCG the guest's TSC is the host's, but calibrating it against the
        # emulated PIT fails at random when the host is busy; the kernel then
        # marks the TSC unusable, its clock never advances and boot stalls. Tell
        # it the host's TSC frequency instead, and skip the delay-loop
        # calibration (which needs timer interrupts) with a fixed loops-per-jiffy.
        khz = host_tsc_khz()
        if khz:
            cmdline += f" tsc_early_khz={khz} tsc=reliable"
        cmdline += " lpj=578048"
        cmdline += " " + TCG_GUEST_CMDLINE  # see TCG_GUEST_CMDLINE
    cmdline = "quiet loglevel=1 " + cmdline if not os.environ.get("TKBOX_GUEST_DEBUG") else cmdline
    argv = [
        qemu, "-M", machine, "-nodefaults", "-no-user-config", "-display", "none",
        "-sandbox", SANDBOX,
        "-no-reboot", "-nic", "none",
        "-accel", "kvm" if accel == "kvm" else "tcg",
        "-cpu", "host" if accel == "kvm" else "max",
        "-m", str(spec.memory_mib), "-smp", str(spec.vcpus),
        "-kernel", str(spec.kernel), "-initrd", str(spec.initramfs), "-append", cmdline,
        # The console goes to a socket the daemon drains into a capped log, so a
        # guest that floods its console cannot fill the host's disk.
        # The daemon listens and QEMU connects (server=off): the socket exists before
        # QEMU starts, so nothing waits for QEMU to bind it.
        "-chardev", f"socket,id=con,path={qemu_value(d / 'console.sock')},server=off",
        "-serial", "chardev:con",
        "-device", "virtio-rng-device",
    ]
    if vsock is None:
        argv += [
            "-chardev", f"socket,id=mux,path={qemu_value(d / 'mux.sock')},server=off",
            "-device", "virtio-serial-device,max_ports=2",
            "-device", "virtserialport,chardev=mux,name=tkbox.mux",
        ]
    else:
        cid, fd = vsock
        argv += ["-device", f"vhost-vsock-device,guest-cid={cid},vhostfd={fd}"]
    argv += [
        # QMP on a chardev of its own: `-qmp unix:PATH` takes the path as an implied
        # first value, which an '=' in the path would turn into a key.
        "-chardev", f"socket,id=qmp,path={qemu_value(d / 'qmp.sock')},server=on,wait=off",
        "-mon", "chardev=qmp,mode=control",
    ]
    for i, disk in enumerate(spec.disks):
        ro = ",readonly=on" if disk.read_only else ""
        path = qemu_value(disk.path)
        argv += ["-drive", f"id=d{i},file={path},format=raw,if=none,cache=unsafe{ro}"
                 if not disk.read_only else
                 f"id=d{i},file={path},format=raw,if=none{ro}",
                 "-device", f"virtio-blk-device,drive=d{i},serial={disk.role}"]
    if ram is not None:
        argv += ["-object", f"memory-backend-file,id=ram,size={spec.memory_mib}M,"
                            f"mem-path={qemu_value(ram)},share={'on' if share_ram else 'off'}",
                 "-machine", "memory-backend=ram"]
    if incoming:
        argv += ["-incoming", "defer"]
    return argv


def template_argv(spec: VMSpec, accel: str, qemu: str) -> list[str]:
    """`build_argv` for a template, with the per-VM paths as placeholders: the
    part of the key that says which machine a saved state belongs to."""
    # The kernel and initramfs are keyed by their contents (tkbox.vm.template), not
    # by the path they are reached by (a symlinked TKBOX_HOME reaches the same files).
    placeholder = replace(spec, name="template", workdir=Path("/WORKDIR"),
                          kernel=Path("/KERNEL"), initramfs=Path("/INITRAMFS"),
                          disks=tuple(replace(disk, path=Path(f"/DISK{i}"))
                                      for i, disk in enumerate(spec.disks)))
    return build_argv(placeholder, accel, qemu, template=True, ram=Path("/RAM"))


def _send_file(qmp: QMPClient, path: Path, flags: int) -> None:
    """Open `path` here (no final symlink followed; created 0600) and send it to QEMU
    over QMP (SCM_RIGHTS); a `getfd` must name it next. QEMU opens no template file
    itself, and spawns nothing to read or write one (its sandbox forbids it)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        qmp.send_fd_scm(fd)
    finally:
        os.close(fd)  # QEMU holds its own copy


async def _wait_path(path: Path, proc: asyncio.subprocess.Process, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.returncode is not None:
            raise HostError(f"QEMU exited at start (status {proc.returncode}); "
                            f"see {path.parent / 'qemu.log'}")
        if time.monotonic() > deadline:
            raise HostError(f"QEMU did not create {path.name} within {timeout:.0f}s")
        await asyncio.sleep(0.02)


#: Seconds for QEMU to connect its chardevs to our sockets once it has started.
CHARDEV_TIMEOUT = 30.0


class _Listeners:
    """The Unix sockets QEMU's chardevs connect to (`server=off`), bound (0600) and
    listening in the VM's private directory before QEMU starts.

    So nothing polls for a socket QEMU has not made yet: `accept` is one wait on
    two events, QEMU connecting or QEMU ending, whichever comes first. Only
    QEMU's own connection is taken: a peer whose pid (`SO_PEERCRED`) is not
    the VMM's is closed and the wait goes on, so no other process can pose as
    a box's VM, even one that connects first.
    """

    def __init__(self, workdir: Path, names: tuple[str, ...]) -> None:
        self._socks: dict[str, socket.socket] = {}
        self._workdir = workdir
        try:
            for name in names:
                path = workdir / name
                path.unlink(missing_ok=True)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._socks[name] = sock
                sock.bind(str(path))
                os.chmod(path, 0o600)
                sock.listen(8)  # room for QEMU behind any impostor queued first
                sock.setblocking(False)
        except OSError as exc:
            self.close()
            raise HostError(f"cannot listen in {workdir} for QEMU: {exc.strerror}") from None

    async def accept(self, name: str, ended: asyncio.Future[int], pid: int,
                     timeout: float = CHARDEV_TIMEOUT) -> tuple[asyncio.StreamReader,
                                                                asyncio.StreamWriter]:
        """The connection process `pid` (QEMU) makes to `name`; VMError if QEMU ends
        or `timeout` passes first."""
        listener = self._socks[name]
        loop = asyncio.get_running_loop()
        owner = TaskOwner(f"tkbox-qemu-accept-{name}")
        accepting = owner.spawn(_accept_from(loop, listener, pid))
        try:
            either: set[asyncio.Future[Any]] = {accepting, ended}
            done, _ = await asyncio.wait(either, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if accepting in done and accepting.exception() is None:
                conn, _peer = accepting.result()
            elif ended.done() and not ended.cancelled():
                raise VMExitedAtStart("QEMU", ended.result(), str(self._workdir / "qemu.log"))
            else:
                raise VMError(f"QEMU did not connect to {name} within {timeout:.0f}s; see "
                              f"{self._workdir / 'qemu.log'}")
        finally:
            await owner.aclose()
        self._close_one(name)  # one connection each: no one else may connect after QEMU
        try:
            return await asyncio.open_unix_connection(sock=conn, limit=1 << 20)
        except BaseException:
            conn.close()
            raise

    def _close_one(self, name: str) -> None:
        sock = self._socks.pop(name, None)
        if sock is not None:
            sock.close()
            (self._workdir / name).unlink(missing_ok=True)

    def close(self) -> None:
        for name in list(self._socks):
            self._close_one(name)


def _peer_pid(conn: socket.socket) -> int | None:
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return int(struct.unpack("3i", creds)[0])


async def _accept_from(loop: asyncio.AbstractEventLoop, listener: socket.socket,
                       pid: int) -> tuple[socket.socket, Any]:
    """Accept until the peer is process `pid`; close every other connection."""
    while True:
        conn, peer = await loop.sock_accept(listener)
        if _peer_pid(conn) == pid:
            return conn, peer
        log.warning("closed a connection to a VM socket from pid %s, not QEMU's (%d)",
                    _peer_pid(conn), pid)
        conn.close()


def _no_event(event: object) -> bool:
    return False


def _qmp_client(name: str) -> QMPClient:
    """A QMP client that keeps no event.

    qemu.qmp's client queues every event QEMU sends, and keeps a history of all of
    them, for a reader tkbox never is; and a guest decides how many QEMU sends (each
    write to a read-only disk is a `BLOCK_IO_ERROR`, not rate-limited). Kept, they
    grew the daemon by about 2 KiB per write for the box's life. The default
    listener is filtered to accept none, so each event is read and dropped."""
    from qemu.qmp import QMPClient as Client

    client = Client(name)
    client.events.event_filter = _no_event
    return client


def _ending(proc: asyncio.subprocess.Process, owner: TaskOwner) -> asyncio.Future[int]:
    """A future that is done when `proc` ends, its waiting task held by `owner`."""
    return owner.spawn(proc.wait())


class QemuVM(ProcessVM):
    """A QEMU process, its console drain, its ports and its QMP client.

    Every task it starts (the reaper, the console drain, the mux engine) is
    owned by `_tasks`; `wait` ends them all before it returns.
    """

    def __init__(self, proc: asyncio.subprocess.Process, spec: VMSpec, accel: str,
                 listeners: _Listeners, ports: Ports | None = None) -> None:
        super().__init__()
        self.proc = proc
        self._listeners = listeners
        self.spec = spec
        self._accel = accel
        self.ports: Ports
        if ports is not None:  # vhost vsock: the ports exist before the VMM
            self.ports = ports
        self._mux: MuxPorts | None = None
        self._qmp: QMPClient | None = None
        self._last: dict[str, object] = {}
        self._tasks = TaskOwner(f"tkbox-qemu-{spec.name}")
        self._ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._log = _drain_log(proc, spec.workdir, self._tasks)
        self._tasks.spawn(self._reap())

    @property
    def accel(self) -> str:
        return self._accel

    async def _reap(self) -> None:
        code = await self.proc.wait()
        if not self._ended.done():
            self._ended.set_result(code)

    async def _drain_console(self) -> None:
        """Copy the guest's console into console.log, up to CONSOLE_CAP bytes."""
        reader, writer = await self._listeners.accept("console.sock", self._ended,
                                                      self.proc.pid)
        written = 0
        with open(self.spec.workdir / "console.log", "ab") as log:
            try:
                while data := await reader.read(65536):
                    if written < CONSOLE_CAP:
                        chunk = data[: CONSOLE_CAP - written]
                        log.write(chunk)
                        log.flush()
                        written += len(chunk)
                        if written >= CONSOLE_CAP:
                            log.write(b"\n[tkbox: console log truncated at 16 MiB]\n")
                            log.flush()
            finally:
                writer.close()

    async def _connect(self, wake: bool = False,
                       before_boot: BeforeBoot | None = None) -> None:
        self._tasks.spawn(self._drain_console(), f"tkbox-qemu-console-{self.spec.name}")
        if hasattr(self, "ports"):  # vhost vsock: served before QEMU started
            return
        reader, writer = await self._listeners.accept("mux.sock", self._ended, self.proc.pid)
        if wake:  # a restored guest waits for this byte before it starts its mux
            writer.write(WAKE)
        self._mux = MuxPorts(AsyncioStream(reader, writer), initiator=True)
        self.ports = self._mux
        if before_boot is not None:
            before_boot(self._mux)  # before the engine reads: no OPEN is dispatched yet
        self._tasks.spawn(self._mux.run(), f"tkbox-qemu-mux-{self.spec.name}")

    async def status(self) -> str:
        """The VMM's own word on the VM: "running", "paused", ... (QMP query-status)."""
        if self.proc.returncode is not None:
            return "ended"
        await self._qmp_exec("query-status")
        return str(self._last.get("status", "unknown"))

    async def _qmp_exec(self, cmd: str, args: dict[str, object] | None = None) -> None:
        from qemu.qmp import QMPError

        if self.proc.returncode is not None or self._closed:
            raise VMEnded(f"QEMU of {self.spec.name} has ended (status "
                          f"{self.proc.returncode}); cannot {cmd}")
        if self._qmp is None:
            from qemu.qmp import ConnectError

            sock = self.spec.workdir / "qmp.sock"
            await _wait_path(sock, self.proc, 10)
            deadline = time.monotonic() + 10
            while True:  # the socket exists from bind(); QEMU may not listen() yet
                client = _qmp_client(self.spec.name)
                try:
                    await client.connect(str(sock))
                    break
                except ConnectError:
                    if time.monotonic() > deadline or self.proc.returncode is not None:
                        raise VMError(f"QEMU did not accept on {sock.name}; see "
                                      f"{self.spec.workdir / 'qemu.log'}") from None
                    await asyncio.sleep(0.01)
            self._qmp = client
        try:
            result = await self._qmp.execute(cmd, args)
        except (QMPError, OSError, EOFError) as exc:
            if self.proc.returncode is not None:
                raise VMEnded(f"QEMU of {self.spec.name} ended during {cmd} (status "
                              f"{self.proc.returncode})") from None
            raise VMError(f"QEMU refused {cmd}: {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:300]}") from None
        self._last = result if isinstance(result, dict) else {}

    async def restore(self, state: Path) -> None:
        """Load a template's device state (its memory is the file mapped by `-object`)."""
        await self._qmp_exec("migrate-set-capabilities", {"capabilities": [
            {"capability": "x-ignore-shared", "state": True}]})
        assert self._qmp is not None  # connected by the call above
        try:
            _send_file(self._qmp, state, os.O_RDONLY)
        except OSError as exc:
            if self.proc.returncode is not None:
                raise VMEnded(f"QEMU of {self.spec.name} ended before it took the "
                              f"template (status {self.proc.returncode})") from None
            raise VMError(f"cannot pass the template to QEMU: {exc.strerror or exc}") from None
        await self._qmp_exec("getfd", {"fdname": "state"})
        await self._qmp_exec("migrate-incoming", {"uri": "fd:state"})
        await self.wait_incoming()

    async def wait_incoming(self, timeout: float = 120.0) -> None:
        """Until QEMU has loaded the state it restores (`-incoming`); HostError if
        the load failed or QEMU ended. The guest runs as soon as it is loaded."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.returncode is not None:
                raise VMEnded(f"QEMU ended while loading the template (status "
                              f"{self.proc.returncode}; see {self.spec.workdir / 'qemu.log'})")
            try:
                await self._qmp_exec("query-migrate")
            except VMError as exc:  # QMP gone: QEMU is ending; say why above
                if self.proc.returncode is None and time.monotonic() > deadline:
                    raise VMError(f"QMP failed while loading the template: {exc}") from None
                await asyncio.sleep(0.02)
                continue
            status = self._last.get("status")
            if status == "completed":
                return
            if status in ("failed", "cancelled"):
                raise VMError(f"loading the template failed: "
                              f"{self._last.get('error-desc', status)}")
            if time.monotonic() > deadline:
                raise VMError(f"the template did not load within {timeout:.0f}s")
            await asyncio.sleep(0.02)

    async def pause(self) -> None:
        await self._qmp_exec("stop")

    async def resume(self) -> None:
        await self._qmp_exec("cont")

    async def _cleanup(self) -> None:
        qmp, self._qmp = self._qmp, None
        if qmp is not None:
            with contextlib.suppress(Exception):
                await qmp.disconnect()
        # QEMU's last words (why it ended) reach qemu.log before its drain is ended.
        await asyncio.wait({self._log}, timeout=LOG_SETTLE)
        self._tasks.cancel()  # the console drain and the mux engine end with the VM
        try:
            if hasattr(self, "ports"):
                await self.ports.aclose()
        finally:
            await self._tasks.aclose()
            self._listeners.close()

    @property
    def running(self) -> bool:
        return self.proc.returncode is None


async def _spawn(argv: list[str], workdir: Path,
                 pass_fds: tuple[int, ...] = ()) -> asyncio.subprocess.Process:
    """Start QEMU: private cwd, empty environment, stdin from /dev/null, no inherited
    descriptors but `pass_fds` (the vhost-vsock device holding the box's CID), its
    own session.

    Its stdout and stderr are one pipe: the caller must drain it (`_drain_log`) from
    now on, or QEMU blocks once the pipe is full."""
    (workdir / "argv.json").write_text(json.dumps(argv))
    try:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, cwd=workdir, env={}, close_fds=True,
            pass_fds=pass_fds, start_new_session=True,
            preexec_fn=pdeathsig(),  # noqa: PLW1509 - one prctl, resolved before fork
        )
    except OSError as exc:
        raise VMError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None


def _drain_log(proc: asyncio.subprocess.Process, workdir: Path,
               owner: TaskOwner) -> asyncio.Task[None]:
    """QEMU's output into `workdir/qemu.log`, capped at QEMU_LOG_CAP; a task of `owner`."""
    return owner.spawn(drain_to_file(proc.stdout, workdir / "qemu.log", QEMU_LOG_CAP),
                       "tkbox-qemu-log")


def _private(workdir: Path) -> None:
    if len(str(workdir / "mux.sock")) > 100:
        raise HostError(f"VM directory {workdir} is too long for Unix socket paths; "
                        "set TKBOX_HOME to a shorter path")
    paths.private_dir(workdir)  # 0700, parents too; refused below others' dirs


class QemuLauncher(Launcher):
    """Starts each VM from a booted template where one matches, cold otherwise.

    `templates=None` turns templates off (every VM boots cold); by default they
    live in the guest build's cache. `build_templates`: build a missing template
    in the background after a cold boot.

    `transport`: "serial-mux" or "vhost-vsock" (see `tkbox.vm.choice`). Under
    vhost vsock each VM gets a guest CID claimed from the kernel
    (`tkbox.vm.cid`), boots cold (templates are parked and woken over the serial
    mux), and its guest is told `tkbox.ports=vsock` on its command line.
    """

    name = "qemu"

    def __init__(self, accel: AccelDecision, templates: tpl.TemplateStore | None | str = "default",
                 build_templates: bool = True, transport: str = SERIAL_MUX) -> None:
        if transport not in (SERIAL_MUX, VHOST_VSOCK):
            raise InternalError(f"QEMU has no {transport!r} transport")
        self.decision = accel
        self.transport = transport
        if templates == "default":
            templates = tpl.TemplateStore(paths.guest_build() / "templates")
        self.templates: tpl.TemplateStore | None = (
            templates if isinstance(templates, tpl.TemplateStore) else None)
        self.build_templates = build_templates
        self._builds: dict[str, asyncio.Task[Path | None]] = {}
        self._build_tasks = TaskOwner("tkbox-qemu-template-build")

    def key(self, spec: VMSpec) -> tpl.Key:
        qemu = qemu_binary()
        return tpl.make_key(spec, tpl.vmm_version(qemu),
                            template_argv(spec, self.decision.accel, QEMU))

    async def start(self, spec: VMSpec, *, before_boot: BeforeBoot | None = None) -> QemuVM:
        qemu = qemu_binary()
        check_boot_files(spec)
        _private(spec.workdir)
        if self.transport == VHOST_VSOCK:
            return await self._start_vsock(spec, qemu, before_boot)
        found = tpl.Lookup(None, "cold boot: templates are off for this launcher", build=False)
        key: tpl.Key | None = None
        if self.templates is not None:
            key = await asyncio.to_thread(self.key, spec)
            found = self.templates.lookup(key)
        if found.state is not None and key is not None and self.templates is not None:
            try:
                return await self._start(spec, build_argv(
                    spec, self.decision.accel, qemu, template=True,
                    ram=found.state.parent / tpl.RAM, incoming=True),
                    "template", found.reason, found.state, before_boot=before_boot)
            except HostError as exc:
                # A template that does not load (truncated, or from a QEMU that
                # reports the same version but differs) is dropped and rebuilt;
                # this box boots cold and says so.
                self.templates.discard(key)
                found = tpl.Lookup(None, f"cold boot: template {key.digest[:12]} did not "
                                         f"restore ({exc}); it is rebuilt")
                log.warning("%s", found.reason)
        vm = await self._start(spec, build_argv(spec, self.decision.accel, qemu), "cold",
                               found.reason, before_boot=before_boot)
        if key is not None and self.build_templates and found.build:
            self._build_in_background(spec, key)
        return vm

    async def _start_vsock(self, spec: VMSpec, qemu: str,
                           before_boot: BeforeBoot | None) -> QemuVM:
        claimed = await asyncio.to_thread(claim_cid)
        try:
            ports = VhostVsockHostPorts(claimed.cid)
            try:
                if before_boot is not None:
                    before_boot(ports)  # the host's listeners exist before the guest runs
                argv = build_argv(spec, self.decision.accel, qemu,
                                  vsock=(claimed.cid, claimed.fd))
                return await self._start(
                    spec, argv, "cold", "cold boot: templates are parked and woken over "
                    "the serial mux, and this box's ports are vhost vsock",
                    ports=ports, pass_fds=(claimed.fd,))
            except BaseException:
                await ports.aclose()
                raise
        finally:
            claimed.close()  # QEMU holds its own copy, and with it the CID, while it runs

    async def _start(self, spec: VMSpec, argv: list[str], kind: str, reason: str,
                     state: Path | None = None, *, before_boot: BeforeBoot | None = None,
                     ports: Ports | None = None, pass_fds: tuple[int, ...] = ()) -> QemuVM:
        for stale in ("qmp.sock", "console.log"):
            (spec.workdir / stale).unlink(missing_ok=True)
        listeners = _Listeners(spec.workdir, ("console.sock",) if ports is not None
                               else ("console.sock", "mux.sock"))
        try:
            proc = await _spawn(argv, spec.workdir, pass_fds)
        except BaseException:
            listeners.close()
            raise
        vm = QemuVM(proc, spec, self.decision.accel, listeners, ports)
        vm.start_kind, vm.start_reason = kind, reason
        try:
            await vm._connect(wake=kind == "template", before_boot=before_boot)
            if state is not None:
                await vm.restore(state)
        except VMExitedAtStart as exc:
            await vm.kill()  # QEMU's output has reached qemu.log once this returns
            raise VMExitedAtStart("QEMU", exc.status, exc.see,
                                  last_words(Path(exc.see))) from None
        except BaseException:
            await vm.kill()
            raise
        return vm

    def _build_in_background(self, spec: VMSpec, key: tpl.Key) -> None:
        if key.digest in self._builds or self._build_tasks.closed:
            return
        task = self._build_tasks.spawn(self.build_template(spec, key),
                                       f"tkbox-template-{key.digest[:12]}")
        self._builds[key.digest] = task

        def done(t: asyncio.Task[Path | None]) -> None:
            self._builds.pop(key.digest, None)
            if not t.cancelled() and t.exception() is not None:
                log.warning("template %s could not be built: %s", key.digest[:12],
                            t.exception())

        task.add_done_callback(done)

    async def wait_templates(self) -> None:
        """Until every background template build has ended."""
        while self._builds:
            await asyncio.wait(set(self._builds.values()))

    async def aclose(self) -> None:
        await self._build_tasks.aclose()

    async def build_template(self, spec: VMSpec, key: tpl.Key | None = None) -> Path | None:
        """Boot `spec`'s machine to the guest's park point, save it, end it.

        Returns the template's state file (None if templates are off). Disks are
        placeholders in the same layout: the parked guest never probes them.
        """
        if self.templates is None:
            return None
        if key is None:
            key = await asyncio.to_thread(self.key, spec)
        qemu = qemu_binary()
        with self.templates.building(key) as d:
            if d is None:
                return self.templates.lookup(key).state
            t0 = time.monotonic()
            # The template VM's own sockets live in a short private directory (Unix
            # socket paths are short); only the saved state goes into the store.
            work = Path(tempfile.mkdtemp(prefix="tkbox-template-"))
            saved, ram = d / "state.partial", d / "ram.partial"
            try:
                disks = []
                for i, disk in enumerate(spec.disks):
                    placeholder = work / f"disk{i}"
                    with open(placeholder, "wb") as f:
                        f.truncate(1 << 20)
                    disks.append(Disk(placeholder, disk.read_only, disk.role))
                tspec = replace(spec, name="template", workdir=work, disks=tuple(disks))
                _private(work)
                listeners = _Listeners(work, ("console.sock", "mux.sock"))
                try:
                    proc = await _spawn(build_argv(tspec, self.decision.accel, qemu,
                                                   template=True, ram=ram, share_ram=True), work)
                    waiting = TaskOwner("tkbox-template-qemu")
                    _drain_log(proc, work, waiting)
                    try:
                        await _save_parked(proc, work, saved, listeners,
                                           _ending(proc, waiting))
                    finally:
                        if proc.returncode is None:
                            with contextlib.suppress(ProcessLookupError):
                                os.killpg(proc.pid, signal.SIGKILL)
                        await proc.wait()
                        await waiting.aclose()
                finally:
                    listeners.close()
                path = await asyncio.to_thread(self.templates.commit, d, key, saved, ram,
                                               time.monotonic() - t0)
                saved = path
                log.info("template %s built in %.1fs (%d MiB)", key.digest[:12],
                         time.monotonic() - t0, path.stat().st_size >> 20)
                return path
            finally:
                shutil.rmtree(work, ignore_errors=True)
                if saved.name != tpl.STATE:
                    saved.unlink(missing_ok=True)
                    ram.unlink(missing_ok=True)


async def _save_parked(proc: asyncio.subprocess.Process, work: Path, saved: Path,
                       listeners: _Listeners, ended: asyncio.Future[int]) -> None:
    """Wait for the guest to park, then migrate the VM into `saved` (QEMU ends paused).

    The template guest's console is accepted and dropped (nobody reads it; QEMU
    must not block on it)."""
    _con_reader, con_writer = await listeners.accept("console.sock", ended, proc.pid)
    con_writer.close()
    reader, writer = await listeners.accept("mux.sock", ended, proc.pid)
    try:
        got = b""
        deadline = time.monotonic() + TEMPLATE_BOOT_TIMEOUT
        while PARKED not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HostError(f"the template guest did not park within "
                                f"{TEMPLATE_BOOT_TIMEOUT:.0f}s")
            try:
                chunk = await asyncio.wait_for(reader.read(4096), left)
            except TimeoutError:
                continue
            if not chunk:
                raise HostError(f"the template guest ended before it parked "
                                f"(QEMU status {proc.returncode})")
            got = (got + chunk)[-4096:]
        qmp = _qmp_client("template")
        await qmp.connect(str(work / "qmp.sock"))
        try:
            # Migrated running, not stopped first: the destination takes the
            # source's run state, so a state saved paused would restore paused and
            # need a QMP `cont` per box. The parked guest dirties almost nothing.
            # The guest's memory is the template's RAM file (share=on): the stream
            # holds only device state, and each box maps the file privately.
            await qmp.execute("migrate-set-capabilities", {"capabilities": [
                {"capability": "x-ignore-shared", "state": True}]})
            await qmp.execute("migrate-set-parameters", {"max-bandwidth": 1 << 40})
            _send_file(qmp, saved, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            await qmp.execute("getfd", {"fdname": "saved"})
            await qmp.execute("migrate", {"uri": "fd:saved"})
            while True:
                info = await qmp.execute("query-migrate")
                facts: dict[str, object] = info if isinstance(info, dict) else {}
                status = facts.get("status")
                if status == "completed":
                    break
                if status in ("failed", "cancelled"):
                    raise HostError(f"saving the template failed: "
                                    f"{facts.get('error-desc', status)}")
                await asyncio.sleep(0.05)
            with contextlib.suppress(Exception):
                await qmp.execute("quit")
        finally:
            with contextlib.suppress(Exception):
                await qmp.disconnect()
    finally:
        writer.close()
