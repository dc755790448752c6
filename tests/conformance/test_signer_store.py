"""The signer's `Store` conformance suite, run against every store (`tkbox.signer.store`):

- `sqlite`: `SQLiteStore`, a file in a temporary directory;
- `postgresql`: `PostgresStore` on a real PostgreSQL server (Debian's package,
  `tests/integration/signer/pg_proc.py`), a fresh database per test.

What the log relies on: rows come back exactly as appended, in index order; a
batch is one transaction (a batch that fails leaves none of its rows); a run's
leaves come in its order; witness sizes and checkpoints are kept and
overwritten; everything is there after the store is closed and opened again;
and the `Log` on top replays it (chains, tree) and refuses a tampered row.
A property one store cannot have is named in its `cannot` table with the reason.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "integration" / "signer"))
from pg_proc import PgServer  # noqa: E402

from tkbox.errors import InternalError  # noqa: E402
from tkbox.formats import merkle, record  # noqa: E402
from tkbox.signer.log import Log  # noqa: E402
from tkbox.signer.store import SQLiteStore, Store, StoreError, open_store  # noqa: E402

pytestmark = pytest.mark.integration


class Harness:
    spec: str
    cannot: dict[str, str] = {}

    def open(self) -> Store:
        return open_store(self.spec)

    def tamper(self, idx: int, raw: bytes) -> None:
        raise NotImplementedError


class SQLiteHarness(Harness):
    cannot = {"exclusive": "one host, one home: the signer's socket check keeps a second "
                           "signer off its home (test_signer_process), before the store opens"}

    def __init__(self, tmp: Path) -> None:
        self.spec = str(tmp / "log.db")

    def tamper(self, idx: int, raw: bytes) -> None:
        s = SQLiteStore(Path(self.spec))
        s.db.execute("UPDATE leaves SET record = ? WHERE idx = ?", (raw, idx))
        s.close()


class PostgresHarness(Harness):
    def __init__(self, pg: PgServer, name: str) -> None:
        self.spec = pg.database(name)

    def tamper(self, idx: int, raw: bytes) -> None:
        import psycopg

        with psycopg.connect(self.spec, autocommit=True) as c:
            c.execute("UPDATE leaves SET record = %s WHERE idx = %s", (raw, idx))


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    server = PgServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "sqlite":
        yield SQLiteHarness(tmp_path)
    else:
        pg = request.getfixturevalue("pg")
        yield PostgresHarness(pg, f"t_{abs(hash(request.node.name)) % 10**9}")


def _rows(n: int, start: int = 0, run: str = "r") -> list[tuple[int, str, int, str, bytes,
                                                                 bytes]]:
    return [(i, run, i, "tkbox.gap", b"rec%d" % i, merkle.leaf_hash(b"rec%d" % i))
            for i in range(start, start + n)]


def _using(h: Harness, fn: Callable[[Store], None]) -> None:
    s = h.open()
    try:
        fn(s)
    finally:
        s.close()


def test_rows_come_back_as_appended_in_index_order(store: Harness) -> None:
    def go(s: Store) -> None:
        assert list(s.rows()) == []
        s.append(_rows(3))
        s.append(_rows(5, start=3))
        assert list(s.rows()) == _rows(8)

    _using(store, go)


def test_a_batch_that_fails_leaves_none_of_its_rows(store: Harness) -> None:
    def go(s: Store) -> None:
        s.append(_rows(2))
        with pytest.raises(Exception):  # noqa: B017 - the driver's own error
            s.append(_rows(3, start=2) + [_rows(1)[0]])  # idx 0 again: the batch fails
        assert list(s.rows()) == _rows(2)
        s.append(_rows(1, start=2))  # and the store takes the next batch
        assert [r[0] for r in s.rows()] == [0, 1, 2]

    _using(store, go)


def test_a_runs_leaves_come_in_its_order(store: Harness) -> None:
    def go(s: Store) -> None:
        rows = [(0, "a", 0, "k", b"a0", b"h"), (1, "b", 0, "k", b"b0", b"h"),
                (2, "a", 1, "k", b"a1", b"h"), (3, "a", 2, "k", b"a2", b"h")]
        s.append(rows)
        assert s.run_leaves("a") == [(0, b"a0"), (2, b"a1"), (3, b"a2")]
        assert s.run_leaves("b") == [(1, b"b0")]
        assert s.run_leaves("none") == []

    _using(store, go)


def test_witness_sizes_and_checkpoints_are_kept_and_overwritten(store: Harness) -> None:
    def go(s: Store) -> None:
        assert s.witness_size("w1") == 0
        s.set_witness_size("w1", 5)
        s.set_witness_size("w1", 9)
        s.set_witness_size("w2", 1)
        s.save_checkpoint(5, b"note5")
        s.save_checkpoint(9, b"note9")
        assert (s.witness_size("w1"), s.witness_size("w2")) == (9, 1)

    _using(store, go)
    _using(store, lambda s: None)
    s = store.open()
    try:
        assert (s.witness_size("w1"), s.witness_size("w2")) == (9, 1)
    finally:
        s.close()


def test_everything_is_there_after_the_store_is_opened_again(store: Harness) -> None:
    _using(store, lambda s: s.append(_rows(10)))
    got: list[object] = []
    _using(store, lambda s: got.extend(s.rows()))
    assert got == _rows(10)


def test_the_log_replays_from_the_store_and_refuses_a_tampered_row(store: Harness) -> None:
    async def fill() -> tuple[int, bytes]:
        lg = Log(store.open())
        try:
            lg.stage("a", record.OPEN, {"facts": {}, "isolation": "same-user"})
            for i in range(20):
                lg.stage("a", "tkbox.gap", {"i": i})
            lg.stage("a", record.CLOSE, {})
            await lg.wait_durable()
            return lg.tree.size, lg.tree.root()
        finally:
            lg.close()

    size, root = asyncio.run(fill())
    lg = Log(store.open())
    try:
        assert (lg.tree.size, lg.tree.root()) == (size, root)
        assert lg.runs["a"].state == "closed"
        raw = lg.run_leaves("a")[3][1]
    finally:
        lg.close()
    store.tamper(3, raw.replace(b'"i":2', b'"i":7'))
    with pytest.raises(InternalError, match="hash"):
        Log(store.open()).close()


def test_one_store_one_signer(store: Harness) -> None:
    """Two signers appending to one log would fork it: a second is refused."""
    if why := store.cannot.get("exclusive"):
        assert why
        return
    s = store.open()
    try:
        with pytest.raises(StoreError, match="another signer is using the store"):
            store.open()
    finally:
        s.close()
    store.open().close()  # free again once the first is closed


def test_a_store_url_is_never_shown_with_its_password() -> None:
    with pytest.raises(StoreError) as info:
        open_store("mysql://u:s3cret@h/db")
    assert "s3cret" not in str(info.value)
    with pytest.raises(StoreError) as info2:
        open_store("postgresql://u:s3cret@127.0.0.1:1/db")
    assert "s3cret" not in str(info2.value) and "\n" not in str(info2.value)
