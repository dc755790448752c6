"""FirecrackerLauncher driving a fake `firecracker` process, end to end.

The fake (tests/unit/vm/fake_firecracker.py) serves the API on its
Unix socket, checks every request against Firecracker's OpenAPI description,
records them, and plays the hybrid vsock device with a tiny guest on port
1024. So the launcher's real process handling runs here: start, configure,
ports over CONNECT/OK both ways, pause, resume, kill, reap, and what the VMM
process must not inherit. The real binary is exercised per docs/firecracker.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest

from tkbox.errors import HostError
from tkbox.protocol.ports import PortError, Ports
from tkbox.protocol.streams import ByteStream
from tkbox.vm import firecracker
from tkbox.vm.base import Disk, VMSpec
from tkbox.vm.firecracker import FirecrackerLauncher, FirecrackerVM, build_requests

pytestmark = pytest.mark.integration

FAKE = Path(__file__).resolve().parents[2] / "unit" / "vm" / "fake_firecracker.py"


def run(coro: Coroutine[Any, Any, None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(30):
            await coro

    asyncio.run(bounded())


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    """An executable `firecracker` that is the fake (exec'd, so the pid is the fake's)."""
    path = tmp_path / "bin" / "firecracker"
    path.parent.mkdir()
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    path.chmod(0o755)
    return path


def make_spec(tmp_path: Path, name: str = "demo") -> VMSpec:
    files = tmp_path / "files"
    files.mkdir(exist_ok=True)
    (files / "vmlinux").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(57))
    (files / "initramfs").write_bytes(b"070701")
    for disk in ("root", "lower", "upper"):
        (files / f"{disk}.img").write_bytes(bytes(4096))
    return VMSpec(
        name=name,
        kernel=files / "vmlinux",
        initramfs=files / "initramfs",
        workdir=tmp_path / "vm",
        disks=(
            Disk(files / "root.img", True, "root"),
            Disk(files / "lower.img", True, "lower"),
            Disk(files / "upper.img", False, "upper"),
        ),
        memory_mib=512,
        vcpus=2,
        cmdline="tkbox.boot=1",
    )


@contextlib.asynccontextmanager
async def booted(binary: Path, spec: VMSpec, **kwargs: Any) -> AsyncIterator[FirecrackerVM]:
    """A started VM that is killed however the test ends."""
    vm = await FirecrackerLauncher(binary).start(spec, **kwargs)
    try:
        yield vm
    finally:
        await vm.kill()


def recorded(spec: VMSpec) -> list[dict[str, Any]]:
    lines = (spec.workdir / "fake-requests.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def proc_facts(spec: VMSpec) -> dict[str, Any]:
    return json.loads((spec.workdir / "fake-proc.json").read_text())  # type: ignore[no-any-return]


async def rpc(ports: Ports, line: bytes) -> bytes:
    stream = await ports.connect(1024)
    await stream.send_all(line + b"\n")
    parts = []
    while chunk := await stream.receive():
        parts.append(chunk)
    await stream.aclose()
    return b"".join(parts)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_start_configures_firecracker_and_boots(binary: Path, tmp_path: Path) -> None:
    spec = make_spec(tmp_path)

    async def main() -> None:
        async with booted(binary, spec) as vm:
            assert vm.running and vm.accel == "kvm"
            # Every request passed the fake's OpenAPI check (it answers 400 otherwise).
            calls = [
                (r["method"], r["path"], r["body"]) for r in recorded(spec) if r["method"] != "GET"
            ]
            assert calls == [tuple(c) for c in build_requests(spec)]
            assert all(r["status"] in (200, 204) for r in recorded(spec))
            assert await rpc(vm.ports, b"echo hello guest") == b"hello guest"

    run(main())


def test_vmm_process_is_private_and_inherits_no_descriptors(
    binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The VMM must not get the daemon's open files or sockets (an inherited
    API-socket or signer descriptor would be a way out), nor its environment
    (which may hold secret values)."""
    spec = make_spec(tmp_path)
    monkeypatch.setenv("TKBOX_TEST_SECRET_VALUE", "s3cr3t")
    r, w = os.pipe()
    os.set_inheritable(r, True)
    os.set_inheritable(w, True)

    async def main() -> None:
        async with booted(binary, spec) as vm:
            facts = proc_facts(spec)
            assert facts["fds"] == [0, 1, 2]
            assert facts["cwd"] == str(spec.workdir.absolute())
            assert stat.S_IMODE(spec.workdir.stat().st_mode) == 0o700
            assert facts["pid"] == vm.proc.pid
            assert facts["pgid"] == facts["pid"] == facts["sid"]  # own session and group
            assert "TKBOX_TEST_SECRET_VALUE" not in facts["env"]
            assert facts["argv"] == ["--api-sock", str(spec.workdir.absolute() / "fc.sock"),
                                     "--id", "demo"]

    try:
        run(main())
    finally:
        os.close(r)
        os.close(w)


