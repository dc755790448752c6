"""The serial stream multiplexer: many port streams over one byte stream.

Used wherever the guest is reached through one virtio-serial port (QEMU
anywhere, software emulation included), so that every layer above sees the
same one-connection-per-request semantics as vsock.

Written by hand: no maintained library multiplexes byte streams over a serial
line with per-stream credit in a form the guest can carry (stdlib only).

This module is the asyncio shell, `MuxPorts` implementing `Ports`: it reads
the link, hands the bytes to the sans-IO core (`tkbox.protocol.muxcore`:
the wire format, stream ids, credit windows, every protocol rule), runs a
handler task per accepted stream and writes what the core queued. The core's
public names are re-exported here (callers import them from either).

Bounds against a hostile peer (each side applies them to the other), the
stream counts being the core's:

- **Streams, counted apart.** The peer may have `max_streams` streams it
  opened; we may have `max_own` streams we opened, of which `RESERVED_OWN`
  are kept for `connect(..., reserved=True)`. A peer that opens every stream
  it may still cannot stop the host asking for the diff at stop.
- **Output.** Frames the peer makes us send without credit (RESET for a
  refused OPEN, ACCEPT, CREDIT) are counted; while more than
  `MAX_QUEUED_CONTROL` bytes of them wait to be written (the peer does not
  read its end), the peer is no longer read. DATA is bounded by each
  stream's credit and, over all streams, by `MAX_QUEUED_OUT`: a writer waits
  before queuing more while that much is still unwritten.
- **Input.** Bytes received but not yet read by their stream's owner are
  counted across streams; above `MAX_BUFFERED_IN` the peer is no longer read.
- **Work.** Every frame parsed costs one unit of the transport's `Budget`,
  plus one per `BYTES_PER_UNIT` bytes of payload (copying bytes is work too),
  and every OPEN `OPEN_COST` units (a stream costs the host a task, buffers
  and an answer, whether it is served or refused): abuse that breaks no rule is
  read more slowly instead of taking the event loop from other boxes. At
  most `SLICE_FRAMES` frames are parsed between two yields to the loop.

Standard library only: the guest agent imports this module.
"""

from __future__ import annotations

import asyncio

from tkbox._tasks import TaskOwner
from tkbox.protocol.budget import Budget
from tkbox.protocol.muxcore import BYTES_PER_UNIT as BYTES_PER_UNIT
from tkbox.protocol.muxcore import HEADER as HEADER
from tkbox.protocol.muxcore import MAX_OWN as MAX_OWN
from tkbox.protocol.muxcore import MAX_PAYLOAD as MAX_PAYLOAD
from tkbox.protocol.muxcore import MAX_REASON as MAX_REASON
from tkbox.protocol.muxcore import MAX_STREAMS as MAX_STREAMS
from tkbox.protocol.muxcore import OPEN_COST as OPEN_COST
from tkbox.protocol.muxcore import RESERVED_OWN as RESERVED_OWN
from tkbox.protocol.muxcore import WINDOW as WINDOW
from tkbox.protocol.muxcore import Accepted as Accepted
from tkbox.protocol.muxcore import Credit as Credit
from tkbox.protocol.muxcore import Data as Data
from tkbox.protocol.muxcore import Eof as Eof
from tkbox.protocol.muxcore import Event as Event
from tkbox.protocol.muxcore import MuxCore as MuxCore
from tkbox.protocol.muxcore import MuxError as MuxError
from tkbox.protocol.muxcore import Opened as Opened
from tkbox.protocol.muxcore import Reset as Reset
from tkbox.protocol.muxcore import T as T
from tkbox.protocol.ports import Handler, PortError, Ports, TransportClosed
from tkbox.protocol.streams import ByteStream, StreamClosed

MAX_QUEUED_CONTROL = 64 * 1024  # bytes of uncredited frames owed to a peer that does not read
MAX_BUFFERED_IN = 16 << 20  # bytes received and not yet read, over all streams
MAX_QUEUED_OUT = 4 << 20  # bytes queued or being written to the peer, over all streams
SLICE_FRAMES = 256  # frames parsed between two yields to the event loop


