"""Egress resources and records: descriptors, connections per box, tunnel time, refusals.

Each security test names the attack it stops. Doors run over memory streams
with a fake signer, resolver and clock (`tkbox.doors.network.testing`).
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any

import pytest

from tkbox._clock import FakeClock
from tkbox.doors.network.limits import (
    FD_RESERVE,
    MIN_SHARE,
    ConnectionPool,
    connections_for,
    raise_nofile,
)
from tkbox.doors.network.records import RefusalLog, excerpt
from tkbox.doors.network.testing import aiotest, make_door
from tkbox.errors import SignerUnavailable
from tkbox.protocol.streams import ByteStream, MemoryStream, memory_stream_pair
from tkbox.record.budget import BudgetedSigner, RecordBudgetExhausted, estimate
from tkbox.record.testing import FakeSigner

PUBLIC = "93.184.215.14"


async def open_conn(door: Any, raw: bytes) -> tuple[MemoryStream, asyncio.Task[None]]:
    guest, ours = memory_stream_pair()
    task = asyncio.ensure_future(door.handle(ours))
    await guest.send_all(raw)
    return guest, task


async def read_head(guest: ByteStream) -> bytes:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = await guest.receive()
        if not chunk:
            break
        buf += chunk
    return buf


def connect(host: str, port: int) -> bytes:
    return f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


# --- descriptors and connections ----------------------------------------------------


def test_soft_nofile_limit_is_raised_to_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        got = raise_nofile()
        now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert got == now and now >= soft and now > low
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_connection_cap_leaves_descriptors_for_the_daemon() -> None:
    assert connections_for(1024) == (1024 - FD_RESERVE) // 2
    assert connections_for(100) == MIN_SHARE


def test_fair_share_leaves_room_for_a_box_that_has_none() -> None:
    """Attack: one box opens tunnels until the daemon has no descriptor left."""
    pool = ConnectionPool(120)
    taken = 0
    while pool.acquire("a") is None:
        taken += 1
    assert taken == 60  # alone, a box gets half
    assert "fair share" in (pool.refusal("a") or "")
    got_b = 0
    while pool.acquire("b") is None:
        got_b += 1
    assert got_b == 40  # a newcomer still gets its share (cap // 3)
    pool.release("a")
    assert pool.acquire("a") is not None  # over its share now: no more until it is under
    for _ in range(60):
        pool.release("a")
    assert pool.held("a") == 0 and pool.total == 40


def test_daemon_wide_cap_refuses_with_a_reason() -> None:
    pool = ConnectionPool(16)
    for i in range(16):
        assert pool.acquire(f"box{i}") is None
    why = pool.acquire("late")
    assert why is not None and "daemon holds 16 egress connections" in why


@aiotest
async def test_a_box_over_its_share_gets_503_while_another_box_connects() -> None:
    """Attack: box A holds tunnels open to take every connection the daemon may have."""
    pool = ConnectionPool(MIN_SHARE * 2)
    door_a, _, _, _ = make_door(["git.example:22"], dns={"git.example": [PUBLIC]},
                                box="a", pool=pool)
    door_b, signer_b, _, _ = make_door(["git.example:22"], dns={"git.example": [PUBLIC]},
                                       box="b", pool=pool)
    held = [await open_conn(door_a, connect("git.example", 22)) for _ in range(MIN_SHARE)]
    for g, _t in held:
        assert (await read_head(g)).startswith(b"HTTP/1.1 200")
    guest, task = await open_conn(door_a, connect("git.example", 22))
    head = await read_head(guest)
    await task
    assert head.startswith(b"HTTP/1.1 503") and b"fair share" in head
    gb, _tb = await open_conn(door_b, connect("git.example", 22))
    assert (await read_head(gb)).startswith(b"HTTP/1.1 200")
    await door_a.close()
    await door_b.close()
    assert pool.total == 0


# --- tunnel time ---------------------------------------------------------------------


async def _complete(signer: FakeSigner) -> dict[str, Any]:
    for _ in range(TURNS):
        done = [r for r in signer.records if r["kind"] == "tkbox.complete"]
        if done:
            return done[-1]["outcome"]  # type: ignore[no-any-return]
        await asyncio.sleep(0)
    raise AssertionError("no completion record")


#: turns of the event loop a completion may take to be recorded (all in memory)
TURNS = 10_000


async def _settled(clock: FakeClock, task: asyncio.Future[Any]) -> None:
    """Until the tunnel's timer sleeps on the fake clock again, or the tunnel ended:
    whatever a step of the clock set off has happened."""
    while not clock.sleepers and not task.done():
        await asyncio.sleep(0)


@aiotest
async def test_idle_tunnel_is_closed_after_the_idle_timeout() -> None:
    """Attack: hold tunnels open and silent, so descriptors are never given back."""
    door, signer, _, clock = make_door(["git.example:22"], dns={"git.example": [PUBLIC]},
                                       tunnel_idle=30.0, tunnel_total=3600.0)
    guest, task = await open_conn(door, connect("git.example", 22))
    assert (await read_head(guest)).startswith(b"HTTP/1.1 200")
    await _settled(clock, task)  # the timer sleeps until the idle deadline
    clock.advance(29.0)
    await _settled(clock, task)
    assert not task.done() and clock.sleepers  # still asleep: nothing woke it
    clock.advance(2.0)
    await asyncio.wait_for(task, 5)
    outcome = await _complete(signer)
    assert outcome["ended"].startswith("idle timeout") and "--tunnel-idle" in outcome["ended"]


@aiotest
async def test_busy_tunnel_is_closed_at_its_total_time() -> None:
    """Attack: keep a tunnel alive for ever with a byte now and then."""
    door, signer, _, clock = make_door(["git.example:22"], dns={"git.example": [PUBLIC]},
                                       tunnel_idle=30.0, tunnel_total=100.0)
    guest, task = await open_conn(door, connect("git.example", 22))
    assert (await read_head(guest)).startswith(b"HTTP/1.1 200")
    rounds = 0
    while not task.done() and rounds < 10:
        await guest.send_all(b"x")  # echoed by the origin: activity both ways
        assert await guest.receive() == b"x"
        clock.advance(20.0)  # under the idle timeout each time
        await _settled(clock, task)
        rounds += 1
    await asyncio.wait_for(task, 5)
    assert rounds == 5  # 5 x 20 s: cut at 100 s, not before
    outcome = await _complete(signer)
    assert outcome["ended"].startswith("time limit") and "--tunnel-total" in outcome["ended"]


# --- records of guest bytes -----------------------------------------------------------


@pytest.mark.parametrize("text, want", [
    ("plain words", "plain words"),
    ("tab\there", "tab\\x09here"),
    ("esc\x1b[31m", "esc\\x1b[31m"),
    ("back\\slash", "back\\\\slash"),
    ("é", "\\xe9"),
    ("\u2028", "\\u2028"),
])
def test_excerpt_escapes_every_byte_that_is_not_printable_ascii(text: str, want: str) -> None:
    assert excerpt(text) == want


def test_excerpt_is_bounded_and_says_how_much_was_left_out() -> None:
    """Attack: a refusal reason quoting a whole 8 KB request line in a durable record."""
    out = excerpt("a" * 8000, 200)
    assert len(out) <= 200 + 20 and out.endswith("...(+7800 chars)")
    assert len(excerpt("\x00" * 8000, 200)) <= 220


def test_refusals_past_the_first_few_are_one_summary_per_interval() -> None:
    """Attack: ask for refusals as fast as possible to grow the shared log."""
    log = RefusalLog(full=3, interval=60.0)
    own = [log.admit(float(i) / 100, "request", "h") for i in range(1000)]
    assert sum(1 for o, _ in own if o) == 3
    assert all(d is None for _, d in own)
    admitted, summary = log.admit(61.0, "tls", "h2")
    assert admitted and summary is not None
    assert summary["refusals"] == 997 and summary["by_stage"] == {"request": 997}
    assert summary["by_host"] == {"h": 997}
    assert log.flush(62.0) is None  # the new interval's one refusal was recorded itself


def test_summary_names_a_bounded_number_of_hosts() -> None:
    log = RefusalLog(full=0, interval=60.0)
    for i in range(500):
        log.admit(1.0, f"stage{i}", f"host{i}.example")
    summary = log.flush(2.0)
    assert summary is not None and summary["refusals"] == 500
    assert len(summary["by_host"]) <= 16 and len(summary["by_stage"]) <= 16


# --- a per-run record budget -----------------------------------------------------------


def test_record_budget_stops_the_run_once_and_keeps_a_reserve_for_the_host() -> None:
    """Attack: make records until the run cannot be exported, hiding it."""

    async def main() -> None:
        inner = FakeSigner()
        told: list[tuple[str, str]] = []
        s = BudgetedSigner(inner, max_records=10, max_bytes=1 << 30, reserve_records=3,
                           on_exhausted=lambda run, why: told.append((run, why)))
        await s.open_run("r", {"box": "b"})
        for _ in range(9):
            await s.event("r", "tkbox.egress.refused", {"reason": "x"})
        with pytest.raises(RecordBudgetExhausted, match="record budget"):
            await s.event("r", "tkbox.egress.refused", {"reason": "x"})
        assert len(told) == 1 and told[0][0] == "r"
        with pytest.raises(SignerUnavailable):  # the guest's crossings: refused at once
            await s.decide("r", "Connect", {"host": "h"}, {})
        await s.event("r", "tkbox.containment", {"reason": told[0][1]})  # the host's: kept
        await s.decide("r", "Write", {"path": "a"}, {})
        await s.event("r", "tkbox.box.stop", {})
        with pytest.raises(RecordBudgetExhausted, match="reserve"):
            await s.event("r", "tkbox.box.stop", {})
        await s.close_run("r")  # never refused: export must work
        assert len(told) == 1
        assert len(inner.of_run("r")) == 1 + 9 + 3 + 1

    asyncio.run(main())


def test_byte_budget_counts_what_a_record_adds_to_the_bundle() -> None:
    small, big = estimate({"a": 1}), estimate({"a": "x" * 3000})
    assert big - small >= 3000 * 4 // 3

    async def main() -> None:
        s = BudgetedSigner(FakeSigner(), max_records=10**6, max_bytes=estimate({}) * 3 + 100)
        await s.open_run("r", {})
        await s.event("r", "k", {})
        with pytest.raises(RecordBudgetExhausted):
            await s.event("r", "k", {"a": "x" * 5000})

    asyncio.run(main())
