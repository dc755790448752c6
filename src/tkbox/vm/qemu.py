"""The QEMU launcher: `qemu-system-x86_64 -M microvm`, no network card: the process.

Disks are virtio-mmio block devices, identified in the guest by their serial
(`root`, `lower`, `upper`); the three ports ride one virtio-serial port
(`tkbox.mux`) through the serial mux. Pause, resume and quit go through QMP.

Acceleration is decided from facts and cached (`decide_accel`): KVM only where
`/dev/kvm` is usable *and* the host's KVM can run this guest kernel. A host
whose KVM is a paravirtual nested hypervisor (PVM, seen as
`/sys/module/kvm_pvm`) runs only kernels built for it, which we read from the
guest kernel's config; otherwise we use software emulation (TCG) and say so.

The VMM process gets a private 0700 working directory, an empty environment
(the daemon's may hold the values the secrets door keeps out of the box), its
own session, QEMU's seccomp sandbox (`SANDBOX`), and `PR_SET_PDEATHSIG` so that
it cannot outlive the daemon; it is reaped however it ends. Where the daemon
jails VMMs (`tkbox.vm.jail`), it runs in a cell of its own: its uid, namespaces,
root and cgroup, started by `tkbox-jailer`, which stays its parent (the process
the launcher holds) and ends as it ended. It inherits no path of the daemon's
and no descriptor but those it is handed (`Wiring`): its chardevs' ends of
socketpairs (the daemon holds the others: no socket file exists), one
descriptor per disk (`-add-fd`), its memory file; QEMU opens only the kernel
and initramfs itself. `start` returns once QEMU answers on QMP (it has built
the machine). Its stdout and stderr are a pipe
drained into `qemu.log`, capped at `QEMU_LOG_CAP`: QEMU reports a guest's
device errors there (`Guest says index 5 is available`, one line per fault,
as often as a guest kernel that drives a virtio device's registers makes
them), so a file it wrote itself would grow without bound.

Booted templates (`tkbox.vm.template`): where a template matches the VM's key,
the VM starts with `-incoming` from it and is woken on the mux port; where none
does, it boots cold and one is built in the background (single flight), so
later boxes restore. The template's memory is a RAM file (written through while
it is saved, mapped private by each box; in a cell, a sealed memfd of it,
`jail.TemplateRam`, so no VMM can write what other boxes restore); migration with `x-ignore-shared`
carries only device state, saved and restored through a file the daemon
opens and passes to QEMU over QMP (`getfd`, then `fd:` URIs; QEMU 7.2 has no
`file:` URI, and its sandbox forbids `exec:`).

Transports: the serial mux by default; with `transport="vhost-vsock"` a
`vhost-vsock-device` whose guest CID the kernel gave to an fd QEMU inherits
(`tkbox.vm.cid`), and the ports are `VhostVsockHostPorts` served before QEMU
starts. Every task a VM starts belongs to it (`TaskOwner`) and has ended once
`wait` returns.

The command line itself is `tkbox.vm.qemuargv` (pure: no process, no file;
`build_argv` here gives it this host's TSC rate and `TKBOX_GUEST_DEBUG`), the
template store `tkbox.vm.template`, the cell `tkbox.vm.jail`.

One idea: the life of one QEMU process (the host facts it starts from, its
descriptors, QMP, the template saved from it and restored into it, its end),
whose parts share the private helpers (`_spawn`, `_Handles`) that make it.
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
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tkbox import paths
from tkbox._process import pdeathsig
from tkbox._tasks import TaskOwner
from tkbox.errors import HostError, InternalError
from tkbox.protocol.mux import MuxPorts
from tkbox.protocol.ports import Ports
from tkbox.protocol.streams import AsyncioStream
from tkbox.protocol.vsock import VhostVsockHostPorts
from tkbox.vm import qemuargv
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
from tkbox.vm.jail import CELL_INITRD, CELL_KERNEL, Cell, Jail, JailConfig, TemplateRam
from tkbox.vm.qemuargv import QEMU as QEMU
from tkbox.vm.qemuargv import SANDBOX as SANDBOX
from tkbox.vm.qemuargv import TCG_TRADEOFF as TCG_TRADEOFF
from tkbox.vm.qemuargv import Wiring as Wiring
from tkbox.vm.qemuargv import placeholder_wiring as placeholder_wiring

if TYPE_CHECKING:
    from qemu.qmp import QMPClient

log = logging.getLogger("tkbox.vm.qemu")

CONSOLE_CAP = 16 * 1024 * 1024
#: Bytes kept of QEMU's own output (stdout and stderr) in qemu.log; the rest is dropped.
QEMU_LOG_CAP = LOG_CAP
#: Seconds to wait, once QEMU has ended, for the last of its output to reach qemu.log.
LOG_SETTLE = 2.0
TEMPLATE_BOOT_TIMEOUT = 300.0
#: The guest agent's side of the template handshake (tkbox.guest.agent).
PARKED, WAKE = b"tkbox-parked\n", b"W"


BOOT = Path("/boot")  # where a kernel's build config is read from: config-VERSION


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


def build_argv(spec: VMSpec, accel: str, qemu: str = QEMU, *, wiring: Wiring | None = None,
               template: bool = False, share_ram: bool = False,
               incoming: bool = False, vsock: tuple[int, int] | None = None) -> list[str]:
    """`tkbox.vm.qemuargv.build_argv` with what it needs of this host: its TSC rate
    under TCG (`host_tsc_khz`), and `TKBOX_GUEST_DEBUG` (the guest kernel speaks)."""
    return qemuargv.build_argv(
        spec, accel, qemu, wiring=wiring, template=template, share_ram=share_ram,
        incoming=incoming, vsock=vsock,
        tsc_khz=host_tsc_khz() if accel != "kvm" else None,
        guest_debug=bool(os.environ.get("TKBOX_GUEST_DEBUG")))


def template_argv(spec: VMSpec, accel: str, qemu: str) -> list[str]:
    """`build_argv` for a template, with the per-VM descriptors and paths as
    placeholders: the part of the key that says which machine a saved state
    belongs to. The kernel and initramfs are keyed by their contents
    (tkbox.vm.template), not by the path they are reached by."""
    return build_argv(replace(spec, name="template", workdir=Path("/WORKDIR")), accel, qemu,
                      wiring=placeholder_wiring(spec, ram=True), template=True)


def _send_file(qmp: QMPClient, path: Path, flags: int) -> None:
    """Open `path` here (no final symlink followed; created 0600) and send it to QEMU
    over QMP (SCM_RIGHTS); a `getfd` must name it next. QEMU opens no template file
    itself, and spawns nothing to read or write one (its sandbox forbids it)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        qmp.send_fd_scm(fd)
    finally:
        os.close(fd)  # QEMU holds its own copy


