"""The network door of one box: a thin asyncio shell around the pure core.

`EgressDoor.handle(stream)` serves one guest proxy connection (one port-1025
stream) end to end and never raises into its caller: every refusal is an
HTTP answer to the guest with the reason (status line, `X-Tkbox-Reason`
header, body) and a record in the run with the same reason.

For each connection, in order:

1. read the request head (bounded, `request.RequestHeadParser`), with a
   deadline; refuse anything but CONNECT and absolute-form http://;
2. the allowlist and approvals (`policy.EgressPolicy`), a person's answer
   through the shared `ApprovalBoard` if needed;
3. addresses: literal, operator-mapped, or resolved once on the host; each
   checked (`addresses.AddressPolicy`);
4. a `Connect` decision from the signer (fail closed: no answer, no
   connection), naming the host, port, addresses and the rule;
5. dial exactly a checked address (never the name, so DNS rebinding between
   check and dial has nothing to act on);
6. CONNECT: `200`, then splice through a `tls.TunnelInspector` until the
   handshake commits; http://: one request re-serialised by h11 in
   origin-form with `Connection: close`, the response re-framed by h11;
7. a `complete` record: bytes each way, duration, how it ended.

Memory per connection is bounded: reads of at most `chunk` bytes, each sent
(with the stream's own flow control) before the next is read, and the
inspector's bounded buffers. Connections are bounded per box and, through a
shared `limits.ConnectionPool`, daemon-wide with a fair share per box; a
tunnel ends after `tunnel_idle` s without a byte and `tunnel_total` s in all.
Records carry `records.excerpt`s of guest bytes only, and refusals past the
first few a minute are summarised (`records.RefusalLog`). `close()` (box
stop) cuts every tunnel at once and refuses new connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import h11

from tkbox.doors.network.addresses import AddressPolicy, IPAddress
from tkbox.doors.network.allowlist import Allowlist
from tkbox.doors.network.approvals import ApprovalBoard
from tkbox.doors.network.clock import Clock
from tkbox.doors.network.config import OperatorConfig
from tkbox.doors.network.limits import TUNNEL_IDLE, TUNNEL_TOTAL, ConnectionPool
from tkbox.doors.network.names import HostNameError, parse_host
from tkbox.doors.network.policy import EgressPolicy, Explanation
from tkbox.doors.network.records import RefusalLog, excerpt
from tkbox.doors.network.request import (
    HOP_BY_HOP,
    BadRequest,
    ProxyRequest,
    RequestHeadParser,
    answer,
)
from tkbox.doors.network.resolver import HostAddresses, ResolveError, Resolver
from tkbox.doors.network.tls import TLSRefused, TunnelInspector
from tkbox.errors import GuestError, Refused, SignerUnavailable, TkboxError, UserError
from tkbox.protocol.streams import AsyncioStream, ByteStream, StreamClosed
from tkbox.record.client import SignerClient

log = logging.getLogger(__name__)

T = TypeVar("T")
Dialer = Callable[[str, int], Awaitable[ByteStream]]

CHUNK = 64 * 1024
MAX_CONNECTIONS = 1024
HEAD_TIMEOUT = 30.0
HELLO_TIMEOUT = 30.0
DIAL_TIMEOUT = 10.0
MAX_RECORDED_PATH = 512
# TLS alert record: fatal (2), access_denied (49), RFC 8446 §6.2
TLS_ACCESS_DENIED = bytes([21, 3, 3, 0, 2, 2, 49])


async def open_tcp(address: str, port: int) -> ByteStream:
    """The real dialer: a TCP connection to exactly this IP address."""
    reader, writer = await asyncio.open_connection(address, port, limit=CHUNK)
    return AsyncioStream(reader, writer)


class _Cut(Exception):
    """The door is closing: this connection ends now."""


class _Refusal(Exception):
    def __init__(self, status: int, reason: str, stage: str) -> None:
        super().__init__(reason)
        self.status, self.reason, self.stage = status, reason, stage


@dataclass(eq=False)
class _Conn:
    cut: asyncio.Event = field(default_factory=asyncio.Event)
    up: int = 0
    down: int = 0


class EgressDoor:
    """One box's egress proxy. See the module docstring for what it does."""

    def __init__(
        self,
        run_id: str,
        signer: SignerClient,
        allow: Iterable[str],
        operator: OperatorConfig,
        resolver: Resolver,
        board: ApprovalBoard,
        clock: Clock,
        *,
        box: str | None = None,
        dial: Dialer = open_tcp,
        own_addresses: Callable[[], frozenset[IPAddress]] | None = None,
        allowlist: Allowlist | None = None,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout: float = HEAD_TIMEOUT,
        hello_timeout: float = HELLO_TIMEOUT,
        dial_timeout: float = DIAL_TIMEOUT,
        chunk: int = CHUNK,
        on_record_lost: Callable[[TkboxError], None] | None = None,
        pool: ConnectionPool | None = None,
        tunnel_idle: float = TUNNEL_IDLE,
        tunnel_total: float = TUNNEL_TOTAL,
        mitm: Any = None,
    ) -> None:
        self.run_id = run_id
        self.box = box or run_id
        self.signer = signer
        self.operator = operator
        self.resolver = resolver
        self.board = board
        self.clock = clock
        self.dial = dial
        self.max_connections = max_connections
        self.head_timeout = head_timeout
        self.hello_timeout = hello_timeout
        self.dial_timeout = dial_timeout
        self.chunk = chunk
        self.on_record_lost = on_record_lost
        self.pool = pool
        self.tunnel_idle = tunnel_idle
        self.tunnel_total = tunnel_total
        # The secrets door (tkbox.doors.secrets.SecretsDoor): tunnels to the hosts it
        # `wants` are read by it instead of spliced, after every check above.
        self.mitm = mitm
        self.ca_pem: str | None = mitm.ca_pem if mitm is not None else None
        own = own_addresses if own_addresses is not None else HostAddresses(clock)
        self.policy = EgressPolicy(
            allowlist if allowlist is not None else Allowlist(allow),
            operator,
            AddressPolicy(operator.block, operator.permit, own),
        )
        self._conns: set[_Conn] = set()
        self._refusals = RefusalLog()
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    # --- for the daemon and the CLI -----------------------------------------

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def check(self, host: str, port: int) -> Explanation:
        """What the door would decide for host:port and why, without DNS or dialing."""
        try:
            h = parse_host(host)
        except HostNameError as exc:
            raise UserError(exc.message) from None
        if not 1 <= port <= 65535:
            raise UserError(f"port {port} is out of range (1 to 65535)")
        return self.policy.explain(h, port)

    async def resolve_and_check(self, host: str, port: int) -> Explanation:
        """`check`, and for an allowed name also its resolved addresses."""
        ex = self.check(host, port)
        if ex.verdict != "allow" or ex.source != "not resolved":
            return ex
        h = parse_host(host)
        try:
            addrs = await self.resolver.resolve(h.name, port)
        except ResolveError as exc:
            ex.verdict, ex.reason = "refuse", f"refused: {exc.message}"
            return ex
        return self.policy.explain(h, port, addrs)

    async def close(self) -> None:
        """Stop: refuse new connections, cut open ones at once, end approvals."""
        already = self._closed
        self._closed = True
        for c in list(self._conns):
            c.cut.set()
        await self.board.stop_box(self.box)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), 10.0)
        if not already:
            await self._record_summary(self._refusals.flush(self.clock.monotonic()))

    # --- one connection -------------------------------------------------------

    async def handle(self, stream: ByteStream) -> None:
        """Serve one proxy connection; never raises (except cancellation)."""
        reason = None
        if self._closed:
            reason = f"refused: box {self.box} is stopping; egress is closed"
        elif len(self._conns) >= self.max_connections:
            reason = (f"refused: box {self.box} has {self.max_connections} connections open "
                      "(the limit); close some and retry")
        elif self.pool is not None:
            reason = self.pool.acquire(self.box)
        if reason is not None:
            with contextlib.suppress(Exception):
                await self._refuse(stream, _Refusal(503, reason, "limit"), None)
            with contextlib.suppress(Exception):
                await stream.aclose()
            return
        try:
            await self._handle(stream)
        finally:
            if self.pool is not None:
                self.pool.release(self.box)

    async def _handle(self, stream: ByteStream) -> None:
        conn = _Conn()
        self._conns.add(conn)
        self._idle.clear()
        try:
            await self._serve(stream, conn)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the daemon's loop must never see it
            log.exception("egress door: internal error on a connection of %s", self.box)
            with contextlib.suppress(Exception):
                await self._refuse(
                    stream,
                    _Refusal(
                        500,
                        f"refused: internal error in the egress door ({exc.__class__.__name__})",
                        "internal",
                    ),
                    None,
                )
        finally:
            self._conns.discard(conn)
            if not self._conns:
                self._idle.set()
            with contextlib.suppress(Exception):
                await stream.aclose()

    async def _race(self, conn: _Conn, coro: Awaitable[T], timeout: float | None = None) -> T:
        """Run `coro` unless the door cuts this connection or the timeout passes."""
        task = asyncio.ensure_future(coro)
        cut = asyncio.ensure_future(conn.cut.wait())
        try:
            done, _ = await asyncio.wait(
                {task, cut}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            cut.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if task in done:
            return task.result()
        if conn.cut.is_set():
            raise _Cut()
        raise TimeoutError()

    async def _read_head(self, stream: ByteStream, parser: RequestHeadParser) -> ProxyRequest:
        while True:
            data = await stream.receive(self.chunk)
            if not data:
                raise BadRequest(
                    400, "refused: the connection ended before a complete request head"
                )
            req = parser.feed(data)
            if req is not None:
                return req

    async def _serve(self, stream: ByteStream, conn: _Conn) -> None:
        started = self.clock.monotonic()
        parser = RequestHeadParser()
        req: ProxyRequest | None = None
        try:
            try:
                req = await self._race(conn, self._read_head(stream, parser), self.head_timeout)
            except TimeoutError:
                raise _Refusal(
                    408,
                    f"refused: no complete request head within {self.head_timeout:g} s",
                    "request",
                ) from None
            except BadRequest as exc:
                raise _Refusal(exc.status, exc.message, "request") from None
            if self.mitm is not None:
                # A secret's value or placeholder in the proxy request (its target host; for
                # plain http also its path and headers) is a leak, recorded by the secrets
                # door without the host, which may hold the value: nothing here records it.
                why = await self.mitm.check_plain(req.host.name, req.method, req.path,
                                                  list(req.headers))
                if why:
                    await self._refuse(stream, _Refusal(403, why, "secret"), None, record=False)
                    return
            ex, addresses = await self._decide_addresses(conn, req)
            decision_id = await self._decide(req, ex, addresses)
        except _Refusal as r:
            await self._refuse(stream, r, req)
            return
        except _Cut:
            await self._refuse(
                stream,
                _Refusal(503, f"refused: box {self.box} is stopping; egress is closed", "stop"),
                req,
            )
            return
        outcome: dict[str, Any] = {}
        try:
            origin, address = await self._dial(conn, req, addresses)
        except _Cut:
            outcome = {"ended": "box stopped"}
            await self._refuse(
                stream,
                _Refusal(503, f"refused: box {self.box} is stopping", "stop"),
                req,
                record=False,
            )
        except _Refusal as r:
            outcome = {"ended": "dial failed", "reason": r.reason}
            await self._refuse(stream, r, req, record=False)
        else:
            outcome = {"address": str(address)}
            try:
                if req.kind == "connect" and self.mitm is not None and self.mitm.wants(
                        req.host.name, req.port):
                    outcome.update(await self._intercept(stream, origin, conn, req, parser))
                elif req.kind == "connect":
                    outcome.update(
                        await self._tunnel(stream, origin, conn, req, parser, ex.require_tls)
                    )
                else:
                    outcome.update(await self._forward_http(stream, origin, conn, req, parser))
            finally:
                with contextlib.suppress(Exception):
                    await origin.aclose()
        if "reason" in outcome:
            outcome["reason"] = excerpt(outcome["reason"])
        outcome.update(
            bytes_up=conn.up,
            bytes_down=conn.down,
            duration_ms=round((self.clock.monotonic() - started) * 1000),
        )
        try:
            await self.signer.complete(self.run_id, decision_id, outcome)
        except SignerUnavailable as exc:
            self._lost(exc)
        if outcome.get("ended") == "refused":
            await self._record_refusal(
                str(outcome.get("stage", "tls")), str(outcome["reason"]), req
            )

    async def _decide_addresses(
        self, conn: _Conn, req: ProxyRequest
    ) -> tuple[Explanation, list[IPAddress]]:
        host, port = req.host, req.port
        ex = self.policy.explain(host, port)
        if ex.verdict == "refuse":
            raise _Refusal(403, ex.reason, "policy")
        if ex.verdict == "ask":
            try:
                ans = await self._race(
                    conn, self.board.wait_for_answer(self.box, self.run_id, host.name, port)
                )
            except Refused as exc:
                raise _Refusal(429, exc.reason, "approval") from None
            except SignerUnavailable:
                raise _Refusal(
                    503,
                    "refused: the signer did not answer, so no approval can be recorded",
                    "approval",
                ) from None
            key = (host.name, port)
            if ans.outcome == "approved":
                self.policy.approved[key] = ans.id
            elif ans.outcome == "denied":
                self.policy.denied[key] = ans.id
                raise _Refusal(
                    403,
                    f"refused: {host}:{port} was denied by a person on the host "
                    f"(approval {ans.id})",
                    "approval",
                )
            elif ans.outcome == "expired":
                raise _Refusal(
                    403,
                    f"refused: {host}:{port} is not allowed and nobody answered approval {ans.id} "
                    f"within {self.board.wait_seconds:g} s; ask for --allow {host}:{port}",
                    "approval",
                )
            else:
                raise _Cut()
            ex = self.policy.explain(host, port)
        if ex.source == "not resolved":
            try:
                resolved = await self._race(conn, self.resolver.resolve(host.name, port))
            except ResolveError as exc:
                raise _Refusal(502, f"refused: {exc.message}", "resolve") from None
            ex = self.policy.explain(host, port, resolved)
        if ex.verdict != "allow":
            raise _Refusal(403, ex.reason, "address")
        return ex, ex.allowed_addresses

    async def _decide(self, req: ProxyRequest, ex: Explanation, addresses: list[IPAddress]) -> str:
        context: dict[str, Any] = {
            "rule": ex.rule,
            "method": req.method,
            "kind": "tunnel" if req.kind == "connect" else "http",
            "addresses_from": ex.source,
            "tls_required": ex.require_tls if req.kind == "connect" else False,
        }
        refused = [str(a.address) for a in ex.addresses if not a.allowed]
        if refused:
            context["refused_addresses"] = refused
        permits = sorted({a.rule for a in ex.addresses if a.allowed and a.rule != "public"})
        if permits:
            context["operator"] = permits
        if req.kind == "http":
            path = req.path
            context["path"] = (
                path if len(path) <= MAX_RECORDED_PATH else path[:MAX_RECORDED_PATH] + "..."
            )
        resource = {
            "host": req.host.name,
            "port": req.port,
            "addresses": [str(a) for a in addresses],
        }
        try:
            verdict = await self.signer.decide(self.run_id, "Connect", resource, context)
        except SignerUnavailable:
            raise _Refusal(
                503,
                "refused: the signer did not answer; nothing crosses without a record",
                "signer",
            ) from None
        if not verdict.allowed:
            raise _Refusal(403, f"refused by policy: {verdict.reason}", "signer-policy-recorded")
        return verdict.decision_id

    async def _dial(
        self, conn: _Conn, req: ProxyRequest, addresses: list[IPAddress]
    ) -> tuple[ByteStream, IPAddress]:
        errors: list[str] = []
        for ip in addresses:
            try:
                stream = await self._race(conn, self.dial(str(ip), req.port), self.dial_timeout)
                return stream, ip
            except TimeoutError:
                errors.append(f"{ip}: no answer within {self.dial_timeout:g} s")
            except (OSError, StreamClosed) as exc:
                errors.append(f"{ip}: {exc.__class__.__name__}")
        raise _Refusal(
            502, f"could not connect to {req.host}:{req.port} ({'; '.join(errors)})", "dial"
        )

    # --- tunnels --------------------------------------------------------------

    async def _tunnel(
        self,
        guest: ByteStream,
        origin: ByteStream,
        conn: _Conn,
        req: ProxyRequest,
        parser: RequestHeadParser,
        require_tls: bool,
    ) -> dict[str, Any]:
        await guest.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        insp = TunnelInspector(req.host, require_tls)
        gate = asyncio.Event()
        if insp.server_may_speak:
            gate.set()
        deadline = self.clock.monotonic() + self.hello_timeout

        async def up() -> str:
            data = parser.leftover
            while True:
                if not data:
                    if insp.done:
                        data = await guest.receive(self.chunk)
                    else:
                        left = deadline - self.clock.monotonic()
                        try:
                            data = await asyncio.wait_for(
                                guest.receive(self.chunk), max(left, 0.001)
                            )
                        except TimeoutError:
                            raise TLSRefused(
                                f"refused: no TLS handshake within {self.hello_timeout:g} s"
                            ) from None
                if not data:
                    await origin.send_eof()
                    gate.set()  # let the origin's close (or its last bytes, checked) through
                    return "client closed"
                out = insp.client_data(data)
                if out:
                    await origin.send_all(out)
                    conn.up += len(out)
                if insp.server_may_speak:
                    gate.set()
                data = b""

        async def down() -> str:
            await gate.wait()
            while True:
                data = await origin.receive(self.chunk)
                if not data:
                    await guest.send_eof()
                    return "origin closed"
                out = insp.server_data(data)
                await guest.send_all(out)
                conn.down += len(out)

        result = await self._run_pair(conn, up(), down())
        result["tls"] = insp.tls
        if insp.server_names:
            result["server_name"] = insp.server_names[-1]
        if insp.retried:
            result["hello_retry"] = True
        if result.get("ended") == "refused" and insp.tls and conn.down == 0:
            with contextlib.suppress(Exception):
                await guest.send_all(TLS_ACCESS_DENIED)
        return result

    async def _intercept(
        self,
        guest: ByteStream,
        origin: ByteStream,
        conn: _Conn,
        req: ProxyRequest,
        parser: RequestHeadParser,
    ) -> dict[str, Any]:
        """Hand a decided, dialed tunnel to the secrets door (it reads the HTTP inside),
        under the same cut and time limits as a spliced tunnel."""
        await guest.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        task = asyncio.ensure_future(
            self.mitm.tunnel(guest, origin, req.host.name, req.port, parser.leftover, conn))
        cut = asyncio.ensure_future(conn.cut.wait())
        timer = asyncio.ensure_future(self._watch_time(conn))
        try:
            done, _ = await asyncio.wait({task, cut, timer}, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                result: dict[str, Any] = task.result()
                return result
            if cut in done:
                return {"ended": "box stopped", "intercepted": True}
            return {"ended": timer.result(), "intercepted": True}
        finally:
            for t in (task, cut, timer):
                t.cancel()
            for t in (task, cut, timer):
                with contextlib.suppress(BaseException):
                    await t

    async def _watch_time(self, conn: _Conn) -> str:
        """Return once the connection has been idle `tunnel_idle` s, or open `tunnel_total` s."""
        clock = self.clock
        started = last = clock.monotonic()
        seen = (conn.up, conn.down)
        while True:
            now = clock.monotonic()
            if (conn.up, conn.down) != seen:
                seen, last = (conn.up, conn.down), now
            if now - started >= self.tunnel_total:
                return (f"time limit: open {self.tunnel_total:g} s "
                        "(tkbox daemon --tunnel-total)")
            if now - last >= self.tunnel_idle:
                return (f"idle timeout: no bytes for {self.tunnel_idle:g} s "
                        "(tkbox daemon --tunnel-idle)")
            await clock.sleep(min(last + self.tunnel_idle, started + self.tunnel_total) - now)

    async def _run_pair(
        self, conn: _Conn, a: Coroutine[Any, Any, str], b: Coroutine[Any, Any, str]
    ) -> dict[str, Any]:
        """Run both directions until both end, one fails, the door cuts, or time is up."""
        tasks = {asyncio.ensure_future(a), asyncio.ensure_future(b)}
        cut = asyncio.ensure_future(conn.cut.wait())
        timer = asyncio.ensure_future(self._watch_time(conn))
        ends: list[str] = []
        result: dict[str, Any] = {}
        try:
            pending = set(tasks)
            while pending:
                done, _ = await asyncio.wait(
                    pending | {cut, timer}, return_when=asyncio.FIRST_COMPLETED
                )
                if cut in done:
                    return {"ended": "box stopped"}
                if timer in done:
                    return {"ended": timer.result()}
                for t in done:
                    pending.discard(t)
                    exc = t.exception()
                    if isinstance(exc, GuestError):
                        return {"ended": "refused", "reason": exc.message, "stage": _stage(exc)}
                    if isinstance(exc, StreamClosed | OSError):
                        return {"ended": "reset"}
                    if exc is not None:
                        raise exc
                    ends.append(str(t.result()))
            result["ended"] = " and ".join(ends) if ends else "closed"
            return result
        finally:
            cut.cancel()
            timer.cancel()
            for t in tasks:
                t.cancel()
            for t in (*tasks, timer):
                with contextlib.suppress(BaseException):
                    await t

    # --- plain http -------------------------------------------------------------

    async def _forward_http(
        self,
        guest: ByteStream,
        origin: ByteStream,
        conn: _Conn,
        req: ProxyRequest,
        parser: RequestHeadParser,
    ) -> dict[str, Any]:
        gconn = parser.conn
        oconn = h11.Connection(h11.CLIENT)
        started = False
        status: int | None = None
        await origin.send_all(
            oconn.send(h11.Request(method=req.method, target=req.path, headers=list(req.headers)))
        )
        gconn.receive_data(parser.leftover)

        async def up_events() -> str:
            while True:
                try:
                    ev = gconn.next_event()
                except h11.RemoteProtocolError as exc:
                    raise BadRequest(400, f"refused: malformed request body ({exc})") from None
                if ev is h11.NEED_DATA:
                    gconn.receive_data(await guest.receive(self.chunk))
                elif isinstance(ev, h11.Data):
                    await origin.send_all(oconn.send(h11.Data(data=ev.data)) or b"")
                    conn.up += len(ev.data)
                elif isinstance(ev, h11.EndOfMessage):
                    await origin.send_all(oconn.send(h11.EndOfMessage()) or b"")
                    return "request sent"
                else:
                    return "client closed"

        async def down_events() -> str:
            nonlocal started, status
            while True:
                try:
                    ev = oconn.next_event()
                except h11.RemoteProtocolError as exc:
                    raise _OriginError(f"the origin sent a malformed response ({exc})") from None
                if ev is h11.NEED_DATA:
                    oconn.receive_data(await origin.receive(self.chunk))
                elif isinstance(ev, h11.InformationalResponse):
                    if ev.status_code == 101:
                        raise _OriginError(
                            "the origin switched protocols, which the proxy does not carry"
                        )
                    await guest.send_all(
                        gconn.send(
                            h11.InformationalResponse(
                                status_code=ev.status_code,
                                headers=_response_headers(ev.headers, False),
                                reason=ev.reason,
                            )
                        )
                        or b""
                    )
                elif isinstance(ev, h11.Response):
                    started, status = True, ev.status_code
                    await guest.send_all(
                        gconn.send(
                            h11.Response(
                                status_code=ev.status_code,
                                headers=_response_headers(ev.headers, True),
                                reason=ev.reason,
                            )
                        )
                        or b""
                    )
                elif isinstance(ev, h11.Data):
                    await guest.send_all(gconn.send(h11.Data(data=ev.data)) or b"")
                    conn.down += len(ev.data)
                elif isinstance(ev, h11.EndOfMessage):
                    await guest.send_all(gconn.send(h11.EndOfMessage()) or b"")
                    return "response sent"
                else:
                    raise _OriginError("the origin closed the connection before its response ended")

        async def up() -> str:
            try:
                return await up_events()
            except h11.LocalProtocolError as exc:
                raise BadRequest(400, f"refused: the request cannot be relayed ({exc})") from None

        async def down() -> str:
            try:
                return await down_events()
            except h11.LocalProtocolError as exc:
                raise _OriginError(f"the origin's response cannot be relayed ({exc})") from None

        result = await self._run_pair(conn, up(), down())
        if result.get("ended") == "refused" and not started:
            with contextlib.suppress(Exception):
                await guest.send_all(
                    answer(502 if result.get("stage") == "origin" else 400, result["reason"])
                )
        result["status"] = status
        return result

    # --- refusals and records -----------------------------------------------------

    async def _refuse(
        self, stream: ByteStream, r: _Refusal, req: ProxyRequest | None, record: bool = True
    ) -> None:
        if record and r.stage != "signer-policy-recorded":
            await self._record_refusal(r.stage, r.reason, req, r.status)
        with contextlib.suppress(StreamClosed, OSError):
            await stream.send_all(answer(r.status, r.reason))

    async def _record_refusal(
        self, stage: str, reason: str, req: ProxyRequest | None, status: int | None = None
    ) -> None:
        """One refusal: its own record while the interval allows, else counted in a summary.

        Every guest-derived string is an `excerpt`: bounded and escaped."""
        own, due = self._refusals.admit(
            self.clock.monotonic(), stage, req.host.name if req is not None else None
        )
        await self._record_summary(due)
        if not own:
            return
        body: dict[str, Any] = {"stage": stage, "reason": excerpt(reason)}
        if status is not None:
            body["status"] = status
        if req is not None:
            body.update(host=excerpt(req.host.name), port=req.port, method=excerpt(req.method, 32))
        try:
            await self.signer.event(self.run_id, "tkbox.egress.refused", body)
        except SignerUnavailable as exc:
            self._lost(exc)

    async def _record_summary(self, summary: dict[str, Any] | None) -> None:
        if summary is None:
            return
        try:
            await self.signer.event(self.run_id, "tkbox.egress.refused.summary", summary)
        except SignerUnavailable as exc:
            self._lost(exc)

    def _lost(self, exc: TkboxError) -> None:
        log.error("egress door of %s could not record: %s", self.box, exc)
        if self.on_record_lost is not None:
            self.on_record_lost(exc)


class _OriginError(GuestError):
    """The origin answered with something the proxy cannot carry."""


def _stage(exc: Exception) -> str:
    if isinstance(exc, TLSRefused):
        return "tls"
    if isinstance(exc, _OriginError):
        return "origin"
    return "request body"


def _response_headers(headers: Any, final: bool) -> list[tuple[bytes, bytes]]:
    pairs = [(bytes(n).lower(), bytes(v)) for n, v in headers]
    named: set[bytes] = set()
    for n, v in pairs:
        if n == b"connection":
            named.update(t.strip().lower() for t in v.split(b","))
    named -= {b"content-length"}
    out = [(n, v) for n, v in pairs if n not in HOP_BY_HOP and n not in named]
    if final:
        out.append((b"connection", b"close"))
    return out
