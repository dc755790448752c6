"""The signer's log: chains per run, the run lifecycle table, replay after restart."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from tkbox.errors import InternalError
from tkbox.formats import merkle, record
from tkbox.signer import log as log_mod
from tkbox.signer.log import HOLD, QUARANTINE, RELEASE, STATES, TRANSITIONS, Log, LogError


def _open(lg: Log, run: str) -> None:
    lg.stage(run, record.OPEN, {"facts": {}, "isolation": "same-user"})


def test_records_chain_and_replay(tmp_path: Path) -> None:
    db = tmp_path / "log.db"

    async def fill() -> None:
        lg = Log(db)
        _open(lg, "a")
        _open(lg, "b")
        for i in range(5):
            lg.stage("a", "tkbox.gap", {"i": i})
            lg.stage("b", "tkbox.gap", {"i": i})
        _, fut = lg.stage("a", record.CLOSE, {})
        await fut
        await lg.wait_durable()
        assert lg.durable_size == 13
        lg.close()

    asyncio.run(fill())
    lg = Log(db)
    assert lg.tree.size == 13
    assert lg.runs["a"].state == "closed" and lg.runs["b"].state == "open"
    leaves = lg.run_leaves("a")
    assert [record.parse(raw).seq for _, raw in leaves] == list(range(7))
    prev = None
    for _, raw in leaves:
        rec = record.parse(raw)
        assert rec.prev == prev
        prev = rec.hash
    assert lg.tree.root() == merkle.root_of(merkle.leaf_hash(bytes(r[0])) for r in
                                            lg.db.execute("SELECT record FROM leaves ORDER BY idx"))


def test_every_edge_of_the_lifecycle_table(tmp_path: Path) -> None:
    """Walk each (state, event): the table's edges are taken, every other one refused."""
    events = (HOLD, RELEASE, QUARANTINE, record.CLOSE)
    paths = {"open": [], "held": [HOLD], "quarantined": [QUARANTINE],
             "closed": [record.CLOSE]}

    async def walk() -> None:
        lg = Log(tmp_path / "log.db")
        n = 0
        for state in STATES:
            for ev in events:
                run = f"run{n}"
                n += 1
                _open(lg, run)
                for step in paths[state]:
                    lg.stage(run, step, {"reason": "test"})
                assert lg.runs[run].state == state
                if (state, ev) in TRANSITIONS:
                    lg.stage(run, ev, {"reason": "test"})
                    assert lg.runs[run].state == TRANSITIONS[(state, ev)]
                else:
                    with pytest.raises(LogError):
                        lg.stage(run, ev, {"reason": "test"})
        await lg.wait_durable()
        lg.close()

    asyncio.run(walk())
    assert Log(tmp_path / "log.db").tree.size > 0  # and it replays


def test_refusals(tmp_path: Path) -> None:
    async def go() -> None:
        lg = Log(tmp_path / "log.db")
        with pytest.raises(LogError, match="not open"):
            lg.stage("nope", "tkbox.gap", {})
        with pytest.raises(LogError, match="run id"):
            _open(lg, "bad id with spaces")
        _open(lg, "r")
        with pytest.raises(LogError, match="exists already"):
            _open(lg, "r")
        with pytest.raises(LogError, match="cannot be made"):
            lg.stage("r", "tkbox.gap", {"x": 0.5})
        lg.stage("r", record.CLOSE, {})
        with pytest.raises(LogError, match="closed"):
            lg.stage("r", "tkbox.gap", {})
        await lg.wait_durable()
        lg.close()

    asyncio.run(go())


def test_a_tampered_store_is_refused_at_start(tmp_path: Path) -> None:
    async def go() -> None:
        lg = Log(tmp_path / "log.db")
        _open(lg, "r")
        lg.stage("r", "tkbox.gap", {"a": 1})
        await lg.wait_durable()
        lg.close()

    asyncio.run(go())
    db = sqlite3.connect(tmp_path / "log.db")
    (raw,) = db.execute("SELECT record FROM leaves WHERE idx = 1").fetchone()
    db.execute("UPDATE leaves SET record = ? WHERE idx = 1", (raw.replace(b'"a":1', b'"a":2'),))
    db.commit()
    db.close()
    with pytest.raises(InternalError, match="hash"):
        Log(tmp_path / "log.db")


