"""Benchmark: box B's `exec true` while box A abuses the host, against B alone.

One daemon (`BoxManager`, one event loop, as in `tkbox daemon`), a fake
signer in memory, and boxes behind the real serial mux. Box B is a polite
agent (a coroutine on an in-memory link, the fake launcher). Each attacking
box A is a guest in a process of its own, as a VM would be, on a socketpair
that carries the mux (the host reads it as it reads QEMU's serial socket).
Once B's idle figure is taken, one box A per attack is started, and attacks:

- `open-flood`: stops reading its port and opens streams to a port nobody
  serves (each OPEN makes the host owe a RESET);
- `tiny-frames`: a stream of one-byte mux DATA frames (9-byte header each);
- `tiny-answers`: during an `exec`, an endless run of small msgpack `out`
  frames, read by a client as fast as the daemon gives them;
- `nested`: during an `exec`, 1 MiB frames of tiny containers, again and again;
- `unread-streams`: opens streams and fills their windows while nobody reads.

The figure is the median wall time of B's `exec true` through
`BoxManager.exec` (Bash decision at the fake signer, RPC stream over the mux,
the agent's answer, the completion record), over `--runs` sequential runs.
Printed: B idle, B during each attack, and the ratio (goal: within 2x). The
machine's other load is not controlled: run it twice if a figure looks odd.

    .venv/bin/python benchmarks/guest_abuse.py [--runs 60] [--no-budget]

`--no-budget` gives each box A an unlimited work budget (the other bounds
stay), to show what the budget buys.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from tkbox.daemon.manager import BoxManager, BoxSpec, Options
from tkbox.daemon.testing import FakeBuild, FakeBuilder, FakeImages
from tkbox.protocol.budget import Budget
from tkbox.protocol.framing import FramedStream, encode
from tkbox.protocol.mux import HEADER, MuxPorts, T
from tkbox.protocol.ports import PORT_BOOT, PORT_EGRESS, PORT_RPC
from tkbox.protocol.streams import AsyncioStream, ByteStream
from tkbox.record.testing import FakeSigner
from tkbox.vm.base import VM, BeforeBoot, Launcher, VMSpec
from tkbox.vm.fake import FakeLauncher


async def boot(ports: MuxPorts) -> None:
    fs = FramedStream(await ports.connect(PORT_BOOT))
    await fs.receive()
    await fs.send({"ev": "ready", "uptime": 0.01})
    await fs.aclose()


async def polite_rpc(stream: ByteStream) -> None:
    fs = FramedStream(stream)
    req = await fs.receive()
    if req is not None and req.get("op") == "exec":
        await fs.send({"ev": "started", "pid": 2})
        await fs.send({"ev": "exit", "status": 0, "signal": 0})


NO_BUDGET = "--no-budget" in sys.argv
ATTACK: dict[str, str] = {"mode": "idle"}  # in the attacker's process: its one attack


def raw_opens(n: int, port: int, first: int) -> bytes:
    return b"".join(HEADER.pack(T.OPEN, first + 2 * i, 4) + struct.pack(">I", port)
                    for i in range(n))


async def attacker(ports: MuxPorts, spec: VMSpec) -> None:
    """Box A: boots politely, then does whatever ATTACK says, as fast as it can."""
    await boot(ports)
    link = ports._link  # the guest's end of the link: raw frames go straight onto it

    async def rpc(stream: ByteStream) -> None:
        fs = FramedStream(stream)
        req = await fs.receive()
        if req is None or req.get("op") != "exec":
            return
        await fs.send({"ev": "started", "pid": 2})
        if ATTACK["mode"] == "tiny-answers":
            blob = encode({"ev": "out", "fd": 1, "data": b"x"}) * 4000
            while True:
                await stream.send_all(blob)
        elif ATTACK["mode"] == "nested":
            body = msgpack.packb({"ev": "out", "fd": 1, "data": [[[]] * 15] * 60000})
            await stream.send_all(struct.pack(">I", len(body)) + body)
        await asyncio.sleep(3600)

    ports.serve(PORT_RPC, rpc)
    sid = 1_000_000
    while True:
        mode = ATTACK["mode"]
        if mode == "open-flood":
            async def never(max_bytes: int = 65536) -> bytes:
                await asyncio.Event().wait()
                return b""

            link.receive = never  # type: ignore[method-assign]  # stop reading the port
            while ATTACK["mode"] == mode:
                await link.send_all(raw_opens(2000, 4242, sid))
                sid += 4000
        elif mode == "tiny-frames":
            blob = (HEADER.pack(T.DATA, 999_999_998, 1) + b"x") * 6500
            while ATTACK["mode"] == mode:
                await link.send_all(blob)
        elif mode == "unread-streams":
            chunk = b"Z" * 65536
            while ATTACK["mode"] == mode:
                frames = [raw_opens(1, PORT_EGRESS, sid)]
                frames += [HEADER.pack(T.DATA, sid, len(chunk)) + chunk] * 4
                sid += 2
                await link.send_all(b"".join(frames))
        else:
            await asyncio.sleep(0.05)


class ProcessVM(VM):
    """An attacking guest in a child process, its mux on a socketpair (like a VM's port)."""

    def __init__(self, mode: str, ports: MuxPorts, proc: subprocess.Popen[bytes],
                 task: asyncio.Task[None]) -> None:
        self.mode, self.ports, self.proc, self._task = mode, ports, proc, task

    @property
    def accel(self) -> str:
        return "process"

    async def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    async def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.wait()

    async def wait(self) -> int:
        code = await asyncio.to_thread(self.proc.wait)
        await self.ports.aclose()
        self._task.cancel()
        return code


class SplitLauncher(Launcher):
    """Box `b` in-process (fake launcher); boxes `a-<attack>` each in a process of its own."""

    name = "split"

    def __init__(self) -> None:
        self.fake = FakeLauncher(polite)

    async def start(self, spec: VMSpec, *, before_boot: BeforeBoot | None = None) -> VM:
        if not spec.name.startswith("a-"):
            return await self.fake.start(spec, before_boot=before_boot)
        ours, theirs = socket.socketpair()
        proc = subprocess.Popen([sys.executable, __file__, "--guest", spec.name[2:],
                                 "--fd", str(theirs.fileno())], pass_fds=[theirs.fileno()])
        theirs.close()
        reader, writer = await asyncio.open_connection(sock=ours)
        ports = MuxPorts(AsyncioStream(reader, writer), initiator=True,
                         budget=Budget.unlimited() if NO_BUDGET else None)
        if before_boot is not None:
            before_boot(ports)  # before the engine reads: the launcher contract
        task = asyncio.ensure_future(ports.run())
        return ProcessVM(spec.name, ports, proc, task)


async def guest_main(mode: str, fd: int) -> None:
    """The attacker's process: its own event loop, its own end of the mux."""
    ATTACK["mode"] = mode
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_connection(sock=sock)
    ports = MuxPorts(AsyncioStream(reader, writer), initiator=False, max_own=1024)
    task = asyncio.ensure_future(ports.run())
    await attacker(ports, VMSpec(name="a", kernel=None, initramfs=None,  # type: ignore[arg-type]
                                 workdir=None, disks=()))  # type: ignore[arg-type]
    task.cancel()


async def polite(ports: MuxPorts, spec: VMSpec) -> None:
    await boot(ports)
    ports.serve(PORT_RPC, polite_rpc)
    await asyncio.Event().wait()


async def exec_true(m: BoxManager, name: str) -> float:
    t0 = time.perf_counter()
    async for ev in m.exec(name, ["true"], None, None, None):
        last = ev
    if last.get("ev") != "exit":
        raise SystemExit(f"exec in {name} failed: {last}")
    return time.perf_counter() - t0


async def median_exec(m: BoxManager, name: str, runs: int) -> float:
    times = [await exec_true(m, name) for _ in range(runs)]
    return statistics.median(times)


async def drain_exec(m: BoxManager, name: str) -> None:
    """A client reading box A's abusive exec as fast as the daemon gives it."""
    while True:
        with contextlib.suppress(Exception):
            async for _ in m.exec(name, ["yes"], None, None, None):
                pass
        await asyncio.sleep(0.01)


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tkbench-") as tmp:
        root = Path(tmp)
        ws = root / "ws"
        ws.mkdir()
        (ws / "a.txt").write_text("a\n")

        m = BoxManager(launcher=SplitLauncher(), signer=FakeSigner(), options=Options(),
                       images=FakeImages(root),
                       guest_build=FakeBuilder(FakeBuild(root / "k", root / "i")),
                       home=root / "home")
        await m.create(BoxSpec(name="b", image="x", workspace=str(ws), disk_mib=64))
        for _ in range(5):
            await exec_true(m, "b")  # warm up
        idle = await median_exec(m, "b", runs)
        print(f"box B exec true, idle: {idle * 1000:.2f} ms (median of {runs})")
        rows: list[tuple[str, float, Any]] = []
        for mode in ("tiny-frames", "tiny-answers", "nested", "unread-streams", "open-flood"):
            name = f"a-{mode}"
            await m.create(BoxSpec(name=name, image="x", workspace=str(ws), disk_mib=64))
            reader = None
            if mode in ("tiny-answers", "nested"):
                reader = asyncio.ensure_future(drain_exec(m, name))
            await asyncio.sleep(1.0)  # let the attack reach full speed
            busy = await median_exec(m, "b", runs)
            vm = m.get(name).vm
            assert vm is not None and isinstance(vm.ports, MuxPorts) and vm.ports.budget
            ports = vm.ports
            rows.append((mode, busy, ports))
            print(f"  during {mode:15s}: {busy * 1000:7.2f} ms  ratio {busy / idle:4.2f}x  "
                  f"(box A throttled {ports.budget.throttled:6.2f} s, reads paused "
                  f"{ports.paused_reads}x, box A {m.get(name).state})")
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(BaseException):
                    await reader
            await m.rm(name, force=True)
        worst = max(r[1] for r in rows) / idle
        print(f"worst ratio: {worst:.2f}x (goal: within 2x of idle)")
        for name in list(m.boxes):
            await m.rm(name, force=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--no-budget", action="store_true", help="box A without a work budget")
    ap.add_argument("--guest", help=argparse.SUPPRESS)  # internal: run one attacker
    ap.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.guest:
        with contextlib.suppress(Exception, KeyboardInterrupt):
            asyncio.run(guest_main(args.guest, args.fd))
        os._exit(0)
    asyncio.run(main(args.runs))
