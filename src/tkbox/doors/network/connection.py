"""One guest proxy connection: its byte counts, its time limits, how the door ends it.

A connection is served by one task (the caller of `EgressDoor.handle`). Every
wait that the door may have to interrupt runs through
`Connection.wait_for(coro, ...)`, in that task, inside an `asyncio.Timeout`
scope the connection knows of: `end(why)` (the box is stopping, or the
tunnel's time is up) expires every such scope at once, which cancels the wait
where it is, and the scope turns the cancellation into `ConnectionEnded(why)`.
A cancellation from outside (the daemon cancelling the handler) is never taken
for an end: `asyncio.Timeout` counts cancellations and lets a foreign one
through.

The two directions of a tunnel or an HTTP exchange run as two tasks of one
`asyncio.TaskGroup` (`run_directions`): the first to fail cancels the other,
and the time-limit watcher is a third task of a group that ends with the wait.
No task outlives the call that started it.

Failures after the crossing began are mapped here, by type, to how the
connection ended (`Ending.from_failure`): the tunnel's TLS checks
(`TLSRefused`) are `Stage.TLS`, the origin (`OriginError`) `Stage.ORIGIN`, any
other guest error `Stage.REQUEST_BODY`, a broken stream `reset`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tkbox._clock import Clock
from tkbox.doors.network.errors import ConnectionEnded, EgressRefused, OriginError, Stage
from tkbox.doors.network.tls import TLSRefused
from tkbox.errors import GuestError
from tkbox.protocol.streams import StreamClosed

T = TypeVar("T")

#: how a connection that the box's stop cut ended
BOX_STOPPED = "box stopped"


@dataclass(frozen=True)
class TimeLimits:
    """A tunnel ends after `idle` s without a byte either way, or `total` s open."""

    clock: Clock
    idle: float
    total: float

    async def wait_expired(self, conn: Connection) -> str:
        """Return, with the reason, once `conn` has been idle or open too long.

        Sleeps until the next deadline, then looks at the byte counts: a wake-up
        per idle interval at most, not a poll."""
        clock = self.clock
        started = last = clock.monotonic()
        seen = (conn.up, conn.down)
        while True:
            now = clock.monotonic()
            if (conn.up, conn.down) != seen:
                seen, last = (conn.up, conn.down), now
            if now - started >= self.total:
                return f"time limit: open {self.total:g} s (tkbox daemon --tunnel-total)"
            if now - last >= self.idle:
                return f"idle timeout: no bytes for {self.idle:g} s (tkbox daemon --tunnel-idle)"
            await clock.sleep(min(last + self.idle, started + self.total) - now)


@dataclass(eq=False)
class Connection:
    """One proxy connection. `up`/`down` count the bytes relayed each way (the
    secrets door counts into them too, as its `counts`)."""

    up: int = 0
    down: int = 0
    _ended: str | None = None
    _scopes: set[asyncio.Timeout] = field(default_factory=set)

    @property
    def ended(self) -> str | None:
        """Why the door ended this connection, or None while it may go on."""
        return self._ended

    def end(self, why: str) -> None:
        """End the connection now: every `wait_for` under way raises `ConnectionEnded`.

        The first reason stays; ending twice changes nothing."""
        if self._ended is not None:
            return
        self._ended = why
        loop = asyncio.get_running_loop()
        for scope in list(self._scopes):
            if not scope.expired():
                scope.reschedule(loop.time())

    async def wait_for(
        self,
        coro: Coroutine[Any, Any, T],
        timeout: float | None = None,
        limits: TimeLimits | None = None,
    ) -> T:
        """Await `coro` here, unless the connection ends (`ConnectionEnded`) or
        `timeout` s pass (`TimeoutError`). With `limits`, a watcher ends the
        connection once it has been idle or open too long."""
        if self._ended is not None:
            coro.close()
            raise ConnectionEnded(self._ended)
        scope = asyncio.timeout(timeout)
        try:
            async with scope:
                self._scopes.add(scope)
                try:
                    if limits is None:
                        return await coro
                    return await self._with_limits(coro, limits)
                finally:
                    self._scopes.discard(scope)
        except TimeoutError:
            if self._ended is not None:
                raise ConnectionEnded(self._ended) from None
            raise
        except Exception:
            # the end raced a failure (a stream that broke as it was cut): the end wins
            if self._ended is not None and scope.expired():
                raise ConnectionEnded(self._ended) from None
            raise

    async def _with_limits(self, coro: Coroutine[Any, Any, T], limits: TimeLimits) -> T:
        async def watch() -> None:
            self.end(await limits.wait_expired(self))

        failure: Exception | None = None
        async with asyncio.TaskGroup() as tg:
            watcher = tg.create_task(watch())
            try:
                result = await coro
            except Exception as exc:  # noqa: BLE001 - raised as itself below, not as a group
                failure = exc
            finally:
                watcher.cancel()
        if failure is not None:
            raise failure
        return result


Direction = Callable[[], Coroutine[Any, Any, str]]


async def run_directions(*directions: Direction) -> list[str]:
    """Run each direction as a task of one group until all end; returns how each
    ended, in the order they did. The first to fail cancels the rest, and its
    exception (itself, not a group) is raised once all have ended."""
    ends: list[str] = []
    failures: list[Exception] = []
    tasks: list[asyncio.Task[None]] = []

    async def run(direction: Direction) -> None:
        try:
            ends.append(await direction())
        except Exception as exc:  # noqa: BLE001 - kept, the others cancelled, raised below
            failures.append(exc)
            me = asyncio.current_task()
            for t in tasks:
                if t is not me:
                    t.cancel()

    async with asyncio.TaskGroup() as tg:
        tasks.extend(tg.create_task(run(d)) for d in directions)
    if failures:
        raise failures[0]
    return ends


async def run_crossing(conn: Connection, limits: TimeLimits, *directions: Direction) -> Ending:
    """The directions of one crossing under the connection's cut and time limits,
    until all end, one fails, the door ends the connection or time is up."""
    try:
        ends = await conn.wait_for(run_directions(*directions), limits=limits)
    except ConnectionEnded as e:
        return Ending(e.reason)
    except Exception as exc:  # noqa: BLE001 - mapped by type; anything else is raised again
        return Ending.from_failure(exc)
    return Ending(" and ".join(ends) if ends else "closed")


@dataclass
class Ending:
    """How a crossing ended, for its completion record (and, if it was refused
    after the door had let it through, a `tkbox.egress.refused` event too)."""

    ended: str
    refused: EgressRefused | None = None
    facts: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_failure(cls, exc: Exception) -> Ending:
        """A direction's failure, mapped by its type. Raises `exc` again if it is
        none of the failures a crossing may meet (a bug)."""
        if isinstance(exc, TLSRefused):
            return cls.refusal(EgressRefused(400, exc.message, Stage.TLS))
        if isinstance(exc, OriginError):
            return cls.refusal(EgressRefused(502, exc.message, Stage.ORIGIN))
        if isinstance(exc, GuestError):
            return cls.refusal(EgressRefused(400, exc.message, Stage.REQUEST_BODY))
        if isinstance(exc, StreamClosed | OSError):
            return cls("reset")
        raise exc

    @classmethod
    def refusal(cls, refused: EgressRefused) -> Ending:
        return cls("refused", refused)

    def outcome(self) -> dict[str, Any]:
        """The completion's facts: `ended`, a refusal's `reason` and `stage`, the rest."""
        out: dict[str, Any] = {"ended": self.ended}
        if self.refused is not None:
            out["reason"] = self.refused.reason
            out["stage"] = self.refused.stage.value
        out.update(self.facts)
        return out
