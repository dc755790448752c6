"""Security: a malformed request to a real signer gets one refusal and records nothing.

Whatever a peer puts in a well-formed frame (a missing, extra or mistyped
field, a value past its bound, an unknown op, an id that is not one), the
signer parses it at the edge (`formats.wire.parse_request`) and answers that
request once: `refused`, its id echoed when readable (else -1), a one-line
error that quotes at most a few dozen characters of what was sent. Nothing is
staged (the log's size does not move) and the connection goes on serving.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from signer_proc import SignerProc

from tkbox.formats import wire

pytestmark = pytest.mark.integration

BIG = "\u202e" + "x" * 200_000  # larger than any bound, with a bidi control first

MALFORMED: list[dict[str, Any]] = [
    {"op": "ping"},  # no id
    {"id": -1, "op": "ping"},
    {"id": "7", "op": "ping"},
    {"id": True, "op": "ping"},
    {"id": 1, "op": BIG},
    {"id": 2, "op": ["decide"]},
    {"id": 3},
    {"id": 4, "op": "ping", "extra": 1},
    {"id": 5, "op": "open", "run": "r2"},
    {"id": 6, "op": "open", "run": BIG, "facts": {}},
    {"id": 7, "op": "open", "run": "-r", "facts": {}},
    {"id": 8, "op": "open", "run": "r2", "facts": []},
    {"id": 9, "op": "decide", "run": "r", "action": "Bash", "resource": "ls", "context": {}},
    {"id": 10, "op": "decide", "run": "r", "action": BIG, "resource": {}, "context": {}},
    {"id": 11, "op": "decide", "run": "r", "action": "Ba\nsh", "resource": {}, "context": {}},
    {"id": 12, "op": "decide", "run": "r", "action": "Bash", "resource": {}, "context": {},
     "allowed": True},
    {"id": 13, "op": "complete", "run": "r", "decision": BIG, "outcome": {}},
    {"id": 14, "op": "complete", "run": "r", "decision": "r/1", "outcome": 0},
    {"id": 15, "op": "event", "run": "r", "kind": BIG, "body": {}},
    {"id": 16, "op": "event", "run": "r", "kind": "Tkbox.Gap", "body": {}},
    {"id": 17, "op": "event", "run": "r", "kind": "tkbox.gap", "body": None},
    {"id": 18, "op": "close", "run": 5},
    {"id": 19, "op": "export"},
    {"id": 20, "op": "hold", "run": "r", "reason": BIG},
    {"id": 21, "op": "release", "run": "r", "reason": 1},
    {"id": 22, "op": "quarantine", "run": ["r"]},
    {"id": 23, "op": "auth", "token": 5},
    {"id": 24, "op": "subscribe", "run": "r"},
    {"id": 25, "op": "status", BIG[:100]: 1},
]


async def _exchange(sock: str, frames: list[dict[str, Any]], last: int
                    ) -> list[dict[str, Any]]:
    """Send the frames on one connection, then read answers until the one to `last`."""
    r, w = await asyncio.open_unix_connection(sock, limit=wire.MAX_FRAME + 4)
    try:
        w.write(b"".join(wire.encode(f) for f in frames))
        await w.drain()
        d, got = wire.Decoder(), []
        async with asyncio.timeout(30):
            while not any(a.get("id") == last for a in got):
                data = await r.read(1 << 16)
                assert data, f"the signer closed the connection after {got}"
                d.feed(data)
                while (f := d.next()) is not None:
                    got.append(f)
        return got
    finally:
        w.close()


def test_malformed_requests_are_each_refused_once_and_record_nothing(signer: SignerProc
                                                                       ) -> None:
    async def go() -> None:
        c = signer.client()
        try:
            await c.open_run("r", {})
            before = (await c.status())["size"]
            got = await _exchange(str(signer.socket), [*MALFORMED, {"id": 999, "op": "ping"}],
                                  999)
            *answers, pong = got
            assert pong["id"] == 999 and pong["ok"] is True  # the connection still serves
            assert len(answers) == len(MALFORMED)  # one answer each, no more
            for req, a in zip(MALFORMED, answers, strict=True):
                rid = req.get("id")
                readable = type(rid) is int and rid >= 0
                assert a["id"] == (rid if readable else -1), (req, a)
                assert a["ok"] is False and a["kind"] == "refused", (req, a)
                error = a["error"]
                assert isinstance(error, str) and error and "\n" not in error
                assert len(error) <= 400 and "x" * 50 not in error, (req, error)
            assert (await c.status())["size"] == before  # nothing was recorded
        finally:
            await c.aclose()

    asyncio.run(go())


def test_a_frame_that_is_not_an_object_ends_only_its_connection(signer: SignerProc) -> None:
    """Not a request at all (a JSON array): the framing is broken, the connection closed,
    nothing recorded, and the signer goes on serving others."""
    async def go() -> None:
        c = signer.client()
        try:
            before = (await c.status())["size"]
            r, w = await asyncio.open_unix_connection(str(signer.socket))
            body = b'["ping"]'
            w.write(len(body).to_bytes(4, "big") + body)
            await w.drain()
            async with asyncio.timeout(30):
                assert await r.read() == b""
            w.close()
            assert (await c.status())["size"] == before
        finally:
            await c.aclose()

    asyncio.run(go())
