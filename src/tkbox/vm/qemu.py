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

Booted templates (`tkbox.vm.template`): where a template matches the VM's key,
the VM starts with `-incoming` from it and is woken on the mux port; where none
does, it boots cold and one is built in the background (single flight), so
later boxes restore. The template's memory is a RAM file (written through while
it is saved, mapped private by each box); migration with `x-ignore-shared`
carries only device state, saved with `exec:cat > FILE` and restored with
`migrate-incoming exec:cat FILE` (QEMU 7.2 has no `file:` URI).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import shlex
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from tkbox import paths
from tkbox.errors import HostError
from tkbox.protocol.mux import MuxPorts
from tkbox.protocol.streams import AsyncioStream
from tkbox.vm import template as tpl
from tkbox.vm.base import VM, Disk, Launcher, VMSpec

log = logging.getLogger("tkbox.vm.qemu")

QEMU = "qemu-system-x86_64"
PR_SET_PDEATHSIG = 1
CONSOLE_CAP = 16 * 1024 * 1024
TEMPLATE_BOOT_TIMEOUT = 300.0
#: The guest agent's side of the template handshake (tkbox.guest.agent).
PARKED, WAKE = b"tkbox-parked\n", b"W"
TEMPLATE_CMDLINE = "tkbox.template=1"


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


