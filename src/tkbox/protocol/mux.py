"""The serial stream multiplexer: many port streams over one byte stream.

Used wherever the guest is reached through one virtio-serial port (QEMU
anywhere, software emulation included), so that every layer above sees the
same one-connection-per-request semantics as vsock.

Written by hand: no maintained library multiplexes byte streams over a serial
line with per-stream credit in a form the guest can carry (stdlib only).

Wire format, every frame::

    type: u8 | stream id: u32 BE | length: u32 BE | payload (length bytes, ≤ 64 KiB)

| type   | payload            | meaning                                          |
| ------ | ------------------ | ------------------------------------------------ |
| OPEN   | port: u32 BE       | open stream `id` to the peer's listener on port  |
| ACCEPT | (empty)            | the listener took stream `id`                    |
| DATA   | bytes (≥ 1)        | stream data; consumes the sender's credit        |
| CREDIT | increment: u32 BE  | the receiver consumed bytes; sender may send more |
| EOF    | (empty)            | sender will send no more data (half-close)       |
| RESET  | reason: UTF-8      | abort both directions; the id is free again      |

The host opens odd ids, the guest even ones, so ids never collide. Each
stream starts with `WINDOW` bytes of credit in each direction: a peer that
sends more than it was granted, or a frame that breaks these rules, is a
protocol violation and ends the whole mux (`MuxError`). A flood on one stream
can fill only that stream's window, so it cannot starve another stream.

Bounds against a hostile peer (each side applies them to the other):

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

`MuxCore` is sans-IO; `MuxPorts` is the asyncio shell implementing `Ports`.
Standard library only: the guest agent imports this module.

Why one module (about 660 lines): the wire format, the sans-IO core and its
asyncio shell are one protocol; the shell's bounds (owed output, unread
input, work) are stated against the core's counters, and keeping them side by
side is what lets a reader check one against the other.
"""

from __future__ import annotations

import asyncio
import enum
import struct
from dataclasses import dataclass

from tkbox._tasks import TaskOwner
from tkbox.protocol import errors
from tkbox.protocol.budget import Budget
from tkbox.protocol.ports import Handler, PortError, Ports, TransportClosed
from tkbox.protocol.streams import ByteStream, StreamClosed

HEADER = struct.Struct(">BII")
MAX_PAYLOAD = 64 * 1024
WINDOW = 256 * 1024
MAX_STREAMS = 1024  # streams the peer may have open at once
MAX_OWN = 128  # streams we may have open at once, RESERVED_OWN of them kept back
RESERVED_OWN = 2  # for the host's own use at stop (diff, shutdown)
MAX_REASON = 512
MAX_QUEUED_CONTROL = 64 * 1024  # bytes of uncredited frames owed to a peer that does not read
MAX_BUFFERED_IN = 16 << 20  # bytes received and not yet read, over all streams
MAX_QUEUED_OUT = 4 << 20  # bytes queued or being written to the peer, over all streams
SLICE_FRAMES = 256  # frames parsed between two yields to the event loop
OPEN_COST = 200  # budget units an OPEN costs the peer (at the default rate: 100 a second)
BYTES_PER_UNIT = 4096  # payload bytes that cost one budget unit (~80 MB/s at the default rate)


MuxError = errors.MuxError  # re-exported: callers import it from here


class T(enum.IntEnum):
    OPEN = 1
    ACCEPT = 2
    DATA = 3
    CREDIT = 4
    EOF = 5
    RESET = 6


# ---- events the core yields ------------------------------------------------


@dataclass(frozen=True)
class Opened:
    sid: int
    port: int


@dataclass(frozen=True)
class Accepted:
    sid: int


@dataclass(frozen=True)
class Data:
    sid: int
    data: bytes


@dataclass(frozen=True)
class Credit:
    sid: int
    increment: int


@dataclass(frozen=True)
class Eof:
    sid: int


@dataclass(frozen=True)
class Reset:
    sid: int
    reason: str


Event = Opened | Accepted | Data | Credit | Eof | Reset


@dataclass
class _State:
    send_credit: int
    recv_allowed: int  # bytes the peer may still send before our next CREDIT
    unacked: int = 0  # bytes consumed by the application, not yet credited back
    sent_eof: bool = False
    got_eof: bool = False
    accepted: bool = False


