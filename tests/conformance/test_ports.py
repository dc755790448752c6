"""The `Ports` conformance suite: what the daemon and the guest agent rely on,
checked against every transport (`tkbox.protocol.ports`).

Each transport is set up as a connected pair, host side and guest side:

- `serial-mux`: `MuxPorts` on both ends of an in-memory byte stream (the
  virtio-serial port's stand-in; the real port is exercised by the e2e tests);
- `hybrid-vsock`: `HybridVsockHostPorts` against a stand-in VMM that speaks
  Firecracker's Unix-socket convention (CONNECT/OK one way, `<uds>_<port>` the
  other), with the guest's handlers behind it;
- `vhost-vsock (stand-in sockets)`: `VhostVsockHostPorts` and
  `GuestVsockPorts` with `AF_VSOCK` swapped for Unix sockets whose bound name
  carries the peer's CID, so the code that shares one host listener per port
  and routes by the kernel's peer CID runs for real;
- `vhost-vsock (AF_VSOCK)`: the same two classes over the kernel's vsock
  loopback, where this host has one (skipped otherwise, saying what was
  measured).

What every transport must do: a served port is reached both ways with every
byte in order; an unserved port is a `PortError`, not a hang; streams are
independent; a closed stream reads as EOF on the other side; a sender that
is not read from blocks (bounded buffers) and catches up when it is; a frame
over the 1 MiB bound is refused (`FrameError`) on any transport; opening
streams past the transport's bound is a `PortError`, and closing them gives
the room back; a failing handler ends only its own stream; after `aclose`,
`connect` raises `TransportClosed` and `aclose` is idempotent. Half-close is
checked where the transport carries it (Firecracker's hybrid vsock does not:
an EOF from the host ends the whole stream, see docs/firecracker.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tkbox._tasks import TaskOwner
from tkbox.protocol import vsock
from tkbox.protocol.budget import Budget
from tkbox.protocol.framing import MAX_FRAME, FramedStream, FrameError
from tkbox.protocol.mux import MAX_STREAMS, MuxPorts
from tkbox.protocol.ports import PortError, Ports, TransportClosed
from tkbox.protocol.streams import ByteStream, memory_stream_pair
from tkbox.protocol.vsock import (
    GuestVsockPorts,
    HybridVsockHostPorts,
    VhostVsockHostPorts,
    encode_connect,
    listener_path,
)

pytestmark = pytest.mark.integration

TIMEOUT = 30.0


def run(coro: Coroutine[Any, Any, None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(TIMEOUT):
            await coro

    asyncio.run(bounded())


@dataclass
class Pair:
    """A connected transport: `host` and `guest` sides, and the ports to use.

    `down` is a port the guest serves (host → guest, like 1024); `up` one the
    host serves (guest → host, like 1025/1026).
    """

    host: Ports
    guest: Ports
    down: int = 1024
    up: int = 1025
    half_close: bool = True
    closers: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)

    async def aclose(self) -> None:
        await self.host.aclose()
        await self.guest.aclose()
        for close in reversed(self.closers):
            await close()


# --- the transports -------------------------------------------------------------------


@contextlib.asynccontextmanager
async def mux_pair(tmp: Path) -> AsyncIterator[Pair]:
    a, b = memory_stream_pair()
    host = MuxPorts(a, initiator=True)
    guest = MuxPorts(b, initiator=False, max_own=MAX_STREAMS, budget=Budget.unlimited())
    engines = TaskOwner("mux-engines")
    engines.spawn(host.run())
    engines.spawn(guest.run())
    pair = Pair(host, guest, closers=[engines.aclose])
    try:
        yield pair
    finally:
        await pair.aclose()


class StandInVMM:
    """Firecracker's vsock device as the host sees it, with the guest behind it.

    Host → guest: accepts on `uds_path`, reads `CONNECT <port>\\n`, and if the
    guest serves that port answers `OK <n>\\n` and hands the connection to the
    guest's handler; else closes it (what Firecracker does when the guest
    resets). Guest → host: `GuestSide.connect(port)` dials `<uds_path>_<port>`.
    """

    def __init__(self, uds_path: Path) -> None:
        self.uds_path = uds_path
        self.guest = GuestSide(self)
        self._server: asyncio.Server | None = None
        self._next = 1 << 30

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._client, path=str(self.uds_path))

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        words = line.split()
        handler = None
        if len(words) == 2 and words[0] == b"CONNECT" and words[1].isdigit():
            handler = self.guest.handlers.get(int(words[1]))
        if handler is None:
            writer.close()
            return
        self._next += 1
        writer.write(b"OK %d\n" % self._next)
        await writer.drain()
        await self.guest.run_handler(handler, reader, writer)


class GuestSide(Ports):
    """The guest's Ports behind a `StandInVMM` (a test double of GuestVsockPorts)."""

    def __init__(self, vmm: StandInVMM) -> None:
        from tkbox.protocol.streams import AsyncioStream

        self._vmm = vmm
        self._stream_type = AsyncioStream
        self.handlers: dict[int, Any] = {}
        self._tasks = TaskOwner("stand-in-guest")
        self._closed = False

    async def connect(self, port: int, *, reserved: bool = False) -> ByteStream:
        if self._closed:
            raise TransportClosed("closed")
        try:
            reader, writer = await asyncio.open_unix_connection(
                str(listener_path(self._vmm.uds_path, port)))
        except OSError as exc:
            raise PortError(f"no host listener on {port}: {exc.strerror}") from None
        return self._stream_type(reader, writer)

    def serve(self, port: int, handler: Any) -> None:
        self.handlers[port] = handler

    async def run_handler(self, handler: Any, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        stream = self._stream_type(reader, writer)
        try:
            await handler(stream)
        except Exception:  # noqa: BLE001, S110 - as the agent: a failed handler ends its stream
            pass
        finally:
            await stream.aclose()

    async def aclose(self) -> None:
        self._closed = True
        await self._tasks.aclose()


@contextlib.asynccontextmanager
async def hybrid_pair(tmp: Path) -> AsyncIterator[Pair]:
    d = tmp / "vm"
    d.mkdir(mode=0o700)
    vmm = StandInVMM(d / "v.sock")
    await vmm.start()
    host = HybridVsockHostPorts(d / "v.sock")
    pair = Pair(host, vmm.guest, half_close=False, closers=[vmm.aclose])
    try:
        yield pair
    finally:
        await pair.aclose()


@contextlib.contextmanager
def unix_for_vsock(d: Path, guest_cid: int) -> Any:
    """AF_UNIX in place of AF_VSOCK: the listener for port P is `d/listen_P`, and a
    peer's CID is the number in the name its socket is bound to (the kernel's word)."""
    serial = iter(range(1 << 30))
    saved = (vsock._vsock_listener, vsock._peer_cid, vsock._vsock_connect)

    def listener(port: int) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(d / f"listen_{port}"))
        s.listen(64)
        s.setblocking(False)
        return s

    def peer_cid(conn: socket.socket) -> int | None:
        name = Path(conn.getpeername()).name
        return int(name.split("_")[1]) if name.startswith("cid_") else None

    async def connect(cid: int, port: int, timeout: float) -> socket.socket:
        source = guest_cid if cid == vsock.HOST_CID else vsock.HOST_CID
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(d / f"cid_{source}_c{next(serial)}"))
        s.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(s, str(d / f"listen_{port}"))
        except OSError as exc:
            s.close()
            raise PortError(f"cannot reach port {port}: {exc.strerror}") from None
        return s

    vsock._vsock_listener, vsock._peer_cid, vsock._vsock_connect = (  # type: ignore[assignment]
        listener, peer_cid, connect)
    try:
        yield
    finally:
        vsock._vsock_listener, vsock._peer_cid, vsock._vsock_connect = saved


