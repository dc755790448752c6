"""The network door of one box: a thin asyncio shell around the pure core.

`EgressDoor.handle(stream)` serves one guest proxy connection (one port-1025
stream) end to end and never raises into its caller: every refusal is an
HTTP answer to the guest with the reason (status line, `X-Tkbox-Reason`
header, body) and a record in the run with the same reason.

For each connection, in order, each step in its own module:

1. deciding (`decide`): the request head (bounded, with a deadline; only
   CONNECT and absolute-form http://), a secret in the head, the allowlist
   and approvals, the addresses (literal, operator-mapped, or resolved once
   on the host, each checked), then a `Connect` decision from the signer
   (fail closed: no answer, no connection);
2. dialing (here): exactly a checked address (never the name, so DNS
   rebinding between check and dial has nothing to act on);
3. crossing: CONNECT answers `200` and is spliced through a
   `tls.TunnelInspector` until the handshake commits, or handed to the
   secrets door for its hosts (`tunnel`); http:// relays one request
   re-serialised by h11 in origin form with `Connection: close`, the
   response re-framed by h11 (`relay`);
4. a `complete` record: bytes each way, duration, how it ended.

A refusal is an `errors.EgressRefused` carrying its HTTP status and its
`errors.Stage`; how a crossing ended is a `connection.Ending`.

Memory per connection is bounded: reads of at most `chunk` bytes, each sent
(with the stream's own flow control) before the next is read, and the
inspector's bounded buffers. Connections are bounded per box and, through a
shared `limits.ConnectionPool`, daemon-wide with a fair share per box; a
tunnel ends after `tunnel_idle` s without a byte and `tunnel_total` s in all.
Records carry `records.excerpt`s of guest bytes only, and refusals past the
first few a minute are summarised (`records.RefusalLog`). `close()` (box
stop) ends every connection at once (`connection.Connection.end`) and refuses
new ones. Each connection's waits and tasks end with it (`connection`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from tkbox._clock import Clock
from tkbox.doors.network.addresses import AddressPolicy, IPAddress
from tkbox.doors.network.allowlist import Allowlist
from tkbox.doors.network.approvals import ApprovalBoard
from tkbox.doors.network.config import OperatorConfig
from tkbox.doors.network.connection import BOX_STOPPED, Connection, Ending, TimeLimits
from tkbox.doors.network.decide import Decided, Decider, check_secrets, read_request
from tkbox.doors.network.errors import ConnectionEnded, EgressRefused, Stage
from tkbox.doors.network.hostpolicy import EgressPolicy, Explanation
from tkbox.doors.network.httpgate import BoxRequests, HttpGate, HttpRefused
from tkbox.doors.network.httprules import RuleSet
from tkbox.doors.network.limits import TUNNEL_IDLE, TUNNEL_TOTAL, ConnectionPool
from tkbox.doors.network.records import RefusalLog, excerpt
from tkbox.doors.network.relay import relay
from tkbox.doors.network.request import ProxyRequest, RequestHeadParser, answer
from tkbox.doors.network.resolver import HostAddresses, Resolver
from tkbox.doors.network.tunnel import Interceptor, Tunnel, intercept, splice
from tkbox.errors import SignerUnavailable, TkboxError
from tkbox.protocol.streams import AsyncioStream, ByteStream, StreamClosed
from tkbox.record.client import SignerClient

log = logging.getLogger(__name__)

Dialer = Callable[[str, int], Coroutine[Any, Any, ByteStream]]

CHUNK = 64 * 1024
MAX_CONNECTIONS = 1024
HEAD_TIMEOUT = 30.0
HELLO_TIMEOUT = 30.0
DIAL_TIMEOUT = 10.0


async def open_tcp(address: str, port: int) -> ByteStream:
    """The real dialer: a TCP connection to exactly this IP address."""
    reader, writer = await asyncio.open_connection(address, port, limit=CHUNK)
    return AsyncioStream(reader, writer)


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
        mitm: Interceptor | None = None,
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
        self.decider = Decider(self.run_id, self.box, signer, self.policy, resolver, board)
        self._conns: set[Connection] = set()
        self._refusals = RefusalLog()
        self._requests = BoxRequests()  # answers to `ask` rules, HTTP refusal records
        self._rulesets: dict[tuple[str, int], RuleSet | None] = {}
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    # --- for the daemon and the CLI -----------------------------------------

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def check(self, host: str, port: int) -> Explanation:
        """What the door would decide for host:port and why, without DNS or dialing."""
        return self.decider.check(host, port)

    async def resolve_and_check(self, host: str, port: int) -> Explanation:
        """`check`, and for an allowed name also its resolved addresses."""
        return await self.decider.resolve_and_check(host, port)

    async def close(self) -> None:
        """Stop: refuse new connections, cut open ones at once, end approvals."""
        already = self._closed
        self._closed = True
        for c in list(self._conns):
            c.end(BOX_STOPPED)
        await self.board.stop_box(self.box)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10.0):
                await self._idle.wait()
        if not already:
            await self._record_summary(self._refusals.flush(self.clock.monotonic()))

    # --- one connection -------------------------------------------------------

    async def handle(self, stream: ByteStream) -> None:
        """Serve one proxy connection; never raises (except cancellation)."""
        reason = None
        stage = Stage.LIMIT
        if self._closed:
            reason = f"refused: box {self.box} is stopping; egress is closed"
            stage = Stage.STOP
        elif len(self._conns) >= self.max_connections:
            reason = (f"refused: box {self.box} has {self.max_connections} connections open "
                      "(the limit); close some and retry")
        elif self.pool is not None:
            reason = self.pool.acquire(self.box)
        if reason is not None:
            with contextlib.suppress(Exception):
                await self._refuse(stream, EgressRefused(503, reason, stage), None)
            with contextlib.suppress(Exception):
                await stream.aclose()
            return
        try:
            await self._handle(stream)
        finally:
            if self.pool is not None:
                self.pool.release(self.box)

    async def _handle(self, stream: ByteStream) -> None:
        conn = Connection()
        self._conns.add(conn)
        self._idle.clear()
        try:
            await self._serve(stream, conn)
        except Exception as exc:  # noqa: BLE001 - the daemon's loop must never see it
            log.exception("egress door: internal error on a connection of %s", self.box)
            with contextlib.suppress(Exception):
                await self._refuse(
                    stream,
                    EgressRefused(
                        500,
                        f"refused: internal error in the egress door ({exc.__class__.__name__})",
                        Stage.INTERNAL,
                    ),
                    None,
                )
        finally:
            self._conns.discard(conn)
            if not self._conns:
                self._idle.set()
            with contextlib.suppress(Exception):
                await stream.aclose()

    async def _serve(self, stream: ByteStream, conn: Connection) -> None:
        started = self.clock.monotonic()
        req: ProxyRequest | None = None
        try:
            req, parser = await read_request(stream, conn, self.chunk, self.head_timeout)
            await check_secrets(self.mitm, req)
            decided = await self.decider.decide(conn, req)
        except EgressRefused as r:
            await self._refuse(stream, r, req)
            return
        except ConnectionEnded:
            await self._refuse(
                stream,
                EgressRefused(
                    503, f"refused: box {self.box} is stopping; egress is closed", Stage.STOP
                ),
                req,
            )
            return
        try:
            origin, address = await self._dial(conn, req, decided.addresses)
        except ConnectionEnded:
            await self._refuse(
                stream,
                EgressRefused(503, f"refused: box {self.box} is stopping", Stage.STOP,
                              recorded_elsewhere=True),
                req,
            )
            await self._complete(decided, req, Ending(BOX_STOPPED), conn, started)
            return
        except EgressRefused as r:
            await self._refuse(stream, r, req)
            await self._complete(decided, req, Ending("dial failed", facts={"reason": r.reason}),
                                 conn, started)
            return
        # Whatever the crossing raises (a bug, a cancellation), the decision is completed:
        # a crossing that began is never left out of the record.
        ending = Ending("cancelled")
        try:
            ending = await self._cross(stream, origin, conn, req, parser, decided)
        except (StreamClosed, OSError):
            # a stream reset before the crossing's directions ran (the guest gone
            # before its `200`, the origin before the relayed request's head):
            # an ordinary ending, as inside the crossing (`Ending.from_failure`)
            ending = Ending("reset")
        except Exception as exc:  # noqa: BLE001 - a bug: recorded, never the loop's
            log.exception("egress door: internal error in a crossing of %s", self.box)
            ending = Ending.refusal(EgressRefused(
                500, f"refused: internal error in the egress door ({exc.__class__.__name__})",
                Stage.INTERNAL))
        finally:
            with contextlib.suppress(Exception):
                await origin.aclose()
            ending.facts["address"] = str(address)
            await self._complete(decided, req, ending, conn, started)

    async def _complete(self, decided: Decided, req: ProxyRequest, ending: Ending,
                        conn: Connection, started: float) -> None:
        """The decision's completion (bytes each way, duration, how it ended), and for a
        crossing refused after it began, its `tkbox.egress.refused` too."""
        outcome = ending.outcome()
        if "reason" in outcome:
            outcome["reason"] = excerpt(outcome["reason"])
        outcome.update(
            bytes_up=conn.up,
            bytes_down=conn.down,
            duration_ms=round((self.clock.monotonic() - started) * 1000),
        )
        try:
            await self.signer.complete(self.run_id, decided.decision_id, outcome)
        except SignerUnavailable as exc:
            self._lost(exc)
        if ending.refused is not None:
            # the reason as the completion has it (an excerpt), excerpted again for the
            # event: what the door has always written (docs/bundle-format.md)
            await self._record_refusal(ending.refused.stage, str(outcome["reason"]), req)

    async def _cross(
        self,
        stream: ByteStream,
        origin: ByteStream,
        conn: Connection,
        req: ProxyRequest,
        parser: RequestHeadParser,
        decided: Decided,
    ) -> Ending:
        """The crossing itself: a tunnel read by the secrets door, a tunnel spliced, or
        one plain-HTTP request relayed."""
        limits = TimeLimits(self.clock, self.tunnel_idle, self.tunnel_total)
        gate = self._gate(req, decided)
        if req.kind == "http":
            if gate is None:
                return await relay(stream, origin, conn, req, parser.conn, parser.leftover,
                                   limits, self.chunk)
            try:
                admitted = await conn.wait_for(gate.check(
                    req.method.encode("ascii", "replace"),
                    req.path.encode("ascii", "replace"), req.headers, req.http_version))
            except HttpRefused as r:
                with contextlib.suppress(StreamClosed, OSError):
                    await stream.send_all(answer(r.status, r.reason))
                return Ending("refused request", facts={"reason": r.reason})
            except ConnectionEnded as e:
                return Ending(e.reason)
            ending = await relay(stream, origin, conn, req, parser.conn, parser.leftover,
                                 limits, self.chunk)
            status = ending.facts.get("status")
            await gate.done(admitted, status if isinstance(status, int) else None, conn.up,
                            conn.down, None if ending.refused is None and status is not None
                            else ending.ended)
            return ending
        t = Tunnel(stream, origin, conn, req, parser.leftover, limits, self.chunk)
        if self.mitm is not None and self.mitm.wants(req.host.name, req.port):
            return await intercept(t, self.mitm, gate)
        if gate is not None:
            # never reached when the daemon wires the secrets door for every ruled host
            await stream.send_all(answer(403, f"refused: {req.host}:{req.port} has request "
                                              "rules but this door cannot read its traffic"))
            return Ending.refusal(EgressRefused(403, "refused: a ruled host whose traffic "
                                                "the door cannot read", Stage.POLICY))
        return await splice(t, decided.explanation.require_tls, self.hello_timeout)

    def _gate(self, req: ProxyRequest, decided: Decided) -> HttpGate | None:
        """The request gate of a ruled host and port, or None (not ruled)."""
        if req.host.literal is not None:
            return None
        key = (req.host.name, req.port)
        if key not in self._rulesets:  # one per host and port: its verdict cache is shared
            if len(self._rulesets) >= 256:  # bounded, whatever ports a range admits
                self._rulesets.clear()
            self._rulesets[key] = self.policy.allowlist.rules_for(*key)
        rules = self._rulesets[key]
        if rules is None:
            return None
        return HttpGate(run_id=self.run_id, box=self.box, host=req.host.name, port=req.port,
                        rules=rules, signer=self.signer, board=self.board, clock=self.clock,
                        state=self._requests, connect_decision=decided.decision_id,
                        on_record_lost=self._lost)

    async def _dial(
        self, conn: Connection, req: ProxyRequest, addresses: list[IPAddress]
    ) -> tuple[ByteStream, IPAddress]:
        """Dial exactly a checked address (never the name), each in turn."""
        errors: list[str] = []
        for ip in addresses:
            try:
                stream = await conn.wait_for(self.dial(str(ip), req.port), self.dial_timeout)
                return stream, ip
            except TimeoutError:
                errors.append(f"{ip}: no answer within {self.dial_timeout:g} s")
            except (OSError, StreamClosed) as exc:
                errors.append(f"{ip}: {exc.__class__.__name__}")
        raise EgressRefused(
            502, f"could not connect to {req.host}:{req.port} ({'; '.join(errors)})", Stage.DIAL,
            recorded_elsewhere=True,
        )

    # --- refusals and records -----------------------------------------------------

    async def _refuse(
        self, stream: ByteStream, r: EgressRefused, req: ProxyRequest | None
    ) -> None:
        """Answer a refusal to the guest, recorded first unless the run already has it."""
        if not r.recorded_elsewhere:
            await self._record_refusal(r.stage, r.reason, req, r.status)
        with contextlib.suppress(StreamClosed, OSError):
            await stream.send_all(answer(r.status, r.reason))

    async def _record_refusal(
        self, stage: Stage, reason: str, req: ProxyRequest | None, status: int | None = None
    ) -> None:
        """One refusal: its own record while the interval allows, else counted in a summary.

        Every guest-derived string is an `excerpt`: bounded and escaped. A refusal
        answered in HTTP carries its `status`; one after a tunnel's `200` has none."""
        own, due = self._refusals.admit(
            self.clock.monotonic(), stage.value, req.host.name if req is not None else None
        )
        await self._record_summary(due)
        if not own:
            return
        body: dict[str, Any] = {"stage": stage.value, "reason": excerpt(reason)}
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

