"""Guest agents for tests above the launcher: one that behaves, several that attack."""

from __future__ import annotations

import asyncio
import os
import struct
from typing import Any

import msgpack

from tkbox.guest.testing import answer_diff
from tkbox.protocol.framing import FramedStream, encode
from tkbox.protocol.mux import HEADER, MuxPorts, T
from tkbox.protocol.ports import PORT_BOOT, PORT_EGRESS, PORT_RPC
from tkbox.protocol.streams import ByteStream
from tkbox.vm.base import VMSpec

PATCH = (b"diff --git a/hello.txt b/hello.txt\nnew file mode 100644\n"
         b"index 0000000000000000000000000000000000000000.."
         b"ce013625030ba8dba906f756967f9e9ca394464a\n"
         b"--- /dev/null\n+++ b/hello.txt\n@@ -0,0 +1 @@\n+hello\n")


async def boot(ports: MuxPorts) -> dict[str, Any]:
    fs = FramedStream(await ports.connect(PORT_BOOT))
    cfg = await fs.receive()
    await fs.send({"ev": "ready", "uptime": 0.01})
    await fs.aclose()
    assert cfg is not None
    return cfg


async def serve_forever(ports: MuxPorts, handler: Any) -> None:
    ports.serve(PORT_RPC, handler)
    await asyncio.Event().wait()


async def polite_rpc(stream: ByteStream, patch: bytes = PATCH) -> None:
    fs = FramedStream(stream)
    req = await fs.receive()
    if req is None:
        return
    op = req.get("op")
    if op == "ping":
        await fs.send({"ev": "ok", "uptime": 1.0})
    elif op == "exec":
        await fs.send({"ev": "started", "pid": 2})
        if req.get("stdin"):
            while (m := await fs.receive()) is not None and m.get("op") != "stdin_eof":
                if m.get("op") == "stdin":
                    await fs.send({"ev": "out", "fd": 1, "data": m["data"]})
        else:
            await fs.send({"ev": "out", "fd": 1, "data": " ".join(req["argv"]).encode() + b"\n"})
        await fs.send({"ev": "exit", "status": 0, "signal": 0})
    elif op == "diff":
        await answer_diff(fs, req, patch)
    elif op == "shutdown":
        await fs.send({"ev": "ok"})
        raise SystemExit


async def polite(ports: MuxPorts, spec: VMSpec) -> None:
    await boot(ports)
    done = asyncio.Event()

    async def handler(stream: ByteStream) -> None:
        try:
            await polite_rpc(stream)
        except SystemExit:
            done.set()

    ports.serve(PORT_RPC, handler)
    await done.wait()


