"""The signer's log: one append-only Merkle log, kept in a store (`signer.store`:
SQLite by default, PostgreSQL for a signer many hosts share).

Storage (the same three tables in both):

    leaves(idx INTEGER PRIMARY KEY, run, seq, kind, record BLOB, hash BLOB, UNIQUE(run, seq))
    witnesses(name PRIMARY KEY, size)          -- the size each witness last cosigned
    checkpoints(size PRIMARY KEY, note BLOB)   -- the last cosigned checkpoints

`leaves` is the only truth: on start every record is re-read, its hash
checked, its run's chain re-walked and the Merkle tree rebuilt, so a crash
at any point leaves either a whole transaction or none of it.

Appends are staged in memory in order (the run's next `seq` and `prev` are
assigned at once, so concurrent requests cannot interleave a chain), then
written by one writer thread in group commits: every staged record not yet
written goes into one transaction, which is one fsync of the WAL. The batch
is handed over at the end of the loop's turn, not at the first record, so
the requests read together (32 in flight arrive in one read) share one
commit, and the records staged while a commit is in flight share the next.
A record is acknowledged (its future resolves) only after its transaction
committed. If a write fails the signer stops: it cannot keep what it would
acknowledge.

A run's states, and what moves it:

| state       | hold        | release | quarantine  | close  | decisions |
| ----------- | ----------- | ------- | ----------- | ------ | --------- |
| open        | held        | -       | quarantined | closed | decided   |
| held        | -           | open    | quarantined | closed | refused   |
| quarantined | -           | -       | -           | closed | refused   |
| closed      | -           | -       | -           | -      | -         |

Events and completions are recorded in every state but closed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tkbox.errors import InternalError
from tkbox.formats import merkle, record
from tkbox.formats.errors import FormatError
from tkbox.signer.store import SQLiteStore, Store

log = logging.getLogger("tkbox.signer.log")

HOLD, RELEASE, QUARANTINE = "tkbox.hold", "tkbox.release", "tkbox.quarantine"

#: (state, event) -> new state; anything missing is refused.
TRANSITIONS: dict[tuple[str, str], str] = {
    ("open", HOLD): "held",
    ("held", RELEASE): "open",
    ("open", QUARANTINE): "quarantined",
    ("held", QUARANTINE): "quarantined",
    ("open", record.CLOSE): "closed",
    ("held", record.CLOSE): "closed",
    ("quarantined", record.CLOSE): "closed",
}
STATES = ("open", "held", "quarantined", "closed")

class LogError(Exception):
    """A request the log refuses (unknown run, closed run, ...): one line for a person."""


@dataclass
class Run:
    run: str
    state: str = "open"
    next_seq: int = 0
    last_hash: bytes | None = None
    decisions: dict[int, bool] = field(default_factory=dict)
    completed: set[int] = field(default_factory=set)
    isolation: str = ""
    reason: str = ""  # of the last hold or quarantine
    owner: str = ""  # the principal of the remote workload that opened it; "" on the socket


@dataclass
class Staged:
    idx: int
    rec: record.Record
    future: asyncio.Future[None]


class Log:
    def __init__(self, store: Store | Path, on_fatal: Callable[[str], None] | None = None
                 ) -> None:
        self.store = store if isinstance(store, Store) else SQLiteStore(store)
        self.path = self.store.name
        self.tree = merkle.Tree()
        self.runs: dict[str, Run] = {}
        self.jtis: dict[str, str] = {}  # `issuer#jti` of each token that opened a run -> run
        self.durable_size = 0
        self._staged: list[Staged] = []
        self._busy = False  # a batch is with the writer thread
        self._handover_soon = False  # a hand-over is scheduled for the end of this turn
        self._last: asyncio.Future[None] | None = None  # the future of the last staged record
        self.commits = 0  # transactions committed (each one fsync of the WAL)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.SimpleQueue[list[Staged] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._failed = False
        self._on_fatal = on_fatal or _die
        try:
            self._replay()
        except BaseException:
            self.store.close()  # a store that does not check out is left, not held open
            raise

    # --- start: re-read everything -----------------------------------------

    def _replay(self) -> None:
        for idx, run, seq, kind, raw, h in self.store.rows():
            where = f"{self.path} leaf {idx}"
            if idx != self.tree.size:
                raise InternalError(f"{where}: leaves are not contiguous")
            if not isinstance(raw, bytes) or not isinstance(h, bytes):
                raise InternalError(f"{where}: the row does not hold bytes")
            if merkle.leaf_hash(raw) != h:
                raise InternalError(f"{where}: the stored hash is not the record's hash")
            try:
                rec = record.parse(raw, where, ours=True)
            except FormatError as exc:
                raise InternalError(f"{where}: {exc}") from None
            if (rec.run, rec.seq, rec.kind) != (run, seq, kind):
                raise InternalError(f"{where}: the row does not match its record")
            self._apply(rec)
            self.tree.append(bytes(h))
        self.durable_size = self.tree.size
        log.info("log %s: %d records, %d runs (%d open)", self.path, self.tree.size,
                 len(self.runs), sum(r.state != "closed" for r in self.runs.values()))

    def _apply(self, rec: record.Record) -> None:
        """Advance the in-memory state by one record (replay and staging alike)."""
        r = self.runs.get(rec.run)
        if rec.kind == record.OPEN:
            if r is not None:
                raise InternalError(f"run {rec.run} opened twice")
            r = self.runs[rec.run] = Run(rec.run, isolation=str(rec.body.get("isolation", "")))
            w = rec.body.get("workload")
            if isinstance(w, dict):  # opened remotely (formats/workload.py)
                r.owner = str(w.get("principal", ""))
                if isinstance(w.get("jti"), str) and isinstance(w.get("issuer"), str):
                    self.jtis[f"{w['issuer']}#{w['jti']}"] = rec.run
        elif r is None:
            raise InternalError(f"record of run {rec.run}, which was never opened")
        if rec.seq != r.next_seq or rec.prev != r.last_hash:
            raise InternalError(f"run {rec.run}: record {rec.seq} does not extend its chain")
        if rec.kind in (HOLD, RELEASE, QUARANTINE, record.CLOSE):
            new = TRANSITIONS.get((r.state, rec.kind))
            if new is None:
                raise InternalError(f"run {rec.run}: {rec.kind} while {r.state}")
            r.state = new
            if rec.kind in (HOLD, QUARANTINE):
                r.reason = str(rec.body.get("reason", ""))
        elif rec.kind == record.DECISION:
            r.decisions[rec.seq] = bool(rec.body.get("allowed"))
        elif rec.kind == record.COMPLETE:
            d = rec.body.get("decision")
            if isinstance(d, int):
                r.completed.add(d)
        r.next_seq = rec.seq + 1
        r.last_hash = rec.hash

    # --- appends -------------------------------------------------------------

    def check(self, run: str, kind: str) -> Run:
        """The run a record of `kind` may be appended to, or LogError saying why not."""
        r = self.runs.get(run)
        if kind == record.OPEN:
            if r is not None:
                raise LogError(f"run {run} exists already; a run id is used once")
            if not record.valid_run_id(run):
                raise LogError("a run id is 1-128 of [A-Za-z0-9._:-], starting with a letter "
                               "or digit")
            return Run(run)
        if r is None:
            raise LogError(f"run {run} is not open at this signer")
        if r.state == "closed":
            raise LogError(f"run {run} is closed; nothing can be added to it")
        if kind in (HOLD, RELEASE, QUARANTINE, record.CLOSE) and \
                (r.state, kind) not in TRANSITIONS:
            raise LogError(f"run {run} is {r.state}: it cannot take {kind}")
        return r

    def stage(self, run: str, kind: str, body: dict[str, Any]) -> tuple[record.Record,
                                                                       asyncio.Future[None]]:
        """Add a record at the end of its run's chain; the future resolves once durable.

        Synchronous: call it from the event loop, in the order requests came.
        """
        r = self.check(run, kind)
        try:
            rec = record.make(run, r.next_seq, r.last_hash, kind, body)
        except FormatError as exc:
            raise LogError(f"the record cannot be made: {exc.what}") from None
        self._apply(rec)
        idx = self.tree.append(rec.hash)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._staged.append(Staged(idx, rec, fut))
        self._last = fut
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.Thread(target=self._writer, name="log-writer", daemon=True)
            self._thread.start()
        if not self._busy and not self._handover_soon:
            self._handover_soon = True
            asyncio.get_running_loop().call_soon(self._hand_over)
        return rec, fut

    def _hand_over(self) -> None:
        """Give every staged record to the writer thread: one transaction (group commit)."""
        self._handover_soon = False
        if self._busy or not self._staged:
            return
        if self._failed:
            for s in self._staged:
                s.future.set_exception(LogError("the signer could not write its log"))
            self._staged = []
            return
        batch, self._staged = self._staged, []
        self._busy = True
        self._queue.put(batch)

    def _writer(self) -> None:
        """The writer thread: commit each batch, then tell the loop."""
        assert self._loop is not None
        while (batch := self._queue.get()) is not None:
            try:
                self._write(batch)
                error: BaseException | None = None
            except Exception as exc:  # noqa: BLE001 - handed to the loop, which stops
                error = exc
            try:
                self._loop.call_soon_threadsafe(self._written, batch, error)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return

    def _written(self, batch: list[Staged], error: BaseException | None) -> None:
        self._busy = False
        if error is not None:
            self._failed = True
            self._on_fatal(f"cannot write the log ({error.__class__.__name__}: {error}); "
                           "stopping so nothing unrecorded is acknowledged")
            for s in batch:
                if not s.future.done():
                    s.future.set_exception(LogError("the signer could not write its log"))
        else:
            self.commits += 1
            self.durable_size = batch[-1].idx + 1
            for s in batch:
                if not s.future.done():
                    s.future.set_result(None)
        if self._staged:
            self._hand_over()

    def _write(self, batch: list[Staged]) -> None:
        self.store.append([(s.idx, s.rec.run, s.rec.seq, s.rec.kind, s.rec.raw, s.rec.hash)
                           for s in batch])

    async def wait_durable(self) -> None:
        """Until everything staged so far is durable (or has failed).

        Batches commit in the order they were staged, so the last staged
        record's future resolving means every record before it is durable.
        """
        last = self._last
        if last is not None and not last.done():
            await asyncio.wait({last})

    # --- reads ---------------------------------------------------------------

    def run_leaves(self, run: str) -> list[tuple[int, bytes]]:
        """(leaf index, record bytes) of a run, in its order."""
        return self.store.run_leaves(run)

    def witness_size(self, name: str) -> int:
        return self.store.witness_size(name)

    def set_witness_size(self, name: str, size: int) -> None:
        self.store.set_witness_size(name, size)

    def save_checkpoint(self, size: int, note: bytes) -> None:
        self.store.save_checkpoint(size, note)

    @property
    def db(self) -> sqlite3.Connection:
        """The SQLite connection of a SQLite store (for tests that reach into it)."""
        assert isinstance(self.store, SQLiteStore)
        return self.store.db

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None
        self.store.close()


def _die(msg: str) -> None:
    log.critical("%s", msg)
    os._exit(75)
