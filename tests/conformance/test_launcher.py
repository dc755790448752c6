"""The `Launcher` conformance suite: what the daemon relies on, checked against
every implementation (`tkbox.vm.base`).

- `fake`: `FakeLauncher` with an agent that behaves as tkbox's does at boot;
- `firecracker`: `FirecrackerLauncher` driving the stand-in binary
  (`tests/unit/vm/fake_firecracker.py`, which checks every API
  request against Firecracker's OpenAPI description and, with `agent` in its
  id, boots a guest that asks for its config on port 1026 and powers off when
  the host ends that stream);
- `firecracker-jailed`: the same launcher under a stand-in of Firecracker's own
  jailer that holds it to the jailer's documented interface
  (`tests/unit/vm/fake_jailer.py`), the stand-in Firecracker then
  running as the VM's own uid in its chroot directory;
- `qemu`: `QemuLauncher` booting the real guest build under this host's
  acceleration (TCG here), templates off so that each start is a cold boot;
- `qemu-jailed`: the same, each QEMU in its cell (`tkbox.vm.jail`), as the
  daemon runs it wherever it can.

What every launcher must do: `before_boot` listeners are in place before the
guest's first stream; the VMM's directory is private; `wait` reports the exit
status to every waiter; `kill` is idempotent and reaps; after the VM ends,
`ports.connect` raises `TransportClosed` and `pause` raises `VMEnded` (a VM's
end is never a guest transport error); every task the VM started has ended
once `wait` returns; a start that fails leaves no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tkbox.errors import HostError
from tkbox.protocol.mux import MuxPorts
from tkbox.protocol.ports import PORT_BOOT, PORT_RPC, Ports, TransportClosed
from tkbox.protocol.streams import ByteStream
from tkbox.vm.base import VM, Disk, Launcher, VMSpec
from tkbox.vm.errors import VMEnded
from tkbox.vm.fake import FakeLauncher
from tkbox.vm.firecracker import FirecrackerLauncher

FAKE_FC = Path(__file__).resolve().parents[1] / "unit" / "vm" / "fake_firecracker.py"
FAKE_JAILER = FAKE_FC.with_name("fake_jailer.py")
#: The interpreter a jailed stand-in Firecracker runs under (its own uid must reach it).
SYSTEM_PYTHON = Path("/usr/bin/python3")


@dataclass
class Harness:
    name: str
    launcher: Launcher
    spec: Callable[[str], VMSpec]  # a spec for a VM named so (names choose stand-in faults)
    pid: Callable[[VM], int | None]  # the VMM's pid, where there is a process
    boot_timeout: float
    can_fail_to_start: Callable[[Path], VMSpec] | None = None  # a spec whose start fails


def _proc_pid(vm: VM) -> int | None:
    proc = getattr(vm, "proc", None)
    return None if proc is None else int(proc.pid)


def _short_dir(prefix: str) -> Path:
    # Unix socket paths are short: the VM directory must be too.
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


async def fake_agent(ports: MuxPorts, spec: VMSpec) -> None:
    """As tkbox's agent at boot: ask for the config on 1026; no config, power off."""
    stream = await ports.connect(PORT_BOOT)
    await stream.send_all(b"hello from the guest\n")
    while await stream.receive():
        pass
    await stream.aclose()


@contextlib.contextmanager
def fake_harness(tmp: Path) -> Iterator[Harness]:
    def spec(name: str) -> VMSpec:
        return VMSpec(name=name, kernel=tmp / "vmlinux", initramfs=tmp / "initramfs",
                      workdir=tmp / name)

    yield Harness("fake", FakeLauncher(fake_agent), spec, _proc_pid, 10.0)


