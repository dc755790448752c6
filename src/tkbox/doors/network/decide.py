"""Deciding one connection: parse, normalise, bound, then ask the signer.

In order, each step refusing with an `EgressRefused` that names its `Stage`
and the HTTP status the guest gets:

1. `read_request`: the request head, bounded (`request.RequestHeadParser`),
   within `head_timeout` s (`Stage.REQUEST`, 400/408/414/431/...);
2. `check_secrets`: a secret's value or placeholder in the head is a leak,
   already recorded by the secrets door (`Stage.SECRET`, 403);
3. `Decider.decide`:
   - the allowlist (`policy.EgressPolicy`; `Stage.POLICY`, 403), or a
     person's answer through the shared `ApprovalBoard` (`Stage.APPROVAL`,
     403/429/503);
   - the addresses: literal, operator-mapped, or resolved once on the host
     (`Stage.RESOLVE`, 502), each checked (`Stage.ADDRESS`, 403);
   - a `Connect` decision from the signer, naming the host, port, addresses
     and the rule; no answer is a refusal (`Stage.SIGNER`, 503), and so is
     the signer's "no" (403), which its own decision record already holds.

Waits (the head, a person, the resolver) run through `Connection.wait_for`,
so the box's stop ends them at once (`ConnectionEnded`). Nothing here dials.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tkbox.doors.network.addresses import IPAddress
from tkbox.doors.network.approvals import ApprovalBoard
from tkbox.doors.network.connection import BOX_STOPPED, Connection
from tkbox.doors.network.errors import ConnectionEnded, EgressRefused, Stage
from tkbox.doors.network.hostpolicy import EgressPolicy, Explanation
from tkbox.doors.network.names import HostNameError, parse_host
from tkbox.doors.network.request import BadRequest, ProxyRequest, RequestHeadParser
from tkbox.doors.network.resolver import ResolveError, Resolver
from tkbox.doors.network.tunnel import Interceptor
from tkbox.errors import Refused, SignerUnavailable, UserError
from tkbox.protocol.streams import ByteStream
from tkbox.record.client import SignerClient

#: characters of a plain-http path a `Connect` decision keeps
MAX_RECORDED_PATH = 512


async def read_request(
    stream: ByteStream, conn: Connection, chunk: int, head_timeout: float
) -> tuple[ProxyRequest, RequestHeadParser]:
    """The guest's request head, parsed; the parser keeps what followed it."""
    parser = RequestHeadParser()

    async def read() -> ProxyRequest:
        while True:
            data = await stream.receive(chunk)
            if not data:
                raise BadRequest(
                    400, "refused: the connection ended before a complete request head"
                )
            req = parser.feed(data)
            if req is not None:
                return req

    try:
        return await conn.wait_for(read(), head_timeout), parser
    except TimeoutError:
        raise EgressRefused(
            408, f"refused: no complete request head within {head_timeout:g} s", Stage.REQUEST
        ) from None
    except BadRequest as exc:
        raise EgressRefused(exc.status, exc.message, Stage.REQUEST) from None


async def check_secrets(interceptor: Interceptor | None, req: ProxyRequest) -> None:
    """Refuse a request whose head (its target host; for plain http also its path and
    headers) holds a secret's value or placeholder. The secrets door records the leak,
    without the host, which may hold the value: nothing here records it."""
    if interceptor is None:
        return
    why = await interceptor.check_plain(req.host.name, req.port, req.method, req.path,
                                        list(req.headers))
    if why:
        raise EgressRefused(403, why, Stage.SECRET, recorded_elsewhere=True)


@dataclass(frozen=True)
class Decided:
    """A connection the signer allowed: what to dial, and the decision to complete."""

    explanation: Explanation
    addresses: list[IPAddress]
    decision_id: str


class Decider:
    """One box's decisions. See the module docstring."""

    def __init__(
        self,
        run_id: str,
        box: str,
        signer: SignerClient,
        policy: EgressPolicy,
        resolver: Resolver,
        board: ApprovalBoard,
    ) -> None:
        self.run_id = run_id
        self.box = box
        self.signer = signer
        self.policy = policy
        self.resolver = resolver
        self.board = board

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

    async def decide(self, conn: Connection, req: ProxyRequest) -> Decided:
        """Policy, approval, addresses, then the signer: a `Decided`, or `EgressRefused`."""
        ex = await self._admit(conn, req)
        decision_id = await self._ask_signer(req, ex)
        return Decided(ex, ex.allowed_addresses, decision_id)

    async def _admit(self, conn: Connection, req: ProxyRequest) -> Explanation:
        host, port = req.host, req.port
        ex = self.policy.explain(host, port)
        if ex.verdict == "refuse":
            raise EgressRefused(403, ex.reason, Stage.POLICY)
        if ex.verdict == "ask":
            await self._approve(conn, req)
            ex = self.policy.explain(host, port)
        if ex.source == "not resolved":
            try:
                resolved = await conn.wait_for(self.resolver.resolve(host.name, port))
            except ResolveError as exc:
                raise EgressRefused(502, f"refused: {exc.message}", Stage.RESOLVE) from None
            ex = self.policy.explain(host, port, resolved)
        if ex.verdict != "allow":
            raise EgressRefused(403, ex.reason, Stage.ADDRESS)
        return ex

    async def _approve(self, conn: Connection, req: ProxyRequest) -> None:
        """Wait for a person's answer; remember it for the box's life, or refuse."""
        host, port = req.host, req.port
        try:
            ans = await conn.wait_for(
                self.board.wait_for_answer(self.box, self.run_id, host.name, port)
            )
        except Refused as exc:
            raise EgressRefused(429, exc.reason, Stage.APPROVAL) from None
        except SignerUnavailable:
            raise EgressRefused(
                503,
                "refused: the signer did not answer, so no approval can be recorded",
                Stage.APPROVAL,
            ) from None
        key = (host.name, port)
        if ans.outcome == "approved":
            self.policy.approved[key] = (ans.id, ans.by)
        elif ans.outcome == "denied":
            self.policy.denied[key] = (ans.id, ans.by)
            raise EgressRefused(
                403,
                f"refused: {host}:{port} was denied by {ans.by} (approval {ans.id})",
                Stage.APPROVAL,
            )
        elif ans.outcome == "expired":
            raise EgressRefused(
                403,
                f"refused: {host}:{port} is not allowed and nobody answered approval {ans.id} "
                f"within {self.board.wait_seconds:g} s; ask for --allow {host}:{port}",
                Stage.APPROVAL,
            )
        else:  # stopped: the box is stopping
            raise ConnectionEnded(BOX_STOPPED)

    async def _ask_signer(self, req: ProxyRequest, ex: Explanation) -> str:
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
            "addresses": [str(a) for a in ex.allowed_addresses],
        }
        try:
            verdict = await self.signer.decide(self.run_id, "Connect", resource, context)
        except SignerUnavailable:
            raise EgressRefused(
                503,
                "refused: the signer did not answer; nothing crosses without a record",
                Stage.SIGNER,
            ) from None
        if not verdict.allowed:
            raise EgressRefused(
                403, f"refused by policy: {verdict.reason}", Stage.SIGNER, recorded_elsewhere=True
            )
        return verdict.decision_id
