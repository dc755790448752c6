"""The sockets QEMU's chardevs connect to (`tkbox.vm.qemu._Listeners`): bound by the
daemon before QEMU starts, one connection each, only from QEMU's own pid.

A stand-in process plays QEMU (it connects as QEMU's `server=off` chardev does);
no VM is booted here (tests/conformance/test_launcher.py boots real QEMU)."""

from __future__ import annotations

import asyncio
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tkbox.protocol.tasks import TaskOwner
from tkbox.vm.errors import VMError
from tkbox.vm.qemu import _ending, _Listeners

pytestmark = pytest.mark.integration

CLIENT = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode())
time.sleep(float(sys.argv[3]))
"""


def stand_in(path: Path, says: str, linger: float = 5.0) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", CLIENT, str(path), says, str(linger)])


def test_only_the_vmms_own_connection_is_taken(tmp_path: Path) -> None:
    """Attack: another local process connects to a box's mux socket before QEMU does,
    to pose as the box's guest. Its connection is closed; QEMU's is taken."""
    work = tmp_path / "vm"
    work.mkdir(mode=0o700)

    async def main() -> None:
        listeners = _Listeners(work, ("mux.sock",))
        assert stat.S_IMODE((work / "mux.sock").stat().st_mode) == 0o600
        impostor = stand_in(work / "mux.sock", "impostor")
        qemu = None
        try:
            await asyncio.sleep(0.5)  # the impostor is queued first
            qemu = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CLIENT, str(work / "mux.sock"), "qemu", "5")
            owner = TaskOwner("t")
            reader, writer = await listeners.accept("mux.sock", _ending(qemu, owner), qemu.pid)
            assert await reader.readexactly(4) == b"qemu"
            writer.close()
            assert not (work / "mux.sock").exists()  # one connection, then gone
            qemu.kill()
            await qemu.wait()
            await owner.aclose()
        finally:
            impostor.kill()
            impostor.wait()
            listeners.close()

    asyncio.run(main())


def test_a_vmm_that_ends_before_connecting_is_a_vm_error(tmp_path: Path) -> None:
    work = tmp_path / "vm"
    work.mkdir(mode=0o700)

    async def main() -> None:
        listeners = _Listeners(work, ("console.sock",))
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "raise SystemExit(7)")
        owner = TaskOwner("t")
        with pytest.raises(VMError, match="QEMU exited at start \\(status 7\\)"):
            await listeners.accept("console.sock", _ending(proc, owner), proc.pid)
        await owner.aclose()
        listeners.close()
        assert not (work / "console.sock").exists()

    asyncio.run(main())


def test_a_socket_path_in_the_way_is_replaced_not_followed(tmp_path: Path) -> None:
    """A stale socket (from a VM that died with this directory) is removed and
    bound afresh; the listener is ours."""
    work = tmp_path / "vm"
    work.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(work / "mux.sock"))
    stale.close()
    listeners = _Listeners(work, ("mux.sock",))
    try:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(work / "mux.sock"))  # listening: a fresh socket, not the stale one
        probe.close()
    finally:
        listeners.close()
