"""Every task the daemon starts has an owner that cancels *and* awaits it, and no
cancellation of the caller is ever taken for the end of the task it waited on."""

from __future__ import annotations

import asyncio

import pytest

from tkbox._tasks import TaskOwner, cancel_and_wait
from tkbox.errors import GuestError, InternalError


def test_aclose_cancels_and_awaits_every_task_and_then_refuses_new_ones() -> None:
    ended: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # a cleanup step: aclose must wait for it
            ended.append(name)

    async def main() -> None:
        owner = TaskOwner("box b", quote=True)
        a, b = owner.spawn(forever("a")), owner.spawn(forever("b"))
        await asyncio.sleep(0)
        assert len(owner) == 2
        await owner.aclose()
        assert a.cancelled() and b.cancelled() and sorted(ended) == ["a", "b"]
        assert len(owner) == 0
        coro = forever("late")
        with pytest.raises(InternalError, match="box b has ended"):
            owner.spawn(coro)

    asyncio.run(main())


def test_a_task_closing_its_own_owner_is_not_awaited_by_itself() -> None:
    async def main() -> None:
        owner = TaskOwner("box b", quote=True)
        other = owner.spawn(asyncio.Event().wait())

        async def rm() -> str:
            await owner.aclose()  # `tkbox rm` from a box's own task (its --timeout)
            return "closed"

        assert await owner.spawn(rm()) == "closed" and other.cancelled()

    asyncio.run(asyncio.wait_for(main(), 5))


def test_a_failed_task_is_logged_not_lost(caplog: pytest.LogCaptureFixture) -> None:
    """A task nobody awaits: its error is logged (a bug as an error, with its
    traceback); a task its spawner awaits leaves its error to the spawner."""

    async def boom(exc: Exception) -> None:
        raise exc

    async def main() -> None:
        owner = TaskOwner("box b", quote=True)
        tasks = [owner.spawn(boom(ValueError("the watcher broke")), name="watcher"),
                 owner.spawn(boom(GuestError("guest gone")), name="door"),
                 owner.spawn(boom(GuestError("handled")), name="exec", awaited=True)]
        await asyncio.wait(tasks)
        with pytest.raises(GuestError, match="handled"):
            await tasks[2]
        await owner.aclose()

    with caplog.at_level("WARNING", logger="tkbox.daemon"):
        asyncio.run(main())
    by_level = {(r.levelname, r.getMessage()) for r in caplog.records}
    assert ("ERROR", "box b: watcher failed (a bug in tkbox)") in by_level
    assert ("WARNING", "box b: door failed: GuestError: guest gone") in by_level
    assert "handled" not in caplog.text
    assert "ValueError: the watcher broke" in caplog.text  # the traceback is kept


def test_cancel_and_wait_takes_the_tasks_end_but_passes_on_the_callers_cancellation() -> None:
    async def main() -> None:
        task = asyncio.get_running_loop().create_task(asyncio.Event().wait())
        await cancel_and_wait(task)  # the task's own CancelledError is taken
        assert task.cancelled()

        stuck_started = asyncio.Event()
        release = asyncio.Event()

        async def stubborn() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                stuck_started.set()
                await release.wait()  # slow to end: the caller is cancelled meanwhile
                raise

        inner = asyncio.get_running_loop().create_task(stubborn())
        await asyncio.sleep(0)

        async def caller() -> str:
            await cancel_and_wait(inner)
            return "went on as if not cancelled"

        outer = asyncio.get_running_loop().create_task(caller())
        await stuck_started.wait()
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        assert not inner.done()  # the caller's cancellation came while the task still ran
        release.set()
        await asyncio.wait({inner})

    asyncio.run(asyncio.wait_for(main(), 5))
