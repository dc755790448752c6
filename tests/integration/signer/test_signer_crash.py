"""Crash safety: the signer SIGKILLed at random points of a stream of appends.

After every kill the store is re-read (every hash and chain checked, the
tree rebuilt), every record the signer acknowledged must be in it, and the
tree must extend the one before (append-only across crashes). Trials run
until a time budget (TKBOX_CRASH_SECONDS, default 25 s) is spent.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest
from signer_proc import SignerProc

from tkbox.errors import SignerUnavailable
from tkbox.formats import record
from tkbox.signer.log import Log
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


def _check(s: SignerProc, acked: set[tuple[str, int]], roots: dict[int, bytes]) -> int:
    lg = Log(s.home / "log.db")  # replays: every hash, every chain
    try:
        present: set[tuple[str, int]] = set()
        for (raw,) in lg.db.execute("SELECT record FROM leaves"):
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


def test_sigkill_at_random_points_loses_nothing_acknowledged() -> None:
    budget = float(os.environ.get("TKBOX_CRASH_SECONDS", "25"))
    rng = random.Random(os.environ.get("TKBOX_CRASH_SEED", "tkbox"))
    s = SignerProc()
    acked: set[tuple[str, int]] = set()
    roots: dict[int, bytes] = {}
    trials, sent = 0, 0
    try:
        s.start()
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline or trials < 3:
            run = f"crash-{trials}"
            sent += asyncio.run(_stream(s, run, rng.uniform(0.0, 0.25), acked))
            size = _check(s, acked, roots)
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
