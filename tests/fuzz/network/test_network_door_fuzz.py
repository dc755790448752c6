"""Fuzzing the door's shell: any bytes a guest sends, split any way, at any stage.

Promise: whatever the guest sends (a garbage head, garbage after a tunnel's `200`,
a broken plain-HTTP body) and whatever a broken origin answers, `EgressDoor.handle`
returns without raising; every record it writes is of a known kind, every refusal
names a `Stage` the bundle format knows, with a bounded reason; and once the door
has closed, no task of any connection is left.
"""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.doors.network.errors import Stage
from tkbox.doors.network.records import EXCERPT
from tkbox.doors.network.testing import client_hello, echo, make_door, records
from tkbox.protocol.streams import ByteStream, memory_stream_pair

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
PUBLIC = "93.184.215.14"
STAGES = {s.value for s in Stage}
KINDS = {"tkbox.decision", "tkbox.complete", "tkbox.egress.refused",
         "tkbox.egress.refused.summary", "tkbox.approval"}

_prefixes = st.sampled_from([
    b"",
    b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n",
    b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n"
    + records(client_hello("example.org")),
    b"CONNECT git.example:22 HTTP/1.1\r\nHost: git.example:22\r\n\r\n",
    b"GET http://example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n",
    b"POST http://example.org/ HTTP/1.1\r\nHost: example.org\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n",
])


async def garbage_origin(stream: ByteStream) -> None:
    """An origin that answers anything with bytes that are no HTTP and no TLS."""
    try:
        while await stream.receive():
            await stream.send_all(b"\x00garbage\r\n\r\n\xff" * 3)
        await stream.send_eof()
    except Exception:  # noqa: BLE001,S110 - a test origin; the door's side is under test
        pass


async def scenario(prefix: bytes, pieces: list[bytes], origin_kind: str) -> list[dict]:  # type: ignore[type-arg]
    handler = echo if origin_kind == "echo" else garbage_origin
    door, signer, dialer, _ = make_door(
        ["example.org", "git.example:22"],
        dns={"example.org": [PUBLIC], "git.example": [PUBLIC]},
        handler=handler,
    )
    guest, ours = memory_stream_pair()
    task = asyncio.ensure_future(door.handle(ours))
    try:
        await guest.send_all(prefix)
        for p in pieces:
            await guest.send_all(p)
        await guest.send_eof()
        while await guest.receive():
            pass
    except Exception:  # noqa: BLE001,S110 - the door may close its end first
        pass
    await task  # raises if the door let anything escape
    await door.close()
    await dialer.aclose()
    assert asyncio.all_tasks() == {asyncio.current_task()}
    return signer.records


@FUZZ
@given(
    prefix=_prefixes,
    pieces=st.lists(st.binary(max_size=600), max_size=6),
    origin_kind=st.sampled_from(["echo", "garbage"]),
)
def test_any_guest_bytes_end_in_known_records_and_no_task_left(
    prefix: bytes, pieces: list[bytes], origin_kind: str
) -> None:
    async def bounded() -> list[dict]:  # type: ignore[type-arg]
        async with asyncio.timeout(20):
            return await scenario(prefix, pieces, origin_kind)

    recs = asyncio.run(bounded())
    for r in recs:
        assert r["kind"] in KINDS, r["kind"]
        if r["kind"] == "tkbox.egress.refused":
            body = r["body"]
            assert body["stage"] in STAGES
            assert len(body["reason"]) <= EXCERPT + len("...(+99999 chars)")
            assert body["reason"].isascii() and body["reason"].isprintable()
        if r["kind"] == "tkbox.complete":
            out = r["outcome"]
            assert isinstance(out["ended"], str)
            if out["ended"] == "refused":
                assert out["stage"] in STAGES
            assert "reason" not in out or len(out["reason"]) <= EXCERPT + len("...(+99999 chars)")