def _reason(payload: bytes) -> str:
    """A RESET's reason from the peer: bounded, printable ASCII only (it reaches messages)."""
    return "".join(c if " " <= c <= "~" else "?"
                   for c in payload[:MAX_REASON].decode("ascii", "replace"))


class MuxCore:
    """Sans-IO mux state: feed received bytes, collect bytes to send."""

    def __init__(self, *, initiator: bool, window: int = WINDOW, max_streams: int = MAX_STREAMS,
                 max_own: int = MAX_OWN, reserved: int = RESERVED_OWN):
        self._parity = 1 if initiator else 0
        self._next_id = 1 if initiator else 2
        self._window = window
        self._max_streams = max_streams
        self._max_own = max_own
        self._reserved = min(reserved, max_own)
        self._streams: dict[int, _State] = {}
        self._own = 0  # streams in _streams that we opened
        self._inbuf = bytearray()
        self._out = bytearray()
        self.control_pending = 0  # bytes of non-DATA frames in _out
        self.work_in = 0  # budget units of what was parsed, for the owner's budget
        self.refused_opens = 0  # OPENs from the peer we refused
        self.closed = False

    # -- outgoing ---------------------------------------------------------

    def _frame(self, t: T, sid: int, payload: bytes = b"") -> None:
        self._out += HEADER.pack(t, sid, len(payload)) + payload
        if t is not T.DATA:
            self.control_pending += HEADER.size + len(payload)

    @property
    def pending_output(self) -> int:
        return len(self._out)

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        self.control_pending = 0
        return out

    def _mine(self, sid: int) -> bool:
        return sid % 2 == self._parity

    def _forget(self, sid: int) -> _State | None:
        st = self._streams.pop(sid, None)
        if st is not None and self._mine(sid):
            self._own -= 1
        return st

    def open(self, port: int, *, reserved: bool = False) -> int:
        """Open a stream to `port`; `reserved` may use the last `RESERVED_OWN` slots."""
        limit = self._max_own if reserved else self._max_own - self._reserved
        if self._own >= limit:
            raise PortError(f"too many open streams ({self._own} of {limit})")
        if not 0 <= port < 1 << 32:
            raise PortError(f"bad port {port}")
        sid = self._next_id
        self._next_id += 2
        if self._next_id >= 1 << 32:
            raise PortError("stream ids exhausted")
        self._streams[sid] = _State(self._window, self._window)
        self._own += 1
        self._frame(T.OPEN, sid, struct.pack(">I", port))
        return sid

    def accept(self, sid: int) -> None:
        st = self._streams[sid]
        st.accepted = True
        self._frame(T.ACCEPT, sid)

    def send(self, sid: int, data: bytes) -> int:
        """Queue up to the stream's credit; returns how many bytes were taken."""
        st = self._streams.get(sid)
        if st is None or st.sent_eof:
            raise StreamClosed("stream is closed")
        n = min(len(data), st.send_credit)
        for i in range(0, n, MAX_PAYLOAD):
            self._frame(T.DATA, sid, data[i : min(n, i + MAX_PAYLOAD)])
        st.send_credit -= n
        return n

    def credit(self, sid: int) -> int:
        st = self._streams.get(sid)
        return st.send_credit if st else 0

    def consumed(self, sid: int, n: int) -> None:
        """The application read `n` bytes of stream `sid`: grant them back in batches."""
        st = self._streams.get(sid)
        if st is None or st.got_eof:
            return
        st.unacked += n
        if st.unacked >= self._window // 2:
            st.recv_allowed += st.unacked
            self._frame(T.CREDIT, sid, struct.pack(">I", st.unacked))
            st.unacked = 0

    def eof(self, sid: int) -> None:
        st = self._streams.get(sid)
        if st is None or st.sent_eof:
            return
        st.sent_eof = True
        self._frame(T.EOF, sid)
        self._maybe_forget(sid)

    def reset(self, sid: int, reason: str = "") -> None:
        if self._forget(sid) is None:
            return
        self._frame(T.RESET, sid, reason.encode("utf-8", "replace")[:MAX_REASON])

    def reject(self, sid: int, reason: str) -> None:
        """Refuse an incoming OPEN (no listener, too many streams)."""
        self.refused_opens += 1
        self._forget(sid)
        self._frame(T.RESET, sid, reason.encode("utf-8", "replace")[:MAX_REASON])

    def _maybe_forget(self, sid: int) -> None:
        st = self._streams.get(sid)
        if st is not None and st.sent_eof and st.got_eof:
            self._forget(sid)

    def is_open(self, sid: int) -> bool:
        return sid in self._streams

    @property
    def stream_count(self) -> int:
        return len(self._streams)

    @property
    def own_stream_count(self) -> int:
        return self._own

    # -- incoming ---------------------------------------------------------

    def has_frame(self) -> bool:
        """A whole frame is buffered (call `receive_data(b"")` to parse it)."""
        if len(self._inbuf) < HEADER.size:
            return False
        n: int = HEADER.unpack_from(self._inbuf)[2]
        return n > MAX_PAYLOAD or len(self._inbuf) >= HEADER.size + n

    def receive_data(self, data: bytes, max_frames: int | None = None) -> list[Event]:
        """Buffer `data`; parse whole frames (at most `max_frames`) into events."""
        if self.closed:
            raise MuxError("mux is closed")
        self._inbuf += data
        events: list[Event] = []
        parsed = 0
        while len(self._inbuf) >= HEADER.size and (max_frames is None or parsed < max_frames):
            t, sid, n = HEADER.unpack_from(self._inbuf)
            if n > MAX_PAYLOAD:
                raise MuxError(f"mux frame of {n} bytes exceeds {MAX_PAYLOAD}")
            if len(self._inbuf) < HEADER.size + n:
                break
            payload = bytes(self._inbuf[HEADER.size : HEADER.size + n])
            del self._inbuf[: HEADER.size + n]
            parsed += 1
            self.work_in += 1 + n // BYTES_PER_UNIT + (OPEN_COST if t == T.OPEN else 0)
            ev = self._handle(t, sid, payload)
            if ev is not None:
                events.append(ev)
        return events

    def _handle(self, t: int, sid: int, payload: bytes) -> Event | None:
        try:
            kind = T(t)
        except ValueError:
            raise MuxError(f"unknown mux frame type {t}") from None
        if kind is T.OPEN:
            if len(payload) != 4:
                raise MuxError("OPEN frame payload must be 4 bytes")
            if self._mine(sid) or sid == 0:
                raise MuxError(f"peer opened stream {sid} with our parity")
            if sid in self._streams:
                raise MuxError(f"peer reopened stream {sid}")
            (port,) = struct.unpack(">I", payload)
            if len(self._streams) - self._own >= self._max_streams:
                self.reject(sid, f"too many open streams ({self._max_streams})")
                return None
            self._streams[sid] = _State(self._window, self._window)
            return Opened(sid, port)
        st = self._streams.get(sid)
        if kind is T.RESET:
            if st is None:
                if self._mine(sid):
                    # The answer to one of our OPENs may be a reset we already forgot.
                    return Reset(sid, _reason(payload))
                return None
            self._forget(sid)
            return Reset(sid, _reason(payload))
        if st is None:
            # A frame for a stream we already reset or finished: in flight, ignore.
            return None
        if kind is T.ACCEPT:
            if payload or not self._mine(sid) or st.accepted:
                raise MuxError(f"unexpected ACCEPT for stream {sid}")
            st.accepted = True
            return Accepted(sid)
        if kind is T.DATA:
            if not payload:
                raise MuxError("empty DATA frame")
            if st.got_eof:
                raise MuxError(f"DATA after EOF on stream {sid}")
            if len(payload) > st.recv_allowed:
                raise MuxError(f"peer sent past its credit on stream {sid}")
            st.recv_allowed -= len(payload)
            return Data(sid, payload)
        if kind is T.CREDIT:
            if len(payload) != 4:
                raise MuxError("CREDIT frame payload must be 4 bytes")
            (inc,) = struct.unpack(">I", payload)
            if inc == 0 or st.send_credit + inc > 4 * self._window:
                raise MuxError(f"bad credit {inc} on stream {sid}")
            st.send_credit += inc
            return Credit(sid, inc)
        if kind is T.EOF:
            if payload or st.got_eof:
                raise MuxError(f"bad EOF on stream {sid}")
            st.got_eof = True
            self._maybe_forget(sid)
            return Eof(sid)
        raise MuxError(f"unhandled frame type {kind}")  # pragma: no cover


# ---- asyncio shell ------------------------------------------------------


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
        while not self._buf and not self._eof:
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
