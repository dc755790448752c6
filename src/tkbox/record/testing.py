"""`FakeSigner`: an in-memory `SignerClient` for tests of the layers above the signer.

Test code only: no production module imports this one (the import-graph test
holds `tkbox.record.testing` to that, as it does every `testing` module). It
keeps every record in memory, unbounded, which is what a test wants to read
back and what a running daemon must never do; `--unrecorded` runs on
`tkbox.record.unrecorded.UnrecordedSigner`, which keeps nothing.

It passes the signer conformance suite
(`tests/integration/signer/test_signer_conformance.py`) with the real signer.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from tkbox.errors import SignerRefused, SignerUnavailable
from tkbox.record.client import JSON, Action, Export, Push, SignerClient, Verdict, unrecordable

Policy = Callable[[str, Action, JSON, JSON], tuple[bool, str]]


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
        why = unrecordable(dict(body))
        if why:
            raise SignerUnavailable(f"{kind} cannot be recorded: {why} (records hold JSON "
                                    "objects, strings, booleans and integers only)")
        if run_id not in self._open:
            raise SignerRefused(f"the signer refused: run {run_id} is not open at the signer")
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
