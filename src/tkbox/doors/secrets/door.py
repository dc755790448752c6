"""The secrets door: a thin asyncio shell that reads intercepted tunnels.

The network door decides a CONNECT (allowlist, approvals, addresses, signer),
dials exactly the address it checked, answers `200`, and then, for a host in
this door's set (`wants`), hands both streams here instead of splicing them:

1. the box's first bytes are read up to its whole ClientHello
   (`tls.read_client_hello`, kept for the handshake) to learn whether it offers
   `h2` (ALPN);
2. TLS to the origin runs over the already-dialed stream to the checked
   address: SNI = the host, verified against the system's trust and the
   operator's `--ca-cert` PEMs, ALPN `h2` and `http/1.1` if the box offered
   `h2`, else `http/1.1` only;
3. the box's TLS is terminated on the port stream (`TLSStream`, MemoryBIO)
   with a leaf of the box CA for the tunnel's host; the ClientHello's server
   name must be that host; `h2` is offered only if the origin chose it, so both
   legs speak one protocol. HTTP/2 goes to `h2relay.H2Relay` (stream for
   stream, each stream treated as below, but a leak refuses only its stream);
   HTTP/1.1 stays here:
4. every request of the keep-alive connection, parsed by h11, goes through
   `rules.TunnelRules`: Host check, swap, scan of target, headers, body
   (held back by the scanner's span, so no byte of a leak leaves) and
   trailers. A leak answers the guest `403` naming the secret and where,
   records `tkbox.secret.leak`, and ends the tunnel (the origin's connection
   is dropped mid-request);
5. every response is redacted (headers, body, trailers), streaming; the body's
   chunks already read are redacted and sent together (one read, one write),
   so an origin's 1-byte chunks do not each cost a redaction and a TLS write;
6. the two sides' versions and framings may differ: every send to either
   side can fail, so each goes through `_send`, which makes h11's refusal the
   refusal of that side; before that, what can be normalised is (a 1.0 guest
   gets no 1xx and no trailers, and `Connection: close` when the origin's
   connection ends with the response);
7. records: `tkbox.secret.use` per swap; `tkbox.model.call` per request
   forwarded to a model host, in a `finally` (model and token usage read as
   the body streams by; `ended` when the exchange did not complete).

Memory per HTTP/1.1 tunnel: one chunk, the scanner's span, the redactor's
hold, the h11 buffers (bounded heads); per HTTP/2 tunnel, `h2core` says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import h11

from tkbox.doors.network.errors import OriginError
from tkbox.doors.network.httpgate import Admitted, HttpGate, HttpRefused
from tkbox.doors.network.relay import next_event
from tkbox.doors.network.tls import TLSRefused, read_client_hello
from tkbox.doors.secrets.ca import BoxCA
from tkbox.doors.secrets.exchange import Exchange, reason_phrase
from tkbox.doors.secrets.h2core import H2Limits
from tkbox.doors.secrets.h2relay import H2Relay
from tkbox.doors.secrets.leaks import scan_once
from tkbox.doors.secrets.rules import BadTunnelRequest, SecretLeak, TunnelRules
from tkbox.doors.secrets.spec import Secret
from tkbox.doors.secrets.tlsstream import TLSError, TLSStream
from tkbox.errors import GuestError, TkboxError
from tkbox.protocol.streams import ByteStream, StreamClosed

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
HANDSHAKE_TIMEOUT = 30.0
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
                 ruled_hosts: Iterable[str] = (),
                 ca_pems: Sequence[str] = (), record: Recorder | None = None,
                 http2: bool = True, h2_limits: H2Limits | None = None,
                 clock: Callable[[], float] = time.time, chunk: int = CHUNK) -> None:
        self.box = box
        self.secrets = list(secrets)
        self.model_hosts = frozenset(model_hosts)
        bound = {h for s in self.secrets for h in s.spec.hosts}
        self.hosts = frozenset(bound | set(inspect_hosts) | self.model_hosts | set(ruled_hosts))
        self.ca = BoxCA(box, self.hosts, clock) if self.hosts else None
        # the origin's context by whether h2 is offered (ALPN is a context's setting)
        self.origin_contexts = {h2: _origin_context(ca_pems, h2) for h2 in (False, True)}
        self.http2 = http2
        self.h2_limits = h2_limits
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
                     leftover: bytes = b"", counts: Any = None,
                     gate: HttpGate | None = None) -> dict[str, Any]:
        """Serve one intercepted tunnel to its end; returns the completion's facts."""
        assert self.ca is not None
        stats: dict[str, Any] = {"intercepted": True, "requests": 0, "secret_uses": 0,
                                 "redactions": 0}
        # 1. Which protocols the box offers: its ClientHello, read (and kept) first.
        first, offers_h2, refused = await self._read_hello(guest_raw, leftover)
        if refused is not None:
            return {**stats, "ended": "refused", "stage": "tls", "reason": refused}
        # 2. TLS to the origin, offering h2 only if the box did; 3. TLS with the box,
        # offering h2 only if the origin chose it. The two legs then speak one protocol.
        origin = TLSStream(origin_raw, self.origin_contexts[offers_h2 and self.http2],
                           server_side=False, server_hostname=host)
        origin_failed: str | None = None
        try:
            await asyncio.wait_for(origin.handshake(), HANDSHAKE_TIMEOUT)
        except (TLSError, StreamClosed, OSError, TimeoutError) as exc:
            why = exc.message if isinstance(exc, TkboxError) else exc.__class__.__name__
            origin_failed = f"refused: TLS to the origin {host} failed ({why})"
        origin_h2 = origin_failed is None and origin.obj.selected_alpn_protocol() == "h2"
        guest = TLSStream(_Prefixed(first, guest_raw), self.ca.server_context(host, origin_h2),
                          server_side=True)
        try:
            await asyncio.wait_for(guest.handshake(), HANDSHAKE_TIMEOUT)
        except (TLSError, StreamClosed, OSError, TimeoutError, ssl.SSLError) as exc:
            why = exc.message if isinstance(exc, TkboxError) else exc.__class__.__name__
            return {**stats, "ended": "refused", "stage": "tls",
                    "reason": f"refused: the box's TLS to {host} failed ({why}); the box must "
                              "trust its CA and name the host in its ClientHello"}
        if origin_failed is not None:
            await self._answer_guest(guest, h11.Connection(h11.SERVER), 502, origin_failed)
            return {**stats, "ended": "origin TLS failed", "reason": origin_failed}
        guest_h2 = guest.obj.selected_alpn_protocol() == "h2"
        stats["http"] = "2" if origin_h2 else "1.1"
        if guest_h2 != origin_h2:
            # the box's retried ClientHello (after a HelloRetryRequest) took h2 back
            with contextlib.suppress(Exception):
                await guest.send_eof()
            return {**stats, "ended": "refused request",
                    "reason": "refused: the box's TLS did not keep the protocol its "
                              "ClientHello offered (ALPN)"}
        rules = TunnelRules(host, port, self.secrets)
        if origin_h2:
            relay = H2Relay(guest=guest, origin=origin, host=host, rules=rules, gate=gate,
                            stats=stats, counts=counts, record=self._record,
                            model_host=host in self.model_hosts, limits=self.h2_limits,
                            chunk=self.chunk)
            await relay.run()
            with contextlib.suppress(Exception):
                await guest.send_eof()
            return stats
        gconn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        oconn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        try:
            while True:
                await self._one(guest, origin, gconn, oconn, rules, host, stats, counts, gate)
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
        except HttpRefused as exc:
            stats["ended"] = "refused request"
            stats["reason"] = exc.reason
            await self._answer_guest(guest, gconn, exc.status, exc.reason)
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
        except h11.ProtocolError as exc:
            # every send is mapped to its side's refusal (`_send`); an event h11 would
            # not even build from what the sides sent is a refusal of the exchange too
            stats["ended"] = "refused request"
            stats["reason"] = f"refused: the exchange cannot be relayed ({str(exc)[:120]})"
            await self._answer_guest(guest, gconn, 502, stats["reason"])
        with contextlib.suppress(Exception):
            await guest.send_eof()
        return stats

    async def _read_hello(self, guest_raw: ByteStream, leftover: bytes
                          ) -> tuple[bytes, bool, str | None]:
        """The box's first bytes up to its whole ClientHello (kept, to be handshaken),
        whether it offers h2, and a refusal if none came in time. Bytes that are not a
        ClientHello are left to the handshake, which says what is wrong with them."""
        seen = leftover
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                while True:
                    try:
                        hello = read_client_hello(seen)
                    except TLSRefused:
                        return seen, False, None
                    if hello is not None:
                        return seen, b"h2" in hello.alpn, None
                    more = await guest_raw.receive(self.chunk)
                    if not more:
                        return seen, False, None
                    seen += more
        except TimeoutError:
            return seen, False, ("refused: the box's TLS sent no ClientHello within "
                                 f"{HANDSHAKE_TIMEOUT:g} s")
        except (StreamClosed, OSError) as exc:
            return seen, False, f"refused: the box's connection failed ({exc.__class__.__name__})"

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
                   stats: dict[str, Any], counts: Any, gate: HttpGate | None) -> None:
        ev = await self._next(gconn, guest, _GuestBad)
        if isinstance(ev, h11.ConnectionClosed):
            raise _End("client closed")
        if not isinstance(ev, h11.Request):
            raise _GuestBad("refused: expected an HTTP/1.1 request")
        raw = [(bytes(n), bytes(v)) for n, v in ev.headers.raw_items()]
        headers, uses = rules.request(ev.method, ev.target, raw)
        stats["requests"] += 1
        admitted: Admitted | None = None
        if gate is not None:
            # the rules read the request the origin will get: h11 parsed it, and only
            # what it parsed is written on (one request per request, no smuggling)
            admitted = await gate.check(ev.method, ev.target, raw,
                                        (gconn.their_http_version or b"1.1").decode())
        ex = Exchange(ev.method, ev.target, time.monotonic())
        try:
            out = _send(oconn, h11.Request(method=ev.method, target=ev.target, headers=headers),
                        _GuestBad, "the request cannot be relayed")
            if gconn.they_are_waiting_for_100_continue:
                await guest.send_all(_send(gconn, h11.InformationalResponse(
                    status_code=100, headers=[]), OriginError, _NOT_RELAYED))
            # From here the origin may have the request: whatever happens next, a model
            # host's request is recorded (the `finally` below).
            ex.forwarded = True
            await origin.send_all(out)
            for u in uses:
                stats["secret_uses"] += 1
                await self._record("tkbox.secret.use", {"name": u.name, "host": u.host,
                                                        "header": u.header})
            await self._request_body(guest, origin, gconn, oconn, rules, counts, ex)
            await self._response(guest, origin, gconn, oconn, rules, stats, host, counts, ex)
            ex.ended = None
        finally:
            if ex.forwarded and host in self.model_hosts:
                await self._record("tkbox.model.call", ex.model_call(host, rules))
            if admitted is not None and gate is not None:
                await gate.done(admitted, ex.status, ex.up, ex.down, ex.ended)

    async def _request_body(self, guest: TLSStream, origin: TLSStream, gconn: h11.Connection,
                            oconn: h11.Connection, rules: TunnelRules, counts: Any,
                            ex: Exchange) -> None:
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
        ex.ended = "client closed mid-request"

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
                    await origin.send_all(_send(oconn, h11.Data(data=out), _GuestBad,
                                                _BODY_NOT_RELAYED))
                    ex.up += len(out)
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
                    await origin.send_all(_send(oconn, h11.Data(data=bytes(held)), _GuestBad,
                                                _BODY_NOT_RELAYED))
                    ex.up += len(held)
                    if counts is not None:
                        counts.up += len(held)
                await origin.send_all(_send(oconn, h11.EndOfMessage(headers=trailers),
                                            _GuestBad, _BODY_NOT_RELAYED))
                ex.ended = "no response"
                return
            else:
                raise _End("client closed mid-request")

    async def _response(self, guest: TLSStream, origin: TLSStream, gconn: h11.Connection,
                        oconn: h11.Connection, rules: TunnelRules, stats: dict[str, Any],
                        host: str, counts: Any, ex: Exchange) -> None:
        """Relay the origin's response to the guest, redacted, framed for the guest's
        HTTP version: a 1.0 guest gets no interim (1xx) response and no trailers
        (RFC 9110 sections 15.2 and 6.5; h11 sends it the body close-delimited, never
        chunked), and a guest whose origin ends the connection after this response
        (HTTP/1.0, `Connection: close`, a close-delimited body) is told so, so it never
        sends another request into a tunnel whose origin is gone. What still cannot be
        relayed is the origin's refusal (`OriginError`), never an exception of h11."""
        redactor = rules.redactor()
        reads_model = host in self.model_hosts  # only a model host's calls are recorded
        old_guest = (gconn.their_http_version or b"1.0") < b"1.1"
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
                final = isinstance(ev, h11.Response)
                if not final and old_guest:
                    continue  # RFC 9110 section 15.2: never a 1xx to an HTTP/1.0 client
                headers, n = rules.redact_headers([(bytes(k), bytes(v))
                                                   for k, v in ev.headers.raw_items()])
                stats["redactions"] += n
                for k, v in headers:
                    if k.lower() == b"content-encoding" and v.strip().lower() not in (
                            b"", b"identity"):
                        raise OriginError(f"refused: {host} sent an encoded response "
                                         "(Content-Encoding other than identity) after "
                                         "being asked for identity; it cannot be redacted")
                if isinstance(ev, h11.Response):
                    ex.status = ev.status_code
                    ex.ended = "origin closed mid-response"
                    if old_guest:
                        headers = [(k, v) for k, v in headers if k.lower() != b"trailer"]
                    if origin_closes(ex.method, ev):
                        headers = [(k, v) for k, v in headers if k.lower() != b"connection"]
                        headers.append((b"connection", b"close"))
                cls = h11.Response if isinstance(ev, h11.Response) else h11.InformationalResponse
                # The origin's reason phrase is never passed on: it is free text the
                # origin chose (it could quote the request's credentials).
                await guest.send_all(_send(gconn, cls(status_code=ev.status_code,
                                                      headers=headers,
                                                      reason=reason_phrase(ev.status_code)),
                                           OriginError, _NOT_RELAYED))
            elif isinstance(ev, h11.Data):
                data = bytes(ev.data)
                ex.down += len(data)
                if counts is not None:
                    counts.down += len(data)
                # The model name and usage are read from what the guest gets (redacted):
                # a model field echoing the value must not put it in the record.
                out = redactor.feed(data)
                if out:
                    if reads_model:
                        ex.model.feed(out)
                    await guest.send_all(_send(gconn, h11.Data(data=out), OriginError,
                                               _NOT_RELAYED))
            elif isinstance(ev, h11.EndOfMessage):
                out = redactor.feed(b"", final=True)
                if reads_model:
                    ex.model.feed(out)
                    ex.model.finish()
                stats["redactions"] += redactor.count
                if out:
                    await guest.send_all(_send(gconn, h11.Data(data=out), OriginError,
                                               _NOT_RELAYED))
                trailers, n = rules.redact_headers([(bytes(k), bytes(v))
                                                    for k, v in ev.headers.raw_items()])
                stats["redactions"] += n
                if old_guest:
                    trailers = []  # RFC 9110 section 6.5: an HTTP/1.0 client gets none
                await guest.send_all(_send(gconn, h11.EndOfMessage(headers=trailers),
                                           OriginError, _NOT_RELAYED))
                return
            else:
                raise OriginError(f"the origin {host} closed the connection before its "
                                 "response ended")


