"""A per-run record budget, so that every run can always be exported and verified.

A bundle holds at most `formats.bundle.MAX_BUNDLE` bytes and `MAX_RECORDS`
records. A guest that can make records (connections, refusals) could push
its own run past that and so hide it: a run that cannot be exported cannot
be read. `BudgetedSigner` wraps the daemon's `SignerClient` and counts, per
run, the records asked for and an estimate of what each adds to the bundle:

    bundle bytes ≈ 4/3 × (canonical JSON of the body + ENVELOPE)   (base64 `extra` line)
                 + PROOF                                          (index and audit path)

When a run passes `max_records` or `max_bytes`, the call that crossed is
refused (`RecordBudgetExhausted`, a `SignerUnavailable`: fail closed, so the
crossing it was for does not happen) and `on_exhausted(run_id, why)` is told
once: the daemon stops that box and records why. From then on, crossings the
guest starts (`Connect` and `Http` decisions, `tkbox.egress.*` and
`tkbox.http.*` events) are refused at
once; the host's own records (containment, gaps, stop, `apply`'s `Write`
decisions, the close) still pass, within a `reserve`. Budget plus reserve
stays well under the bundle's limits, so export always works.

Counts live in the daemon's memory: a run's guest never outlives a daemon
restart (its box is failed at start-up), so nothing guest-driven is missed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tkbox.errors import SignerUnavailable
from tkbox.record.client import JSON, Action, ForwardingSigner, SignerClient, Verdict

#: records a run may hold before its box is stopped
RUN_RECORDS = 60_000
#: estimated bundle bytes a run may reach before its box is stopped
RUN_BYTES = 112 << 20
#: what the host may still record after that (containment, stop, apply, gaps)
RESERVE_RECORDS = 5_000
RESERVE_BYTES = 16 << 20
#: bytes of each record's envelope (id, run, sequence, previous hash, kind, time)
ENVELOPE = 320
#: bytes of each record's index and audit path in a bundle (log of up to 2^30 leaves)
PROOF = 30 * 45 + 32


class RecordBudgetExhausted(SignerUnavailable):
    """The run has used its record budget: nothing the guest starts is recorded."""


def estimate(payload: Any) -> int:
    """Bundle bytes a record with this payload adds (see the module docstring)."""
    body = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False,
                          default=str).encode())
    return (body + ENVELOPE) * 4 // 3 + PROOF


@dataclass
class _Count:
    records: int = 0
    bytes: int = 0
    exhausted: str | None = None


def _guest_driven(action: str | None, kind: str | None) -> bool:
    return action in ("Connect", "Http") or (kind is not None and kind.startswith(
        ("tkbox.egress", "tkbox.http")))


class BudgetedSigner(ForwardingSigner):
    """A `SignerClient` that keeps each run within its record budget."""

    def __init__(self, inner: SignerClient, *, max_records: int = RUN_RECORDS,
                 max_bytes: int = RUN_BYTES, reserve_records: int = RESERVE_RECORDS,
                 reserve_bytes: int = RESERVE_BYTES,
                 on_exhausted: Callable[[str, str], None] | None = None) -> None:
        super().__init__(inner)
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.reserve_records = reserve_records
        self.reserve_bytes = reserve_bytes
        self.on_exhausted = on_exhausted
        self._runs: dict[str, _Count] = {}

    def usage(self, run_id: str) -> tuple[int, int]:
        c = self._runs.get(run_id, _Count())
        return c.records, c.bytes

    def _charge(self, run_id: str, payload: Any, *, action: str | None = None,
                kind: str | None = None) -> None:
        c = self._runs.setdefault(run_id, _Count())
        size = estimate(payload)
        if c.exhausted is not None:
            if _guest_driven(action, kind):
                raise RecordBudgetExhausted(c.exhausted)
            if (c.records + 1 > self.max_records + self.reserve_records
                    or c.bytes + size > self.max_bytes + self.reserve_bytes):
                raise RecordBudgetExhausted(
                    f"{c.exhausted}; its reserve for the host's own records is used up too")
        elif c.records + 1 > self.max_records or c.bytes + size > self.max_bytes:
            c.exhausted = (f"run {run_id} reached its record budget ({c.records} records, "
                           f"~{c.bytes >> 20} MiB of bundle; at most {self.max_records} "
                           f"records and {self.max_bytes >> 20} MiB), so the box was stopped "
                           "and the run can still be exported")
            if self.on_exhausted is not None:
                self.on_exhausted(run_id, c.exhausted)
            raise RecordBudgetExhausted(c.exhausted)
        c.records += 1
        c.bytes += size

    # --- SignerClient -------------------------------------------------------------

    async def open_run(self, run_id: str, facts: JSON) -> None:
        self._charge(run_id, facts)
        await self.inner.open_run(run_id, facts)

    async def decide(self, run_id: str, action: Action, resource: JSON, context: JSON) -> Verdict:
        self._charge(run_id, [resource, context], action=action)
        return await self.inner.decide(run_id, action, resource, context)

    async def complete(self, run_id: str, decision_id: str, outcome: JSON) -> None:
        self._charge(run_id, outcome)
        await self.inner.complete(run_id, decision_id, outcome)

    async def event(self, run_id: str, kind: str, body: JSON) -> None:
        self._charge(run_id, body, kind=kind)
        await self.inner.event(run_id, kind, body)

    async def close_run(self, run_id: str) -> None:
        await self.inner.close_run(run_id)  # the close is never refused: export must work