class MuxStream(ByteStream):
    """One port stream carried by a `MuxPorts`."""

    def __init__(self, mux: MuxPorts, sid: int) -> None:
        self._mux = mux
        self.sid = sid
        self._buf = bytearray()
        self._eof = False
        self._reset: str | None = None
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed = False

    # called by MuxPorts
    def _on_data(self, data: bytes) -> None:
        self._buf += data
        self._mux._buffered += len(data)
        self._readable.set()

    def _on_eof(self) -> None:
        self._eof = True
        self._readable.set()

    def _on_reset(self, reason: str) -> None:
        self._reset = reason or "reset by peer"
        self._eof = True
        self._readable.set()
        self._writable.set()

    def _on_credit(self) -> None:
        self._writable.set()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._buf and not self._eof and not self._closed:
            self._readable.clear()
            await self._readable.wait()
        data = bytes(self._buf[:max_bytes])
        del self._buf[:max_bytes]
        if data:
            self._mux._buffered -= len(data)
            self._mux._room.set()
            self._mux._core.consumed(self.sid, len(data))
            self._mux._kick()
        return data

    async def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._reset is not None or self._closed:
                raise StreamClosed(self._reset or "stream is closed")
            if self._mux.dead is not None:
                raise StreamClosed(self._mux.dead)
            if self._mux._output_full():
                # A peer that does not read: queue nothing more until the writer gets through.
                await self._mux._drained()
                continue
            n = self._mux._core.send(self.sid, bytes(view[:MAX_PAYLOAD * 4]))
            if n:
                view = view[n:]
                self._mux._kick()
                await self._mux._drained()
            else:
                self._writable.clear()
                await self._writable.wait()

    async def send_eof(self) -> None:
        if self._reset is None and not self._closed:
            self._mux._core.eof(self.sid)
            self._mux._kick()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        core = self._mux._core
        if core.is_open(self.sid):
            if self._eof:
                core.eof(self.sid)
            else:
                core.reset(self.sid, "closed")
            self._mux._kick()
        self._mux._streams.pop(self.sid, None)
        if self._buf:  # unread bytes no longer count against the mux
            self._mux._buffered -= len(self._buf)
            self._buf.clear()
            self._mux._room.set()
        # a receive or send waiting on this stream returns (b"") or raises StreamClosed
        self._readable.set()
        self._writable.set()


