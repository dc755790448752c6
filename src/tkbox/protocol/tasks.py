"""Task ownership for objects whose life is not one `async with` block.

A transport or a VM lives from `start` to `aclose`/`wait`, across many calls,
so its tasks cannot all sit in one `asyncio.TaskGroup` block. `TaskOwner` is
the owner they belong to instead: every task is started through `spawn`, kept
until it ends, and `aclose` cancels what is left and awaits each one.

Cancellation is never swallowed: the owned tasks' own cancellation is
expected and taken, but when the task calling `aclose` (or `cancel_and_wait`)
is cancelled while it waits, its `CancelledError` propagates (the owned tasks
have been cancelled by then; they end on their own). What an owned task raised is logged by
type (its text may carry bytes a guest sent), never re-raised into the owner's
caller, since the owner's caller did not start it.

Standard library only: the guest agent imports this module.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and wait until it has ended.

    Its own cancellation, or an error it ended with, is taken here; the
    caller's cancellation is not: if the calling task is cancelled while
    waiting, CancelledError propagates.
    """
    if task.done():
        _collect(task)
        return
    task.cancel()
    try:
        await asyncio.wait({task})  # raises only if the caller itself is cancelled
    finally:
        if task.done():
            _collect(task)


def _collect(task: asyncio.Future[Any]) -> None:
    """Mark a finished task's outcome as seen; log an unexpected error by type."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        name = task.get_name() if isinstance(task, asyncio.Task) else "future"
        log.warning("task %s ended with %s", name, type(exc).__name__)


class TaskOwner:
    """Owns tasks started with `spawn`; `aclose` cancels and awaits all of them."""

    def __init__(self, name: str = "") -> None:
        self._name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    def spawn(self, coro: Coroutine[Any, Any, T], name: str = "") -> asyncio.Task[T]:
        """Run `coro` in a task this owner holds until it ends or `aclose` runs."""
        if self.closed:
            coro.close()
            raise RuntimeError(f"task owner {self._name} is closed")
        task = asyncio.get_running_loop().create_task(coro, name=name or self._name or None)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        # An error nobody awaits is still seen (logged by type), never lost silently.
        self._tasks.discard(task)
        _collect(task)

    def __len__(self) -> int:
        return len(self._tasks)

    def cancel(self) -> None:
        """Cancel every task now and take no more; `aclose` then waits for them."""
        self.closed = True
        for task in self._tasks:
            task.cancel()

    async def aclose(self) -> None:
        """Cancel every task still running and wait for each. Idempotent.

        Raises CancelledError if the calling task is cancelled meanwhile.
        """
        self.cancel()
        tasks = list(self._tasks)
        if not tasks:
            return
        try:
            await asyncio.wait(tasks)  # raises only if the caller itself is cancelled
        finally:
            for task in tasks:
                if task.done():
                    _collect(task)
