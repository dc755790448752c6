"""TaskOwner: every task has an owner, and cancellation is never swallowed."""

from __future__ import annotations

import asyncio

import pytest

from tkbox._tasks import TaskOwner, cancel_and_wait
from tkbox.errors import InternalError


def test_aclose_cancels_and_awaits_every_task() -> None:
    async def main() -> None:
        owner = TaskOwner("t")
        ended: list[str] = []

        async def forever(name: str) -> None:
            try:
                await asyncio.Event().wait()
            finally:
                ended.append(name)

        owner.spawn(forever("a"))
        owner.spawn(forever("b"))
        await asyncio.sleep(0)
        assert len(owner) == 2
        await owner.aclose()
        assert sorted(ended) == ["a", "b"] and len(owner) == 0
        await owner.aclose()  # idempotent

    asyncio.run(main())


def test_a_closed_owner_starts_nothing() -> None:
    async def main() -> None:
        owner = TaskOwner("t")
        await owner.aclose()

        async def never() -> None:
            raise AssertionError("ran")

        coro = never()
        with pytest.raises(InternalError, match="closed"):
            owner.spawn(coro)

    asyncio.run(main())


def test_the_callers_cancellation_is_not_swallowed() -> None:
    """Closing an owner whose task will not die quickly must not eat the cancel
    aimed at the task doing the closing."""

    async def main() -> None:
        owner = TaskOwner("t")
        release = asyncio.Event()
        caught = asyncio.Event()

        async def stubborn() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                caught.set()  # aclose has cancelled it, and is waiting for it to end
                await release.wait()  # slow to end
                raise

        owner.spawn(stubborn())
        await asyncio.sleep(0)
        closer = asyncio.get_running_loop().create_task(owner.aclose())
        await caught.wait()
        closer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closer
        release.set()
        await owner.aclose()

    asyncio.run(main())


def test_cancel_and_wait_takes_the_tasks_own_end_and_errors() -> None:
    async def main() -> None:
        async def boom() -> None:
            raise ValueError("inside")

        task = asyncio.get_running_loop().create_task(boom())
        await asyncio.sleep(0)
        await cancel_and_wait(task)  # a finished task's error is collected, not raised
        sleeper = asyncio.get_running_loop().create_task(asyncio.Event().wait())
        await cancel_and_wait(sleeper)
        assert sleeper.cancelled()

    asyncio.run(main())
