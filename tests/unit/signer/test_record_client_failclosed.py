"""Security: the real signer client fails closed.

Whatever the signer does (not there, silent, gone mid-answer, garbage, an
answer that is not a decision), every call raises SignerUnavailable, so a door
refuses instead of letting something cross unrecorded. The peer here is a
scripted fake over a socket pair: no signer process, no file system.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tkbox.errors import SignerUnavailable
from tkbox.formats import wire
from tkbox.record.unix import UnixSignerClient

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _Client(UnixSignerClient):
    """The real client, its peer a scripted fake; `aclose` also ends the peers."""

    peers: list[tuple[asyncio.Task[None], asyncio.StreamWriter]]

    async def aclose(self) -> None:
        await super().aclose()
        for task, w in self.peers:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            w.close()


def _client(script: Script, timeout: float = 0.2) -> tuple[_Client, list[int]]:
    opened: list[int] = []
    peers: list[tuple[asyncio.Task[None], asyncio.StreamWriter]] = []

    async def connector() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        r, w = await asyncio.open_unix_connection(sock=b)
        pr, pw = await asyncio.open_unix_connection(sock=a)
        peers.append((asyncio.get_running_loop().create_task(script(pr, pw)), pw))
        opened.append(1)
        return r, w

    c = _Client("/nonexistent", timeout=timeout, connector=connector)
    c.peers = peers
    return c, opened


async def _frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    try:
        (n,) = struct.unpack(">I", await reader.readexactly(4))
        d = wire.Decoder()
        d.feed(struct.pack(">I", n) + await reader.readexactly(n))
        return d.next()
    except asyncio.IncompleteReadError:
        return None


def _answer(result: Callable[[dict[str, Any]], dict[str, Any] | bytes | None]) -> Script:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while (req := await _frame(r)) is not None:
            out = result(req)
            if out is None:
                continue
            w.write(out if isinstance(out, bytes) else wire.encode(out))
            await w.drain()
        w.close()

    return script


def _run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_no_socket_is_unavailable(tmp_path: Path) -> None:
    async def go() -> None:
        c = UnixSignerClient(tmp_path / "signer.sock")
        with pytest.raises(SignerUnavailable, match="tkbox signer serve"):
            await c.decide("r", "Bash", {"command": "ls"}, {})

    _run(go())


def test_a_signer_that_never_answers_times_out_and_is_dropped() -> None:
    async def go() -> None:
        c, opened = _client(_answer(lambda req: None), timeout=0.05)
        with pytest.raises(SignerUnavailable, match="did not answer decide"):
            await c.decide("r", "Bash", {"command": "ls"}, {})
        with pytest.raises(SignerUnavailable):
            await c.event("r", "tkbox.gap", {})
        assert len(opened) == 2  # a new connection for the next call
        await c.aclose()

    _run(go())


def test_a_signer_that_goes_away_mid_request() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _frame(r)
        w.close()

    async def go() -> None:
        c, _ = _client(script)
        with pytest.raises(SignerUnavailable, match="closed the connection"):
            await c.open_run("r", {})
        await c.aclose()

    _run(go())


@pytest.mark.parametrize("garbage", [
    struct.pack(">I", 0), struct.pack(">I", 1 << 30), struct.pack(">I", 5) + b"[1,2]",
    struct.pack(">I", 3) + b"{x}",
])
def test_garbage_from_the_signer(garbage: bytes) -> None:
    async def go() -> None:
        c, _ = _client(_answer(lambda req: garbage))
        with pytest.raises(SignerUnavailable):
            await c.decide("r", "Bash", {"command": "ls"}, {})
        await c.aclose()

    _run(go())


@pytest.mark.parametrize("result", [
    {"allowed": "yes", "reason": "x", "decision": "r/1"},
    {"allowed": True, "decision": "r/1"},
    {"allowed": True, "reason": "x", "decision": 1},
    {},
])
def test_an_answer_that_is_not_a_decision_is_a_refusal(result: dict[str, Any]) -> None:
    async def go() -> None:
        c, _ = _client(_answer(lambda req: {"id": req["id"], "ok": True, "result": result}))
        with pytest.raises(SignerUnavailable, match="malformed"):
            await c.decide("r", "Bash", {"command": "ls"}, {})
        await c.aclose()

    _run(go())


def test_an_error_answer_carries_the_signers_reason() -> None:
    async def go() -> None:
        c, _ = _client(_answer(lambda req: {"id": req["id"], "ok": False, "kind": "refused",
                                            "error": "run r is closed"}))
        with pytest.raises(SignerUnavailable, match="run r is closed"):
            await c.complete("r", "r/1", {"exit": 0})
        await c.aclose()

    _run(go())


def test_a_value_that_cannot_be_recorded_is_not_sent() -> None:
    sent: list[dict[str, Any]] = []

    async def go() -> None:
        c, _ = _client(_answer(lambda req: sent.append(req) or None))
        with pytest.raises(SignerUnavailable, match="cannot be recorded"):
            await c.event("r", "tkbox.model.call", {"seconds": 0.5})
        await c.aclose()

    _run(go())
    assert sent == []


def test_answers_in_any_order_reach_their_callers() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        reqs = [await _frame(r) for _ in range(3)]
        for req in reversed(reqs):
            assert req is not None
            w.write(wire.encode({"id": req["id"], "ok": True, "result": {
                "allowed": True, "reason": req["resource"]["command"], "decision": "r/1"}}))
        await w.drain()
        await r.read()
        w.close()

    async def go() -> None:
        c, _ = _client(script)
        vs = await asyncio.gather(*(c.decide("r", "Bash", {"command": f"c{i}"}, {})
                                    for i in range(3)))
        assert [v.reason for v in vs] == ["c0", "c1", "c2"]
        await c.aclose()

    _run(go())


def test_a_push_subscription_that_breaks_raises() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        req = await _frame(r)
        assert req is not None and req["op"] == "subscribe"
        w.write(wire.encode({"id": 0, "ok": True, "result": {}}))
        w.write(wire.encode({"push": "hold", "run": "r", "reason": "look"}))
        await w.drain()
        w.close()

    async def go() -> None:
        c, _ = _client(script)
        got = []
        with pytest.raises(SignerUnavailable):
            async for p in c.pushes():
                got.append(p)
        assert [(p.kind, p.run_id, p.reason) for p in got] == [("hold", "r", "look")]
        await c.aclose()

    _run(go())


def test_a_signer_that_stops_reading_times_out_the_call_not_the_client() -> None:
    """A signer that takes no more bytes leaves the request in the socket's buffer: the call
    still ends at its timeout, as SignerUnavailable, instead of waiting on the write."""
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await asyncio.Event().wait()  # never reads, never answers

    async def go() -> None:
        c, _ = _client(script, timeout=0.2)
        big = {"note": "x" * (wire.MAX_FRAME - 1024)}  # more than the socket pair buffers
        with pytest.raises(SignerUnavailable, match="did not answer event within 0.2 s"):
            await c.event("r", "tkbox.note", big)
        await c.aclose()

    _run(asyncio.wait_for(go(), 30))


def test_a_cancelled_call_leaves_the_client_working() -> None:
    """The caller of one decision gives up (its task is cancelled): the answer that comes
    later is dropped, and the next call on the same connection gets its own answer."""
    got_first, first_gone = asyncio.Event(), asyncio.Event()

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while (req := await _frame(r)) is not None:
            if not got_first.is_set():  # the first is answered once its caller gave up
                got_first.set()
                await first_gone.wait()
            w.write(wire.encode({"id": req["id"], "ok": True, "result": {
                "allowed": True, "reason": req["resource"]["command"], "decision": "r/1"}}))
            await w.drain()

    async def go() -> None:
        c, opened = _client(script, timeout=5)
        first = asyncio.ensure_future(c.decide("r", "Bash", {"command": "first"}, {}))
        await got_first.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        first_gone.set()
        v = await c.decide("r", "Bash", {"command": "second"}, {})
        assert v.reason == "second" and len(opened) == 1
        await c.aclose()

    _run(asyncio.wait_for(go(), 30))