class _Handles:
    """What the daemon opens for one QEMU: its ends of the chardevs' socketpairs (the
    daemon keeps the other ends), its disks, its memory file, and the wiring that
    names them. `close_theirs` once QEMU has started (it holds its own copies)."""

    def __init__(self, spec: VMSpec, cell: Cell, *, mux: bool = True,
                 ram: int | None = None, extra: tuple[int, ...] = ()) -> None:
        self.ours: dict[str, socket.socket] = {}
        self._theirs: list[socket.socket] = []
        self._files: list[int] = []
        self.extra = extra
        try:
            ends = {}
            for name in ("con", "qmp", *(("mux",) if mux else ())):
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                self.ours[name] = mine
                self._theirs.append(theirs)
                ends[name] = theirs.fileno()
            disks = []
            for disk in spec.disks:
                disks.append((self._open(disk.path,
                                         os.O_RDONLY if disk.read_only else os.O_RDWR),))
            jailed = cell.on
            self.wiring = Wiring(
                ends["con"], ends["qmp"], ends.get("mux"), tuple(disks),
                CELL_KERNEL if jailed else str(spec.kernel),
                CELL_INITRD if jailed else str(spec.initramfs),
                f"/proc/self/fd/{ram}" if ram is not None else None)
        except OSError as exc:
            self.close()
            raise HostError(f"cannot open what QEMU is handed: {exc.filename or ''} "
                            f"{exc.strerror}".strip()) from None
        except BaseException:
            self.close()
            raise
        self.ram = ram

    def _open(self, path: Path, flags: int) -> int:
        fd = os.open(path, flags | os.O_CLOEXEC)
        self._files.append(fd)
        return fd

    def pass_fds(self) -> tuple[int, ...]:
        return self.wiring.fds() + ((self.ram,) if self.ram is not None else ()) + self.extra

    def close_theirs(self) -> None:
        for s in self._theirs:
            s.close()
        self._theirs.clear()
        for fd in self._files:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._files.clear()

    def close(self) -> None:
        self.close_theirs()
        for s in self.ours.values():
            s.close()
        self.ours.clear()


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
    """A QEMU process (in its cell, where the daemon jails VMMs), its console drain, its
    ports and its QMP client.

    Every task it starts (the reaper, the console drain, the mux engine) is
    owned by `_tasks`; `wait` ends them all before it returns, and then the cell
    (its cgroup, its uid's lease) is released, once the kernel's word on why the
    VMM ended (`end_reason`) has been read.
    """

    def __init__(self, proc: asyncio.subprocess.Process, spec: VMSpec, accel: str,
                 handles: _Handles, cell: Cell, ports: Ports | None = None) -> None:
        super().__init__()
        self.proc = proc
        self._handles = handles
        self.cell = cell
        self.isolation = cell.isolation
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

    @property
    def vmm_pid(self) -> int | None:
        """QEMU's own pid: the jailer's child in a cell, the process itself without one."""
        if not self.cell.on:
            return self.proc.pid
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = self.proc.pid
            return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
        return None

    async def kill(self) -> None:
        """End the VM now. In a cell, QEMU itself is killed first: its jailer reaps it
        at once and ends as it did, so no QEMU is left a zombie for init to reap (the
        jailer and QEMU killed together left one for up to two seconds); the whole
        process group is killed too if the jailer has not ended within `KILL_GRACE`."""
        if self.proc.returncode is None and self.cell.on:
            self._kill_vmm()
            await asyncio.wait({self._ended}, timeout=KILL_GRACE)
        await super().kill()

    def _kill_vmm(self) -> None:
        """SIGKILL to QEMU, through a pidfd taken while it is still the jailer's child
        (so a pid the kernel gave to another process since can never be signalled)."""
        pid = self.vmm_pid
        if pid is None or pid == self.proc.pid:
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            if self.vmm_pid == pid:  # still the jailer's child: the pidfd is QEMU's
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(pidfd)

    async def _reap(self) -> None:
        code = await self.proc.wait()
        if not self._ended.done():
            self._ended.set_result(code)

    async def _drain_console(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        """Copy the guest's console into console.log, up to CONSOLE_CAP bytes."""
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
        """Take the daemon's ends of the chardevs, then wait until QEMU answers on QMP
        (it has built the machine); VMExitedAtStart if it ends first."""
        con = await asyncio.open_unix_connection(sock=self._handles.ours.pop("con"),
                                                 limit=1 << 20)
        self._tasks.spawn(self._drain_console(*con), f"tkbox-qemu-console-{self.spec.name}")
        mux = self._handles.ours.pop("mux", None)
        if mux is not None:  # vhost vsock: its ports were served before QEMU started
            reader, writer = await asyncio.open_unix_connection(sock=mux, limit=1 << 20)
            if wake:  # a restored guest waits for this byte before it starts its mux
                writer.write(WAKE)
            self._mux = MuxPorts(AsyncioStream(reader, writer), initiator=True)
            self.ports = self._mux
            if before_boot is not None:
                before_boot(self._mux)  # before the engine reads: no OPEN is dispatched yet
            self._tasks.spawn(self._mux.run(), f"tkbox-qemu-mux-{self.spec.name}")
        try:
            await self._qmp_exec("query-status")
        except VMError:
            done, _ = await asyncio.wait({self._ended}, timeout=LOG_SETTLE)
            if done:
                raise VMExitedAtStart("QEMU", self._ended.result(),
                                      str(self.spec.workdir / "qemu.log")) from None
            raise

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
            sock = self._handles.ours.pop("qmp", None)
            if sock is None:
                raise VMError(f"QEMU of {self.spec.name}: its QMP session is gone")
            client = _qmp_client(self.spec.name)
            try:
                await asyncio.wait_for(client.connect(sock), QMP_TIMEOUT)
            except (QMPError, OSError, EOFError, TimeoutError) as exc:
                sock.close()
                raise VMError(f"QEMU did not answer on QMP ({type(exc).__name__}); see "
                              f"{self.spec.workdir / 'qemu.log'}") from None
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
            self._handles.close()
            verdict = self.cell.verdict()
            self.end_reason, self.end_limit = verdict.reason, verdict.limit
            await asyncio.to_thread(self.cell.close)

    @property
    def running(self) -> bool:
        return self.proc.returncode is None


#: Seconds for QEMU to answer its first QMP command once started (it builds the machine).
QMP_TIMEOUT = 60.0
#: Seconds a jailer has to end after its QEMU was killed, before its group is killed too.
KILL_GRACE = 1.0


async def _spawn(argv: list[str], workdir: Path, handles: _Handles,
                 cell: Cell) -> asyncio.subprocess.Process:
    """Start QEMU in `cell` (as it is, where the daemon does not jail VMMs): `workdir`
    as cwd (and, in a cell, where the cell's root is mounted), empty environment,
    stdin from /dev/null, no inherited descriptors but those `handles` names, its own
    session; `argv.json` says what ran.

    Its stdout and stderr are one pipe: the caller must drain it (`_drain_log`) from
    now on, or QEMU blocks once the pipe is full."""
    command, fds = cell.command(argv, handles.pass_fds(), workdir)
    (workdir / "argv.json").write_text(json.dumps(command))
    try:
        proc = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, cwd=workdir, env={}, close_fds=True,
            pass_fds=fds, start_new_session=True,
            preexec_fn=pdeathsig(),  # noqa: PLW1509 - one prctl, resolved before fork
        )
    except OSError as exc:
        raise VMError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    finally:
        cell.started()
        handles.close_theirs()  # QEMU (or its jailer) holds its own copies
    return proc