@contextlib.contextmanager
def firecracker_harness(tmp: Path) -> Iterator[Harness]:
    binary = tmp / "bin" / "firecracker"
    binary.parent.mkdir()
    binary.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_FC} \"$@\"\n")
    binary.chmod(0o755)
    files = tmp / "files"
    files.mkdir()
    (files / "vmlinux").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(57))
    (files / "initramfs").write_bytes(b"070701")
    for role in ("root", "lower", "upper"):
        (files / f"{role}.img").write_bytes(bytes(4096))
    work = _short_dir("tkc-fc-")

    def spec(name: str) -> VMSpec:
        return VMSpec(name=f"agent-{name}", kernel=files / "vmlinux",
                      initramfs=files / "initramfs", workdir=work / name,
                      disks=tuple(Disk(files / f"{r}.img", r != "upper", r)
                                  for r in ("root", "lower", "upper")),
                      memory_mib=256)

    def failing(_: Path) -> VMSpec:
        return VMSpec(name="exit-at-start", kernel=files / "vmlinux",
                      initramfs=files / "initramfs", workdir=work / "failing")

    try:
        yield Harness("firecracker", FirecrackerLauncher(binary), spec, _proc_pid, 15.0,
                      failing)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def jailed_firecracker_harness(tmp: Path) -> Iterator[Harness]:
    """Firecracker's launcher under a stand-in of Firecracker's own jailer
    (`fake_jailer.py`: refuses any command line its documentation does not allow, then
    builds the chroot directory, copies the binary in, drops to the VM's uid and execs
    it), the stand-in Firecracker then running as that uid, in that directory."""
    from tkbox.vm.firecracker import FirecrackerJailer
    from tkbox.vm.jail import DEFAULT_UIDS

    if os.geteuid() != 0:
        pytest.skip("Firecracker's jailer runs as root")
    probe = f"{SYSTEM_PYTHON} -c 'import yaml'"
    if not SYSTEM_PYTHON.exists() or os.system(probe) != 0:  # noqa: S605
        pytest.skip(f"{SYSTEM_PYTHON} with yaml is needed for the stand-in under its own uid")
    bindir = tmp / "bin"
    bindir.mkdir()
    binary = bindir / "firecracker"
    binary.write_text(f"#!/bin/sh\nexec {SYSTEM_PYTHON} {FAKE_FC} --behave agent \"$@\"\n")
    binary.chmod(0o755)
    jailer = bindir / "jailer"
    jailer.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_JAILER} \"$@\"\n")
    jailer.chmod(0o755)
    files = tmp / "files"
    files.mkdir()
    (files / "vmlinux").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(57))
    (files / "initramfs").write_bytes(b"070701")
    for role in ("root", "lower", "upper"):
        (files / f"{role}.img").write_bytes(bytes(4096))
    work = _short_dir("tkc-fj-")

    def spec(name: str) -> VMSpec:
        return VMSpec(name=name, kernel=files / "vmlinux", initramfs=files / "initramfs",
                      workdir=work / name,
                      disks=tuple(Disk(files / f"{r}.img", r != "upper", r)
                                  for r in ("root", "lower", "upper")),
                      memory_mib=256)

    def failing(_: Path) -> VMSpec:
        return VMSpec(name="failing", kernel=files / "no-such-vmlinux",
                      initramfs=files / "initramfs", workdir=work / "failing")

    cell = FirecrackerJailer(jailer, work / "jail", DEFAULT_UIDS, cgroup_version=1)
    try:
        yield Harness("firecracker-jailed", FirecrackerLauncher(binary, jailer=cell), spec,
                      _proc_pid, 15.0, failing)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def qemu_harness(tmp: Path) -> Iterator[Harness]:
    if not shutil.which("qemu-system-x86_64"):
        pytest.skip("qemu-system-x86_64 is not installed (run scripts/setup.sh)")
    from tkbox import paths
    from tkbox.image.initramfs import build
    from tkbox.image.kernel import find_kernel
    from tkbox.vm.qemu import QemuLauncher, decide_accel

    kernel = find_kernel()
    cache = paths.private_dir(paths.guest_build())
    guest = build(cache, kernel=kernel)
    launcher = QemuLauncher(decide_accel(kernel.version, cache), templates=None)
    work = _short_dir("tkc-q-")

    def spec(name: str) -> VMSpec:
        return VMSpec(name=name, kernel=guest.kernel, initramfs=guest.initramfs,
                      workdir=work / name, memory_mib=512)

    def failing(_: Path) -> VMSpec:
        return VMSpec(name="failing", kernel=work / "no-such-kernel",
                      initramfs=guest.initramfs, workdir=work / "failing", memory_mib=256)

    try:
        yield Harness("qemu", launcher, spec, _proc_pid, 300.0, failing)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def jailed_qemu_harness(tmp: Path) -> Iterator[Harness]:
    """Real QEMU in its cell (`tkbox.vm.jail`), as `tkbox daemon` runs it by default:
    the process the launcher holds is the jailer, QEMU its child in its namespaces."""
    from tkbox import paths
    from tkbox.vm.jail import JailConfig, decide
    from tkbox.vm.qemu import qemu_binary

    if not shutil.which("qemu-system-x86_64"):
        pytest.skip("qemu-system-x86_64 is not installed (run scripts/setup.sh)")
    jail = decide(JailConfig(), qemu_binary(), paths.private_dir(paths.guest_build()))
    if not jail.on:
        pytest.skip(f"this host cannot jail a VMM: {jail.summary()}")
    with qemu_harness(tmp) as h:
        h.launcher.jail = jail  # type: ignore[attr-defined]
        h.name = "qemu-jailed"
        # QEMU itself, the jailer's child: it too must be gone and reaped, not left a
        # zombie for init once the jailer has ended.
        h.pid = lambda vm: getattr(vm, "vmm_pid", None)
        yield h


HARNESSES = {
    "fake": fake_harness,
    "firecracker": firecracker_harness,
    "firecracker-jailed": jailed_firecracker_harness,
    "qemu": qemu_harness,
    "qemu-jailed": jailed_qemu_harness,
}