def build_argv(spec: VMSpec, accel: str, qemu: str = QEMU, *, template: bool = False,
               ram: Path | None = None, share_ram: bool = False,
               incoming: bool = False) -> list[str]:
    """The exact QEMU command line for `spec` (pure: tested without QEMU).

    `template`: the guest parks before its disks and boot config (the machine a
    template is saved from and restored into). `ram`: guest memory is that file,
    written through (`share_ram`, the template being saved) or mapped private
    (a box restored from it: its writes are its own, the file is only read).
    `incoming`: wait for the state to load (`migrate-incoming` over QMP).
    """
    d = spec.workdir
    if template:
        spec = replace(spec, cmdline=(spec.cmdline + " " + TEMPLATE_CMDLINE).strip())
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
        # TCG caches translated code by virtual address: with the guest's user-space
        # address randomization on, every exec re-translates the loader and libc
        # (`true` took 80-130 ms, 27 ms without). Off under emulation only; the
        # guest is the agent's own domain, nothing of the host's depends on it
        # (docs/threat-model.md). With KVM it stays on.
        cmdline += " norandmaps"
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
    if ram is not None:
        path = str(ram).replace(",", ",,")  # QEMU option syntax
        argv += ["-object", f"memory-backend-file,id=ram,size={spec.memory_mib}M,"
                            f"mem-path={path},share={'on' if share_ram else 'off'}",
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

    async def _connect(self, wake: bool = False) -> None:
        self._console_task = asyncio.ensure_future(self._drain_console())
        reader, writer = await _connect_unix(self.spec.workdir / "mux.sock", self.proc)
        if wake:  # a restored guest waits for this byte before it starts its mux
            writer.write(WAKE)
        self.ports = MuxPorts(AsyncioStream(reader, writer), initiator=True)
        self._mux_task = asyncio.ensure_future(self.ports.run())

    async def status(self) -> str:
        """The VMM's own word on the VM: "running", "paused", ... (QMP query-status)."""
        if self.proc.returncode is not None:
            return "ended"
        await self._qmp_exec("query-status")
        return str(self._last.get("status", "unknown"))

    async def _qmp_exec(self, cmd: str, args: dict[str, object] | None = None) -> None:
        from qemu.qmp import QMPClient

        if self._qmp is None:
            from qemu.qmp import ConnectError

            sock = self.spec.workdir / "qmp.sock"
            await _wait_path(sock, self.proc, 10)
            deadline = time.monotonic() + 10
            while True:  # the socket exists from bind(); QEMU may not listen() yet
                client = QMPClient(self.spec.name)
                try:
                    await client.connect(str(sock))
                    break
                except ConnectError:
                    if time.monotonic() > deadline or self.proc.returncode is not None:
                        raise HostError(f"QEMU did not accept on {sock.name}; see "
                                        f"{self.spec.workdir / 'qemu.log'}") from None
                    await asyncio.sleep(0.01)
            self._qmp = client
        result = await self._qmp.execute(cmd, args)  # type: ignore[attr-defined]
        self._last = result if isinstance(result, dict) else {}

    async def restore(self, state: Path) -> None:
        """Load a template's device state (its memory is the file mapped by `-object`)."""
        await self._qmp_exec("migrate-set-capabilities", {"capabilities": [
            {"capability": "x-ignore-shared", "state": True}]})
        await self._qmp_exec("migrate-incoming", {"uri": f"exec:cat {shlex.quote(str(state))}"})
        await self.wait_incoming()

    async def wait_incoming(self, timeout: float = 120.0) -> None:
        """Until QEMU has loaded the state it restores (`-incoming`); HostError if
        the load failed or QEMU ended. The guest runs as soon as it is loaded."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.returncode is not None:
                raise HostError(f"QEMU ended while loading the template (status "
                                f"{self.proc.returncode}; see {self.spec.workdir / 'qemu.log'})")
            try:
                await self._qmp_exec("query-migrate")
            except Exception as exc:  # noqa: BLE001 - QMP gone: QEMU is ending; say why above
                if self.proc.returncode is None and time.monotonic() > deadline:
                    raise HostError(f"QMP failed while loading the template: {exc}") from None
                await asyncio.sleep(0.02)
                continue
            status = self._last.get("status")
            if status == "completed":
                return
            if status in ("failed", "cancelled"):
                raise HostError(f"loading the template failed: "
                                f"{self._last.get('error-desc', status)}")
            if time.monotonic() > deadline:
                raise HostError(f"the template did not load within {timeout:.0f}s")
            await asyncio.sleep(0.02)

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


async def _spawn(argv: list[str], workdir: Path) -> asyncio.subprocess.Process:
    (workdir / "argv.json").write_text(json.dumps(argv))
    log_file = open(workdir / "qemu.log", "wb")  # noqa: SIM115 - handed to the child
    try:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file,
            cwd=workdir, close_fds=True, start_new_session=True,
            preexec_fn=_pdeathsig,  # noqa: PLW1509 - async-signal-safe prctl only
        )
    finally:
        log_file.close()


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
    """

    name = "qemu"

    def __init__(self, accel: AccelDecision, templates: tpl.TemplateStore | None | str = "default",
                 build_templates: bool = True) -> None:
        self.decision = accel
        if templates == "default":
            templates = tpl.TemplateStore(paths.guest_build() / "templates")
        self.templates: tpl.TemplateStore | None = (
            templates if isinstance(templates, tpl.TemplateStore) else None)
        self.build_templates = build_templates
        self._builds: dict[str, asyncio.Task[Path | None]] = {}

    def key(self, spec: VMSpec) -> tpl.Key:
        qemu = qemu_binary()
        return tpl.make_key(spec, tpl.vmm_version(qemu),
                            template_argv(spec, self.decision.accel, QEMU))

    async def start(self, spec: VMSpec) -> QemuVM:
        qemu = qemu_binary()
        _private(spec.workdir)
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
                    "template", found.reason, found.state)
            except HostError as exc:
                # A template that does not load (truncated, or from a QEMU that
                # reports the same version but differs) is dropped and rebuilt;
                # this box boots cold and says so.
                self.templates.discard(key)
                found = tpl.Lookup(None, f"cold boot: template {key.digest[:12]} did not "
                                         f"restore ({exc}); it is rebuilt")
                log.warning("%s", found.reason)
        vm = await self._start(spec, build_argv(spec, self.decision.accel, qemu), "cold",
                               found.reason)
        if key is not None and self.build_templates and found.build:
            self._build_in_background(spec, key)
        return vm

    async def _start(self, spec: VMSpec, argv: list[str], kind: str, reason: str,
                     state: Path | None = None) -> QemuVM:
        for stale in ("mux.sock", "console.sock", "qmp.sock", "console.log"):
            (spec.workdir / stale).unlink(missing_ok=True)
        proc = await _spawn(argv, spec.workdir)
        vm = QemuVM(proc, spec, self.decision.accel)
        vm.start_kind, vm.start_reason = kind, reason
        try:
            await vm._connect(wake=kind == "template")
            if state is not None:
                await vm.restore(state)
        except BaseException:
            await vm.kill()
            raise
        return vm

    def _build_in_background(self, spec: VMSpec, key: tpl.Key) -> None:
        if key.digest in self._builds:
            return
        task = asyncio.ensure_future(self.build_template(spec, key))
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
        for t in list(self._builds.values()):
            t.cancel()
        await asyncio.gather(*self._builds.values(), return_exceptions=True)

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
                proc = await _spawn(build_argv(tspec, self.decision.accel, qemu, template=True,
                                               ram=ram, share_ram=True), work)
                try:
                    await _save_parked(proc, work, saved)
                finally:
                    if proc.returncode is None:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, signal.SIGKILL)
                    await proc.wait()
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


async def _save_parked(proc: asyncio.subprocess.Process, work: Path, saved: Path) -> None:
    """Wait for the guest to park, then migrate the VM into `saved` (QEMU ends paused)."""
    from qemu.qmp import QMPClient

    reader, writer = await _connect_unix(work / "mux.sock", proc, 30)
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
        qmp = QMPClient("template")
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
            await qmp.execute("migrate", {"uri": f"exec:cat > {shlex.quote(str(saved))}"})
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
