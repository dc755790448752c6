"""`tkbox signer status|hold|release|quarantine` speak the wire themselves (the signer
imports none of the daemon's client): they fail closed exactly as the daemon's client
does, with one line for a person, whatever the peer on the socket does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tkbox.errors import SignerRefused, SignerUnavailable
from tkbox.formats import wire
from tkbox.signer.cli import _ask

pytestmark = pytest.mark.integration

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _with_peer(tmp_path: Path, handler: Handler, op: str = "status") -> dict[str, object]:
    sock = tmp_path / "s.sock"

    async def closing(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await handler(r, w)
        finally:
            w.close()
            await w.wait_closed()

    async def go() -> dict[str, object]:
        server = await asyncio.start_unix_server(closing, str(sock))
        async with server:
            return await _ask(sock, op, **({"run": "r", "reason": "x"} if op != "status"
                                           else {}))

    return asyncio.run(go())


async def _request(reader: asyncio.StreamReader) -> dict[str, object]:
    d = wire.Decoder()
    while (frame := d.next()) is None:
        data = await reader.read(1 << 16)
        assert data, "the client hung up before its request"
        d.feed(data)
    return frame


def test_an_answer_is_returned_and_pushes_or_other_ids_are_skipped(tmp_path: Path) -> None:
    async def peer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        req = await _request(r)
        assert req["op"] == "hold" and req["run"] == "r"
        w.write(wire.encode({"push": "hold", "run": "other", "reason": ""}))
        w.write(wire.encode({"id": 99, "ok": True, "result": {"seq": 0}}))
        w.write(wire.encode({"id": req["id"], "ok": True, "result": {"seq": 7}}))
        await w.drain()

    assert _with_peer(tmp_path, peer, "hold") == {"seq": 7}


def test_no_signer_is_unavailable_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SignerUnavailable, match="no signer at .*tkbox signer serve"):
        asyncio.run(_ask(tmp_path / "none.sock", "status"))


def test_a_refusal_is_signer_refused(tmp_path: Path) -> None:
    async def peer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        req = await _request(r)
        w.write(wire.encode({"id": req["id"], "ok": False, "error": "run r is not open",
                             "kind": "refused"}))
        await w.drain()

    with pytest.raises(SignerRefused, match="the signer refused: run r is not open"):
        _with_peer(tmp_path, peer, "release")


@pytest.mark.parametrize("reply", [b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"",
                                   b"\x00\x00\x00\x02[]"])
def test_a_peer_that_breaks_the_wire_is_unavailable(tmp_path: Path, reply: bytes) -> None:
    """A peer on the signer's socket that sends garbage (or hangs up) gets one line, never
    a traceback: a zero or oversized length, a close, a frame that is not an object."""
    async def peer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _request(r)
        w.write(reply)
        await w.drain()

    with pytest.raises(SignerUnavailable) as info:
        _with_peer(tmp_path, peer)
    assert "\n" not in str(info.value)


def test_an_error_that_is_not_a_refusal_is_unavailable(tmp_path: Path) -> None:
    async def peer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        req = await _request(r)
        w.write(wire.encode({"id": req["id"], "ok": False, "error": "disk full",
                             "kind": "failed"}))
        w.write(wire.encode({"id": req["id"], "ok": "yes"}))
        await w.drain()

    with pytest.raises(SignerUnavailable, match="disk full") as info:
        _with_peer(tmp_path, peer)
    assert not isinstance(info.value, SignerRefused)