@pytest.fixture(params=[
    pytest.param("fake", marks=pytest.mark.integration),
    pytest.param("firecracker", marks=pytest.mark.integration),
    pytest.param("firecracker-jailed", marks=pytest.mark.integration),
    pytest.param("qemu", marks=pytest.mark.e2e),
    pytest.param("qemu-jailed", marks=pytest.mark.e2e),
])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with HARNESSES[request.param](tmp_path) as h:
        yield h


def run(coro: Coroutine[Any, Any, None], timeout: float) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(timeout):
            await coro

    asyncio.run(bounded())


class BootListener:
    """Port 1026, served in `before_boot`: notes the guest's first stream and holds
    it until `release` (then the guest, given no config, powers off)."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.served_before_start_returned = False
        self.cancelled = False

    def before_boot(self, ports: Ports) -> None:
        ports.serve(PORT_BOOT, self.handle)
        self.served_before_start_returned = True

    async def handle(self, stream: ByteStream) -> None:
        self.reached.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            await stream.aclose()


def reaped(pid: int | None) -> bool:
    """The process is gone and reaped (no zombie left for us to collect)."""
    if pid is None:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return True
    # A recycled pid would not be our child; ours would show as Z until reaped.
    return fields[0] != "Z" and int(fields[1]) != os.getpid()


def processes_in(directory: Path) -> list[int]:
    """Pids whose working directory is `directory` (a VMM left behind)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if Path(os.readlink(entry / "cwd")) == directory.resolve():
                    found.append(int(entry.name))
    return found


def leftover_tasks() -> list[asyncio.Task[Any]]:
    me = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not me and not t.done()]


async def assert_ended(vm: VM, harness: Harness, pid: int | None) -> None:
    assert reaped(pid), f"{harness.name}: the VMM {pid} was not reaped"
    with pytest.raises(TransportClosed):
        await vm.ports.connect(PORT_RPC)
    with pytest.raises(VMEnded):
        await vm.pause()
    with pytest.raises(VMEnded):
        await vm.resume()
    assert leftover_tasks() == [], f"{harness.name}: tasks outlived the VM"


# --- the suite ------------------------------------------------------------------------


def test_before_boot_listener_gets_the_first_stream_and_the_exit_is_reported(
    harness: Harness,
) -> None:
    """The guest's first act (port 1026) finds the listener served in before_boot;
    when the guest ends by itself, every waiter gets its exit status."""

    async def main() -> None:
        boot = BootListener()
        spec = harness.spec("ends")
        vm = await harness.launcher.start(spec, before_boot=boot.before_boot)
        pid = harness.pid(vm)
        try:
            assert boot.served_before_start_returned
            if pid is not None:
                assert stat.S_IMODE(spec.workdir.stat().st_mode) == 0o700
            await asyncio.wait_for(boot.reached.wait(), harness.boot_timeout)
            boot.release.set()  # no config: the guest powers off
            first, second = await asyncio.gather(vm.wait(), vm.wait())
            assert first == second == 0, f"{harness.name}: exit {first}, {second}"
            assert await vm.wait() == 0  # as often as asked
            await assert_ended(vm, harness, pid)
        finally:
            await vm.kill()

    run(main(), harness.boot_timeout + 60)


def test_kill_is_idempotent_reaps_and_is_reported(harness: Harness) -> None:
    """Pause and resume a running guest, then kill it twice: the VMM is reaped, the
    status says it was killed, and the stream it held is cancelled, not left open."""

    async def main() -> None:
        boot = BootListener()
        vm = await harness.launcher.start(harness.spec("killed"), before_boot=boot.before_boot)
        pid = harness.pid(vm)
        try:
            await asyncio.wait_for(boot.reached.wait(), harness.boot_timeout)
            await vm.pause()
            await vm.resume()
        finally:
            await vm.kill()
        await vm.kill()  # idempotent
        assert await vm.wait() == -9, harness.name
        assert boot.cancelled, f"{harness.name}: the held stream's handler outlived the VM"
        await assert_ended(vm, harness, pid)

    run(main(), harness.boot_timeout + 60)


def test_kill_right_after_start_leaves_nothing(harness: Harness) -> None:
    """A box stopped before its guest is up: nothing is left running or unreaped."""

    async def main() -> None:
        spec = harness.spec("early")
        vm = await harness.launcher.start(spec, before_boot=BootListener().before_boot)
        pid = harness.pid(vm)
        await vm.kill()
        assert await vm.wait() == -9, harness.name
        await assert_ended(vm, harness, pid)
        assert processes_in(spec.workdir) == []

    run(main(), 120)


def test_a_start_that_fails_raises_a_host_error_and_leaves_no_process(
    harness: Harness, tmp_path: Path,
) -> None:
    if harness.can_fail_to_start is None:
        pytest.skip(f"the {harness.name} launcher has no VMM process that can fail to start")
    spec = harness.can_fail_to_start(tmp_path)

    async def main() -> None:
        with pytest.raises(HostError):
            await harness.launcher.start(spec, before_boot=BootListener().before_boot)
        assert processes_in(spec.workdir) == []
        assert leftover_tasks() == []

    run(main(), 120)
