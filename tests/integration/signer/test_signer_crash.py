"""Crash safety: the signer SIGKILLed at random points of a stream of appends, on
each store (SQLite, and PostgreSQL on a real server: `pg_proc.py`).

After every kill the store is re-read (every hash and chain checked, the
tree rebuilt), every record the signer acknowledged must be in it, and the
tree must extend the one before (append-only across crashes). Trials run
until a time budget (TKBOX_CRASH_SECONDS, default 25 s, per store) is spent.
With PostgreSQL, the server itself is also restarted under a stream of appends:
the signer stops (it cannot know whether the commit in flight went in), and
once both are back nothing acknowledged is missing.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Iterator

import pytest
from pg_proc import PgServer
from signer_proc import SignerProc

from tkbox.errors import SignerUnavailable
from tkbox.formats import record
from tkbox.signer.log import Log
from tkbox.signer.store import open_store
from tkbox.verify import verify_bundle

pytestmark = pytest.mark.integration

WRITERS = 8


async def _stream(s: SignerProc, run: str, kill_after: float, acked: set[tuple[str, int]]
                  ) -> int:
    c = s.client(timeout=5.0)
    await c.open_run(run, {"trial": run})
    acked.add((run, -1))
    counter = iter(range(1 << 30))
    loop = asyncio.get_running_loop()
    killed = loop.create_future()

    def kill() -> None:
        s.kill()
        killed.set_result(None)

    loop.call_later(kill_after, kill)

    async def writer() -> None:
        while True:
            n = next(counter)
            try:
                await c.event(run, "tkbox.gap", {"n": n, "pad": "x" * (n % 200)})
            except SignerUnavailable:
                return
            acked.add((run, n))

    await asyncio.gather(*(writer() for _ in range(WRITERS)))
    await killed
    await c.aclose()
    return next(counter)


def _check(s: SignerProc, acked: set[tuple[str, int]], roots: dict[int, bytes],
           store: str) -> int:
    lg = Log(open_store(store))  # replays: every hash, every chain
    try:
        present: set[tuple[str, int]] = set()
        for *_, raw, _h in lg.store.rows():
            rec = record.parse(bytes(raw))
            present.add((rec.run, -1 if rec.kind == record.OPEN else rec.body.get("n", -2)))
        lost = acked - present
        assert not lost, f"acknowledged records lost: {sorted(lost)[:5]}"
        for size, root in roots.items():
            assert lg.tree.root(size) == root, f"the tree at size {size} changed"
        roots[lg.tree.size] = lg.tree.root()
        return lg.tree.size
    finally:
        lg.close()


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    server = PgServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest) -> str:
    """A store spec for `--store` (empty: the home's SQLite log.db)."""
    if request.param == "sqlite":
        return ""
    pg: PgServer = request.getfixturevalue("pg")
    return pg.database(f"crash_{request.node.name.split('[')[0][-20:]}")


def test_sigkill_at_random_points_loses_nothing_acknowledged(store: str) -> None:
    budget = float(os.environ.get("TKBOX_CRASH_SECONDS", "25"))
    rng = random.Random(os.environ.get("TKBOX_CRASH_SEED", "tkbox"))
    s = SignerProc()
    if store:
        s.serve_args = ("--store", store)
    spec = store or str(s.home / "log.db")
    acked: set[tuple[str, int]] = set()
    roots: dict[int, bytes] = {}
    trials, sent = 0, 0
    try:
        s.start()
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline or trials < 3:
            run = f"crash-{trials}"
            sent += asyncio.run(_stream(s, run, rng.uniform(0.0, 0.25), acked))
            size = _check(s, acked, roots, spec)
            trials += 1
            s.start()
        # The last run can still be closed and exported, and it verifies.
        async def finish() -> bytes:
            c = s.client()
            try:
                await c.close_run(f"crash-{trials - 1}")
                e = await c.export(f"crash-{trials - 1}")
                assert verify_bundle(e.bundle, e.trust).records > 0
                return e.bundle
            finally:
                await c.aclose()

        asyncio.run(finish())
    finally:
        s.cleanup()
    print(f"{trials} kills, {len(acked)} acknowledged records kept, {sent} sent, "
          f"log size {size}")
    assert trials >= 3 and len(acked) > trials


def test_a_postgresql_restart_mid_stream_loses_nothing_acknowledged(pg: PgServer) -> None:
    url = pg.database("restart")
    s = SignerProc()
    s.serve_args = ("--store", url)
    acked: set[tuple[str, int]] = set()
    roots: dict[int, bytes] = {}
    try:
        s.start()

        async def stream() -> None:
            c = s.client(timeout=5.0)
            await c.open_run("pg-restart", {})
            acked.add(("pg-restart", -1))
            stop = asyncio.get_running_loop().create_future()

            async def writer(k: int) -> None:
                for n in range(k, 1 << 30, WRITERS):
                    try:
                        await c.event("pg-restart", "tkbox.gap", {"n": n})
                    except SignerUnavailable:
                        return
                    acked.add(("pg-restart", n))

            async def restart() -> None:
                await asyncio.sleep(0.5)
                await asyncio.to_thread(pg.restart)
                stop.set_result(None)

            await asyncio.gather(*(writer(k) for k in range(WRITERS)), restart())
            await stop
            await c.aclose()

        asyncio.run(stream())
        # The signer could not commit: it stopped rather than acknowledge what it cannot keep.
        assert s.wait_exit() == 75, s.read_log()
        assert "cannot write the log" in s.read_log()
        size = _check(s, acked, roots, url)
        s.start()  # on the restarted server: the log checks out, and goes on
        async def more() -> None:
            c = s.client()
            try:
                await c.event("pg-restart", "tkbox.gap", {"reason": "the store restarted"})
                await c.close_run("pg-restart")
                e = await c.export("pg-restart")
                assert verify_bundle(e.bundle, e.trust).records == size + 2
            finally:
                await c.aclose()

        asyncio.run(more())
    finally:
        s.cleanup()
    assert len(acked) > 10
