"""The daemon's side of the signer: the client interface.

Every door asks the signer through this interface and nothing else. The
implementations, each run through the same conformance suite
(`tests/integration/signer/test_signer_conformance.py`):

- `tkbox.record.unix.UnixSignerClient` speaks to `tkbox signer serve` over
  its Unix socket (the real one);
- `tkbox.record.tracekit.TracekitSignerClient`, a Tracekit signer behind it;
- `tkbox.record.unrecorded.UnrecordedSigner`, `--unrecorded`: unsafe, allows
  and keeps nothing, for debugging tkbox itself;
- `tkbox.record.testing.FakeSigner` keeps records in memory for tests of the
  layers above (doors, daemon). Production code never imports it.

Fail closed: any method may raise `SignerUnavailable`. A caller that gets it
from `decide` treats it as a refusal; from `event` or `complete` it stops the
box and the loss is recorded later as `tkbox.gap`.

Actions decided: "Bash" (a command), "Connect" (an egress connection),
"Write" (one file of an applied patch), "Approval" (a person's answer), "Http"
(one request on a host with method and path rules).
Records name secrets, never their values: callers must never put a secret
value into `facts`, `resource`, `context`, `outcome` or `body`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tkbox.errors import Refused

Action = Literal["Bash", "Connect", "Write", "Approval", "Http"]
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


class ForwardingSigner(SignerClient):
    """A signer client in front of another (`inner`) that passes every call on: the
    base of the wrappers that add one thing (a record budget, a journal) and
    override only the calls that thing concerns."""

    def __init__(self, inner: SignerClient) -> None:
        self.inner = inner

    async def ping(self) -> JSON:
        return await self.inner.ping()

    async def open_run(self, run_id: str, facts: JSON) -> None:
        await self.inner.open_run(run_id, facts)

    async def decide(self, run_id: str, action: Action, resource: JSON, context: JSON) -> Verdict:
        return await self.inner.decide(run_id, action, resource, context)

    async def complete(self, run_id: str, decision_id: str, outcome: JSON) -> None:
        await self.inner.complete(run_id, decision_id, outcome)

    async def event(self, run_id: str, kind: str, body: JSON) -> None:
        await self.inner.event(run_id, kind, body)

    async def close_run(self, run_id: str) -> None:
        await self.inner.close_run(run_id)

    async def export(self, run_id: str) -> Export:
        return await self.inner.export(run_id)

    def pushes(self) -> AsyncIterator[Push]:
        return self.inner.pushes()

    async def aclose(self) -> None:
        await self.inner.aclose()



def unrecordable(value: Any, path: str = "body") -> str | None:
    """Why `value` cannot be a record field, or None."""
    if value is None or isinstance(value, (bool, str)):
        return None
    if isinstance(value, int):
        return None if -(2**53) < value < 2**53 else f"{path} is an integer beyond 2^53"
    if isinstance(value, float):
        return f"{path} is a float"
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            why = unrecordable(v, f"{path}[{i}]")
            if why:
                return why
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{path} has a non-string key"
            why = unrecordable(v, f"{path}.{k}")
            if why:
                return why
        return None
    return f"{path} is a {type(value).__name__}"
