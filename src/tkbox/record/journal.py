"""A box's live view: every crossing the daemon has had recorded, as it happens.

`JournalingSigner` wraps the daemon's signer client (any backend). After the
signer has acknowledged a call (a record is durable only then), it appends one
JSON line to the run's journal, `$TKBOX_HOME/journal/RUN.jsonl`, and wakes
whoever follows it (`tkbox logs BOX -f`). A refused or failed call appends
nothing: the journal shows what is in the record, never more.

The journal is a view, not the record: the bundle is what proves. It holds what
the daemon sent (which names secrets, never their values), with each string cut
to `MAX_FIELD` characters, and a run's journal stops at `MAX_JOURNAL` bytes
with a last line that says so.

Lines (`v` 1): `{"v", "time", "op", ...}` where `op` is `open` (facts), `decide`
(action, resource, allowed, reason, decision), `complete` (decision, outcome),
`event` (kind, body) or `close`.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from tkbox.record.client import JSON, Action, ForwardingSigner, SignerClient, Verdict

#: a run's journal stops growing here (the record itself is bounded by the signer)
MAX_JOURNAL = 16 << 20
#: the longest string kept in a journal line
MAX_FIELD = 512
#: containers deeper than this are cut
MAX_DEPTH = 6
POLL_S = 1.0  # a follower looks again at least this often (it is woken by each line)


def _bounded(v: Any, depth: int = 0) -> Any:
    if isinstance(v, str):
        return v if len(v) <= MAX_FIELD else v[:MAX_FIELD] + f"… ({len(v)} characters)"
    if depth >= MAX_DEPTH and isinstance(v, (dict, list)):
        return "…"
    if isinstance(v, dict):
        return {str(k)[:MAX_FIELD]: _bounded(x, depth + 1) for k, x in list(v.items())[:256]}
    if isinstance(v, (list, tuple)):
        return [_bounded(x, depth + 1) for x in list(v)[:256]]
    if v is None or isinstance(v, (bool, int, float)):
        return v
    return str(v)[:MAX_FIELD]


class Journals:
    """The journal files of one daemon, and who waits on them."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._wake: dict[str, asyncio.Event] = {}
        self._sizes: dict[str, int] = {}  # bytes in each run's journal; `room` once full

    def path(self, run_id: str) -> Path:
        return self.dir / f"{run_id}.jsonl"

    def append(self, run_id: str, entry: dict[str, Any]) -> None:
        # Called after every acknowledged record: each run's size is read from disk once,
        # then kept here, so the decision path costs one open and one write.
        size = self._sizes.get(run_id)
        p = self.path(run_id)
        if size is None:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            size = p.stat().st_size if p.exists() else 0
        room = MAX_JOURNAL - 256  # the last line, that says the journal is full, fits
        if size >= room:
            return
        entry = {"v": 1, "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")
                 .replace("+00:00", "Z"), **_bounded(entry)}
        line = json.dumps(entry, sort_keys=True, ensure_ascii=False).encode() + b"\n"
        full = size + len(line) > room
        if full:
            line = json.dumps({"v": 1, "op": "full", "time": entry["time"],
                               "limit": MAX_JOURNAL}).encode() + b"\n"
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        self._sizes[run_id] = room if full else size + len(line)
        self.wake(run_id)

    async def follow(self, run_id: str, *, follow: bool,
                     done: Callable[[], bool]) -> AsyncIterator[dict[str, Any]]:
        """Every line so far; then, if `follow`, each new one until `done()` holds."""
        offset = 0
        partial = b""
        while True:
            wake = self._wake.setdefault(run_id, asyncio.Event())
            p = self.path(run_id)
            if p.exists():
                with open(p, "rb") as f:
                    f.seek(offset)
                    data = f.read(1 << 20)
                    offset += len(data)
                *lines, partial = (partial + data).split(b"\n")
                for line in lines:
                    try:
                        yield json.loads(line)
                    except ValueError:
                        continue
                if len(data) == 1 << 20:
                    continue
            if not follow or done():
                return
            try:
                await asyncio.wait_for(wake.wait(), POLL_S)
            except TimeoutError:
                pass

    def wake(self, run_id: str) -> None:
        """Each follower of `run_id` looks again now (and asks its `done()`)."""
        ev = self._wake.pop(run_id, None)
        if ev is not None:
            ev.set()


class JournalingSigner(ForwardingSigner):
    """A signer client that journals what the signer acknowledged (see the module)."""

    def __init__(self, inner: SignerClient, journals: Journals) -> None:
        super().__init__(inner)
        self.journals = journals

    def _note(self, run_id: str, entry: dict[str, Any]) -> None:
        try:
            self.journals.append(run_id, entry)
        except OSError:
            pass  # the journal is a view; the record was kept, and that is what counts

    async def open_run(self, run_id: str, facts: JSON) -> None:
        await self.inner.open_run(run_id, facts)
        self._note(run_id, {"op": "open", "facts": facts})

    async def decide(self, run_id: str, action: Action, resource: JSON, context: JSON) -> Verdict:
        v = await self.inner.decide(run_id, action, resource, context)
        self._note(run_id, {"op": "decide", "action": action, "resource": resource,
                            "allowed": v.allowed, "reason": v.reason,
                            "decision": v.decision_id})
        return v

    async def complete(self, run_id: str, decision_id: str, outcome: JSON) -> None:
        await self.inner.complete(run_id, decision_id, outcome)
        self._note(run_id, {"op": "complete", "decision": decision_id, "outcome": outcome})

    async def event(self, run_id: str, kind: str, body: JSON) -> None:
        await self.inner.event(run_id, kind, body)
        self._note(run_id, {"op": "event", "kind": kind, "body": body})

    async def close_run(self, run_id: str) -> None:
        await self.inner.close_run(run_id)
        self._note(run_id, {"op": "close"})