def test_a_failed_write_stops_the_signer_and_acknowledges_nothing(tmp_path: Path) -> None:
    fatal: list[str] = []

    async def go() -> None:
        lg = Log(tmp_path / "log.db", on_fatal=fatal.append)
        _open(lg, "r")
        await lg.wait_durable()
        lg.db.execute("CREATE TRIGGER no BEFORE INSERT ON leaves BEGIN SELECT RAISE(ABORT, 'disk"
                      " full'); END")
        _, fut = lg.stage("r", "tkbox.gap", {})
        with pytest.raises(LogError):
            await fut

    asyncio.run(go())
    assert fatal and "cannot write the log" in fatal[0]


class _GatedLog(Log):
    """A log whose writer waits at a gate before each commit, counting the records of each."""

    def __init__(self, path: Path) -> None:
        import threading

        self.gate = threading.Event()
        self.arrived = threading.Event()  # the writer has a batch and waits at the gate
        self.batches: list[int] = []
        super().__init__(path)

    def _write(self, batch: list) -> None:  # type: ignore[type-arg]
        self.arrived.set()
        self.gate.wait(10)
        super()._write(batch)
        self.batches.append(len(batch))


def test_group_commit_requests_staged_together_share_one_commit_and_wait_for_it(
        tmp_path: Path) -> None:
    """32 records staged in one turn of the loop (32 requests in flight, read at once)
    go into one transaction, one fsync; none is acknowledged before that commit ends,
    and the records staged while it is in flight share the next one, not one each."""

    async def go() -> None:
        lg = _GatedLog(tmp_path / "log.db")
        _open(lg, "r")
        lg.gate.set()
        await lg.wait_durable()
        lg.gate.clear()
        lg.arrived.clear()
        first = [lg.stage("r", "tkbox.gap", {"i": i})[1] for i in range(32)]
        # the writer holds the batch at the gate: nothing is durable
        assert await asyncio.to_thread(lg.arrived.wait, 10)
        assert not any(f.done() for f in first)
        assert lg.durable_size == 1 and lg.commits == 1
        second = [lg.stage("r", "tkbox.gap", {"i": i})[1] for i in range(32, 50)]
        await asyncio.to_thread(lg.arrived.wait, 10)  # a turn of the loop, the writer held
        assert not any(f.done() for f in first + second)
        lg.gate.set()
        await asyncio.gather(*first)
        await lg.wait_durable()
        assert all(f.done() for f in second)
        assert lg.batches == [1, 32, 18] and lg.commits == 3
        assert lg.durable_size == 51
        lg.close()

    asyncio.run(go())


def test_wait_durable_waits_on_the_last_record_not_a_polling_clock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wait_durable returns exactly when the last staged record is durable, and never
    sleeps in a loop (it used to poll every millisecond)."""

    async def no_sleep(delay: float, *a: object) -> None:
        raise AssertionError(f"wait_durable slept {delay}")

    async def go() -> None:
        lg = _GatedLog(tmp_path / "log.db")
        _open(lg, "r")
        lg.arrived.clear()
        _, fut = lg.stage("r", "tkbox.gap", {})
        waiter = asyncio.ensure_future(lg.wait_durable())
        assert await asyncio.to_thread(lg.arrived.wait, 10)  # the record is at the gate
        assert not waiter.done() and not fut.done()
        lg.gate.set()
        await waiter
        assert fut.done() and lg.durable_size == 2
        await lg.wait_durable()  # nothing staged: returns at once
        lg.close()

    with monkeypatch.context() as m:
        m.setattr(log_mod.asyncio, "sleep", no_sleep)  # the log's asyncio, sleeping
        asyncio.run(go())
