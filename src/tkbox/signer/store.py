"""Where the signer's log is kept: one interface, two stores.

    Store.rows()                  every leaf, in index order (the replay at start)
    Store.append(rows)            one transaction; durable when it returns
    Store.run_leaves(run)         (leaf index, record bytes) of one run, in its order
    Store.witness_size / set_witness_size / save_checkpoint

- `SQLiteStore` (`log.db` in the signer's home, the default for one host): WAL,
  `synchronous=FULL`; a commit is one fsync of the WAL.
- `PostgresStore` (`--store postgresql://…`, a signer many hosts share, its
  database on a server the operator runs): psycopg 3, `synchronous_commit=on`
  (a commit returns once the server's WAL is flushed), the same three tables. A
  session advisory lock keeps a second signer off the same database: two
  signers appending to one log would fork it.

`leaves` is the only truth in both: the signer re-reads every row at start
(`Log._replay`), checks each hash and chain and rebuilds the tree, so a crash
at any point leaves a whole transaction or none of it. A write that fails
(disk full, the PostgreSQL server restarted or unreachable) stops the signer
(`Log`): when a commit's answer is lost the signer cannot know whether the
transaction is in, and only a restart that re-reads the store can. Every store
passes `tests/conformance/test_signer_store.py` and the SIGKILL trials.

Errors: `StoreError` (a `HostError`: the operator's store is unusable) with
one line that never holds a password.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tkbox.errors import HostError

Row = tuple[int, str, int, str, bytes, bytes]  # idx, run, seq, kind, record, hash

SCHEMA = """
CREATE TABLE IF NOT EXISTS leaves (
    idx INTEGER PRIMARY KEY,
    run TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    record BLOB NOT NULL,
    hash BLOB NOT NULL,
    UNIQUE (run, seq)
);
CREATE TABLE IF NOT EXISTS witnesses (name TEXT PRIMARY KEY, size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (size INTEGER PRIMARY KEY, note BLOB NOT NULL);
"""

PG_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS leaves (idx BIGINT PRIMARY KEY, run TEXT NOT NULL, "
    "seq BIGINT NOT NULL, kind TEXT NOT NULL, record BYTEA NOT NULL, hash BYTEA NOT NULL, "
    "UNIQUE (run, seq))",
    "CREATE TABLE IF NOT EXISTS witnesses (name TEXT PRIMARY KEY, size BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS checkpoints (size BIGINT PRIMARY KEY, note BYTEA NOT NULL)",
]
#: pg_advisory_lock key: "tkbox signer" as 8 bytes, one signer per database
PG_LOCK = int.from_bytes(b"tkboxsig", "big") & 0x7FFF_FFFF_FFFF_FFFF
LOCK_WAIT = 5.0  # seconds a new signer waits for the lock of one that just died


class StoreError(HostError):
    """The signer's store cannot be used (one line, no password)."""


class Store(ABC):
    """The log's rows (see the module docstring)."""

    name: str  # for messages and logs: a path, or a URL without its password

    @abstractmethod
    def rows(self) -> Iterator[Row]: ...

    @abstractmethod
    def append(self, rows: list[Row]) -> None:
        """Insert `rows` in one transaction, durable on return; raise on any failure
        (nothing of them is then in the store, or the signer cannot tell)."""

    @abstractmethod
    def run_leaves(self, run: str) -> list[tuple[int, bytes]]: ...

    @abstractmethod
    def witness_size(self, name: str) -> int: ...

    @abstractmethod
    def set_witness_size(self, name: str, size: int) -> None: ...

    @abstractmethod
    def save_checkpoint(self, size: int, note: bytes) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


def open_store(spec: str | Path) -> Store:
    """`postgresql://…` (or `postgres://…`), else a SQLite file's path."""
    text = str(spec)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresStore(text)
    if "://" in text:
        raise StoreError(f"--store {redact(text)!r}: use postgresql://… or a file path")
    return SQLiteStore(Path(text))


def redact(url: str) -> str:
    """A URL without its password, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(a URL that cannot be read)"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


# --- SQLite ------------------------------------------------------------------


def sqlite_connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(f"{path}: SQLite could not use WAL mode (got {mode}); use a local disk")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA foreign_keys=ON")
    return db


class SQLiteStore(Store):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)
        try:
            self.db = sqlite_connect(path)
            self.db.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: {exc}") from None
        self._lock = threading.Lock()  # the writer thread against readers

    def rows(self) -> Iterator[Row]:
        yield from self.db.execute(
            "SELECT idx, run, seq, kind, record, hash FROM leaves ORDER BY idx")

    def append(self, rows: list[Row]) -> None:
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.executemany(
                    "INSERT INTO leaves (idx, run, seq, kind, record, hash) VALUES (?,?,?,?,?,?)",
                    rows)
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def run_leaves(self, run: str) -> list[tuple[int, bytes]]:
        with self._lock:
            rows = self.db.execute("SELECT idx, record FROM leaves WHERE run = ? ORDER BY seq",
                                   (run,)).fetchall()
        return [(int(i), bytes(raw)) for i, raw in rows]

    def witness_size(self, name: str) -> int:
        with self._lock:
            row = self.db.execute("SELECT size FROM witnesses WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def set_witness_size(self, name: str, size: int) -> None:
        with self._lock:
            self.db.execute("INSERT INTO witnesses (name, size) VALUES (?, ?) "
                            "ON CONFLICT(name) DO UPDATE SET size = excluded.size", (name, size))

    def save_checkpoint(self, size: int, note: bytes) -> None:
        with self._lock:
            self.db.execute("INSERT OR REPLACE INTO checkpoints (size, note) VALUES (?, ?)",
                            (size, note))
            self.db.execute("DELETE FROM checkpoints WHERE size < ?", (size,))

    def close(self) -> None:
        with self._lock:
            self.db.close()


# --- PostgreSQL --------------------------------------------------------------


class PostgresStore(Store):
    """Two connections: the writer thread's, and one for reads (each behind its lock);
    the reader's session holds the advisory lock that makes this signer the only one."""

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError:
            raise StoreError("--store postgresql://… needs psycopg: pip install "
                             "'tkbox[postgresql]'") from None
        self._psycopg = psycopg
        self.url = url
        self.name = redact(url)
        self._wlock = threading.Lock()
        self._rlock = threading.Lock()
        try:
            self._r = self._connect()
            self._w = self._connect()
        except psycopg.Error as exc:
            raise StoreError(f"cannot open the store {self.name}: {_pg_why(exc)}") from None
        try:
            with self._r.transaction():
                for stmt in PG_SCHEMA:
                    self._r.execute(stmt)
            # A signer killed a moment ago holds it until its server process notices.
            deadline = time.monotonic() + LOCK_WAIT
            while True:
                got = self._r.execute("SELECT pg_try_advisory_lock(%s)",
                                      (PG_LOCK,)).fetchone()
                if (got and got[0] is True) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        except psycopg.Error as exc:
            self._close_all()
            raise StoreError(f"cannot set up the store {self.name}: {_pg_why(exc)}") from None
        if not got or got[0] is not True:
            self._close_all()
            raise StoreError(f"another signer is using the store {self.name}: one log, one "
                             "signer (stop the other, or give this one its own database)")

    def _connect(self) -> Any:
        conn = self._psycopg.connect(self.url, autocommit=True, connect_timeout=10,
                                     application_name="tkbox-signer")
        conn.execute("SET synchronous_commit = on")  # a commit is durable on the server
        return conn

    def rows(self) -> Iterator[Row]:
        # A server-side cursor (it needs a transaction): the rows come 5 000 at a time.
        with self._rlock, self._r.transaction(), self._r.cursor(name="tkbox_replay") as cur:
            cur.itersize = 5000
            cur.execute("SELECT idx, run, seq, kind, record, hash FROM leaves ORDER BY idx")
            for idx, run, seq, kind, raw, h in cur:
                yield int(idx), str(run), int(seq), str(kind), bytes(raw), bytes(h)

    def append(self, rows: list[Row]) -> None:
        with self._wlock:
            with self._w.transaction(), self._w.cursor() as cur:
                cur.executemany(
                    "INSERT INTO leaves (idx, run, seq, kind, record, hash) "
                    "VALUES (%s, %s, %s, %s, %s, %s)", rows)

    def run_leaves(self, run: str) -> list[tuple[int, bytes]]:
        with self._rlock:
            rows = self._r.execute("SELECT idx, record FROM leaves WHERE run = %s ORDER BY seq",
                                   (run,)).fetchall()
        return [(int(i), bytes(raw)) for i, raw in rows]

    def witness_size(self, name: str) -> int:
        with self._rlock:
            row = self._r.execute("SELECT size FROM witnesses WHERE name = %s",
                                  (name,)).fetchone()
        return int(row[0]) if row else 0

    def set_witness_size(self, name: str, size: int) -> None:
        with self._rlock:
            self._r.execute("INSERT INTO witnesses (name, size) VALUES (%s, %s) "
                            "ON CONFLICT (name) DO UPDATE SET size = excluded.size", (name, size))

    def save_checkpoint(self, size: int, note: bytes) -> None:
        with self._rlock, self._r.transaction():
            self._r.execute("INSERT INTO checkpoints (size, note) VALUES (%s, %s) "
                            "ON CONFLICT (size) DO UPDATE SET note = excluded.note", (size, note))
            self._r.execute("DELETE FROM checkpoints WHERE size < %s", (size,))

    def _close_all(self) -> None:
        for attr in ("_w", "_r"):
            conn = getattr(self, attr, None)
            if conn is not None:
                try:
                    conn.close()
                except self._psycopg.Error:
                    pass

    def close(self) -> None:
        with self._wlock, self._rlock:
            self._close_all()


def _pg_why(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or exc.__class__.__name__
    return text[:300]