@contextlib.asynccontextmanager
async def vhost_standin_pair(tmp: Path) -> AsyncIterator[Pair]:
    d = tmp / "vs"
    d.mkdir(mode=0o700)
    with unix_for_vsock(d, guest_cid=3):
        pair = Pair(VhostVsockHostPorts(3), GuestVsockPorts())
        try:
            yield pair
        finally:
            await pair.aclose()


VMADDR_CID_LOCAL = 1


@functools.cache
def vsock_loopback_problem() -> str | None:
    """Why real AF_VSOCK cannot be tested here, from a measurement, or None."""
    if not hasattr(socket, "AF_VSOCK"):
        return "this Python has no AF_VSOCK"
    try:
        listener = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except OSError as exc:
        return f"no AF_VSOCK sockets here ({exc.strerror})"
    with listener, socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM) as client:
        try:
            listener.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
            listener.listen(1)
            port = listener.getsockname()[1]
            client.settimeout(2)
            client.connect((VMADDR_CID_LOCAL, port))
        except OSError as exc:
            vhost = ("present" if os.path.exists("/dev/vhost-vsock")
                     else "absent (no vhost_vsock module for this kernel)")
            return (f"AF_VSOCK exists but a loopback connect to CID 1 failed "
                    f"({exc.strerror or type(exc).__name__}: no vsock_loopback transport); "
                    f"/dev/vhost-vsock is {vhost}, so no guest can be reached over vhost "
                    "either; the same classes run above over stand-in sockets")
    return None


