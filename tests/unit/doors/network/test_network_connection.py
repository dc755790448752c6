"""One connection's waits, ends and tasks (`tkbox.doors.network.connection`), and the
error types the door maps its failures to."""

from __future__ import annotations

import asyncio

import pytest

from tkbox._clock import FakeClock
from tkbox.doors.network.connection import (
    Connection,
    Ending,
    TimeLimits,
    run_crossing,
    run_directions,
)
from tkbox.doors.network.errors import ConnectionEnded, EgressRefused, OriginError, Stage
from tkbox.doors.network.request import BadRequest
from tkbox.doors.network.testing import aiotest
from tkbox.doors.network.tls import TLSRefused
from tkbox.errors import GuestError, Refused, RemoteError
from tkbox.protocol.streams import StreamClosed


async def forever() -> str:
    await asyncio.Event().wait()
    return "never"


async def settle(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@aiotest
async def test_end_interrupts_a_wait_at_once_with_its_reason() -> None:
    conn = Connection()
    waiter = asyncio.ensure_future(conn.wait_for(forever()))
    await settle()
    conn.end("box stopped")
    with pytest.raises(ConnectionEnded) as info:
        await waiter
    assert info.value.reason == "box stopped" and conn.ended == "box stopped"
    conn.end("idle timeout: later")  # the first reason stays
    assert conn.ended == "box stopped"


@aiotest
async def test_a_cancellation_from_outside_is_not_taken_for_an_end() -> None:
    """The daemon cancelling a handler must see CancelledError, never a swallowed
    cancellation turned into an ordinary end."""
    conn = Connection()
    waiter = asyncio.ensure_future(conn.wait_for(forever()))
    await settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert conn.ended is None


@aiotest
async def test_a_wait_after_the_end_refuses_without_running_the_coroutine() -> None:
    conn = Connection()
    conn.end("box stopped")
    ran = False

    async def work() -> None:
        nonlocal ran
        ran = True

    with pytest.raises(ConnectionEnded):
        await conn.wait_for(work())
    assert ran is False


@aiotest
async def test_a_timeout_is_a_timeout_not_an_end() -> None:
    conn = Connection()
    with pytest.raises(TimeoutError):
        await conn.wait_for(forever(), timeout=0.01)
    assert conn.ended is None


@aiotest
async def test_the_end_wins_over_a_failure_the_cut_caused() -> None:
    """A stream that breaks because it was cut reports the cut, not a reset."""
    conn = Connection()

    async def breaks_when_cancelled() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise StreamClosed("cut") from None
        return "never"

    waiter = asyncio.ensure_future(conn.wait_for(breaks_when_cancelled()))
    await settle()
    conn.end("box stopped")
    with pytest.raises(ConnectionEnded):
        await waiter


@aiotest
async def test_idle_and_total_limits_end_the_wait_and_name_their_flag() -> None:
    clock = FakeClock()
    conn = Connection()
    limits = TimeLimits(clock, idle=30.0, total=100.0)
    waiter = asyncio.ensure_future(conn.wait_for(forever(), limits=limits))
    await settle()
    clock.advance(29.0)
    await settle()
    assert not waiter.done()
    clock.advance(2.0)
    with pytest.raises(ConnectionEnded) as info:
        await waiter
    assert info.value.reason.startswith("idle timeout") and "--tunnel-idle" in info.value.reason
    assert clock.sleepers == 0  # the watcher ended with the wait

    conn = Connection()
    waiter = asyncio.ensure_future(conn.wait_for(forever(), limits=limits))
    await settle()
    for _ in range(6):
        conn.up += 1  # busy: never idle
        clock.advance(20.0)
        await settle()
    with pytest.raises(ConnectionEnded) as info:
        await waiter
    assert info.value.reason.startswith("time limit") and "--tunnel-total" in info.value.reason


@aiotest
async def test_a_wait_that_ends_by_itself_leaves_no_watcher_behind() -> None:
    clock = FakeClock()
    conn = Connection()

    async def quick() -> str:
        return "done"

    assert await conn.wait_for(quick(), limits=TimeLimits(clock, 30.0, 100.0)) == "done"
    assert clock.sleepers == 0
    assert asyncio.all_tasks() == {asyncio.current_task()}


@aiotest
async def test_the_first_failing_direction_cancels_the_other_and_raises_itself() -> None:
    cancelled = asyncio.Event()

    async def fails() -> str:
        await asyncio.sleep(0)
        raise TLSRefused("refused: a hidden server name")

    async def waits() -> str:
        try:
            return await forever()
        finally:
            cancelled.set()

    with pytest.raises(TLSRefused):  # itself, not an ExceptionGroup
        await run_directions(fails, waits)
    assert cancelled.is_set()
    assert asyncio.all_tasks() == {asyncio.current_task()}


@aiotest
async def test_directions_that_end_report_in_the_order_they_ended() -> None:
    async def first() -> str:
        return "client closed"

    async def second() -> str:
        await asyncio.sleep(0)
        return "origin closed"

    assert await run_directions(second, first) == ["client closed", "origin closed"]


@aiotest
async def test_a_cut_crossing_ends_as_box_stopped_with_no_task_left() -> None:
    clock = FakeClock()
    conn = Connection()
    crossing = asyncio.ensure_future(
        run_crossing(conn, TimeLimits(clock, 30.0, 100.0), forever, forever)
    )
    await settle()
    conn.end("box stopped")
    ending = await crossing
    assert ending.outcome() == {"ended": "box stopped"}
    assert asyncio.all_tasks() == {asyncio.current_task()}


@pytest.mark.parametrize(
    ("exc", "stage", "status"),
    [
        (TLSRefused("refused: ECH"), Stage.TLS, 400),
        (OriginError("the origin sent a malformed response"), Stage.ORIGIN, 502),
        (BadRequest(400, "refused: malformed request body"), Stage.REQUEST_BODY, 400),
        (GuestError("the guest misbehaved"), Stage.REQUEST_BODY, 400),
    ],
)
def test_failures_are_mapped_to_their_stage_by_type(
    exc: Exception, stage: Stage, status: int
) -> None:
    ending = Ending.from_failure(exc)
    assert ending.refused is not None
    assert ending.refused.stage is stage and ending.refused.status == status
    assert ending.outcome() == {"ended": "refused", "reason": str(exc), "stage": stage.value}


def test_a_broken_stream_is_a_reset_and_a_bug_is_raised_again() -> None:
    assert Ending.from_failure(StreamClosed("gone")).outcome() == {"ended": "reset"}
    assert Ending.from_failure(ConnectionResetError()).outcome() == {"ended": "reset"}
    with pytest.raises(KeyError):
        Ending.from_failure(KeyError("a bug"))


def test_stage_values_are_the_bundle_formats_spelling() -> None:
    """Records carry these strings (docs/bundle-format.md): renaming one breaks readers."""
    assert {s.value for s in Stage} == {
        "limit", "internal", "request", "secret", "stop", "policy", "approval", "resolve",
        "address", "signer", "dial", "tls", "origin", "request body",
    }


def test_an_origin_failure_is_no_guest_error_and_an_end_is_no_refusal() -> None:
    """The origin is a remote party of its own: it can never be blamed on the guest.
    An end (a stop, a time limit) is no refusal, so a `Refused` handler never takes it."""
    assert issubclass(OriginError, RemoteError) and not issubclass(OriginError, GuestError)
    assert not issubclass(ConnectionEnded, Refused)
    refused = EgressRefused(403, "refused:  two  spaces kept", Stage.POLICY)
    assert isinstance(refused, Refused) and refused.reason == "refused:  two  spaces kept"
