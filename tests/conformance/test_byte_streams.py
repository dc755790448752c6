"""The `ByteStream` conformance suite: what `tkbox.protocol.streams.ByteStream`
promises, checked against every implementation in `src/`.

Each implementation is set up as a connected pair `a`, `b` (what `a` sends, `b`
receives, and the other way):

- `AsyncioStream`: both ends of a Unix socket pair;
- `MemoryStream`: `memory_stream_pair()`;
- `MuxStream`: a stream opened through two `MuxPorts` over a memory pair;
- `_PortStream` (vsock): the wrapper the vsock transports hand out, over a Unix
  socket pair (the prefix it carries is checked on its own below);
- `TLSStream`: a real TLS handshake over a memory pair, the server's leaf made by
  a `BoxCA` and the client trusting that CA;
- `_Prefixed` (secrets door): over a Unix socket pair;
- `FdStream` (guest agent): over the fds of a Unix socket pair (the agent's is
  the virtio-serial port, which carries no EOF: no half-close).

What every one must do: bytes arrive in order whatever the chunking of sends and
reads; `receive(n)` returns between 1 and n bytes, and returns what is there
without waiting for more; the peer's `aclose` reads as EOF after every byte it
sent; `send_eof` is a half-close where the stream carries one; `send_all` after
`aclose`, or to a peer that closed, raises `StreamClosed`; `aclose` is
idempotent; a `receive` after `aclose`, or pending when `aclose` is called,
returns at once (`b""`, possibly after bytes that had already arrived); a
cancelled `receive` loses nothing; a few MiB cross both ways at once intact.
A meta-check finds every `ByteStream` subclass in `src/` so that an eighth one
cannot be added without being run here.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import os
import random
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tkbox._tasks import TaskOwner
from tkbox.doors.secrets.ca import BoxCA
from tkbox.doors.secrets.door import _Prefixed
from tkbox.doors.secrets.tlsstream import TLSStream
from tkbox.guest.spawn import FdStream
from tkbox.protocol.budget import Budget
from tkbox.protocol.mux import MuxPorts, MuxStream
from tkbox.protocol.streams import (
    AsyncioStream,
    ByteStream,
    MemoryStream,
    StreamClosed,
    memory_stream_pair,
)
from tkbox.protocol.vsock import _PortStream

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
SRC = Path(__file__).resolve().parents[2] / "src"


def run(coro: Coroutine[Any, Any, None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(TIMEOUT):
            await coro

    asyncio.run(bounded())


@dataclass
class Pair:
    """Two connected ends; `half_close` says whether `send_eof` carries an EOF."""

    a: ByteStream
    b: ByteStream
    half_close: bool = True
    closers: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)

    async def aclose(self) -> None:
        await self.a.aclose()
        await self.b.aclose()
        for close in reversed(self.closers):
            await close()


# --- the implementations --------------------------------------------------------------


async def socket_ends() -> tuple[AsyncioStream, AsyncioStream]:
    s1, s2 = socket.socketpair()
    ends = []
    for s in (s1, s2):
        reader, writer = await asyncio.open_connection(sock=s)
        ends.append(AsyncioStream(reader, writer))
    return ends[0], ends[1]


@contextlib.asynccontextmanager
async def asyncio_pair() -> AsyncIterator[Pair]:
    pair = Pair(*await socket_ends())
    try:
        yield pair
    finally:
        await pair.aclose()


@contextlib.asynccontextmanager
async def memory_pair() -> AsyncIterator[Pair]:
    pair = Pair(*memory_stream_pair())
    try:
        yield pair
    finally:
        await pair.aclose()


@contextlib.asynccontextmanager
async def mux_pair() -> AsyncIterator[Pair]:
    link_a, link_b = memory_stream_pair()
    host = MuxPorts(link_a, initiator=True, budget=Budget.unlimited())
    guest = MuxPorts(link_b, initiator=False, budget=Budget.unlimited())
    engines = TaskOwner("conformance-mux")
    engines.spawn(host.run())
    engines.spawn(guest.run())
    accepted: asyncio.Future[ByteStream] = asyncio.get_running_loop().create_future()
    done = asyncio.Event()

    async def handler(stream: ByteStream) -> None:
        accepted.set_result(stream)
        await done.wait()

    guest.serve(1024, handler)
    a = await host.connect(1024)
    pair = Pair(a, await accepted, closers=[engines.aclose, guest.aclose, host.aclose])
    try:
        yield pair
    finally:
        done.set()
        await pair.aclose()


@contextlib.asynccontextmanager
async def port_stream_pair() -> AsyncIterator[Pair]:
    closed: list[ByteStream] = []
    a, b = await socket_ends()
    pair = Pair(_PortStream(a, b"", closed.append), _PortStream(b, b"", closed.append))
    try:
        yield pair
    finally:
        await pair.aclose()


@contextlib.asynccontextmanager
async def tls_pair() -> AsyncIterator[Pair]:
    host = "origin.test"
    ca = BoxCA("conformance", {host})
    client_ctx = ssl.create_default_context(cadata=ca.pem)
    raw_a, raw_b = memory_stream_pair()
    a = TLSStream(raw_a, client_ctx, server_side=False, server_hostname=host)
    b = TLSStream(raw_b, ca.server_context(host), server_side=True)
    await asyncio.gather(a.handshake(), b.handshake())
    pair = Pair(a, b)
    try:
        yield pair
    finally:
        await pair.aclose()


@contextlib.asynccontextmanager
async def prefixed_pair() -> AsyncIterator[Pair]:
    a, b = await socket_ends()
    pair = Pair(_Prefixed(b"", a), _Prefixed(b"", b))
    try:
        yield pair
    finally:
        await pair.aclose()


@contextlib.asynccontextmanager
async def fd_pair() -> AsyncIterator[Pair]:
    s1, s2 = socket.socketpair()
    pair = Pair(FdStream(s1.detach()), FdStream(s2.detach()), half_close=False)
    try:
        yield pair
    finally:
        await pair.aclose()


IMPLEMENTATIONS: dict[type[ByteStream], Callable[[], Any]] = {
    AsyncioStream: asyncio_pair,
    MemoryStream: memory_pair,
    MuxStream: mux_pair,
    _PortStream: port_stream_pair,
    TLSStream: tls_pair,
    _Prefixed: prefixed_pair,
    FdStream: fd_pair,
}


@pytest.fixture(params=list(IMPLEMENTATIONS), ids=lambda cls: cls.__name__)
def make_pair(request: pytest.FixtureRequest) -> Callable[[], Any]:
    return IMPLEMENTATIONS[request.param]


# --- helpers --------------------------------------------------------------------------


def payload(n: int, seed: int = 0) -> bytes:
    # Not repeating at any short period, so a reordered or dropped chunk shows.
    return b"".join(struct.pack(">II", seed, i) for i in range(n // 8 + 1))[:n]


async def send_chunked(stream: ByteStream, data: bytes, rng: random.Random,
                       most: int = 100_000) -> None:
    at = 0
    while at < len(data):
        n = rng.randint(1, most)
        await stream.send_all(data[at:at + n])
        at += n


async def receive_chunked(stream: ByteStream, total: int, rng: random.Random,
                          most: int = 100_000) -> bytes:
    """`total` bytes read with sizes drawn from `rng`; each read is within its bound."""
    parts, got = [], 0
    while got < total:
        n = rng.randint(1, most)
        chunk = await stream.receive(n)
        assert 1 <= len(chunk) <= n, f"receive({n}) gave {len(chunk)} bytes"
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


async def read_to_eof(stream: ByteStream) -> bytes:
    parts = []
    while chunk := await stream.receive():
        parts.append(chunk)
    return b"".join(parts)


async def settle() -> None:
    """Let every ready task run until it waits on something (no time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)


