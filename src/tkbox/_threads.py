"""Worker threads waited for to their end, even when the task waiting is cancelled.

`asyncio.to_thread` cannot stop its thread: a cancellation ends the task that
awaits it while the thread goes on. Where the thread writes something the task
then records or cleans up (the checkout's files, a new box's disks), the task
must wait for the thread first, or it records what did not happen and removes
what the thread is still writing. The daemon's tasks are cancelled when it
stops (uvicorn cancels the requests still running five seconds in).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["run_through", "through"]

T = TypeVar("T")


async def through(thread: asyncio.Future[Any], stop: threading.Event | None = None) -> bool:
    """Wait for `thread` to end, whatever comes meanwhile. A cancellation sets `stop`
    (which the thread's function may check, to end early) and waiting goes on. True if
    a cancellation came: the caller raises it once it has dealt with what the thread
    did."""
    cancelled = False
    while not thread.done():
        try:
            await asyncio.wait({thread})
        except asyncio.CancelledError:
            cancelled = True
            if stop is not None:
                stop.set()
    return cancelled


async def run_through(fn: Callable[..., T], *args: Any,
                      stop: threading.Event | None = None) -> T:
    """`asyncio.to_thread(fn, *args)`, except that a cancellation is raised only once
    the thread has ended. With `stop`, `fn` is called with it (`stop=`) and it is set
    at a cancellation, for `fn` to end early."""
    call = functools.partial(fn, *args) if stop is None else \
        functools.partial(fn, *args, stop=stop)
    # The thread's own future, not a task: there is nothing to cancel, only a thread
    # to wait out (what `asyncio.to_thread` does, less the task around it).
    context = contextvars.copy_context()
    thread = asyncio.get_running_loop().run_in_executor(None, context.run, call)
    if await through(thread, stop):
        if not thread.cancelled():
            thread.exception()  # seen: the cancellation is what the caller gets
        raise asyncio.CancelledError
    return thread.result()
