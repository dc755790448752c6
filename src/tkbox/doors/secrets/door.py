"""The secrets door: a thin asyncio shell that reads intercepted tunnels.

The network door decides a CONNECT (allowlist, approvals, addresses, signer),
dials exactly the address it checked, answers `200`, and then, for a host in
this door's set (`wants`), hands both streams here instead of splicing them:

1. the guest's TLS is terminated on the port stream (`TLSStream`, MemoryBIO)
   with a leaf of the box CA for the tunnel's host; the ClientHello's server
   name must be that host; only HTTP/1.1 is offered (ALPN);
2. TLS to the origin runs over the already-dialed stream to the checked
   address: SNI = the host, verified against the system's trust and the
   operator's `--ca-cert` PEMs, ALPN http/1.1;
3. every request of the keep-alive connection, parsed by h11, goes through
   `rules.TunnelRules`: Host check, swap, scan of target, headers, body
   (held back by the scanner's span, so no byte of a leak leaves) and
   trailers. A leak answers the guest `403` naming the secret and where,
   records `tkbox.secret.leak`, and ends the tunnel (the origin's connection
   is dropped mid-request);
4. every response is redacted (headers, body, trailers), streaming; the body's
   chunks already read are redacted and sent together (one read, one write),
   so an origin's 1-byte chunks do not each cost a redaction and a TLS write;
5. records: `tkbox.secret.use` per swap; `tkbox.model.call` per request to a
   model host (model and token usage read as the body streams by).

Memory per tunnel: one chunk, the scanner's span, the redactor's hold, the
h11 buffers (bounded heads).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from http import HTTPStatus
from typing import Any

import h11

from tkbox.doors.network.errors import OriginError
from tkbox.doors.network.relay import next_event
from tkbox.doors.secrets.ca import BoxCA
from tkbox.doors.secrets.model import ModelUsage
from tkbox.doors.secrets.rules import BadTunnelRequest, SecretLeak, TunnelRules
from tkbox.doors.secrets.scan import scan_once
from tkbox.doors.secrets.spec import Secret
from tkbox.doors.secrets.tlsstream import TLSError, TLSStream
from tkbox.errors import GuestError, TkboxError
from tkbox.protocol.streams import ByteStream, StreamClosed

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
HANDSHAKE_TIMEOUT = 30.0
MAX_PATH = 512
MAX_HEAD = 64 * 1024
ORIGIN_MALFORMED = "refused: the origin's answer is not valid HTTP/1.1"
Recorder = Callable[[str, dict[str, Any]], Awaitable[None]]


class _Prefixed(ByteStream):
    """A stream whose first bytes were already read (what followed CONNECT)."""

    def __init__(self, first: bytes, inner: ByteStream) -> None:
        self.first, self.inner = first, inner

    async def receive(self, max_bytes: int = CHUNK) -> bytes:
        if self.first:
            out, self.first = self.first[:max_bytes], self.first[max_bytes:]
            return out
        return await self.inner.receive(max_bytes)

    async def send_all(self, data: bytes) -> None:
        await self.inner.send_all(data)

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


class _End(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class SecretsDoor:
    """One box's reader of intercepted tunnels. See the module docstring."""

    def __init__(self, box: str, secrets: Sequence[Secret], *,
                 inspect_hosts: Iterable[str] = (), model_hosts: Iterable[str] = (),
                 ca_pems: Sequence[str] = (), record: Recorder | None = None,
                 origin_context: ssl.SSLContext | None = None,
                 clock: Callable[[], float] = time.time, chunk: int = CHUNK) -> None:
        self.box = box
        self.secrets = list(secrets)
        self.model_hosts = frozenset(model_hosts)
        bound = {h for s in self.secrets for h in s.spec.hosts}
        self.hosts = frozenset(bound | set(inspect_hosts) | self.model_hosts)
        self.ca = BoxCA(box, self.hosts, clock) if self.hosts else None
        if origin_context is None:
            origin_context = ssl.create_default_context()
            if ca_pems:
                origin_context.load_verify_locations(cadata="\n".join(ca_pems))
        origin_context.set_alpn_protocols(["http/1.1"])
        self.origin_context = origin_context
        self.record = record
        self.chunk = chunk

    @property
    def ca_pem(self) -> str | None:
        return self.ca.pem if self.ca is not None else None

    def wants(self, host: str, port: int) -> bool:
        return self.ca is not None and host in self.hosts

    async def _record(self, kind: str, body: dict[str, Any]) -> None:
        if self.record is not None:
            await self.record(kind, body)

    async def check_plain(self, host: str, port: int, method: str, target: str,
                          headers: list[tuple[bytes, bytes]]) -> str | None:
        """A proxy request's head: the reason it leaks (recorded), or None.

        The target host of a CONNECT or plain request, and for plain http its method,
        path and headers: nothing is ever swapped there, so any secret's value or
        placeholder is a leak. A host holding one is never written down (the record
        says `(withheld)`). Plain http bodies are relayed unscanned (docs/secrets.md).
        """
        if not self.secrets:
            return None
        rules = TunnelRules(host, port, self.secrets, plain=True)
        hits = scan_once(rules.scan_patterns, host.encode("utf-8", "surrogateescape"))
        if hits:
            leak = SecretLeak(hits[0], "(withheld)", "proxy target host")
            await self._record("tkbox.secret.leak", leak.record())
            return leak.reason
        try:
            rules.check_plain(
                method.encode("ascii", "replace"), target.encode("utf-8", "surrogateescape"),
                headers)
        except SecretLeak as leak:
            await self._record("tkbox.secret.leak", leak.record())
            return leak.reason
        return None

    # --- one tunnel -----------------------------------------------------------

    async def tunnel(self, guest_raw: ByteStream, origin_raw: ByteStream, host: str, port: int,
                     leftover: bytes = b"", counts: Any = None) -> dict[str, Any]:
        """Serve one intercepted tunnel to its end; returns the completion's facts."""
        assert self.ca is not None
        stats: dict[str, Any] = {"intercepted": True, "requests": 0, "secret_uses": 0,
                                 "redactions": 0}
        guest = TLSStream(_Prefixed(leftover, guest_raw), self.ca.server_context(host),
                          server_side=True)
        try:
            await asyncio.wait_for(guest.handshake(), HANDSHAKE_TIMEOUT)
        except (TLSError, StreamClosed, OSError, TimeoutError, ssl.SSLError) as exc:
            why = exc.message if isinstance(exc, TkboxError) else exc.__class__.__name__
            return {**stats, "ended": "refused", "stage": "tls",
                    "reason": f"refused: the box's TLS to {host} failed ({why}); the box must "
                              "trust its CA and name the host in its ClientHello"}
        origin = TLSStream(origin_raw, self.origin_context, server_side=False,
                           server_hostname=host)
        try:
            await asyncio.wait_for(origin.handshake(), HANDSHAKE_TIMEOUT)
        except (TLSError, StreamClosed, OSError, TimeoutError) as exc:
            why = exc.message if isinstance(exc, TkboxError) else exc.__class__.__name__
            reason = f"refused: TLS to the origin {host} failed ({why})"
            await self._answer_guest(guest, h11.Connection(h11.SERVER), 502, reason)
            return {**stats, "ended": "origin TLS failed", "reason": reason}
        rules = TunnelRules(host, port, self.secrets)
        gconn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        oconn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        try:
            while True:
                await self._one(guest, origin, gconn, oconn, rules, host, stats, counts)
                if (gconn.our_state is h11.DONE and gconn.their_state is h11.DONE
                        and oconn.our_state is h11.DONE and oconn.their_state is h11.DONE):
                    gconn.start_next_cycle()
                    oconn.start_next_cycle()
                else:
                    stats["ended"] = "closed"
                    break
        except _End as e:
            stats["ended"] = e.why
        except SecretLeak as leak:
            stats["ended"] = "secret leak blocked"
            stats["leak"] = leak.record()
            await self._record("tkbox.secret.leak", leak.record())
            await self._answer_guest(guest, gconn, 403, leak.reason)
        except BadTunnelRequest as exc:
            stats["ended"] = "refused request"
            stats["reason"] = exc.message
            await self._answer_guest(guest, gconn, 403, exc.message)
        except _GuestBad as exc:
            stats["ended"] = "refused request"
            stats["reason"] = exc.message
            await self._answer_guest(guest, gconn, 400, exc.message)
        except OriginError as exc:
            stats["ended"] = "origin error"
            stats["reason"] = exc.message
            await self._answer_guest(guest, gconn, 502, exc.message)
        except (TLSError, StreamClosed, OSError) as exc:
            stats["ended"] = "reset"
            log.debug("intercepted tunnel to %s reset: %s", host, exc.__class__.__name__)
        with contextlib.suppress(Exception):
            await guest.send_eof()
        return stats

    async def _answer_guest(self, guest: ByteStream, gconn: h11.Connection, status: int,
                            reason: str) -> None:
        text = "".join(c if " " <= c <= "~" else "?" for c in reason)[:1000]
        body = (text + "\n").encode("ascii")
        head = [(b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"x-tkbox-reason", text.encode("ascii")), (b"connection", b"close")]
        with contextlib.suppress(Exception):
            if gconn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                data = gconn.send(h11.Response(status_code=status, headers=head))
                data = (data or b"") + (gconn.send(h11.Data(data=body)) or b"")
                data += gconn.send(h11.EndOfMessage()) or b""
            else:
                data = b""  # a response was already under way: only the close tells
            if data:
                await guest.send_all(data)

    async def _next(self, conn: h11.Connection, stream: ByteStream, bad: type[TkboxError]
                    ) -> Any:
        if bad is OriginError:
            # h11's text quotes the offending line, which is the origin's and could hold
            # the value swapped into the request: it goes neither to the guest nor into
            # the record.
            return await next_event(conn, stream, self.chunk,
                                    lambda why: OriginError(ORIGIN_MALFORMED))
        return await next_event(conn, stream, self.chunk,
                                lambda why: bad(f"malformed HTTP/1.1 ({why})"))

    async def _one(self, guest: TLSStream, origin: TLSStream, gconn: h11.Connection,
                   oconn: h11.Connection, rules: TunnelRules, host: str,
                   stats: dict[str, Any], counts: Any) -> None:
        ev = await self._next(gconn, guest, _GuestBad)
        if isinstance(ev, h11.ConnectionClosed):
            raise _End("client closed")
        if not isinstance(ev, h11.Request):
            raise _GuestBad("refused: expected an HTTP/1.1 request")
        started = time.monotonic()
        headers, uses = rules.request(ev.method, ev.target, [(bytes(n), bytes(v))
                                                             for n, v in ev.headers.raw_items()])
        stats["requests"] += 1
        try:
            if gconn.they_are_waiting_for_100_continue:
                await guest.send_all(gconn.send(h11.InformationalResponse(
                    status_code=100, headers=[])) or b"")
            await origin.send_all(oconn.send(h11.Request(
                method=ev.method, target=ev.target, headers=headers)) or b"")
        except h11.LocalProtocolError as exc:
            raise _GuestBad(f"refused: the request cannot be relayed ({str(exc)[:120]})") from None
        for u in uses:
            stats["secret_uses"] += 1
            await self._record("tkbox.secret.use", {"name": u.name, "host": u.host,
                                                    "header": u.header})
        up = await self._request_body(guest, origin, gconn, oconn, rules, counts)
        status, down, model = await self._response(guest, origin, gconn, oconn, rules, stats,
                                                    ev.method, host, counts)
        if host in self.model_hosts:
            path = ev.target.decode("ascii", "replace")
            body: dict[str, Any] = {
                "host": host, "method": ev.method.decode("ascii", "replace"),
                "path": path if len(path) <= MAX_PATH else path[:MAX_PATH] + "...",
                "status": status, "bytes_up": up, "bytes_down": down,
                "duration_ms": round((time.monotonic() - started) * 1000)}
            fields = model.fields()
            name = fields.get("model")
            if name is not None and scan_once(rules.scan_patterns,
                                              name.encode("ascii", "replace")):
                fields["model"] = "(withheld)"  # a form the redactor does not replace
            body.update(fields)
            await self._record("tkbox.model.call", body)

    async def _request_body(self, guest: TLSStream, origin: TLSStream, gconn: h11.Connection,
                            oconn: h11.Connection, rules: TunnelRules, counts: Any) -> int:
        scanner = rules.body_scanner()
        hold = scanner.hold
        # `pending`: received, not scanned yet; `held`: scanned, not forwarded yet (the
        # last `hold` bytes could begin a leak that ends in bytes still to come). The
        # scanner is fed only once `hold` new bytes are pending, or at the end: each
        # feed looks at `hold` bytes of tail again, so feeding every h11 Data event
        # (one per chunk: a guest's 1-byte chunks) would cost hold bytes of work per
        # byte, on the loop every box shares.
        pending = bytearray()
        held = bytearray()
        sent = 0

        async def scan() -> None:
            hits = scanner.feed(bytes(pending))
            if hits:
                with contextlib.suppress(Exception):
                    await origin.aclose()
                raise rules.leak(hits[0], "body")
            held.extend(pending)
            del pending[:]

        while True:
            ev = await self._next(gconn, guest, _GuestBad)
            if isinstance(ev, h11.Data):
                pending.extend(ev.data)
                if len(pending) < hold:
                    continue
                await scan()
                if len(held) > hold:
                    out = bytes(held[:len(held) - hold])
                    del held[:len(held) - hold]
                    await origin.send_all(oconn.send(h11.Data(data=out)) or b"")
                    sent += len(out)
                    if counts is not None:
                        counts.up += len(out)
            elif isinstance(ev, h11.EndOfMessage):
                if pending:
                    await scan()
                trailers = [(bytes(n), bytes(v)) for n, v in ev.headers.raw_items()]
                try:
                    trailers = rules.trailers(trailers)
                except SecretLeak:
                    with contextlib.suppress(Exception):
                        await origin.aclose()
                    raise
                if held:
                    await origin.send_all(oconn.send(h11.Data(data=bytes(held))) or b"")
                    sent += len(held)
                    if counts is not None:
                        counts.up += len(held)
                await origin.send_all(oconn.send(h11.EndOfMessage(headers=trailers)) or b"")
                return sent
            else:
                raise _End("client closed mid-request")

    async def _response(self, guest: TLSStream, origin: TLSStream, gconn: h11.Connection,
                        oconn: h11.Connection, rules: TunnelRules, stats: dict[str, Any],
                        method: bytes, host: str, counts: Any
                        ) -> tuple[int | None, int, ModelUsage]:
        model = ModelUsage()
        redactor = rules.redactor()
        status: int | None = None
        down = 0
        after: Any = None  # an event read while gathering Data, handled next
        while True:
            ev, after = (after, None) if after is not None else (
                await self._next(oconn, origin, OriginError), None)
            if isinstance(ev, h11.Data):
                # Every Data event h11 can give from what was already read, together: an
                # origin's 1-byte chunks then cost one redaction and one send per read,
                # not per chunk (the loop is every box's). Nothing waits for more bytes,
                # so a chunk that arrives alone still goes on at once.
                parts = [ev.data]
                after = _more_data(oconn, parts)
                ev = h11.Data(data=b"".join(parts))
            if isinstance(ev, h11.InformationalResponse | h11.Response):
                if ev.status_code == 101:
                    raise OriginError("refused: the origin switched protocols, which an "
                                     "intercepted tunnel does not carry")
                headers, n = rules.redact_headers([(bytes(k), bytes(v))
                                                   for k, v in ev.headers.raw_items()])
                stats["redactions"] += n
                for k, v in headers:
                    if k.lower() == b"content-encoding" and v.strip().lower() not in (
                            b"", b"identity"):
                        raise OriginError(f"refused: {host} sent an encoded response "
                                         "(Content-Encoding other than identity) after "
                                         "being asked for identity; it cannot be redacted")
                cls = h11.Response if isinstance(ev, h11.Response) else h11.InformationalResponse
                if isinstance(ev, h11.Response):
                    status = ev.status_code
                # The origin's reason phrase is never passed on: it is free text the
                # origin chose (it could quote the request's credentials).
                await guest.send_all(gconn.send(cls(status_code=ev.status_code,
                                                    headers=headers,
                                                    reason=_reason(ev.status_code))) or b"")
            elif isinstance(ev, h11.Data):
                data = bytes(ev.data)
                down += len(data)
                if counts is not None:
                    counts.down += len(data)
                # The model name and usage are read from what the guest gets (redacted):
                # a model field echoing the value must not put it in the record.
                out = redactor.feed(data)
                if out:
                    model.feed(out)
                    await guest.send_all(gconn.send(h11.Data(data=out)) or b"")
            elif isinstance(ev, h11.EndOfMessage):
                out = redactor.feed(b"", final=True)
                model.feed(out)
                model.finish()
                stats["redactions"] += redactor.count
                if out:
                    await guest.send_all(gconn.send(h11.Data(data=out)) or b"")
                trailers, n = rules.redact_headers([(bytes(k), bytes(v))
                                                    for k, v in ev.headers.raw_items()])
                stats["redactions"] += n
                await guest.send_all(gconn.send(h11.EndOfMessage(headers=trailers)) or b"")
                return status, down, model
            else:
                raise OriginError(f"the origin {host} closed the connection before its "
                                 "response ended")


class _GuestBad(GuestError):
    pass


def _more_data(conn: h11.Connection, parts: list[Any]) -> Any:
    """Append the data of each Data event `conn` has from bytes already received to
    `parts`; the first other event (to be handled next), or None at NEED_DATA or a
    protocol error (the next `next_event` reads more, or raises the error again)."""
    while True:
        try:
            ev = conn.next_event()
        except h11.RemoteProtocolError:
            return None  # h11 is now in ERROR: the next call raises it again
        if ev is h11.NEED_DATA:
            return None
        if not isinstance(ev, h11.Data):
            return ev
        parts.append(ev.data)


def _reason(status: int) -> bytes:
    """The standard reason phrase of `status` (RFC 9110 §15), or none."""
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""
