"""The QEMU launcher: `qemu-system-x86_64 -M microvm`, no network card.

Disks are virtio-mmio block devices, identified in the guest by their serial
(`root`, `lower`, `upper`); the three ports ride one virtio-serial port
(`tkbox.mux`) through the serial mux. Pause, resume and quit go through QMP.

Acceleration is decided from facts and cached (`decide_accel`): KVM only where
`/dev/kvm` is usable *and* the host's KVM can run this guest kernel. A host
whose KVM is a paravirtual nested hypervisor (PVM, seen as
`/sys/module/kvm_pvm`) runs only kernels built for it, which we read from the
guest kernel's config; otherwise we use software emulation (TCG) and say so.

The VMM process gets a private 0700 working directory, no inherited file
descriptors, its own session, and `PR_SET_PDEATHSIG` so that it cannot outlive
the daemon; it is reaped however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tkbox import paths
from tkbox.errors import HostError
from tkbox.protocol.mux import MuxPorts
from tkbox.protocol.streams import AsyncioStream
from tkbox.vm.base import VM, Launcher, VMSpec

QEMU = "qemu-system-x86_64"
PR_SET_PDEATHSIG = 1
CONSOLE_CAP = 16 * 1024 * 1024


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
        config = Path(f"/boot/config-{kernel_version}")
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


def build_argv(spec: VMSpec, accel: str, qemu: str = QEMU) -> list[str]:
    """The exact QEMU command line for `spec` (pure: tested without QEMU)."""
    d = spec.workdir
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
    cmdline = "quiet loglevel=1 " + cmdline if not os.environ.get("TKBOX_GUEST_DEBUG") else cmdline
    argv = [
        qemu, "-M", machine, "-nodefaults", "-no-user-config", "-display", "none",
        "-no-reboot", "-nic", "none",
        "-accel", "kvm" if accel == "kvm" else "tcg",
        "-cpu", "host" if accel == "kvm" else "max",
        "-m", str(spec.memory_mib), "-smp", str(spec.vcpus),
        "-kernel", str(spec.kernel), "-initrd", str(spec.initramfs), "-append", cmdline,
        # The console goes to a socket the daemon drains into a capped log, so a
        # guest that floods its console cannot fill the host's disk.
        "-chardev", f"socket,id=con,path={d / 'console.sock'},server=on,wait=off",
        "-serial", "chardev:con",
        "-device", "virtio-rng-device",
        "-chardev", f"socket,id=mux,path={d / 'mux.sock'},server=on,wait=off",
        "-device", "virtio-serial-device,max_ports=2",
        "-device", "virtserialport,chardev=mux,name=tkbox.mux",
        "-qmp", f"unix:{d / 'qmp.sock'},server=on,wait=off",
    ]
    for i, disk in enumerate(spec.disks):
        ro = ",readonly=on" if disk.read_only else ""
        argv += ["-drive", f"id=d{i},file={disk.path},format=raw,if=none,cache=unsafe{ro}"
                 if not disk.read_only else
                 f"id=d{i},file={disk.path},format=raw,if=none{ro}",
                 "-device", f"virtio-blk-device,drive=d{i},serial={disk.role}"]
    return argv


def _pdeathsig() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


async def _wait_path(path: Path, proc: asyncio.subprocess.Process, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.returncode is not None:
            raise HostError(f"QEMU exited at start (status {proc.returncode}); "
                            f"see {path.parent / 'qemu.log'}")
        if time.monotonic() > deadline:
            raise HostError(f"QEMU did not create {path.name} within {timeout:.0f}s")
        await asyncio.sleep(0.02)


async def _connect_unix(path: Path, proc: asyncio.subprocess.Process,
                        timeout: float = 10.0) -> tuple[asyncio.StreamReader,
                                                        asyncio.StreamWriter]:
    """Connect to a socket QEMU serves; it exists from bind() on, but QEMU may not
    listen() yet, so a refused connection is retried until `timeout`."""
    await _wait_path(path, proc, timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await asyncio.open_unix_connection(str(path), limit=1 << 20)
        except ConnectionRefusedError:
            if time.monotonic() > deadline or proc.returncode is not None:
                raise HostError(f"QEMU did not accept on {path.name}; see "
                                f"{path.parent / 'qemu.log'}") from None
            await asyncio.sleep(0.02)


class QemuVM(VM):
    def __init__(self, proc: asyncio.subprocess.Process, spec: VMSpec, accel: str) -> None:
        self.proc = proc
        self.spec = spec
        self._accel = accel
        self.ports: MuxPorts
        self._mux_task: asyncio.Task[None] | None = None
        self._console_task: asyncio.Task[None] | None = None
        self._qmp: object | None = None
        self._last: dict[str, object] = {}
        self._waiter = asyncio.ensure_future(proc.wait())

    @property
    def accel(self) -> str:
        return self._accel

    async def _drain_console(self) -> None:
        """Copy the guest's console into console.log, up to CONSOLE_CAP bytes."""
        reader, writer = await _connect_unix(self.spec.workdir / "console.sock", self.proc)
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

    async def _connect(self) -> None:
        self._console_task = asyncio.ensure_future(self._drain_console())
        reader, writer = await _connect_unix(self.spec.workdir / "mux.sock", self.proc)
        self.ports = MuxPorts(AsyncioStream(reader, writer), initiator=True)
        self._mux_task = asyncio.ensure_future(self.ports.run())

    async def status(self) -> str:
        """The VMM's own word on the VM: "running", "paused", ... (QMP query-status)."""
        if self.proc.returncode is not None:
            return "ended"
        await self._qmp_exec("query-status")
        return str(self._last.get("status", "unknown"))

    async def _qmp_exec(self, cmd: str) -> None:
        from qemu.qmp import QMPClient

        if self._qmp is None:
            client = QMPClient(self.spec.name)
            await _wait_path(self.spec.workdir / "qmp.sock", self.proc, 10)
            await client.connect(str(self.spec.workdir / "qmp.sock"))
            self._qmp = client
        result = await self._qmp.execute(cmd)  # type: ignore[attr-defined]
        self._last = result if isinstance(result, dict) else {}

    async def pause(self) -> None:
        await self._qmp_exec("stop")

    async def resume(self) -> None:
        await self._qmp_exec("cont")

    async def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        await self.wait()

    async def wait(self) -> int:
        code = await asyncio.shield(self._waiter)
        await self._cleanup()
        return code

    async def _cleanup(self) -> None:
        # Idempotent: several waiters may get here; each takes what is left.
        qmp, self._qmp = self._qmp, None
        if qmp is not None:
            with contextlib.suppress(Exception):
                await qmp.disconnect()  # type: ignore[attr-defined]
        con, self._console_task = self._console_task, None
        if con is not None:
            con.cancel()
            with contextlib.suppress(BaseException):
                await con
        mux, self._mux_task = self._mux_task, None
        if mux is not None:
            await self.ports.aclose()
            mux.cancel()
            with contextlib.suppress(BaseException):
                await mux

    @property
    def running(self) -> bool:
        return self.proc.returncode is None


class QemuLauncher(Launcher):
    name = "qemu"

    def __init__(self, accel: AccelDecision) -> None:
        self.decision = accel

    async def start(self, spec: VMSpec) -> QemuVM:
        qemu = qemu_binary()
        if len(str(spec.workdir / "mux.sock")) > 100:
            raise HostError(f"VM directory {spec.workdir} is too long for Unix socket paths; "
                            "set TKBOX_HOME to a shorter path")
        paths.private_dir(spec.workdir)  # 0700, parents too; refused below others' dirs
        argv = build_argv(spec, self.decision.accel, qemu)
        (spec.workdir / "argv.json").write_text(json.dumps(argv))
        log = open(spec.workdir / "qemu.log", "wb")  # noqa: SIM115 - handed to the child
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                cwd=spec.workdir, close_fds=True, start_new_session=True,
                preexec_fn=_pdeathsig,  # noqa: PLW1509 - async-signal-safe prctl only
            )
        finally:
            log.close()
        vm = QemuVM(proc, spec, self.decision.accel)
        try:
            await vm._connect()
        except BaseException:
            await vm.kill()
            raise
        return vm
