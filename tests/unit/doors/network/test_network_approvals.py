"""The approval board: waits, answers, limits, records."""

from __future__ import annotations

import asyncio

import pytest

from tkbox._clock import FakeClock
from tkbox.doors.network.approvals import ApprovalBoard
from tkbox.doors.network.testing import aiotest
from tkbox.errors import Refused, SignerUnavailable, UserError
from tkbox.record.testing import FakeSigner


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def board(**kw: object) -> tuple[ApprovalBoard, FakeSigner, FakeClock]:
    signer = FakeSigner()
    signer._open.update({"run-a", "run-b"})
    clock = FakeClock()
    return ApprovalBoard(signer, clock, **kw), signer, clock  # type: ignore[arg-type]


@aiotest
async def test_an_approval_waits_for_a_person_and_is_recorded_before_it_counts() -> None:
    b, signer, clock = board()
    waiter = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "example.com", 443))
    await settle()
    [p] = b.list()
    assert (p.box, p.id, p.host, p.port, p.since) == ("demo", 1, "example.com", 443, clock.time())
    await b.answer("demo", 1, allow=True)
    ans = await waiter
    assert ans.approved and ans.id == 1 and b.list() == []
    states = [r["body"]["state"] for r in signer.of_run("run-a", "tkbox.approval")]
    assert states == ["pending", "approved"]


@aiotest
async def test_a_denial_is_recorded_and_answers_the_waiter() -> None:
    b, signer, _ = board()
    waiter = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "example.com", 443))
    await settle()
    await b.answer("demo", 1, allow=False)
    assert (await waiter).outcome == "denied"
    assert signer.of_run("run-a", "tkbox.approval")[-1]["body"]["by"] == "a person on the host"


@aiotest
async def test_an_unanswered_approval_expires_after_the_wait() -> None:
    b, signer, clock = board(wait_seconds=120.0)
    waiter = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "example.com", 443))
    await settle()
    clock.advance(119.0)
    await settle()
    assert not waiter.done()
    clock.advance(1.0)
    assert (await waiter).outcome == "expired"
    assert (
        b.list() == []
        and signer.of_run("run-a", "tkbox.approval")[-1]["body"]["state"] == "expired"
    )


@aiotest
async def test_the_same_host_and_port_join_one_approval() -> None:
    b, _, _ = board()
    w1 = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "example.com", 443))
    w2 = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "example.com", 443))
    await settle()
    assert len(b.list()) == 1
    await b.answer("demo", 1, allow=True)
    assert (await w1).approved and (await w2).approved


@aiotest
async def test_approval_flood_is_refused_at_once_beyond_16_pending() -> None:
    """Stops a box burying the person (and the daemon) under approvals."""
    b, _, _ = board()
    waiters = [
        asyncio.ensure_future(b.wait_for_answer("demo", "run-a", f"h{i}.example", 443))
        for i in range(16)
    ]
    await settle()
    with pytest.raises(Refused, match="16 approvals pending"):
        await b.wait_for_answer("demo", "run-a", "h99.example", 443)
    # another box is unaffected
    other = asyncio.ensure_future(b.wait_for_answer("other", "run-b", "h0.example", 443))
    await settle()
    assert len(b.list()) == 17
    await b.stop_box("demo")
    await b.stop_box("other")
    outcomes = {(await w).outcome for w in [*waiters, other]}
    assert outcomes == {"stopped"}


@aiotest
async def test_approval_flood_is_refused_beyond_30_opened_a_minute() -> None:
    """Stops a box opening approvals as fast as it can answer them itself by expiry."""
    b, _, clock = board(wait_seconds=1.0)
    for i in range(30):
        w = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", f"h{i}.example", 443))
        await settle()
        clock.advance(1.0)
        assert (await w).outcome == "expired"
    with pytest.raises(Refused, match="30 approvals in the last minute"):
        await b.wait_for_answer("demo", "run-a", "late.example", 443)
    clock.advance(31.0)  # the first openings leave the window
    w = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "late.example", 443))
    await settle()
    assert len(b.list()) == 1
    w.cancel()


@aiotest
async def test_unknown_approval_is_the_users_error() -> None:
    b, _, _ = board()
    with pytest.raises(UserError, match="tkbox approvals"):
        await b.answer("demo", 7, allow=True)


@aiotest
async def test_answer_without_the_signer_fails_closed_and_stays_pending() -> None:
    b, signer, _ = board()
    waiter = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "example.com", 443))
    await settle()
    signer.available = False
    with pytest.raises(SignerUnavailable):
        await b.answer("demo", 1, allow=True)
    assert not waiter.done() and len(b.list()) == 1
    signer.available = True
    await b.answer("demo", 1, allow=True)
    assert (await waiter).approved


@aiotest
async def test_a_connection_that_goes_away_abandons_its_approval() -> None:
    b, signer, _ = board()
    waiter = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "example.com", 443))
    await settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert b.list() == []
    assert signer.of_run("run-a", "tkbox.approval")[-1]["body"]["state"] == "abandoned"


@aiotest
async def test_a_waiter_cut_as_its_box_stops_leaves_quietly_and_is_recorded_once() -> None:
    """The box's stop ends its approvals and cuts their connections in the same turn:
    the waiter must leave with its cancellation (no error about an approval already
    ended), and the record says `stopped` once, never also `abandoned`."""
    b, signer, _ = board()
    waiter = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "example.com", 443))
    await settle()
    asyncio.get_running_loop().call_soon(waiter.cancel)  # the cut, as the door's stop does
    await b.stop_box("demo")
    with pytest.raises(asyncio.CancelledError):
        await waiter
    states = [r["body"]["state"] for r in signer.of_run("run-a", "tkbox.approval")]
    assert states == ["pending", "stopped"]
    assert asyncio.all_tasks() == {asyncio.current_task()}


@aiotest
async def test_a_request_under_an_ask_rule_waits_with_its_method_and_path_shown() -> None:
    """An `ask` rule holds one request: its method and path are shown and recorded,
    escaped and bounded (guest bytes); an identical request joins it, another path
    opens its own, and requests and hosts share the box's limits."""
    b, signer, _ = board(max_pending=3)
    path = "/repos/acme/app/git/refs/heads/\x1b[31mred" + "x" * 600
    first = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "api.test", 443,
                                                    ("DELETE", path)))
    again = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "api.test", 443,
                                                    ("DELETE", path)))
    other = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "api.test", 443,
                                                    ("DELETE", "/other")))
    host = asyncio.ensure_future(b.wait_for_answer("demo", "run-a", "new.test", 443))
    await settle()
    items = b.list()
    assert [(p.method, p.host) for p in items] == [("DELETE", "api.test"),
                                                   ("DELETE", "api.test"), (None, "new.test")]
    shown = items[0].path
    assert shown is not None and "\x1b" not in shown and "\\x1b[31mred" in shown
    assert len(shown) < 560 and shown.endswith("chars)")
    with pytest.raises(Refused, match="DELETE /third on api.test:443 waits for a person"):
        await b.wait_for_answer("demo", "run-a", "api.test", 443, ("DELETE", "/third"))
    await b.answer("demo", items[0].id, allow=True)
    assert (await first).approved and (await again).approved
    pending = [r["body"] for r in signer.of_run("run-a", "tkbox.approval")
               if r["body"]["state"] == "pending"]
    assert pending[0]["method"] == "DELETE" and pending[0]["path"] == shown
    assert "method" not in pending[-1]  # the host's approval names no request
    for w in (other, host):
        w.cancel()
    await asyncio.gather(other, host, return_exceptions=True)