def _drain_log(proc: asyncio.subprocess.Process, workdir: Path,
               owner: TaskOwner) -> asyncio.Task[None]:
    """QEMU's output into `workdir/qemu.log`, capped at QEMU_LOG_CAP; a task of `owner`."""
    return owner.spawn(drain_to_file(proc.stdout, workdir / "qemu.log", QEMU_LOG_CAP),
                       "tkbox-qemu-log")


def _private(workdir: Path) -> None:
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

    `jail`: how each QEMU is put in a cell (`tkbox.vm.jail.decide`); None runs it
    as it is (the seccomp sandbox and an empty environment only).
    """

    name = "qemu"

    def __init__(self, accel: AccelDecision, templates: tpl.TemplateStore | None | str = "default",
                 build_templates: bool = True, transport: str = SERIAL_MUX,
                 jail: Jail | None = None) -> None:
        if transport not in (SERIAL_MUX, VHOST_VSOCK):
            raise InternalError(f"QEMU has no {transport!r} transport")
        self.decision = accel
        self.transport = transport
        self.jail = jail or Jail("off", JailConfig(mode="off"), missing=["the launcher "
                                                                          "was given no jail"])
        if templates == "default":
            templates = tpl.TemplateStore(paths.guest_build() / "templates")
        self.templates: tpl.TemplateStore | None = (
            templates if isinstance(templates, tpl.TemplateStore) else None)
        self.build_templates = build_templates
        self._builds: dict[str, asyncio.Task[Path | None]] = {}
        self._build_tasks = TaskOwner("tkbox-qemu-template-build")
        self._ram = TemplateRam()

    def key(self, spec: VMSpec) -> tpl.Key:
        qemu = qemu_binary()
        return tpl.make_key(spec, tpl.vmm_version(qemu),
                            template_argv(spec, self.decision.accel, QEMU))

    def _cell(self, spec: VMSpec) -> Cell:
        return self.jail.cell(spec.name, memory_mib=spec.memory_mib, vcpus=spec.vcpus,
                              accel=self.decision.accel,
                              binds=((spec.kernel, CELL_KERNEL), (spec.initramfs, CELL_INITRD)))

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
                return await self._start(spec, qemu, "template", found.reason, found.state,
                                         before_boot=before_boot)
            except HostError as exc:
                # A template that does not load (truncated, or from a QEMU that
                # reports the same version but differs) is dropped and rebuilt;
                # this box boots cold and says so.
                self.templates.discard(key)
                found = tpl.Lookup(None, f"cold boot: template {key.digest[:12]} did not "
                                         f"restore ({exc}); it is rebuilt")
                log.warning("%s", found.reason)
        vm = await self._start(spec, qemu, "cold", found.reason, before_boot=before_boot)
        if key is not None and self.build_templates and found.build:
            self._build_in_background(spec, key)
        return vm

    async def _ram_fd(self, state: Path) -> tuple[int, bool]:
        """The template's memory for a box: (descriptor, whether the caller closes it).

        In a cell, the template's sealed memfd (no VMM can write what other boxes
        restore from); without one, the file itself (QEMU runs as the daemon's user,
        which owns it anyway)."""
        ram = state.parent / tpl.RAM
        if self.jail.on:
            return await asyncio.to_thread(self._ram.fd, ram), False
        return os.open(ram, os.O_RDONLY | os.O_CLOEXEC), True

    async def _start_vsock(self, spec: VMSpec, qemu: str,
                           before_boot: BeforeBoot | None) -> QemuVM:
        claimed = await asyncio.to_thread(claim_cid)
        try:
            ports = VhostVsockHostPorts(claimed.cid)
            try:
                if before_boot is not None:
                    before_boot(ports)  # the host's listeners exist before the guest runs
                return await self._start(
                    spec, qemu, "cold", "cold boot: templates are parked and woken over "
                    "the serial mux, and this box's ports are vhost vsock",
                    ports=ports, vsock=(claimed.cid, claimed.fd))
            except BaseException:
                await ports.aclose()
                raise
        finally:
            claimed.close()  # QEMU holds its own copy, and with it the CID, while it runs

    async def _start(self, spec: VMSpec, qemu: str, kind: str, reason: str,
                     state: Path | None = None, *, before_boot: BeforeBoot | None = None,
                     ports: Ports | None = None,
                     vsock: tuple[int, int] | None = None) -> QemuVM:
        (spec.workdir / "console.log").unlink(missing_ok=True)
        ram, close_ram = await self._ram_fd(state) if state is not None else (None, False)
        try:
            cell = self._cell(spec)
            try:
                handles = _Handles(spec, cell, mux=vsock is None, ram=ram,
                                   extra=(vsock[1],) if vsock else ())
                try:
                    argv = build_argv(spec, self.decision.accel, qemu, wiring=handles.wiring,
                                      template=state is not None, incoming=state is not None,
                                      vsock=vsock)
                    proc = await _spawn(argv, spec.workdir, handles, cell)
                except BaseException:
                    handles.close()
                    raise
            except BaseException:
                cell.close()
                raise
        finally:
            if close_ram and ram is not None:
                os.close(ram)
        vm = QemuVM(proc, spec, self.decision.accel, handles, cell, ports)
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
        self._ram.close()

    async def build_template(self, spec: VMSpec, key: tpl.Key | None = None) -> Path | None:
        """Boot `spec`'s machine to the guest's park point, save it, end it.

        Returns the template's state file (None if templates are off). Disks are
        placeholders in the same layout: the parked guest never probes them. The
        template's QEMU runs in a cell like a box's; its memory file is handed to it
        open, and is its uid's only while it is written."""
        if self.templates is None:
            return None
        if key is None:
            key = await asyncio.to_thread(self.key, spec)
        qemu = qemu_binary()
        with self.templates.building(key) as d:
            if d is None:
                return self.templates.lookup(key).state
            t0 = time.monotonic()
            # The template VM's own files live in a short private directory; only the
            # saved state goes into the store.
            work = Path(tempfile.mkdtemp(prefix="tkbox-template-"))
            saved, ram = d / "state.partial", d / "ram.partial"
            ram_fd = -1
            try:
                disks = []
                for i, disk in enumerate(spec.disks):
                    placeholder = work / f"disk{i}"
                    with open(placeholder, "wb") as f:
                        f.truncate(1 << 20)
                    disks.append(Disk(placeholder, disk.read_only, disk.role))
                tspec = replace(spec, name="template", workdir=work, disks=tuple(disks))
                _private(work)
                ram_fd = os.open(ram, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                                 | os.O_NOFOLLOW, 0o600)
                cell = self._cell(tspec)
                try:
                    if cell.lease is not None:  # QEMU reopens it through /proc/self/fd
                        os.fchown(ram_fd, cell.uid, cell.uid)
                    handles = _Handles(tspec, cell, ram=ram_fd)
                except BaseException:
                    cell.close()
                    raise
                try:
                    proc = await _spawn(build_argv(tspec, self.decision.accel, qemu,
                                                   wiring=handles.wiring, template=True,
                                                   share_ram=True), work, handles, cell)
                    waiting = TaskOwner("tkbox-template-qemu")
                    _drain_log(proc, work, waiting)
                    try:
                        await _save_parked(proc, work, saved, handles,
                                           _ending(proc, waiting))
                    finally:
                        if proc.returncode is None:
                            with contextlib.suppress(ProcessLookupError):
                                os.killpg(proc.pid, signal.SIGKILL)
                        await proc.wait()
                        await waiting.aclose()
                finally:
                    handles.close()
                    cell.close()
                os.fchown(ram_fd, os.getuid(), os.getgid())  # its VMM has ended
                path = await asyncio.to_thread(self.templates.commit, d, key, saved, ram,
                                               time.monotonic() - t0)
                saved = path
                log.info("template %s built in %.1fs (%d MiB)", key.digest[:12],
                         time.monotonic() - t0, path.stat().st_size >> 20)
                return path
            finally:
                if ram_fd >= 0:
                    os.close(ram_fd)
                shutil.rmtree(work, ignore_errors=True)
                if saved.name != tpl.STATE:
                    saved.unlink(missing_ok=True)
                    ram.unlink(missing_ok=True)


async def _save_parked(proc: asyncio.subprocess.Process, work: Path, saved: Path,
                       handles: _Handles, ended: asyncio.Future[int]) -> None:
    """Wait for the guest to park, then migrate the VM into `saved` (QEMU ends paused).

    The template guest's console is read and dropped (nobody reads it; QEMU
    must not block on it)."""
    owner = TaskOwner("tkbox-template-console")
    con = handles.ours.pop("con")
    con.setblocking(False)

    async def drop_console() -> None:
        loop = asyncio.get_running_loop()
        while await loop.sock_recv(con, 65536):
            pass

    owner.spawn(drop_console())
    reader, writer = await asyncio.open_unix_connection(sock=handles.ours.pop("mux"),
                                                        limit=1 << 20)
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
            if not chunk:  # QEMU's end of the socketpair closed: it has ended
                code = await asyncio.wait_for(asyncio.shield(ended), LOG_SETTLE)
                raise VMExitedAtStart("QEMU", code, str(work / "qemu.log"),
                                      last_words(work / "qemu.log")
                                      or "the template guest ended before it parked")
            got = (got + chunk)[-4096:]
        qmp = _qmp_client("template")
        await qmp.connect(handles.ours.pop("qmp"))
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
        await owner.aclose()
        con.close()
