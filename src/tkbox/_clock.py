"""The clock interface the door and the approval board use, with a fake.

`monotonic()` measures waits and rates, `time()` stamps what a person sees
(`since` of a pending approval), `sleep()` waits. `FakeClock` moves only when
a test calls `advance()`, waking every sleeper whose deadline has passed.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time as _time
from abc import ABC, abstractmethod


class Clock(ABC):
    @abstractmethod
    def monotonic(self) -> float: ...

    @abstractmethod
    def time(self) -> float: ...

    @abstractmethod
    async def sleep(self, seconds: float) -> None: ...


class SystemClock(Clock):
    def monotonic(self) -> float:
        return _time.monotonic()

    def time(self) -> float:
        return _time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class FakeClock(Clock):
    """A clock that moves only on `advance()`."""

    def __init__(self, start: float = 1_000.0, wall: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall - start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + max(0.0, seconds), next(self._seq), fut))
        await fut

    def advance(self, seconds: float) -> None:
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())
