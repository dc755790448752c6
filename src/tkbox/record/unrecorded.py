"""`UnrecordedSigner`: UNSAFE. What `tkbox daemon --unrecorded` runs on.

No signer process, no policy pack, no log: every decision is allowed and no
record is kept anywhere, so a box run this way leaves no evidence of what it
did. It exists only to debug tkbox itself (a machine without a signer, a
signer bug being chased). Like sigstore's `UnsafeNoOp`, it is named for what
it is, and it says so every time it is used: the daemon prints a warning at
start, every box it starts says `[UNRECORDED]` in its name and
`-unrecorded` in its hostname, and every verdict's reason reads
"allowed: --unrecorded ...". A run cannot be exported (there is nothing to
export).

What it still does:

- the daemon's own rules are untouched: the network door's allowlist,
  address checks, ClientHello checks and approvals, the secrets door, the
  command environment rules, all run before a decision reaches this class.
  It only stands where the signer's policy and log would stand;
- it answers for runs it never saw opened: an unrecorded daemon opens no
  run, and a door asking about one must be let through, not contained;
- a run that was closed stays closed: nothing is decided or added after its
  close (refused with `SignerRefused`), and a run id is opened once, as the
  real signer does, so code that breaks those rules fails here too;
- its memory is bounded: it remembers only which run ids it saw and whether
  each is closed, at most `MAX_RUNS` of them, forgetting the oldest first.
  A forgotten closed run is treated as one never seen (allowed): under
  `--unrecorded` nothing was going to be kept anyway.

It runs through the signer conformance suite
(`tests/integration/signer/test_signer_conformance.py`), which names each
property a signer that keeps nothing cannot have, and why.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator

from tkbox.errors import InternalError, SignerRefused, UserError
from tkbox.record.client import JSON, Action, Export, Push, SignerClient, Verdict

MAX_RUNS = 4096
REASON = "allowed: --unrecorded (no signer decides or records)"
DECISION_ID = "unrecorded"


class UnrecordedSigner(SignerClient):
    """UNSAFE: allows what the daemon's own rules allow, and keeps nothing."""

    def __init__(self, *, max_runs: int = MAX_RUNS) -> None:
        if max_runs < 1:
            raise InternalError("an UnrecordedSigner must remember at least one run")
        self._max = max_runs
        self._runs: OrderedDict[str, bool] = OrderedDict()  # run id -> closed

    def _remember(self, run_id: str, closed: bool) -> None:
        self._runs[run_id] = closed
        self._runs.move_to_end(run_id)
        while len(self._runs) > self._max:
            self._runs.popitem(last=False)

    def _refuse_if_closed(self, run_id: str, what: str) -> None:
        if self._runs.get(run_id):
            raise SignerRefused(f"the signer refused: run {run_id} is closed; {what} comes "
                                "after its close (--unrecorded keeps nothing, but a closed "
                                "run stays closed)")

    async def ping(self) -> JSON:
        return {"key": "unrecorded", "isolation": "none", "unrecorded": True}

    async def open_run(self, run_id: str, facts: JSON) -> None:
        if run_id in self._runs:
            raise SignerRefused(f"the signer refused: run {run_id} exists already")
        self._remember(run_id, closed=False)

    async def decide(self, run_id: str, action: Action, resource: JSON, context: JSON) -> Verdict:
        self._refuse_if_closed(run_id, f"a {action} decision")
        return Verdict(True, REASON, DECISION_ID)

    async def complete(self, run_id: str, decision_id: str, outcome: JSON) -> None:
        self._refuse_if_closed(run_id, "a completion")

    async def event(self, run_id: str, kind: str, body: JSON) -> None:
        self._refuse_if_closed(run_id, f"the event {kind[:64]}")

    async def close_run(self, run_id: str) -> None:
        self._remember(run_id, closed=True)

    async def export(self, run_id: str) -> Export:
        raise UserError("nothing was recorded under --unrecorded, so there is nothing to export")

    async def pushes(self) -> AsyncIterator[Push]:
        # No signer, no operator: nothing is ever held, released or quarantined.
        await asyncio.Event().wait()
        yield Push("hold", "")  # pragma: no cover - unreachable
