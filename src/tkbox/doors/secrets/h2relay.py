"""HTTP/2 on an intercepted tunnel: the asyncio shell around two `h2` connections.

One idea: relaying one intercepted HTTP/2 connection stream for stream, as the
asyncio shell of two `h2` connections; the rules it applies are the pure
`tkbox.doors.secrets.h2core`'s.

**Which way.** The door speaks HTTP/2 to the box only when the origin does too,
and relays stream for stream (the box's stream n is one origin stream): it
never translates HTTP/2 to HTTP/1.1. Translating would put every stream of a
connection onto the one origin connection the network door dialed and checked
(a tunnel has exactly one), one request at a time, and a `Connection: close`
from the origin would end streams the box still has open; relaying keeps each
stream's framing, trailers and flow control end to end, and the origin's own
limits. So the door reads the box's ClientHello first (`tls.read_client_hello`),
offers `h2` to the origin only if the box offered it, and offers `h2` to the box
only if the origin chose it (`SecretsDoor.tunnel`); otherwise both legs are
HTTP/1.1 (h11, `door.py`).

**Per stream, exactly what an HTTP/1.1 request gets** (`_open`, `_pump_request`,
`_on_origin`): the head read from the pseudo-fields (`h2core.read_request`:
CONNECT and extended CONNECT refused, `:scheme` https, `:authority` and `host`
agreeing), then `TunnelRules.request` (the host is the tunnel's, origin-form
target, the swap into the bound header, the scan of target and fields), then the
gate (`HttpGate.check`: the rules, `ask`, the signer's `Http` decision) before
anything of the stream reaches the origin; the body scanned with the scanner's
hold kept back, trailers scanned; the response's fields, body and trailers
redacted by the stream's own `Redactor`; `tkbox.secret.use` per swap,
`tkbox.secret.leak` per leak (that stream answered 403 and its origin stream
reset; the others go on), `tkbox.model.call` and `tkbox.http.request` per
stream, in the `finally` of the stream's task, whichever way it ended.

**Tasks.** One reader and one writer per leg, one task per stream (its gate
decision may wait for a person), all in one task group that ends with the
tunnel. `h2` is sans-IO; every call on it is made from the loop's one thread,
and only the writers send: each leg's output is queued (`_Side.out`) and the
writer drains it. A leg whose queued output passes `out_low` is neither read
from nor fed DATA until it drains (a peer that does not read what it is sent
gets nothing more, and its frames wait in the kernel).

**Flow control.** A stream's bytes are acknowledged to their sender only once
they have been sent on to the other leg (`h2core` "Memory").

**Endings.** A flood or a malformed frame from the box ends the connection with
GOAWAY (the reason in its debug data) and `ended: refused request`; from the
origin, with `origin error`, every open stream answered 502 or reset. An
origin's GOAWAY refuses (REFUSED_STREAM) the streams it did not take and answers
502 on the others that have no response yet. `h2`'s exception texts are never
shown or recorded: they can quote a header, which can hold a secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from tkbox.doors.network.errors import ConnectionEnded
from tkbox.doors.network.httpgate import Admitted, HttpGate, HttpRefused
from tkbox.doors.secrets.exchange import Exchange
from tkbox.doors.secrets.h2core import (
    FrameGuard,
    H2Flood,
    H2Limits,
    Headers,
    origin_head,
    read_request,
    refusal,
)
from tkbox.doors.secrets.leaks import LeakScanner, Redactor
from tkbox.doors.secrets.rules import BadTunnelRequest, SecretLeak, TunnelRules
from tkbox.doors.secrets.tlsstream import TLSError, TLSStream
from tkbox.protocol.streams import StreamClosed

log = logging.getLogger(__name__)

Recorder = Callable[[str, dict[str, Any]], Awaitable[None]]
CHUNK = 64 * 1024
DRAIN_SECONDS = 2.0
E = h2.errors.ErrorCodes


class _H2Ended(Exception):
    """The connection ends: `ended` for the completion, `reason` if refused."""

    def __init__(self, ended: str, reason: str | None = None) -> None:
        super().__init__(ended)
        self.ended, self.reason = ended, reason


@dataclass
class _Side:
    who: str
    stream: TLSStream
    conn: h2.connection.H2Connection
    guard: FrameGuard
    low: int
    out: bytearray = field(default_factory=bytearray)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    room: asyncio.Event = field(default_factory=asyncio.Event)

    def take(self) -> None:
        """Queue what `h2` has to send; wake the writer; note whether there is room."""
        data = self.conn.data_to_send()
        if data:
            self.out += data
            self.wake.set()
        if len(self.out) < self.low:
            self.room.set()
        else:
            self.room.clear()

    @property
    def has_room(self) -> bool:
        return len(self.out) < self.low


@dataclass
class _Stream:
    """One box stream and, once forwarded, its origin stream."""

    gid: int
    headers: list[tuple[bytes, bytes]]
    scanner: LeakScanner
    redactor: Redactor
    ex: Exchange = field(default_factory=lambda: Exchange(b"", b"", time.monotonic()))
    oid: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False
    admitted: Admitted | None = None
    leak: SecretLeak | None = None
    # request: received, not scanned; scanned, held back; scanned, waiting for a window
    pending: bytearray = field(default_factory=bytearray)
    held: bytearray = field(default_factory=bytearray)
    req_q: bytearray = field(default_factory=bytearray)
    req_end: bool = False
    req_trailers: list[tuple[bytes, bytes]] | None = None
    req_sent_end: bool = False
    req_unacked: int = 0  # body bytes from the box not yet acknowledged to it
    # response: redacted, waiting for the box's window
    resp_started: bool = False
    resp_q: bytearray = field(default_factory=bytearray)
    resp_end: bool = False
    resp_trailers: Headers | None = None
    resp_sent_end: bool = False
    resp_unacked: int = 0  # body bytes from the origin not yet acknowledged to it
    discard: bool = False  # the box's further body bytes are dropped (refused, answered)
    outcome: str | None = None  # `ended` once the response to the box is complete

    def finish(self, ended: str | None) -> None:
        if not self.finished:
            self.finished = True
            self.ex.ended = ended
            self.done.set()


def _config(client: bool) -> h2.config.H2Configuration:
    return h2.config.H2Configuration(client_side=client, header_encoding=None,
                                     validate_inbound_headers=True,
                                     normalize_inbound_headers=True,
                                     validate_outbound_headers=True,
                                     normalize_outbound_headers=False)


def _connection(client: bool, limits: H2Limits) -> h2.connection.H2Connection:
    conn = h2.connection.H2Connection(_config(client))
    conn.local_settings = h2.settings.Settings(
        client=client, initial_values={h2.settings.SettingCodes(k): v
                                       for k, v in limits.settings.items()})
    conn.decoder.max_header_list_size = limits.max_header_list
    conn.decoder.max_allowed_table_size = limits.header_table
    conn.initiate_connection()
    conn.increment_flow_control_window(limits.conn_window - 65535)
    return conn


class H2Relay:
    """One intercepted tunnel whose two legs both chose HTTP/2. See the module
    docstring. `run()` returns once the connection has ended, with `stats` filled."""

    def __init__(self, *, guest: TLSStream, origin: TLSStream, host: str, rules: TunnelRules,
                 gate: HttpGate | None, stats: dict[str, Any], counts: Any,
                 record: Recorder, model_host: bool, limits: H2Limits | None = None,
                 clock: Callable[[], float] = time.monotonic, chunk: int = CHUNK) -> None:
        self.host, self.rules, self.gate = host, rules, gate
        self.stats, self.counts, self.record = stats, counts, record
        self.model_host = model_host
        self.chunk = chunk
        hold = max(rules.body_scanner().hold, rules.redactor().hold)
        self.limits = lim = (limits or H2Limits()).for_hold(hold)
        self.g = _Side("the box", guest, _connection(False, lim),
                       FrameGuard("the box", lim, clock, preface=True), lim.out_low)
        self.o = _Side(f"the origin {host}", origin, _connection(True, lim),
                       FrameGuard(f"the origin {host}", lim, clock, preface=False), lim.out_low)
        self.streams: dict[int, _Stream] = {}
        self.by_oid: dict[int, _Stream] = {}
        self.active = 0  # stream tasks not yet ended (reset streams included)
        self.slot = asyncio.Event()  # an origin stream closed, or its limit changed
        self.origin_gone = False
        # streams opened by the box, for `run`'s group to start (their tasks are its)
        self.opened: asyncio.Queue[_Stream] = asyncio.Queue()
        stats.setdefault("streams", 0)

    # --- the connection -------------------------------------------------------------

    async def run(self) -> None:
        self.g.take()
        self.o.take()
        ended: _H2Ended | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._reader(self.g, self._on_guest))
                tg.create_task(self._reader(self.o, self._on_origin))
                tg.create_task(self._writer(self.g))
                tg.create_task(self._writer(self.o))
                # each stream is a task of this group: one failing ends the connection;
                # this loop ends when the group is cancelled (a task of it raised)
                while True:
                    tg.create_task(self._stream(await self.opened.get()))
        except* _H2Ended as eg:
            ended = eg.exceptions[0]  # type: ignore[assignment]
        except* ConnectionEnded as eg:
            raise eg.exceptions[0] from None
        # Each matching clause runs: a side's own reasoned end (`_H2Ended`, say an origin
        # cut off for flooding) is what the completion says, not the transport error
        # another task of the group met while the connection was coming down.
        except* (TLSError, StreamClosed, OSError):
            ended = ended or _H2Ended("reset")
        except* h2.exceptions.ProtocolError as eg:
            # a call `h2` refused in a state the handlers did not foresee: the
            # connection cannot go on (the class only: its text can quote a field)
            ended = ended or _H2Ended("refused request",
                                      "refused: the exchange cannot be relayed "
                                      f"({eg.exceptions[0].__class__.__name__})")
        if ended is None:  # pragma: no cover - the readers only end by raising
            ended = _H2Ended("closed")
        self.stats["ended"] = ended.ended
        if ended.reason is not None:
            self.stats["reason"] = ended.reason
        # what is queued (a GOAWAY, a last refusal) goes out if the box still reads
        with contextlib.suppress(Exception):
            async with asyncio.timeout(DRAIN_SECONDS):
                for side in (self.g, self.o):
                    side.take()
                    if side.out:
                        data, side.out = bytes(side.out), bytearray()
                        await side.stream.send_all(data)

    async def _writer(self, side: _Side) -> None:
        while True:
            await side.wake.wait()
            side.wake.clear()
            while side.out:
                data = bytes(side.out[:self.chunk])
                del side.out[:len(data)]
                await side.stream.send_all(data)
                if side.has_room:
                    # whatever stopped for want of room (DATA to this side, reading
                    # from it) goes on
                    side.room.set()
                    self._pump_all()
                    self._take()

    async def _reader(self, side: _Side, handle: Callable[[Any], None]) -> None:
        while True:
            await side.room.wait()
            data = await side.stream.receive(self.chunk)
            if not data:
                if side is self.g:
                    raise _H2Ended("client closed")
                self._origin_failed("the origin closed the connection")
                raise _H2Ended("origin closed")
            try:
                side.guard.feed(data)
                events = side.conn.receive_data(data)
            except H2Flood as flood:
                self._cut(side, E.ENHANCE_YOUR_CALM, flood.reason)
            except h2.exceptions.ProtocolError as exc:
                # the class only: h2's text can quote a field, which can hold a secret
                self._cut(side, None, f"refused: {side.who} broke HTTP/2 "
                                      f"({exc.__class__.__name__})")
            for ev in events:
                handle(ev)
            self._take()

    def _cut(self, side: _Side, code: E | None, reason: str) -> None:
        """End the connection for what `side` sent: raises `_H2Ended`."""
        if side is self.g:
            if code is not None:
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self.g.conn.close_connection(code, reason.encode("ascii", "replace")[:512])
            self._close(self.o, E.NO_ERROR, b"")
            self._take()
            raise _H2Ended("refused request", reason)
        if code is not None:
            self._close(self.o, code, b"")
        self._origin_failed(reason)
        raise _H2Ended("origin error", reason)

    @staticmethod
    def _close(side: _Side, code: E, data: bytes) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            side.conn.close_connection(code, data or None)

    def _origin_failed(self, reason: str) -> None:
        """The origin's connection is gone: every open stream answered or reset,
        and the box told that no new stream will be taken."""
        self.origin_gone = True
        for s in list(self.streams.values()):
            if s.finished:
                continue
            if not s.resp_started:
                self._answer(s, 502, reason, "origin closed")
            else:
                self._reset_guest(s, E.INTERNAL_ERROR)
            s.finish("origin closed" if s.resp_started else s.ex.ended)
        self._close(self.g, E.NO_ERROR, b"")
        self._take()

    def _take(self) -> None:
        self.g.take()
        self.o.take()

    # --- the box's frames ------------------------------------------------------------

    def _on_guest(self, ev: Any) -> None:
        g = self.g.conn
        if isinstance(ev, h2.events.RequestReceived):
            self._new_stream(ev.stream_id, list(ev.headers), bool(ev.stream_ended))
            return
        if isinstance(ev, h2.events.ConnectionTerminated):
            raise _H2Ended("client closed")
        if isinstance(ev, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            if isinstance(ev, h2.events.RemoteSettingsChanged):
                self._clamp_encoder(self.g)
            self._pump_all()
            return
        sid = getattr(ev, "stream_id", None)
        if sid is None:
            return
        s = self.streams.get(sid)
        if isinstance(ev, h2.events.DataReceived):
            flow = ev.flow_controlled_length
            if s is None or s.discard:
                g.acknowledge_received_data(flow, sid)
                return
            pad = flow - len(ev.data)
            if pad:
                g.acknowledge_received_data(pad, sid)
            s.pending += ev.data
            s.req_unacked += len(ev.data)
            self._pump_request(s)
        elif s is None:
            return
        elif isinstance(ev, h2.events.TrailersReceived):
            s.req_trailers = list(ev.headers)
        elif isinstance(ev, h2.events.StreamEnded):
            s.req_end = True
            self._pump_request(s)
        elif isinstance(ev, h2.events.StreamReset):
            if s.oid is not None and not s.resp_sent_end:
                self._reset(self.o, s.oid, E.CANCEL)
            s.finish("client reset the stream")

    def _new_stream(self, gid: int, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        if self.origin_gone or self.active >= self.limits.max_streams:
            # A stream counts until the door's work on it is done, not until the box
            # reset it: resets never buy more streams (rapid reset, CVE-2023-44487).
            self._reset(self.g, gid, E.REFUSED_STREAM)
            try:
                self.g.guard.spend(1, "a stream beyond the limit")
            except H2Flood as flood:
                self._cut(self.g, E.ENHANCE_YOUR_CALM, flood.reason)
            return
        s = _Stream(gid, headers, self.rules.body_scanner(), self.rules.redactor())
        s.req_end = ended
        self.streams[gid] = s
        self.active += 1
        self.stats["streams"] += 1
        self.opened.put_nowait(s)

    # --- one stream ------------------------------------------------------------------

    async def _stream(self, s: _Stream) -> None:
        try:
            try:
                await self._open(s)
            except h2.exceptions.ProtocolError:
                # the box reset the stream while the door answered it (a 100)
                self._reset(self.o, s.oid, E.CANCEL)
                s.finish("client reset the stream")
            await s.done.wait()
        finally:
            self._end_stream(s)
            if s.leak is not None:
                self.stats["leaks"] = self.stats.get("leaks", 0) + 1
                await self.record("tkbox.secret.leak", s.leak.record())
            if s.ex.forwarded and self.model_host:
                await self.record("tkbox.model.call", s.ex.model_call(self.host, self.rules))
            if s.admitted is not None and self.gate is not None:
                await self.gate.done(s.admitted, s.ex.status, s.ex.up, s.ex.down, s.ex.ended)

    async def _open(self, s: _Stream) -> None:
        """Read, check and decide the stream's request; send its head to the origin."""
        try:
            req = read_request(s.headers)
            s.ex = Exchange(req.method, req.path, time.monotonic())
            headers, uses = self.rules.request(req.method, req.path, req.head)
            self.stats["requests"] += 1
            if self.gate is not None:
                s.admitted = await self.gate.check(req.method, req.path, req.head, "2")
        except SecretLeak as leak:
            s.leak = leak
            self._answer(s, 403, leak.reason, "secret leak blocked")
            return
        except BadTunnelRequest as exc:
            self._answer(s, 403, exc.message)
            return
        except HttpRefused as exc:
            self._answer(s, exc.status, exc.reason)
            return
        while not s.finished and not self.origin_gone and (
                self.o.conn.open_outbound_streams
                >= self.o.conn.remote_settings.max_concurrent_streams):
            self.slot.clear()
            await self.slot.wait()
        if s.finished:
            return
        if self.origin_gone:
            self._answer(s, 502, f"refused: the origin {self.host} ended the connection",
                         "origin closed")
            return
        bodiless = s.req_end and not s.pending and s.req_trailers is None
        try:
            oid = self.o.conn.get_next_available_stream_id()
            self.o.conn.send_headers(oid, origin_head(req.method, req.path,
                                                      self.rules.authority, headers),
                                     end_stream=bodiless)
        except h2.exceptions.ProtocolError as exc:
            self._answer(s, 502, f"refused: the request cannot be relayed to the origin "
                                 f"({exc.__class__.__name__})", "refused")
            return
        s.oid = oid
        s.req_sent_end = bodiless
        self.by_oid[oid] = s
        s.ex.forwarded = True  # from here the origin may have it: recorded, however it ends
        s.ex.ended = "no response" if bodiless else "client closed mid-request"
        if req.expects_continue and not s.req_end:
            # the door dropped Expect (`TunnelRules.request`) and answers it, as for 1.1
            self.g.conn.send_headers(s.gid, [(b":status", b"100")])
        self._pump_request(s)
        self._take()
        for u in uses:
            self.stats["secret_uses"] += 1
            await self.record("tkbox.secret.use", {"name": u.name, "host": u.host,
                                                   "header": u.header})

    def _pump_request(self, s: _Stream) -> None:
        """Scan what the box sent on `s`, and send the origin what its window takes."""
        if s.oid is None or s.finished or s.req_sent_end:
            return
        hold = s.scanner.hold
        # fed once `hold` new bytes are pending, or at the end (as HTTP/1.1: each feed
        # looks at `hold` bytes of tail again)
        if s.pending and (len(s.pending) >= hold or s.req_end):
            hits = s.scanner.feed(bytes(s.pending))
            if hits:
                self._leak(s, self.rules.leak(hits[0], "body"))
                return
            s.held += s.pending
            s.pending.clear()
        keep = 0 if s.req_end else hold
        if len(s.held) > keep:
            cut = len(s.held) - keep
            s.req_q += s.held[:cut]
            del s.held[:cut]
        try:
            self._send_request(s)
        except h2.exceptions.ProtocolError:
            # the origin's stream is gone (its reset is handled as an event)
            self._reset(self.o, s.oid, E.CANCEL)
            self._answer(s, 502, f"refused: the origin {self.host} stopped taking the request",
                         "origin reset the stream")

    def _send_request(self, s: _Stream) -> None:
        assert s.oid is not None
        o = self.o.conn
        while s.req_q and self.o.has_room:
            n = min(len(s.req_q), o.local_flow_control_window(s.oid), o.max_outbound_frame_size)
            if n <= 0:
                break
            o.send_data(s.oid, bytes(s.req_q[:n]))
            del s.req_q[:n]
            self._ack(self.g, s.gid, n)
            s.req_unacked -= n
            s.ex.up += n
            if self.counts is not None:
                self.counts.up += n
            self.o.guard.earn(2)  # its WINDOW_UPDATEs for this frame are paid for
            self.o.take()
        if s.req_end and not s.pending and not s.held and not s.req_q:
            if s.req_trailers is not None:
                try:
                    trailers = self.rules.trailers(s.req_trailers)
                except SecretLeak as leak:
                    self._leak(s, leak)
                    return
                o.send_headers(s.oid, [(n.lower(), v) for n, v in trailers], end_stream=True)
            else:
                o.end_stream(s.oid)
            s.req_sent_end = True
            if not s.resp_started:
                s.ex.ended = "no response"

    def _leak(self, s: _Stream, leak: SecretLeak) -> None:
        """A leak in a stream's body or trailers: nothing more of it reaches the
        origin (its stream reset), the box gets 403, the leak is recorded."""
        s.leak = leak
        if s.oid is not None:
            self._reset(self.o, s.oid, E.CANCEL)
        s.req_sent_end = True
        self._answer(s, 403, leak.reason, "secret leak blocked")

    # --- the origin's frames ---------------------------------------------------------

    def _on_origin(self, ev: Any) -> None:
        o = self.o.conn
        if isinstance(ev, h2.events.ConnectionTerminated):
            last = ev.last_stream_id if ev.last_stream_id is not None else 0
            for t in list(self.streams.values()):
                if not t.finished and t.oid is not None and t.oid > last \
                        and not t.resp_started:
                    self._reset_guest(t, E.REFUSED_STREAM)  # never processed: safe to retry
                    t.finish("the origin refused the stream (GOAWAY)")
            self._origin_failed(f"the origin {self.host} ended the connection (GOAWAY)")
            raise _H2Ended("origin closed")
        if isinstance(ev, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            if isinstance(ev, h2.events.RemoteSettingsChanged):
                self._clamp_encoder(self.o)
                self.slot.set()
            self._pump_all()
            return
        sid = getattr(ev, "stream_id", None)
        if sid is None:
            return
        s = self.by_oid.get(sid)
        if isinstance(ev, h2.events.DataReceived):
            flow = ev.flow_controlled_length
            if s is None or s.finished:
                o.acknowledge_received_data(flow, sid)
                return
            if flow > len(ev.data):
                o.acknowledge_received_data(flow - len(ev.data), sid)
            data = bytes(ev.data)
            s.ex.down += len(data)
            if self.counts is not None:
                self.counts.down += len(data)
            s.resp_unacked += len(data)
            # model and usage read from what the box gets (redacted), as for 1.1
            out = s.redactor.feed(data)
            if out:
                if self.model_host:
                    s.ex.model.feed(out)
                s.resp_q += out
            self._pump_response(s)
            return
        if s is None or s.finished:
            return
        if isinstance(ev, h2.events.ResponseReceived | h2.events.InformationalResponseReceived):
            self._response_head(s, list(ev.headers),
                                isinstance(ev, h2.events.ResponseReceived))
        elif isinstance(ev, h2.events.TrailersReceived):
            trailers, n = self.rules.redact_headers(list(ev.headers))
            self.stats["redactions"] += n
            s.resp_trailers = trailers
        elif isinstance(ev, h2.events.StreamEnded):
            tail = s.redactor.feed(b"", final=True)
            if self.model_host:
                s.ex.model.feed(tail)
                s.ex.model.finish()
            self.stats["redactions"] += s.redactor.count
            s.resp_q += tail
            s.resp_end = True
            self._pump_response(s)
        elif isinstance(ev, h2.events.StreamReset):
            if not s.resp_started:
                if ev.error_code == E.REFUSED_STREAM:
                    self._reset_guest(s, E.REFUSED_STREAM)
                    s.finish("origin reset the stream")
                else:
                    self._answer(s, 502, f"refused: the origin {self.host} reset the stream "
                                         "before it answered", "origin reset the stream")
            else:
                self._reset_guest(s, E.INTERNAL_ERROR)
                s.finish("origin reset the stream")

    def _response_head(self, s: _Stream, headers: Headers, final: bool) -> None:
        redacted, n = self.rules.redact_headers(headers)
        self.stats["redactions"] += n
        status = next((v for k, v in headers if k == b":status"), b"")
        for k, v in redacted:
            if k == b"content-encoding" and v.strip().lower() not in (b"", b"identity"):
                self._reset(self.o, s.oid, E.CANCEL)
                self._answer(s, 502, f"refused: {self.host} sent an encoded response "
                                     "(Content-Encoding other than identity) after being asked "
                                     "for identity; it cannot be redacted", "origin error")
                return
        if final:
            s.ex.status = int(status) if status.isdigit() else None
            s.resp_started = True
            s.ex.ended = "origin closed mid-response"
        # the status as the origin sent it (digits, checked by h2), the rest redacted
        fields = [(b":status", status)] + [(k, v) for k, v in redacted if not k.startswith(b":")]
        try:
            self.g.conn.send_headers(s.gid, fields)
        except h2.exceptions.ProtocolError:
            self._reset(self.o, s.oid, E.CANCEL)
            s.finish("the response cannot be relayed")

    def _pump_response(self, s: _Stream) -> None:
        """Send the box what its window takes of `s`'s redacted response."""
        if s.resp_sent_end:
            return
        g = self.g.conn
        while s.resp_q and self.g.has_room:
            try:
                window = g.local_flow_control_window(s.gid)
            except h2.exceptions.ProtocolError:
                s.finish(s.ex.ended)
                return
            n = min(len(s.resp_q), window, g.max_outbound_frame_size)
            if n <= 0:
                break
            try:
                g.send_data(s.gid, bytes(s.resp_q[:n]))
            except h2.exceptions.ProtocolError:
                s.finish(s.ex.ended)
                return
            del s.resp_q[:n]
            if s.oid is not None and s.resp_unacked:
                acked = min(n, s.resp_unacked)
                self._ack(self.o, s.oid, acked)
                s.resp_unacked -= acked
            self.g.guard.earn(2)
            self.g.take()
        if s.resp_end and not s.resp_q:
            try:
                if s.resp_trailers is not None:
                    g.send_headers(s.gid, list(s.resp_trailers), end_stream=True)
                else:
                    g.end_stream(s.gid)
            except h2.exceptions.ProtocolError:
                s.finish(s.ex.ended)
                return
            s.resp_sent_end = True
            s.finish(s.outcome)

    def _pump_all(self) -> None:
        for s in list(self.streams.values()):
            if not s.finished or s.resp_q:
                self._pump_request(s)
                self._pump_response(s)

    # --- helpers -----------------------------------------------------------------------

    def _answer(self, s: _Stream, status: int, reason: str, outcome: str = "refused") -> None:
        """The door's own answer on a stream (a refusal): `outcome` is its `ended`
        once the answer is sent. A stream whose response had begun is reset."""
        s.discard = True  # the box's further body bytes on it are dropped
        s.outcome = outcome
        if s.resp_started:
            self._reset_guest(s, E.CANCEL)
            s.finish(outcome)
            return
        head, body = refusal(status, reason)
        s.resp_started = True
        try:
            self.g.conn.send_headers(s.gid, head)
        except h2.exceptions.ProtocolError:
            s.finish(outcome)
            return
        s.resp_q = bytearray(body)
        s.resp_unacked = 0
        s.resp_end = True
        s.resp_trailers = None
        self._pump_response(s)

    def _reset_guest(self, s: _Stream, code: E) -> None:
        s.resp_sent_end = True
        self._reset(self.g, s.gid, code)

    @staticmethod
    def _reset(side: _Side, sid: int | None, code: E) -> None:
        if sid is None:
            return
        with contextlib.suppress(h2.exceptions.ProtocolError):
            side.conn.reset_stream(sid, code)

    @staticmethod
    def _ack(side: _Side, sid: int, n: int) -> None:
        if n > 0:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                side.conn.acknowledge_received_data(n, sid)

    def _clamp_encoder(self, side: _Side) -> None:
        """The table the door keeps to encode for a peer is at most `header_table`,
        whatever the peer allows (RFC 7541 §4.2 lets an encoder use less)."""
        enc = side.conn.encoder
        if enc.header_table_size > self.limits.header_table:
            enc.header_table_size = self.limits.header_table

    def _end_stream(self, s: _Stream) -> None:
        """The stream's task is ending: nothing of it stays held, its unacknowledged
        bytes are given back to the connections' windows, its slot is free."""
        if not s.finished:
            s.finish(s.ex.ended)
        if not s.req_end and s.resp_sent_end:
            # RFC 9113 §8.1: the response is complete; the box may stop sending
            self._reset(self.g, s.gid, E.NO_ERROR)
        elif not s.resp_sent_end:
            self._reset(self.g, s.gid, E.CANCEL)
        if s.oid is not None and not (s.resp_end and s.req_sent_end):
            self._reset(self.o, s.oid, E.CANCEL)
        self._ack(self.g, s.gid, s.req_unacked + len(s.pending))
        if s.oid is not None:
            self._ack(self.o, s.oid, s.resp_unacked)
        s.req_unacked = s.resp_unacked = 0
        s.pending.clear()
        s.held.clear()
        s.req_q.clear()
        s.resp_q.clear()
        self.streams.pop(s.gid, None)
        if s.oid is not None:
            self.by_oid.pop(s.oid, None)
        self.active -= 1
        self.slot.set()
        with contextlib.suppress(Exception):
            self._take()