# --- the suite ------------------------------------------------------------------------


def test_bytes_arrive_in_order_whatever_the_chunking(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            for seed, (src, dst) in enumerate([(pair.a, pair.b), (pair.b, pair.a)]):
                data = payload(600_000, seed)
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(send_chunked(src, data, random.Random(seed)))
                    got = tg.create_task(receive_chunked(dst, len(data), random.Random(~seed)))
                assert got.result() == data

    run(main())


def test_receive_is_bounded_by_max_bytes(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            data = payload(3000, seed=7)
            await pair.a.send_all(data)
            parts = []
            for n in (1, 2, 3, 5, 100, 1000, 65536):
                chunk = await pair.b.receive(n)
                assert 1 <= len(chunk) <= n
                parts.append(chunk)
            rest = await pair.b.receive_exactly(len(data) - sum(map(len, parts)))
            assert b"".join(parts) + rest == data

    run(main())


def test_receive_returns_what_is_there_without_waiting_for_more(
        make_pair: Callable[[], Any]) -> None:
    """A request/answer exchange with neither side closing: no read waits to fill up."""

    async def main() -> None:
        async with make_pair() as pair:
            for i in range(20):
                await pair.a.send_all(b"ping %d" % i)
                assert await pair.b.receive_exactly(len(b"ping %d" % i)) == b"ping %d" % i
                await pair.b.send_all(b"pong")
                got = await pair.a.receive(65536)
                assert 1 <= len(got) <= 4
                assert got + await pair.a.receive_exactly(4 - len(got)) == b"pong"

    run(main())


def test_the_peers_close_reads_as_eof_after_its_bytes(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            data = payload(300_000, seed=3)

            async def send_and_close() -> None:
                await pair.a.send_all(data)
                await pair.a.aclose()

            async with asyncio.TaskGroup() as tg:
                tg.create_task(send_and_close())
                got = tg.create_task(read_to_eof(pair.b))
            assert got.result() == data
            assert await pair.b.receive() == b""  # EOF stays EOF
            with pytest.raises(EOFError):
                await pair.b.receive_exactly(1)

    run(main())


def test_send_eof_is_a_half_close(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            if not pair.half_close:
                pytest.skip("carries no EOF (FdStream: a virtio-serial port has none; "
                            "send_eof is a no-op there and the mux above delimits streams)")
            await pair.a.send_all(b"question")
            await pair.a.send_eof()
            assert await read_to_eof(pair.b) == b"question"
            # the other direction still flows, both ways of ending it
            answer = payload(300_000, seed=5)

            async def reply() -> None:
                await pair.b.send_all(answer)
                await pair.b.send_eof()

            async with asyncio.TaskGroup() as tg:
                tg.create_task(reply())
                got = tg.create_task(read_to_eof(pair.a))
            assert got.result() == answer

    run(main())


def test_send_after_aclose_raises_stream_closed(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            await pair.a.aclose()
            with pytest.raises(StreamClosed):
                await pair.a.send_all(b"too late")

    run(main())


def test_send_to_a_closed_peer_raises_stream_closed(make_pair: Callable[[], Any]) -> None:
    """Not at once (bytes may be buffered on the way), but before 64 MiB are sent."""

    async def main() -> None:
        async with make_pair() as pair:
            await pair.b.aclose()
            chunk = bytes(64 << 10)
            with pytest.raises(StreamClosed):
                for _ in range(1024):
                    await pair.a.send_all(chunk)

    run(main())


def test_aclose_is_idempotent(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            await pair.a.aclose()
            await pair.a.aclose()
            await pair.b.aclose()
            await pair.b.aclose()
            await pair.a.aclose()
            with pytest.raises(StreamClosed):
                await pair.b.send_all(b"x")

    run(main())


def test_receive_after_aclose_does_not_wait(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            await pair.a.aclose()
            assert await pair.a.receive() == b""
            assert await pair.a.receive() == b""

    run(main())


def test_receive_after_aclose_gives_at_most_what_had_arrived(
        make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            await pair.b.send_all(b"arrived")
            await pair.a.aclose()
            assert await read_to_eof(pair.a) in (b"", b"arrived")

    run(main())


def test_a_receive_pending_at_aclose_returns(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair, asyncio.TaskGroup() as tg:
            pending = tg.create_task(pair.a.receive())
            await settle()
            assert not pending.done()
            await pair.a.aclose()
            assert await pending == b""

    run(main())


def test_a_cancelled_receive_loses_nothing(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair, asyncio.TaskGroup() as tg:
            for _ in range(3):
                pending = tg.create_task(pair.a.receive())
                await settle()
                assert not pending.done()
                pending.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await pending
            data = payload(100_000, seed=9)
            await pair.b.send_all(data)
            assert await pair.a.receive_exactly(len(data)) == data
            await pair.a.send_all(b"still usable")
            assert await pair.b.receive_exactly(12) == b"still usable"

    run(main())


def test_mebibytes_cross_both_ways_at_once(make_pair: Callable[[], Any]) -> None:
    """4 MiB each way concurrently: neither direction's buffering blocks the other."""

    async def main() -> None:
        async with make_pair() as pair:
            up, down = payload(4 << 20, seed=11), payload(4 << 20, seed=12)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(pair.a.send_all(up))
                tg.create_task(pair.b.send_all(down))
                got_up = tg.create_task(pair.b.receive_exactly(len(up)))
                got_down = tg.create_task(pair.a.receive_exactly(len(down)))
            assert got_up.result() == up
            assert got_down.result() == down

    run(main())


# --- the two that hand out bytes read ahead ------------------------------------------


@pytest.mark.parametrize("wrap", [
    lambda first, inner: _PortStream(inner, first, lambda _s: None),
    lambda first, inner: _Prefixed(first, inner),
], ids=["_PortStream", "_Prefixed"])
def test_bytes_read_ahead_come_first_within_the_bound(
        wrap: Callable[[bytes, ByteStream], ByteStream]) -> None:
    async def main() -> None:
        inner, peer = memory_stream_pair()
        stream = wrap(b"abcde", inner)
        await peer.send_all(b"fgh")
        await peer.send_eof()
        assert await stream.receive(2) == b"ab"
        got = await stream.receive(2) + await stream.receive(1)
        assert got == b"cde"
        assert await read_to_eof(stream) == b"fgh"
        await stream.aclose()
        await peer.aclose()

    run(main())


def test_the_port_stream_tells_its_ports_when_closed() -> None:
    async def main() -> None:
        closed: list[ByteStream] = []
        a, b = await socket_ends()
        stream = _PortStream(a, b"ahead", closed.append)
        await stream.aclose()
        assert closed == [stream]
        assert await stream.receive() == b""  # what was read ahead goes with it
        await b.aclose()

    run(main())


# --- a closed FdStream and its fd number ---------------------------------------------


def test_a_closed_fd_stream_never_uses_its_fd_number_again() -> None:
    """After aclose the number may name another file: a send must not reach it, a
    second aclose must not close it."""

    async def main() -> None:
        s1, s2 = socket.socketpair()
        stream = FdStream(s1.detach())
        old = stream.fd
        await stream.aclose()
        other, other_peer = socket.socketpair()  # the lowest free number: the old one
        try:
            assert other.fileno() == old, "the fd number was not reused; nothing checked"
            with pytest.raises(StreamClosed):
                await stream.send_all(b"for the closed stream")
            assert await stream.receive() == b""
            await stream.aclose()
            os.fstat(old)  # still open
            other_peer.setblocking(False)
            with pytest.raises(BlockingIOError):
                other_peer.recv(100)  # and nothing was written into it
        finally:
            other.close()
            other_peer.close()
            s2.close()

    run(main())


# --- the suite covers every implementation -------------------------------------------


def byte_stream_classes_in_src(src: Path = SRC) -> set[tuple[str, str]]:
    """(module, class) of every class in src/ deriving from ByteStream, at any depth,
    found by reading the source (so a module nothing imports is not missed)."""
    bases: dict[tuple[str, str], set[str]] = {}
    for path in (src / "tkbox").rglob("*.py"):
        module = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                names = {b.id if isinstance(b, ast.Name) else b.attr
                         for b in node.bases if isinstance(b, ast.Name | ast.Attribute)}
                bases[(module, node.name)] = names
    found: set[tuple[str, str]] = set()
    known = {"ByteStream"}
    while True:
        more = {k for k, names in bases.items() if names & known} - found
        if not more:
            return found
        found |= more
        known |= {name for _m, name in more}


def subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *subclasses(sub)}
    return out


def test_every_byte_stream_in_src_is_in_the_suite() -> None:
    in_src = set()
    for module, name in byte_stream_classes_in_src():
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, ByteStream), f"{module}.{name}"
        in_src.add(cls)
    # and whatever is imported now, wherever it was defined inside tkbox
    in_src |= {c for c in subclasses(ByteStream) if c.__module__.startswith("tkbox.")}
    assert len(in_src) >= 7
    missing = sorted(f"{c.__module__}.{c.__qualname__}" for c in in_src - set(IMPLEMENTATIONS))
    assert not missing, f"ByteStream implementations not in the conformance suite: {missing}"


def test_the_coverage_check_can_fail(tmp_path: Path) -> None:
    """A subclass two levels down, in a module of its own, is found."""
    pkg = tmp_path / "tkbox" / "extra"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "more.py").write_text(
        "from tkbox.protocol import streams\n"
        "class Direct(streams.ByteStream): ...\n"
        "class Deeper(Direct): ...\n"
        "class Unrelated: ...\n")
    assert byte_stream_classes_in_src(tmp_path) == {("tkbox.extra.more", "Direct"),
                                                    ("tkbox.extra.more", "Deeper")}