def hostile(kind: str) -> Any:
    """A guest that boots politely, then answers every RPC with an attack."""
    done = asyncio.Event()

    async def rpc(stream: ByteStream) -> None:
        fs = FramedStream(stream)
        req = await fs.receive()
        if req is None:
            return
        if req.get("op") in ("diff", "shutdown") and kind != "not-a-patch":
            await polite_rpc_again(fs, req)
            return
        if kind == "oversized-frame":
            await stream.send_all(struct.pack(">I", 2 << 20) + b"\x80" * 1024)
        elif kind == "truncated-frame":
            frame = encode({"ev": "started", "pid": 2})
            await stream.send_all(frame[: len(frame) // 2])
        elif kind == "garbage":
            await stream.send_all(os.urandom(4096))
        elif kind == "never-answers":
            await asyncio.sleep(3600)
        elif kind == "flood":
            await fs.send({"ev": "started", "pid": 2})
            chunk = encode({"ev": "out", "fd": 1, "data": b"F" * 200_000})
            for _ in range(200):  # 40 MB of output: must stream, not pile up
                await stream.send_all(chunk)
            await fs.send({"ev": "exit", "status": 0, "signal": 0})
        elif kind == "nested":
            # 1 MiB of tiny containers: half a second of the loop to build, if decoded
            await fs.send({"ev": "started", "pid": 2})
            body = msgpack.packb({"ev": "out", "fd": 1, "data": [[[]] * 15] * 60000})
            await stream.send_all(struct.pack(">I", len(body)) + body)
        elif kind == "unknown-key":
            await fs.send({"ev": "started", "pid": 2})
            await fs.send({"ev": "out", "fd": 1, "data": b"x", "smuggled": b"y" * 1000})
        elif kind == "wrong-events":
            await fs.send({"ev": "started", "pid": 2})
            await fs.send({"ev": "out", "fd": 7, "data": "not bytes"})
        elif kind == "not-a-patch":
            if req.get("op") == "diff":
                await answer_diff(fs, req, b"this is not a patch\n\x00\xff")
            else:
                await polite_rpc_again(fs, req)
        await asyncio.sleep(0.1)

    async def polite_rpc_again(fs: FramedStream, req: dict[str, Any]) -> None:
        if req.get("op") == "diff":
            await answer_diff(fs, req, PATCH)
        elif req.get("op") == "shutdown":
            await fs.send({"ev": "ok"})
            done.set()
        else:
            await fs.send({"ev": "error", "message": "no"})

    async def agent(ports: MuxPorts, spec: VMSpec) -> None:
        await boot(ports)
        ports.serve(PORT_RPC, rpc)
        await done.wait()

    return agent


async def link_flooder(ports: MuxPorts, spec: VMSpec) -> None:
    """Breaks the mux itself: data on a stream far past its credit."""
    await boot(ports)
    ports.serve(PORT_RPC, lambda s: asyncio.sleep(0))
    sid = 1000  # an unused guest-side id; frames forged straight onto the link
    link = ports._link
    # The attacker owns its link: stop its own mux writing, so no frame of ours is cut
    # into the forged ones when the host reads slowly (under its work budget).
    ports._fail("the guest forges frames itself")
    await asyncio.sleep(0.05)
    await link.send_all(HEADER.pack(T.OPEN, sid, 4) + struct.pack(">I", 1025))
    for _ in range(64):
        await link.send_all(HEADER.pack(T.DATA, sid, 65536) + b"Z" * 65536)
    # If the host already closed that stream (it refuses egress while the box boots),
    # data past the credit is for a stream it forgot, which is no violation: end with a
    # frame that is one in any state.
    await link.send_all(HEADER.pack(99, sid, 0))
    await asyncio.Event().wait()


# --- guests that attack the host's resources (issue 10) -----------------------------


def trickler(interval: float = 0.05) -> Any:
    """Answers `diff` (and `read`) with its patch one byte a frame, slowly, for ever."""
    done = asyncio.Event()

    async def rpc(stream: ByteStream) -> None:
        try:
            await polite_rpc_trickle(stream)
        except SystemExit:
            done.set()

    async def polite_rpc_trickle(stream: ByteStream) -> None:
        fs = FramedStream(stream)
        req = await fs.receive()
        if req is not None and req.get("op") in ("diff", "read"):
            if req.get("op") == "diff":
                # one whole file first: a stop cut short keeps it
                await answer_diff_start(fs, req, PATCH)
            for i in range(10**9):
                await fs.send({"ev": "data", "data": PATCH[i % len(PATCH):][:1]})
                await asyncio.sleep(interval)
        elif req is not None:
            await _answer(fs, req)

    async def agent(ports: MuxPorts, spec: VMSpec) -> None:
        await boot(ports)
        ports.serve(PORT_RPC, rpc)
        await done.wait()

    return agent


async def answer_diff_start(fs: FramedStream, req: dict[str, Any], *whole: bytes) -> None:
    """The start of a `diff` answer: no changed paths to ask about, then each of `whole`
    as one file (a `mark` after it); the caller sends what comes next."""
    if req.get("ask_ignored"):
        await fs.send({"ev": "paths_end", "count": 0})
        await fs.receive()
    for data in whole:
        await fs.send({"ev": "data", "data": data})
        await fs.send({"ev": "mark"})


def diff_by(answer: Any) -> Any:
    """A polite guest whose `diff` is answered by `await answer(fs, req)`, which may
    return early or break the stream (the connection is closed after it)."""
    done = asyncio.Event()

    async def rpc(stream: ByteStream) -> None:
        fs = FramedStream(stream)
        req = await fs.receive()
        if req is not None and req.get("op") == "diff":
            try:
                await answer(fs, req)
            finally:
                await fs.aclose()
        elif req is not None:
            try:
                await _answer(fs, req)
            except SystemExit:
                done.set()

    async def agent(ports: MuxPorts, spec: VMSpec) -> None:
        await boot(ports)
        ports.serve(PORT_RPC, rpc)
        await done.wait()

    return agent


def cut_off(*whole: bytes, then: bytes) -> Any:
    """Answers `diff` with each of `whole` as a file, then `then` (the start of another
    file), then closes the connection: a guest that dies in the middle of its patch."""
    async def answer(fs: FramedStream, req: dict[str, Any]) -> None:
        await answer_diff_start(fs, req, *whole)
        await fs.send({"ev": "data", "data": then})

    return diff_by(answer)


async def _answer(fs: FramedStream, req: dict[str, Any]) -> None:
    op = req.get("op")
    if op == "exec":
        await fs.send({"ev": "started", "pid": 2})
        await fs.send({"ev": "exit", "status": 0, "signal": 0})
    elif op == "diff":
        await answer_diff(fs, req, PATCH)
    elif op == "shutdown":
        await fs.send({"ev": "ok"})
        raise SystemExit
    elif op == "ping":
        await fs.send({"ev": "ok", "uptime": 1.0})


def answering(extra: Any) -> Any:
    """A polite agent that also runs `extra(ports)` once booted (the attack)."""
    done = asyncio.Event()

    async def rpc(stream: ByteStream) -> None:
        fs = FramedStream(stream)
        req = await fs.receive()
        if req is None:
            return
        try:
            await _answer(fs, req)
        except SystemExit:
            done.set()

    async def agent(ports: MuxPorts, spec: VMSpec) -> None:
        await boot(ports)
        ports.serve(PORT_RPC, rpc)
        attack = asyncio.ensure_future(extra(ports))
        try:
            await done.wait()
        finally:
            attack.cancel()

    return agent


async def hog_streams(ports: MuxPorts) -> None:
    """Open every egress stream the mux lets the guest have, and hold them all."""
    await asyncio.sleep(0.5)  # the box is running (before, its egress streams are refused)
    held = []
    while True:
        try:
            held.append(await ports.connect(PORT_EGRESS))
        except Exception:  # noqa: BLE001 - the limit (or a refusal) ends the grab
            break
    ports.hogged = len(held)  # type: ignore[attr-defined]
    await asyncio.Event().wait()


async def flood_refusals(ports: MuxPorts) -> None:
    """One bad request after another, each quoting 8 KB of guest bytes in h11's message."""
    line = b"GET\tx " + b"a" * 8000 + b" HTTP/1.1\r\n\r\n"
    while True:
        try:
            s = await ports.connect(PORT_EGRESS)
        except Exception:  # noqa: BLE001 - the transport is gone: the box was stopped
            return
        try:
            await s.send_all(line)
            while await s.receive():
                pass
        except Exception:  # noqa: BLE001, S110 - a cut stream: open the next one
            pass
        await s.aclose()


def stop_reading(ports: MuxPorts) -> None:
    """The guest stops reading its port: the host's frames to it pile up on the link."""

    async def never(max_bytes: int = 65536) -> bytes:
        await asyncio.Event().wait()
        return b""

    ports._link.receive = never  # type: ignore[method-assign]


async def open_flood_without_reading(ports: MuxPorts) -> None:
    """OPENs to a port nobody serves, forged on the link, while never reading it."""
    await asyncio.sleep(0.3)
    stop_reading(ports)
    ports._fail("the guest forges frames itself")  # its own writer must not interleave
    link = ports._link
    sid = 1_000_000
    while True:
        await link.send_all(b"".join(HEADER.pack(T.OPEN, sid + 2 * i, 4) + struct.pack(">I", 4242)
                                     for i in range(1000)))
        sid += 2000