class MuxPorts(Ports):
    """`Ports` over one byte stream (a virtio-serial port, or its host socket).

    `run()` must be running (in a task the owner holds) for anything to move;
    it returns when the underlying stream ends or the peer breaks the protocol
    (`dead` then says why), after resetting every stream.
    """

    def __init__(self, link: ByteStream, *, initiator: bool, window: int = WINDOW,
                 max_streams: int = MAX_STREAMS, max_own: int = MAX_OWN,
                 open_timeout: float = 30.0, budget: Budget | None = None,
                 max_queued_control: int = MAX_QUEUED_CONTROL,
                 max_buffered_in: int = MAX_BUFFERED_IN) -> None:
        self._link = link
        self._core = MuxCore(initiator=initiator, window=window, max_streams=max_streams,
                             max_own=max_own)
        self.budget: Budget = budget if budget is not None else Budget()
        self._max_ctl = max_queued_control
        self._max_in = max_buffered_in
        self._buffered = 0  # bytes in every MuxStream's buffer
        self._ctl_inflight = 0  # control bytes handed to the writer, not yet written
        self._out_inflight = 0  # bytes handed to the writer, not yet written
        self._room = asyncio.Event()
        self.paused_reads = 0  # times the peer was not read because of a bound
        self._streams: dict[int, MuxStream] = {}
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._handlers: dict[int, Handler] = {}
        self._tasks = TaskOwner("tkbox-mux-handler")  # one per accepted stream
        self._wake = asyncio.Event()
        self._flushed = asyncio.Event()
        self._flushed.set()
        self._open_timeout = open_timeout
        self.dead: str | None = None
        self.violation = False  # the peer broke the protocol (else: the link ended)
        self._dead_event = asyncio.Event()

    # -- Ports ---------------------------------------------------------

    async def connect(self, port: int, *, reserved: bool = False) -> ByteStream:
        if self.dead is not None:
            raise self._down()
        sid = self._core.open(port, reserved=reserved)
        stream = MuxStream(self, sid)
        self._streams[sid] = stream
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[sid] = fut
        self._kick()
        try:
            await asyncio.wait_for(fut, self._open_timeout)
        except TimeoutError:
            self._core.reset(sid, "open timed out")
            self._streams.pop(sid, None)
            self._kick()
            raise PortError(f"no answer opening port {port}") from None
        finally:
            self._pending.pop(sid, None)
        return stream

    def serve(self, port: int, handler: Handler) -> None:
        self._handlers[port] = handler

    async def aclose(self) -> None:
        self._fail("closed")
        try:
            await self._tasks.aclose()
        finally:
            await self._link.aclose()

    # -- engine ----------------------------------------------------------

    def _kick(self) -> None:
        self._wake.set()
        self._flushed.clear()

    async def _drained(self) -> None:
        # Back-pressure: wait until the writer has handed our frames to the link.
        await self._flushed.wait()

    async def wait_closed(self) -> str:
        await self._dead_event.wait()
        return self.dead or "closed"

    def _down(self) -> PortError:
        """What `connect` raises once the mux is dead: `TransportClosed` when the
        link ended or was closed here, a plain `PortError` when the peer broke it."""
        kind = PortError if self.violation else TransportClosed
        return kind(f"transport is down: {self.dead}")

    def _fail(self, why: str, *, violation: bool = False) -> None:
        if self.dead is None:
            self.dead = why
            self.violation = violation
            self._dead_event.set()
        for s in list(self._streams.values()):
            s._on_reset(why)
        for f in self._pending.values():
            if not f.done():
                f.set_exception(self._down())
        self._flushed.set()
        self._wake.set()
        self._room.set()

    def _output_full(self) -> bool:
        return self._core.pending_output + self._out_inflight >= MAX_QUEUED_OUT

    def _over_bounds(self) -> bool:
        ctl = self._core.control_pending + self._ctl_inflight
        return ctl > self._max_ctl or self._buffered > self._max_in

    async def run(self) -> None:
        writer = TaskOwner("tkbox-mux-writer")  # lives exactly as long as this call
        writer.spawn(self._writer())
        core = self._core
        try:
            while self.dead is None:
                if not core.has_frame():
                    data = await self._link.receive(65536)
                    if not data:
                        self._fail("the other side closed the link")
                        break
                else:
                    data = b""
                for ev in core.receive_data(data, SLICE_FRAMES):
                    self._dispatch(ev)
                self._kick()
                cost, core.work_in = core.work_in, 0
                wait = self.budget.spend(cost)
                if self._over_bounds():
                    # Owed output piles up, or nobody reads what came in: stop reading
                    # this peer until the writer or the streams' owners catch up.
                    self.paused_reads += 1
                    while self._over_bounds() and self.dead is None:
                        self._room.clear()
                        await self._room.wait()
                # Always yield between slices: a read from a busy link returns without
                # suspending, so without this one guest could hold the loop for its burst.
                await self.budget.pause(wait)
        except MuxError as exc:
            self._fail(f"protocol violation: {exc}", violation=True)
        finally:
            self._fail("mux stopped")
            await writer.aclose()

    async def _writer(self) -> None:
        while self.dead is None:
            await self._wake.wait()
            self._wake.clear()
            self._ctl_inflight = self._core.control_pending
            out = self._core.data_to_send()
            self._out_inflight = len(out)
            if out:
                try:
                    await self._link.send_all(out)
                except StreamClosed as exc:
                    self._fail(f"link closed: {exc}")
                    return
            self._ctl_inflight = self._out_inflight = 0
            self._room.set()
            if not self._wake.is_set():
                self._flushed.set()

    def _dispatch(self, ev: Event) -> None:
        if isinstance(ev, Opened):
            handler = self._handlers.get(ev.port)
            if handler is None or self._tasks.closed:
                self._core.reject(ev.sid, f"no listener on port {ev.port}")
                return
            self._core.accept(ev.sid)
            stream = MuxStream(self, ev.sid)
            self._streams[ev.sid] = stream
            self._tasks.spawn(self._run_handler(handler, stream), f"tkbox-mux-port-{ev.port}")
            return
        if isinstance(ev, Accepted):
            fut = self._pending.get(ev.sid)
            if fut is not None and not fut.done():
                fut.set_result(None)
            return
        target = self._streams.get(ev.sid)
        if isinstance(ev, Reset):
            fut = self._pending.get(ev.sid)
            if fut is not None and not fut.done():
                fut.set_exception(PortError(f"refused: {ev.reason}"))
            if target is not None:
                target._on_reset(ev.reason)
                self._streams.pop(ev.sid, None)
            return
        if target is None:
            return
        if isinstance(ev, Data):
            target._on_data(ev.data)
        elif isinstance(ev, Eof):
            target._on_eof()
        elif isinstance(ev, Credit):
            target._on_credit()

    async def _run_handler(self, handler: Handler, stream: MuxStream) -> None:
        try:
            await handler(stream)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001, S110 - a handler's failure ends its stream, not the mux
            pass
        finally:
            await stream.aclose()
