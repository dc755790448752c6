"""Every task has an owner, and ends with it.

A box, a transport or a VM lives from its start to its `aclose`, across many
calls, so its tasks cannot all sit in one `asyncio.TaskGroup` block; and one of
a box's tasks failing (a watcher, a command) must not cancel the others, as a
TaskGroup would. `TaskOwner` is the owner they belong to instead: every task is
started through `spawn` and kept until it ends; `aclose` cancels what is left
and *awaits* each one; after it, `spawn` refuses, so nothing outlives its
owner. The daemon (a box's watchers, `--timeout`, commands; its own background
work), the VMs and the transports all use this one module.

Cancellation is never swallowed: an owned task's own cancellation is expected
and taken, but when the task calling `aclose` or `cancel_and_wait` is itself
cancelled while it waits, its `CancelledError` propagates. A task that closes
its own owner (`tkbox rm` from a box's `--timeout`) is not awaited by itself.

What a task nobody awaits raised is logged, never lost: an error of the tree
(`TkboxError`) as a warning, anything else as a bug with its traceback. Owners
below the daemon (transports, VMs), whose errors may quote what a guest sent,
log an error of the tree by its type alone; the daemon's owners, whose errors
are its own one-line messages, log the message too (`quote=True`). A task whose spawner awaits
it (`awaited=True`) leaves its error to the spawner.

Standard library and `tkbox.errors` only: the guest agent imports this module.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from tkbox.errors import InternalError, TkboxError

log = logging.getLogger("tkbox.tasks")

T = TypeVar("T")


def _log_end(task: asyncio.Future[Any], logger: logging.Logger, quote: bool = False) -> None:
    """Mark a finished task's outcome as seen; log an error nobody will await."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is None:
        return
    name = task.get_name() if isinstance(task, asyncio.Task) else "a future"
    if isinstance(exc, TkboxError):
        if quote:
            logger.warning("%s failed: %s: %s", name, exc.__class__.__name__, exc)
        else:
            logger.warning("%s failed: %s", name, exc.__class__.__name__)
    else:
        logger.error("%s failed (a bug in tkbox)", name, exc_info=exc)


class TaskOwner:
    """The tasks of one owner: spawned here, all cancelled and awaited by `aclose`."""

    def __init__(self, name: str = "", logger: logging.Logger | None = None, *,
                 quote: bool = False) -> None:
        self.name = name
        self._log = logger or log
        self._quote = quote
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, T], name: str = "", *,
              awaited: bool = False) -> asyncio.Task[T]:
        """Start `coro` as a task of this owner. `awaited`: the caller awaits the task
        and handles its error itself; otherwise an error ending it is logged here."""
        if self._closed:
            coro.close()
            raise InternalError(f"{self.name or 'the owner'} has ended (closed); it cannot "
                                f"start {name or 'a task'}")
        full = f"{self.name}: {name}" if self.name and name else (name or self.name or None)
        task = asyncio.get_running_loop().create_task(coro, name=full)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard if awaited else self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        _log_end(task, self._log, self._quote)

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        return self._closed

    def cancel(self) -> None:
        """Cancel every task (but the caller's own) now and take no more; `aclose`
        then waits for them."""
        self._closed = True
        me = asyncio.current_task()
        for task in self._tasks:
            if task is not me:
                task.cancel()

    async def aclose(self) -> None:
        """Cancel every task still running (but the caller's own) and wait for each.
        Idempotent. Raises CancelledError if the calling task is cancelled meanwhile."""
        self.cancel()
        me = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not me]
        if tasks:
            await asyncio.wait(tasks)  # raises only if the caller itself is cancelled


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and wait until it has ended, taking its own end (cancelled or
    failed, logged by type); if the calling task is cancelled while waiting, its
    CancelledError propagates, never taken for the task's."""
    if not task.done():
        task.cancel()
        try:
            await asyncio.wait({task})  # raises only if the caller itself is cancelled
        finally:
            if task.done():
                _log_end(task, log)
    else:
        _log_end(task, log)


def being_cancelled() -> bool:
    """Whether the running task itself is being cancelled (not merely awaiting a task
    that was): a cancellation that must be passed on, never taken."""
    me = asyncio.current_task()
    return me is not None and me.cancelling() > 0