def test_host_and_guest_ports_over_the_fake_vsock(binary: Path, tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    got: list[bytes] = []

    async def boot_config(stream: ByteStream) -> None:
        parts = []
        while chunk := await stream.receive():
            parts.append(chunk)
        got.append(b"".join(parts))
        await stream.send_all(b"here is your config")
        await stream.aclose()

    def before_boot(ports: Ports) -> None:
        ports.serve(1026, boot_config)

    async def main() -> None:
        async with booted(binary, spec, before_boot=before_boot) as vm:
            listener = spec.workdir / "v.sock_1026"
            assert stat.S_IMODE(listener.lstat().st_mode) == 0o600
            assert await rpc(vm.ports, b"dial 1026 may I have my config") == b"here is your config"
            assert got == [b"may I have my config"]
            # Nothing serves 1025 yet: the guest's connect is refused, as Firecracker does.
            assert (await rpc(vm.ports, b"dial 1025 x")).startswith(b"RST")
            # A guest port nobody listens on: the VMM closes without OK.
            with pytest.raises(PortError, match="refused"):
                await vm.ports.connect(1030)
            await vm.kill()
            assert not listener.exists()

    run(main())


def test_pause_and_resume_patch_the_vm_state(binary: Path, tmp_path: Path) -> None:
    spec = make_spec(tmp_path)

    async def main() -> None:
        async with booted(binary, spec) as vm:
            await vm.pause()
            await vm.resume()
            patches = [(r["method"], r["path"], r["body"], r["status"]) for r in recorded(spec)
                       if r["method"] == "PATCH"]
            assert patches == [
                ("PATCH", "/vm", {"state": "Paused"}, 204),
                ("PATCH", "/vm", {"state": "Resumed"}, 204),
            ]
            await vm.kill()
            with pytest.raises(HostError, match="not running"):
                await vm.pause()

    run(main())


def test_kill_ends_the_process_group_reaps_it_and_removes_sockets(
    binary: Path, tmp_path: Path
) -> None:
    spec = make_spec(tmp_path)

    async def main() -> None:
        async with booted(binary, spec) as vm:
            pid = vm.proc.pid
            await vm.kill()
            assert vm.proc.returncode == -signal.SIGKILL
            assert await vm.wait() == -signal.SIGKILL  # again: same answer
            await vm.kill()  # idempotent
            assert gone(pid)
            assert not (spec.workdir / "fc.sock").exists()
            assert not (spec.workdir / "v.sock").exists()
            with pytest.raises(PortError):
                await vm.ports.connect(1024)

    run(main())


def test_wait_reaps_a_vmm_that_ends_by_itself(binary: Path, tmp_path: Path) -> None:
    spec = make_spec(tmp_path)

    async def main() -> None:
        async with booted(binary, spec) as vm:
            assert await rpc(vm.ports, b"exit 7") == b"bye"
            assert await vm.wait() == 7
            assert gone(vm.proc.pid)
            assert not (spec.workdir / "fc.sock").exists()

    run(main())


def test_console_goes_to_a_log_in_the_workdir(binary: Path, tmp_path: Path) -> None:
    spec = make_spec(tmp_path)

    async def main() -> None:
        async with booted(binary, spec) as vm:
            await vm.kill()
            assert b"fake serial console: booting" in (spec.workdir / "console.log").read_bytes()
            assert b"fake firecracker: " in (spec.workdir / "firecracker.log").read_bytes()
            assert stat.S_IMODE((spec.workdir / "console.log").stat().st_mode) == 0o600

    run(main())


def test_guest_console_flood_cannot_fill_the_host_disk(
    binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guest writes the serial console; however much it writes, the host
    keeps at most LOG_CAP bytes of it (and keeps reading, so the VM runs on)."""
    spec = make_spec(tmp_path)
    monkeypatch.setattr(firecracker, "LOG_CAP", 1000)

    async def main() -> None:
        async with booted(binary, spec) as vm:
            assert await rpc(vm.ports, b"console 300000") == b"written"
            assert await rpc(vm.ports, b"echo still running") == b"still running"
            await vm.kill()
            log = (spec.workdir / "console.log").read_bytes()
            assert len(log) <= 1000 + 100
            assert log.endswith(b"[tkbox: output past this point was dropped]\n")

    run(main())


def test_api_fault_is_a_clear_error_and_leaves_no_process(binary: Path, tmp_path: Path) -> None:
    spec = make_spec(tmp_path, name="fault-boot-source")

    async def main() -> None:
        with pytest.raises(
            HostError,
            match=r"Firecracker refused PUT /boot-source \(400\): The kernel file cannot be opened",
        ):
            await FirecrackerLauncher(binary).start(spec)
        assert gone(proc_facts(spec)["pid"])
        assert not (spec.workdir / "fc.sock").exists()

    run(main())


def test_vmm_that_exits_at_start_says_why(binary: Path, tmp_path: Path) -> None:
    spec = make_spec(tmp_path, name="exit-at-start")

    async def main() -> None:
        with pytest.raises(
            HostError,
            match=r"exited at start \(status 1\): Error: the fake was told to fail at start",
        ):
            await FirecrackerLauncher(binary).start(spec)

    run(main())


def test_bzimage_kernel_is_refused_before_anything_starts(binary: Path, tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    spec.kernel.write_bytes(b"MZ" + bytes(510))

    async def main() -> None:
        with pytest.raises(HostError, match="not an ELF vmlinux"):
            await FirecrackerLauncher(binary).start(spec)
        assert not (spec.workdir / "fake-proc.json").exists()

    run(main())


def test_missing_binary_is_a_host_error(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)

    async def main() -> None:
        with pytest.raises(HostError, match="not an executable Firecracker binary"):
            await FirecrackerLauncher(tmp_path / "nope").start(spec)

    run(main())


def test_vmm_does_not_outlive_the_daemon(binary: Path, tmp_path: Path) -> None:
    """A daemon that dies without cleaning up (SIGKILL, crash) must not leave
    a VM running on its own: the VMM gets SIGKILL when its parent dies."""
    spec = make_spec(tmp_path)
    script = textwrap.dedent(
        f"""
        import asyncio, os, sys
        from pathlib import Path
        from tkbox.vm.base import Disk, VMSpec
        from tkbox.vm.firecracker import FirecrackerLauncher

        async def main():
            spec = VMSpec(name="orphan", kernel=Path({str(spec.kernel)!r}),
                          initramfs=Path({str(spec.initramfs)!r}),
                          workdir=Path({str(spec.workdir)!r}))
            vm = await FirecrackerLauncher(Path({str(binary)!r})).start(spec)
            print(vm.proc.pid, flush=True)
            os._exit(0)  # no cleanup, like a crash

        asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=30, check=True
    )
    pid = int(out.stdout.split()[0])
    try:
        deadline = time.monotonic() + 10
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(pid)
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)



def test_binary_that_cannot_run_is_a_host_error(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    junk = tmp_path / "firecracker"
    junk.write_bytes(b"\x00not a program")
    junk.chmod(0o755)

    async def main() -> None:
        with pytest.raises(HostError, match="cannot run .*firecracker"):
            await FirecrackerLauncher(junk).start(spec)

    run(main())
