"""A work budget per guest: how much host CPU its frames may cost each second.

Every frame a guest sends costs the host's single event loop something to
parse, whether or not it breaks a rule: a flood of one-byte mux frames, or of
small msgpack maps, is not a protocol violation, but unbounded it would take
the loop from every other box. So each box's transport owns one `Budget`, a
token bucket counted in *units of work* (one mux frame is one unit; one
msgpack frame costs one unit plus one per object it holds). The reader of that
box spends units for what it parsed and, when the bucket is empty, sleeps
until it refills: the guest is simply read more slowly, and every other box
keeps its share of the loop.

    tokens(t) = min(burst, tokens(t0) + rate × (t − t0))

`Budget.spend(n)` returns how long to wait (0.0 while tokens last); it never
blocks, so the sans-IO cores stay sans-IO and tests use a fake clock.
`throttled` counts the seconds a guest was held back, for `tkbox inspect`.

Standard library only: the guest agent imports `tkbox.protocol`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

#: units a second a guest may cost: about 5% of one core at ~2.5 µs a unit
RATE = 20_000.0
#: units a guest may spend at once after a quiet spell
BURST = 20_000.0


class Budget:
    """A token bucket of work units; see the module docstring."""

    def __init__(self, rate: float = RATE, burst: float = BURST,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """`clock` and `sleep`: a test's fake clock (`tkbox._clock.FakeClock`'s
        `monotonic` and `sleep`), so time passes when the test says."""
        if rate <= 0 or burst <= 0:
            raise ValueError("a budget needs a positive rate and burst")  # our bug, not input
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = burst
        self._at = clock()
        self.spent = 0
        self.throttled = 0.0

    @classmethod
    def unlimited(cls) -> Budget:
        """For the guest's side: the host is trusted, and its downloads must not be slowed."""
        return cls(rate=float("inf"), burst=float("inf"))

    def _refill(self) -> None:
        now = self._clock()
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def spend(self, units: int) -> float:
        """Take `units`; the seconds the caller must wait before its next read (0 if none)."""
        self._refill()
        self.spent += units
        self._tokens -= units
        if self._tokens >= 0:
            return 0.0
        wait = -self._tokens / self.rate
        self.throttled += wait
        return wait

    async def wait_spend(self, units: int) -> None:
        """`spend`, then sleep for as long as it says."""
        wait = self.spend(units)
        if wait > 0:
            await self._sleep(wait)

    async def pause(self, wait: float) -> None:
        """Sleep the `wait` that `spend` returned; at 0, one turn of the loop still."""
        if wait > 0:
            await self._sleep(wait)
        else:
            await asyncio.sleep(0)
