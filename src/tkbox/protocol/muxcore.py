"""The serial stream multiplexer's sans-IO core: frames in, events and frames out.

The state machine of `tkbox.protocol.mux` (its asyncio shell, `MuxPorts`):
stream ids, per-stream credit windows, the stream bounds and every protocol
rule. Bytes received go in (`MuxCore.receive_data`), events come out; calls
(`open`, `send`, `consumed`, `eof`, `reset`) queue frames, taken with
`data_to_send`. It reads no clock, touches no socket and starts no task
(`tests/unit/test_import_graph.py` checks that it imports nothing that could).

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

Streams are counted apart: the peer may have `max_streams` streams it
opened (an OPEN past that is refused with a RESET, counted in
`refused_opens`); we may have `max_own` streams we opened, of which
`RESERVED_OWN` are kept for `open(..., reserved=True)`. What parsing cost
the peer is counted in `work_in` (one unit a frame, one per `BYTES_PER_UNIT`
bytes of payload, `OPEN_COST` an OPEN) and what we owe it without credit in
`control_pending`, for the shell to bound.

Standard library only: the guest agent imports this module.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from tkbox.protocol import errors
from tkbox.protocol.errors import PortError, StreamClosed

HEADER = struct.Struct(">BII")
MAX_PAYLOAD = 64 * 1024
WINDOW = 256 * 1024
MAX_STREAMS = 1024  # streams the peer may have open at once
MAX_OWN = 128  # streams we may have open at once, RESERVED_OWN of them kept back
RESERVED_OWN = 2  # for the host's own use at stop (diff, shutdown)
MAX_REASON = 512
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
