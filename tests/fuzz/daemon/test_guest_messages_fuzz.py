"""Fuzz: what the daemon parses from the guest (the agent RPC answers, port 1024).

The promise of `GuestClient` (`tkbox.daemon.guest_client`): whatever the guest
answers (well-formed frames of any shape, frames with the right events but
wrong types, random bytes, a stream cut anywhere) each call returns a
well-typed result or raises `GuestError`, never any other exception; output
reaches the sink only as `(1|2, bytes)`; a patch never grows past its bound;
a file copied out (`read_file`) neither; strings the guest supplies come out
printable and bounded.

The guest is a scripted peer behind `Ports` (the transport interface), so the
real client code runs, over an in-memory stream.
"""

from __future__ import annotations

import asyncio
import io
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.daemon.guest_client import GuestClient, PatchProgress
from tkbox.errors import GuestError
from tkbox.guest.diff import CHANGES, WHY
from tkbox.protocol.framing import MAX_FRAME
from tkbox.protocol.ports import Handler, Ports
from tkbox.protocol.streams import ByteStream, memory_stream_pair

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

EVENTS = ["ok", "started", "out", "exit", "data", "end", "error", "", "EXIT", "outx"]
KEYS = ["ev", "fd", "data", "status", "signal", "error", "message", "uptime", "stats"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
                    st.binary(max_size=40))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


@st.composite
def answer(draw: st.DrawFn) -> dict[str, Any]:
    """A map shaped like an agent answer: a real event name mostly, fields of any type."""
    msg: dict[str, Any] = {"ev": draw(st.one_of(st.sampled_from(EVENTS), values))}
    for k in draw(st.lists(st.sampled_from(KEYS), max_size=5, unique=True)):
        if k == "ev":
            continue
        msg[k] = draw(st.one_of(values, st.sampled_from([1, 2, 0, 255, 256, -1])))
    return msg


def frame(msg: Any) -> bytes:
    body = msgpack.packb(msg, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


@st.composite
def guest_bytes(draw: st.DrawFn) -> bytes:
    """A whole answer stream: frames of answers, raw junk, cut or not."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.binary(max_size=600))
    parts = [frame(m) for m in draw(st.lists(answer(), min_size=1, max_size=8))]
    if kind == 2:  # a frame that is not a map, or a map with non-string keys
        parts.insert(draw(st.integers(0, len(parts))),
                     frame(draw(st.one_of(values, st.just({1: "x"})))))
    data = b"".join(parts)
    if kind == 3 and data:  # cut anywhere, or an oversized length announced
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.sampled_from(
            [b"", (MAX_FRAME + 1).to_bytes(4, "big"), b"\xff\xff\xff\xff"]))
    return data


class ScriptedGuest(Ports):
    """Each connection gets the same scripted answer, then EOF; requests are read off."""

    def __init__(self, script: bytes) -> None:
        self.script = script
        self.tasks: list[asyncio.Task[None]] = []

    async def connect(self, port: int, *, reserved: bool = False) -> ByteStream:
        host, guest = memory_stream_pair(limit=4 << 20)

        async def play() -> None:
            await guest.send_all(self.script)
            await guest.send_eof()

        self.tasks.append(asyncio.ensure_future(play()))
        return host

    def serve(self, port: int, handler: Handler) -> None:  # pragma: no cover - unused
        raise NotImplementedError

    async def aclose(self) -> None:
        for t in self.tasks:
            t.cancel()


def printable_bounded(s: str, limit: int) -> bool:
    return len(s) <= limit and all(c.isprintable() for c in s)


async def _all_calls(script: bytes) -> None:
    ports = ScriptedGuest(script)
    client = GuestClient(ports, "fuzz", timeout=5)
    try:
        try:
            up = await client.ping(timeout=5)
            assert isinstance(up, float) and 0 <= up < 86400
        except GuestError as exc:
            assert printable_bounded(str(exc), 1000)

        got: list[tuple[int, bytes]] = []

        async def sink(fd: int, data: bytes) -> None:
            got.append((fd, data))

        try:
            r = await client.exec(["true"], cwd="/workspace", env={}, stdin=None, output=sink,
                                  signals=asyncio.Queue())
            assert 0 <= r.status <= 255 and isinstance(r.signal, int)
            assert printable_bounded(r.error, 500)
        except GuestError as exc:
            assert printable_bounded(str(exc), 1000)
        assert all(fd in (1, 2) and isinstance(d, bytes) for fd, d in got)

        buf = io.BytesIO()
        progress = PatchProgress()

        async def none_ignored(paths: list[bytes]) -> set[bytes]:
            return set()

        try:
            await client.diff(buf, progress, kill=False, max_bytes=256, timeout=5,
                              ignored=none_ignored)
        except GuestError:
            pass
        # whatever ended it, what the host kept is bounded and true to the bytes
        assert 0 <= progress.marked <= progress.bytes == len(buf.getvalue()) <= 256
        assert len(progress.stats) <= 64
        for k, v in progress.stats.items():
            assert printable_bounded(k, 64)
            assert (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**53) or \
                (isinstance(v, str) and printable_bounded(v, 256))
        assert len(progress.set_apart) <= 1000
        for a in progress.set_apart:
            assert printable_bounded(a.path, 1024) and a.why in WHY and a.change in CHANGES
        assert len(buf.getvalue()) <= 256

        copied = io.BytesIO()
        try:
            size = await client.read_file("notes.txt", copied, max_bytes=256, timeout=5)
            assert size == len(copied.getvalue())
        except GuestError as exc:
            assert printable_bounded(str(exc), 1000)
        assert len(copied.getvalue()) <= 256

        try:
            await client.shutdown(timeout=5)
        except GuestError:
            pass
    finally:
        await ports.aclose()


@FUZZ
@given(guest_bytes())
def test_guest_answers_raise_only_guest_error(script: bytes) -> None:
    asyncio.run(_all_calls(script))


@FUZZ
@given(st.lists(answer(), min_size=1, max_size=6))
def test_well_formed_frames_of_any_shape_raise_only_guest_error(msgs: list[dict[str, Any]]
                                                                ) -> None:
    asyncio.run(_all_calls(b"".join(frame(m) for m in msgs)))


def test_a_valid_exec_answer_is_read_as_such() -> None:
    """The harness is not vacuous: a well-formed answer gives its result."""
    script = b"".join(frame(m) for m in [{"ev": "started"}, {"ev": "out", "fd": 1, "data": b"hi"},
                                         {"ev": "exit", "status": 3, "signal": 0}])
    got: list[tuple[int, bytes]] = []

    async def go() -> int:
        async def sink(fd: int, data: bytes) -> None:
            got.append((fd, data))

        ports = ScriptedGuest(script)
        try:
            r = await GuestClient(ports, "fuzz").exec(["x"], cwd="/", env={}, stdin=None,
                                                      output=sink, signals=asyncio.Queue())
        finally:
            await ports.aclose()
        return r.status

    assert asyncio.run(go()) == 3 and got == [(1, b"hi")]
