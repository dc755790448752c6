"""Every task the daemon starts has an owner, and ends with it.

`TaskOwner` is the owner of a box's tasks (its VM and transport watchers, its
`--timeout`, its commands, a containment) and of the daemon's own background
tasks (the signer's push channel, a run whose budget ran out). `aclose` cancels
every task it owns and waits for each to end; after it, `spawn` refuses, so
nothing outlives its owner.

Why not `asyncio.TaskGroup`: a box lives across many API requests, so its
tasks have no one `async with` block to live in, and one of a box's tasks
failing (a watcher, a command) must not cancel the others. An owner keeps the
rule that matters (no task without an owner, all of them cancelled *and
awaited* at the end) without those two.

Cancellation is never swallowed: `cancel_and_wait` ends a task it owns and
takes that task's own end (its `CancelledError` or its error), but re-raises
if the caller itself is being cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from tkbox.errors import InternalError, TkboxError

log = logging.getLogger("tkbox.daemon")

T = TypeVar("T")


class TaskOwner:
    """The tasks of one owner (a box, the daemon): spawned here, all ended by `aclose`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str = "",
              awaited: bool = False) -> asyncio.Task[T]:
        """Start `coro` as a task of this owner. `awaited`: the caller awaits the task
        and handles its error itself; otherwise an error ending it is logged here
        (a `TkboxError` as a warning, anything else as a bug, with its traceback)."""
        if self._closed:
            coro.close()
            raise InternalError(f"{self.name} has ended; it cannot start {name or 'a task'}")
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}: {name}")
        self._tasks.add(task)
        task.add_done_callback(self._done_awaited if awaited else self._done)
        return task

    def _done_awaited(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # taken here, so no task's error goes unseen
        if isinstance(exc, TkboxError):
            log.warning("%s failed: %s: %s", task.get_name(), exc.__class__.__name__, exc)
        elif exc is not None:
            log.error("%s failed (a bug in tkbox)", task.get_name(), exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Cancel every task (but the caller's own) and wait until each has ended."""
        self._closed = True
        me = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not me]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and wait for it to end, taking its own end (cancelled or failed);
    a cancellation of the caller is re-raised, never taken for the task's."""
    task.cancel()
    with contextlib.suppress(Exception):  # the task's own failure: it is ending, as asked
        try:
            await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise


def being_cancelled() -> bool:
    """Whether the running task itself is being cancelled (not merely awaiting a task
    that was): a cancellation that must be passed on, never taken."""
    me = asyncio.current_task()
    return me is not None and me.cancelling() > 0
