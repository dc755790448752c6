"""The daemon's side of the signer: the client interface, and its fake.

Every door asks the signer through this interface and nothing else. The real
client (`tkbox.record.unix`) speaks to `tkbox signer serve` over its Unix
socket; `FakeSigner` keeps records in memory for tests of the layers above
(doors, daemon) and must pass the same conformance tests as the real one.

Fail closed: any method may raise `SignerUnavailable`. A caller that gets it
from `decide` treats it as a refusal; from `event` or `complete` it stops the
box and the loss is recorded later as `tkbox.gap`.

Actions decided: "Bash" (a command), "Connect" (an egress connection),
"Write" (one file of an applied patch), "Approval" (a person's answer).
Records name secrets, never their values: callers must never put a secret
value into `facts`, `resource`, `context`, `outcome` or `body`.
"""

from __future__ import annotations

import asyncio
import itertools
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tkbox.errors import Refused, SignerUnavailable

Action = Literal["Bash", "Connect", "Write", "Approval"]
JSON = Mapping[str, Any]


@dataclass(frozen=True)
class Verdict:
    """The signer's answer to a decision, already durable in the log."""

    allowed: bool
    reason: str  # one line for a person; also in the record
    decision_id: str  # pass to `complete`

    def raise_if_refused(self) -> None:
        if not self.allowed:
            raise Refused(self.reason)


@dataclass(frozen=True)
class Push:
    """Something the signer tells the daemon without being asked."""

    kind: Literal["hold", "release", "quarantine"]
    run_id: str
    reason: str = ""


@dataclass(frozen=True)
class Export:
    bundle: bytes  # the `.tkb` file
    trust: bytes  # the `.trust.json` file


class SignerClient(ABC):
    """What the daemon may ask of the signer. Every call is durable on return."""

    @abstractmethod
    async def ping(self) -> JSON:
        """Who the signer is (key name, isolation). Raises SignerUnavailable."""

    @abstractmethod
    async def open_run(self, run_id: str, facts: JSON) -> None:
        """Open a run: image digest, allowlist, limits, env names (once)."""

    @abstractmethod
    async def decide(self, run_id: str, action: Action, resource: JSON, context: JSON) -> Verdict:
        """Ask for a decision; the request and the answer are recorded."""

    @abstractmethod
    async def complete(self, run_id: str, decision_id: str, outcome: JSON) -> None:
        """Record what happened after an allowed decision (exit status, bytes)."""

    @abstractmethod
    async def event(self, run_id: str, kind: str, body: JSON) -> None:
        """Record an event: tkbox.secret.use, tkbox.gap, tkbox.containment, ..."""

    @abstractmethod
    async def close_run(self, run_id: str) -> None:
        """Close the run; no record may be added to it afterwards."""

    @abstractmethod
    async def export(self, run_id: str) -> Export:
        """The bundle and trust file of a closed run."""

    @abstractmethod
    def pushes(self) -> AsyncIterator[Push]:
        """Holds, releases and quarantines as the signer sends them."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release the connection."""


Policy = Callable[[str, Action, JSON, JSON], tuple[bool, str]]


def _unrecordable(value: Any, path: str = "body") -> str | None:
    """Why `value` cannot be a record field, or None."""
    if value is None or isinstance(value, (bool, str)):
        return None
    if isinstance(value, int):
        return None if -(2**53) < value < 2**53 else f"{path} is an integer beyond 2^53"
    if isinstance(value, float):
        return f"{path} is a float"
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            why = _unrecordable(v, f"{path}[{i}]")
            if why:
                return why
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{path} has a non-string key"
            why = _unrecordable(v, f"{path}.{k}")
            if why:
                return why
        return None
    return f"{path} is a {type(value).__name__}"


def allow_all(run_id: str, action: Action, resource: JSON, context: JSON) -> tuple[bool, str]:
    return True, "allowed by the fake signer"


@dataclass
class FakeSigner(SignerClient):
    """An in-memory signer for tests above the signer boundary.

    `policy` decides; `records` keeps every record as a dict in order;
    `available = False` makes every call raise SignerUnavailable, as a dead
    signer would. `push()` simulates a hold, release or quarantine.
    """

    policy: Policy = allow_all
    available: bool = True
    records: list[dict[str, Any]] = field(default_factory=list)
    _open: set[str] = field(default_factory=set)
    _closed: set[str] = field(default_factory=set)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _queue: asyncio.Queue[Push] | None = None

    def _check(self) -> None:
        if not self.available:
            raise SignerUnavailable("the signer did not answer (fake signer set unavailable)")

    def _append(self, run_id: str, kind: str, body: JSON) -> str:
        # As the real client does: records hold JSON objects, strings, booleans
        # and integers only, so a float (or anything else) is refused here too.
        why = _unrecordable(dict(body))
        if why:
            raise SignerUnavailable(f"{kind} cannot be recorded: {why} (records hold JSON "
                                    "objects, strings, booleans and integers only)")
        if run_id not in self._open:
            raise SignerUnavailable(f"run {run_id} is not open at the signer")
        rid = f"{run_id}/{next(self._ids)}"
        self.records.append({"id": rid, "run": run_id, "kind": kind, **dict(body)})
        return rid

    def of_run(self, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.records
                if r["run"] == run_id and (kind is None or r["kind"] == kind)]

    async def ping(self) -> JSON:
        self._check()
        return {"key": "fake", "isolation": "same-user"}

    async def open_run(self, run_id: str, facts: JSON) -> None:
        self._check()
        if run_id in self._open or run_id in self._closed:
            raise SignerUnavailable(f"run {run_id} exists already")
        self._open.add(run_id)
        self._append(run_id, "tkbox.run.open", {"facts": dict(facts)})

    async def decide(self, run_id: str, action: Action, resource: JSON, context: JSON) -> Verdict:
        self._check()
        allowed, reason = self.policy(run_id, action, resource, context)
        rid = self._append(
            run_id,
            "tkbox.decision",
            {"action": action, "resource": dict(resource), "context": dict(context),
             "allowed": allowed, "reason": reason},
        )
        return Verdict(allowed, reason, rid)

    async def complete(self, run_id: str, decision_id: str, outcome: JSON) -> None:
        self._check()
        self._append(run_id, "tkbox.complete", {"decision": decision_id, "outcome": dict(outcome)})

    async def event(self, run_id: str, kind: str, body: JSON) -> None:
        self._check()
        self._append(run_id, kind, {"body": dict(body)})

    async def close_run(self, run_id: str) -> None:
        self._check()
        self._append(run_id, "tkbox.run.close", {})
        self._open.discard(run_id)
        self._closed.add(run_id)

    async def export(self, run_id: str) -> Export:
        self._check()
        import json

        return Export(json.dumps(self.of_run(run_id)).encode(), b"{}")

    def push(self, p: Push) -> None:
        if self._queue is None:
            self._queue = asyncio.Queue()
        self._queue.put_nowait(p)

    async def pushes(self) -> AsyncIterator[Push]:
        if self._queue is None:
            self._queue = asyncio.Queue()
        while True:
            yield await self._queue.get()
