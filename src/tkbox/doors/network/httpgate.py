"""Each HTTP request on a ruled host: the rules, a person, the signer, the records.

A host and port that an allowlist entry gives method and path rules is
*ruled* (`allowlist.Allowlist.rules_for`). The secrets door reads every
request on its tunnels (and the network door the one request of a plain
`http://` connection) and asks this gate before anything of the request
reaches the origin:

1. the rules (`httprules.RuleSet.decide_raw`, pure): `refuse` (an ambiguous
   request too) is a `403` naming the rule it matched or missed, and a
   `tkbox.http.refused` record (host, port, method, path, rule, reason);
2. `ask`: the request waits for a person through the box's
   `ApprovalBoard` (method and path shown, bounded; the same limits as
   hosts: 16 pending, 30 a minute); the answer holds for that method and
   target for the rest of the box's life;
3. an `Http` decision from the signer (resource: host, port, method, path;
   context: the rule, the tunnel's `Connect` decision): the operator's Cedar
   policy may refuse any request (`403`, the reason in its decision record);
   no answer is a refusal (`503`);
4. once the exchange ends, `tkbox.http.request` (method, path, status,
   bytes each way, the decision, `ended` when it did not complete).

Every guest-derived string in a record is an `excerpt`; refusal records past
the first 32 a minute are counted in one `tkbox.http.refused.summary`. The
gate never raises anything but `HttpRefused` and cancellation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tkbox._clock import Clock
from tkbox.doors.network.approvals import ApprovalBoard
from tkbox.doors.network.connection import BOX_STOPPED
from tkbox.doors.network.errors import ConnectionEnded
from tkbox.doors.network.httprules import RuleSet, show
from tkbox.doors.network.records import RefusalLog, excerpt
from tkbox.errors import Refused, SignerUnavailable, TkboxError
from tkbox.record.client import SignerClient

log = logging.getLogger(__name__)

#: characters of a request's path a record keeps
MAX_RECORDED_PATH = 512


class HttpRefused(Refused):
    """One request on a ruled host refused: `status` is the guest's answer. `recorded`
    is False only when its record could not be kept (the box is then stopped)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Admitted:
    """A request the gate let through: what its `tkbox.http.request` names."""

    method: str
    path: str
    rule: str | None
    decision: str


@dataclass
class BoxRequests:
    """One box's state shared by its gates: answers a person gave to `ask`
    requests, and the refusal log (bounded records)."""

    answers: dict[tuple[str, int, str, bytes], bool] = field(default_factory=dict)
    refusals: RefusalLog = field(default_factory=RefusalLog)


class HttpGate:
    """The gate of one ruled host and port on one connection. See the module docstring."""

    def __init__(self, *, run_id: str, box: str, host: str, port: int, rules: RuleSet,
                 signer: SignerClient, board: ApprovalBoard, clock: Clock,
                 state: BoxRequests, connect_decision: str | None = None,
                 on_record_lost: Callable[[TkboxError], None] | None = None) -> None:
        self.run_id, self.box, self.host, self.port = run_id, box, host, port
        self.rules = rules
        self.signer = signer
        self.board = board
        self.clock = clock
        self.state = state
        self.connect_decision = connect_decision
        self.on_record_lost = on_record_lost

    async def check(self, method: bytes, target: bytes,
                    headers: Iterable[tuple[bytes, bytes]], version: str = "1.1") -> Admitted:
        """Let one request through, or raise `HttpRefused`."""
        verdict = self.rules.decide_raw(method, target, headers)
        shown_method = excerpt(method.decode("ascii", "replace"), 32)
        path = show(target, MAX_RECORDED_PATH)
        if verdict.action == "refuse":
            await self._refused(shown_method, path, verdict.rule, verdict.reason)
            raise HttpRefused(403, verdict.reason)
        if verdict.action == "ask":
            await self._ask(method, target, shown_method, path, verdict.rule)
        resource = {"host": self.host, "port": self.port, "method": shown_method,
                    "path": excerpt(path, MAX_RECORDED_PATH + 3)}
        context: dict[str, Any] = {"rule": verdict.rule, "http_version": version}
        if self.connect_decision is not None:
            context["connect_decision"] = self.connect_decision
        try:
            v = await self.signer.decide(self.run_id, "Http", resource, context)
        except SignerUnavailable:
            raise HttpRefused(503, "refused: the signer did not answer; no request on a "
                                   "ruled host crosses without a record") from None
        if not v.allowed:
            raise HttpRefused(403, f"refused by policy: {v.reason}")
        return Admitted(shown_method, path, verdict.rule, v.decision_id)

    async def _ask(self, method: bytes, target: bytes, shown_method: str, path: str,
                   rule: str | None) -> None:
        key = (self.host, self.port, method.decode("ascii", "replace"), target)
        known = self.state.answers.get(key)
        if known is True:
            return
        what = f"{shown_method} {excerpt(path)} on {self.rules.host}"
        if known is False:
            reason = f"refused: {what} was denied earlier (rule '{rule}')"
            await self._refused(shown_method, path, rule, reason)
            raise HttpRefused(403, reason)
        try:
            ans = await self.board.wait_for_answer(self.box, self.run_id, self.host, self.port,
                                                   (shown_method, path))
        except Refused as exc:
            await self._refused(shown_method, path, rule, exc.reason)
            raise HttpRefused(429, exc.reason) from None
        except SignerUnavailable:
            raise HttpRefused(503, "refused: the signer did not answer, so no approval can "
                                   "be recorded") from None
        if ans.outcome == "approved":
            self.state.answers[key] = True
            return
        if ans.outcome == "denied":
            self.state.answers[key] = False
            raise HttpRefused(403, f"refused: {what} was denied by {ans.by} (approval "
                                   f"{ans.id}, rule '{rule}')")
        if ans.outcome == "expired":
            raise HttpRefused(403, f"refused: {what} waits for a person (rule '{rule}') and "
                                   f"nobody answered approval {ans.id} within "
                                   f"{self.board.wait_seconds:g} s")
        raise ConnectionEnded(BOX_STOPPED)

    async def done(self, admitted: Admitted, status: int | None, up: int, down: int,
                   ended: str | None = None) -> None:
        """The `tkbox.http.request` record of an admitted request, once it ended."""
        body: dict[str, Any] = {
            "host": self.host, "port": self.port, "method": admitted.method,
            "path": excerpt(admitted.path, MAX_RECORDED_PATH + 3), "status": status,
            "bytes_up": up, "bytes_down": down, "rule": admitted.rule,
            "decision": admitted.decision}
        if ended is not None:
            body["ended"] = ended
        await self._event("tkbox.http.request", body)

    async def _refused(self, method: str, path: str, rule: str | None, reason: str) -> None:
        own, due = self.state.refusals.admit(self.clock.monotonic(), "rules", self.host)
        if due is not None:
            await self._event("tkbox.http.refused.summary", due)
        if own:
            await self._event("tkbox.http.refused", {
                "host": self.host, "port": self.port, "method": method,
                "path": excerpt(path, MAX_RECORDED_PATH + 3), "rule": rule,
                "reason": excerpt(reason, 600)})

    async def _event(self, kind: str, body: dict[str, Any]) -> None:
        try:
            await self.signer.event(self.run_id, kind, body)
        except SignerUnavailable as exc:
            log.error("the HTTP gate of %s could not record %s: %s", self.box, kind, exc)
            if self.on_record_lost is not None:
                self.on_record_lost(exc)