@contextlib.asynccontextmanager
async def vhost_real_pair(tmp: Path) -> AsyncIterator[Pair]:
    base = 20000 + (os.getpid() * 7) % 30000
    pair = Pair(VhostVsockHostPorts(VMADDR_CID_LOCAL),
                GuestVsockPorts(host_cid=VMADDR_CID_LOCAL), down=base, up=base + 1)
    try:
        yield pair
    finally:
        await pair.aclose()


TRANSPORTS = {
    "serial-mux": mux_pair,
    "hybrid-vsock": hybrid_pair,
    "vhost-vsock-standin": vhost_standin_pair,
    "vhost-vsock-af-vsock": vhost_real_pair,
}


@pytest.fixture(params=list(TRANSPORTS))
def make_pair(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Any]:
    name = request.param
    if name == "vhost-vsock-af-vsock":
        why = vsock_loopback_problem()
        if why:
            pytest.skip(why)
    return lambda: TRANSPORTS[name](tmp_path)


# --- helpers --------------------------------------------------------------------------


async def read_all(stream: ByteStream) -> bytes:
    parts = []
    while chunk := await stream.receive():
        parts.append(chunk)
    return b"".join(parts)


def payload(n: int, seed: int = 0) -> bytes:
    # Not repeating at any short period, so a reordered or dropped chunk shows.
    return b"".join(struct.pack(">II", seed, i) for i in range(n // 8 + 1))[:n]


def echo_handler(prefix: bytes = b"") -> Callable[[ByteStream], Coroutine[Any, Any, None]]:
    async def handler(stream: ByteStream) -> None:
        data = await read_all(stream)
        await stream.send_all(prefix + data)
        await stream.aclose()

    return handler


def sized_handler(prefix: bytes = b"") -> Callable[[ByteStream], Coroutine[Any, Any, None]]:
    """Reads a 4-byte length and that many bytes, answers: no half-close needed."""

    async def handler(stream: ByteStream) -> None:
        (n,) = struct.unpack(">I", await stream.receive_exactly(4))
        data = await stream.receive_exactly(n)
        await stream.send_all(prefix + data)
        await stream.aclose()

    return handler


async def sized_call(ports: Ports, port: int, data: bytes) -> bytes:
    stream = await ports.connect(port)
    try:
        await stream.send_all(struct.pack(">I", len(data)) + data)
        return await read_all(stream)
    finally:
        await stream.aclose()


# --- the suite ------------------------------------------------------------------------


def test_host_to_guest_carries_every_byte_in_order(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            pair.guest.serve(pair.down, sized_handler(b"guest:"))
            data = payload(3 << 20)
            assert await sized_call(pair.host, pair.down, data) == b"guest:" + data

    run(main())


def test_guest_to_host_carries_every_byte_in_order(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            pair.host.serve(pair.up, sized_handler(b"host:"))
            data = payload(1 << 20, seed=1)
            assert await sized_call(pair.guest, pair.up, data) == b"host:" + data

    run(main())


def test_unserved_port_is_a_port_error_not_a_hang(make_pair: Callable[[], Any]) -> None:
    """A guest with nothing on a port (or a host with no listener) refuses the stream."""

    async def main() -> None:
        async with make_pair() as pair:
            with pytest.raises(PortError):
                await pair.host.connect(pair.down + 7)
            with pytest.raises(PortError):
                await pair.guest.connect(pair.up + 7)
            pair.guest.serve(pair.down, sized_handler())
            assert await sized_call(pair.host, pair.down, b"still fine") == b"still fine"

    run(main())


def test_streams_are_independent(make_pair: Callable[[], Any]) -> None:
    """Twenty concurrent streams each get exactly their own bytes back."""

    async def main() -> None:
        async with make_pair() as pair:
            pair.guest.serve(pair.down, sized_handler())
            datas = [payload(64 << 10, seed=i) for i in range(20)]
            got = await asyncio.gather(*(sized_call(pair.host, pair.down, d) for d in datas))
            assert got == datas

    run(main())


def test_half_close_lets_the_other_side_answer(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            if not pair.half_close:
                pytest.skip("this transport has no half-close (Firecracker's hybrid vsock "
                            "ends the whole stream at the host's EOF); its protocols "
                            "delimit their own messages")
            pair.guest.serve(pair.down, echo_handler(b"echo:"))
            stream = await pair.host.connect(pair.down)
            await stream.send_all(b"to the end")
            await stream.send_eof()
            assert await read_all(stream) == b"echo:to the end"
            await stream.aclose()

    run(main())


def test_closing_a_stream_is_eof_on_the_other_side(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            seen: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

            async def handler(stream: ByteStream) -> None:
                seen.set_result(await read_all(stream))
                await stream.aclose()

            pair.guest.serve(pair.down, handler)
            stream = await pair.host.connect(pair.down)
            await stream.send_all(b"last words")
            await stream.aclose()
            await stream.aclose()  # idempotent
            assert await seen == b"last words"

    run(main())


def test_unread_stream_blocks_its_sender_then_catches_up(make_pair: Callable[[], Any]) -> None:
    """Backpressure: a receiver that does not read cannot make the sender's side
    buffer without bound; once it reads, every byte arrives."""

    async def main() -> None:
        async with make_pair() as pair:
            go = asyncio.Event()
            got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

            async def slow(stream: ByteStream) -> None:
                await go.wait()
                got.set_result(await stream.receive_exactly(8 << 20))
                await stream.aclose()

            pair.guest.serve(pair.down, slow)
            stream = await pair.host.connect(pair.down)
            data = payload(8 << 20, seed=9)
            owner = TaskOwner("sender")
            sender = owner.spawn(stream.send_all(data))
            await asyncio.sleep(0.5)
            assert not sender.done(), "8 MiB went nowhere: the transport buffered it all"
            go.set()
            await sender
            assert await got == data
            await stream.aclose()
            await owner.aclose()

    run(main())


def test_frame_over_the_bound_is_refused_on_any_transport(make_pair: Callable[[], Any]) -> None:
    """Attack: a peer announces a frame larger than 1 MiB to make the other side
    buffer it; the framing above every transport refuses it before reading it."""

    async def main() -> None:
        async with make_pair() as pair:
            result: asyncio.Future[BaseException | None] = (
                asyncio.get_running_loop().create_future())

            async def host_side(stream: ByteStream) -> None:
                try:
                    await FramedStream(stream).receive()
                except FrameError as exc:
                    result.set_result(exc)
                else:
                    result.set_result(None)
                await stream.aclose()

            pair.host.serve(pair.up, host_side)
            stream = await pair.guest.connect(pair.up)
            await stream.send_all(struct.pack(">I", MAX_FRAME + 1) + b"\x80" * 64)
            assert isinstance(await result, FrameError)
            await stream.aclose()

    run(main())


def test_streams_past_the_bound_are_refused_and_closing_gives_room_back(
    make_pair: Callable[[], Any],
) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            release = asyncio.Event()

            async def hold(stream: ByteStream) -> None:
                await release.wait()
                await stream.aclose()

            pair.guest.serve(pair.down, hold)
            opened: list[ByteStream] = []
            with pytest.raises(PortError):
                for _ in range(300):
                    opened.append(await pair.host.connect(pair.down))
            assert 1 <= len(opened) < 300
            for stream in opened:
                await stream.aclose()
            release.set()
            pair.guest.serve(pair.down + 1, sized_handler())
            assert await sized_call(pair.host, pair.down + 1, b"room again") == b"room again"

    run(main())


def test_reserved_streams_remain_when_ordinary_ones_are_used_up(
    make_pair: Callable[[], Any],
) -> None:
    """Attack: a guest whose RPC handler never answers makes the host pile up open
    requests until it cannot open one more; the host must still be able to open
    the streams it needs at stop (the diff, shutdown): `reserved=True`."""

    async def main() -> None:
        async with make_pair() as pair:
            release = asyncio.Event()

            async def hold(stream: ByteStream) -> None:
                await release.wait()
                await stream.aclose()

            pair.guest.serve(pair.down, hold)
            opened: list[ByteStream] = []
            with pytest.raises(PortError):
                for _ in range(300):
                    opened.append(await pair.host.connect(pair.down))
            reserved = [await pair.host.connect(pair.down, reserved=True) for _ in range(2)]
            with pytest.raises(PortError):
                await pair.host.connect(pair.down, reserved=True)  # reserved is bounded too
            for stream in opened + reserved:
                await stream.aclose()
            release.set()

    run(main())


def test_a_failing_handler_ends_only_its_own_stream(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            async def broken(stream: ByteStream) -> None:
                raise RuntimeError("handler bug")

            pair.guest.serve(pair.down, broken)
            pair.guest.serve(pair.down + 1, sized_handler())
            stream = await pair.host.connect(pair.down)
            assert await read_all(stream) == b""
            await stream.aclose()
            assert await sized_call(pair.host, pair.down + 1, b"alive") == b"alive"

    run(main())


def test_after_aclose_connect_is_transport_closed(make_pair: Callable[[], Any]) -> None:
    """A closed transport says so by type (`TransportClosed`), and closing is idempotent;
    handlers still running are cancelled and their streams closed."""

    async def main() -> None:
        async with make_pair() as pair:
            started, cancelled = asyncio.Event(), asyncio.Event()

            async def forever(stream: ByteStream) -> None:
                started.set()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cancelled.set()
                    raise

            pair.host.serve(pair.up, forever)
            stream = await pair.guest.connect(pair.up)
            await stream.send_all(b"x")
            await started.wait()
            await pair.host.aclose()
            assert cancelled.is_set()
            await pair.host.aclose()
            with pytest.raises(TransportClosed):
                await pair.host.connect(pair.down)
            await stream.aclose()

    run(main())


def test_connect_refuses_a_port_that_is_not_a_u32(make_pair: Callable[[], Any]) -> None:
    async def main() -> None:
        async with make_pair() as pair:
            for bad in (-1, 1 << 32):
                with pytest.raises(PortError):
                    await pair.host.connect(bad)
            assert encode_connect(pair.down) == b"CONNECT %d\n" % pair.down

    run(main())