def _origin_context(ca_pems: Sequence[str], h2: bool) -> ssl.SSLContext:
    """TLS to origins: the system's trust and the operator's PEMs; ALPN h2 and
    http/1.1, or http/1.1 only; no renegotiation (`TLSStream`)."""
    ctx = ssl.create_default_context()
    if ca_pems:
        ctx.load_verify_locations(cadata="\n".join(ca_pems))
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    ctx.set_alpn_protocols(["h2", "http/1.1"] if h2 else ["http/1.1"])
    return ctx


def origin_closes(method: bytes, response: h11.Response) -> bool:
    """Whether the origin's connection ends with this response (RFC 9112 sections 9.3
    and 6.3): it spoke HTTP/1.0, said `Connection: close`, or framed a body by closing
    (no Content-Length, no Transfer-Encoding, on a response that has a body)."""
    tokens = {t.strip().lower() for n, v in response.headers.raw_items()
              if bytes(n).lower() == b"connection" for t in bytes(v).split(b",")}
    if response.http_version < b"1.1" or b"close" in tokens:
        return True
    if method == b"HEAD" or response.status_code in (204, 304):
        return False
    names = {bytes(n).lower() for n, _ in response.headers.raw_items()}
    return not names & {b"content-length", b"transfer-encoding"}


def _send(conn: h11.Connection, event: Any, error: type[TkboxError], what: str) -> bytes:
    """`conn.send(event)`; h11's refusal (the two sides' versions or framings do not
    fit) as `error`, naming `what` could not be done."""
    try:
        return conn.send(event) or b""
    except h11.LocalProtocolError as exc:
        raise error(f"refused: {what} ({str(exc)[:120]})") from None


_NOT_RELAYED = "the origin's response cannot be relayed to the box's HTTP client"
_BODY_NOT_RELAYED = "the request body cannot be relayed"


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
