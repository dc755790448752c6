"""Approvals: a person on the host lets a box reach a host it was not allowed.

One `ApprovalBoard` is shared by every box of the daemon. A box's door asks
with `wait_for_answer(...)`; the connection waits (up to two minutes) until
someone on the host calls `answer(box, id, allow, via)` through the daemon's API
(`tkbox approve BOX ID` / `tkbox deny BOX ID`). Nothing from the VM reaches
`answer`: the door holds only `wait_for_answer`, and the guest's bytes never
name an approval.

`via` is the kind of client that sent the answer, as that client says: the
CLI (a person), the SDK (a program), or `tkbox mcp --answer-approvals` (an
agent, which may be answering what a box's output asked it to). The record
and the connection's reason say which, never "a person" for the other two.

An approval may also be for one HTTP request on a host whose rules say `ask`
(`method` and `path` set, each bounded): the request waits, not the
connection. Requests and hosts share the limits below.

Limits per box, refused at once beyond them (so a flood from one box cannot
bury the person or the daemon): at most `max_pending` (16) pending, at most
`max_per_minute` (30) opened in any 60 seconds. A second connection to the
same host and port (or a second identical request) joins the pending approval
instead of opening another.

Every approval is recorded in the box's run as a `tkbox.approval` event:
when it opens, and how it ends (approved or denied by a person, expired,
box stopped, connection gone). An answer is recorded before the waiting connection learns it,
so a connection never proceeds on an answer the record lacks; if the signer
is down, `answer` raises `SignerUnavailable` and the approval stays pending.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Any, Literal

from tkbox._clock import Clock
from tkbox.doors.network.records import excerpt
from tkbox.errors import Refused, UserError
from tkbox.record.client import SignerClient

WAIT_SECONDS = 120.0
MAX_PENDING = 16
MAX_PER_MINUTE = 30
#: characters of a request's method and path an approval shows and records
MAX_METHOD = 32
MAX_PATH = 512


@dataclass(frozen=True)
class PendingApproval:
    box: str
    id: int
    host: str
    port: int
    since: float  # wall-clock seconds
    method: str | None = None  # for one HTTP request under an `ask` rule
    path: str | None = None

    @property
    def what(self) -> str:
        where = f"{self.host}:{self.port}"
        return where if self.method is None else f"{self.method} {self.path} on {where}"


#: the clients that may answer, and who each answer is recorded as coming from
Via = Literal["cli", "sdk", "mcp"]
ANSWERED_BY: dict[str, str] = {
    "cli": "a person on the host",
    "sdk": "a program on the host (the tkbox SDK)",
    "mcp": "an agent through tkbox mcp --answer-approvals",
}


@dataclass(frozen=True)
class Answer:
    id: int
    outcome: Literal["approved", "denied", "expired", "stopped", "abandoned"]
    by: str = ""  # who answered, for "approved" and "denied" (ANSWERED_BY)

    @property
    def approved(self) -> bool:
        return self.outcome == "approved"


@dataclass
class _Pending:
    info: PendingApproval
    run_id: str
    opened: float
    future: asyncio.Future[Answer]
    waiters: int = 0


@dataclass
class _Box:
    next_id: int = 1
    pending: dict[int, _Pending] = field(default_factory=dict)
    opened: collections.deque[float] = field(default_factory=collections.deque)


class ApprovalBoard:
    def __init__(
        self,
        signer: SignerClient,
        clock: Clock,
        wait_seconds: float = WAIT_SECONDS,
        max_pending: int = MAX_PENDING,
        max_per_minute: int = MAX_PER_MINUTE,
    ) -> None:
        self._signer = signer
        self._clock = clock
        self.wait_seconds = wait_seconds
        self.max_pending = max_pending
        self.max_per_minute = max_per_minute
        self._boxes: dict[str, _Box] = {}

    def list(self) -> list[PendingApproval]:
        """Every pending approval, oldest first."""
        out = [p.info for b in self._boxes.values() for p in b.pending.values()]
        return sorted(out, key=lambda p: (p.since, p.box, p.id))

    async def answer(self, box: str, approval_id: int, allow: bool,
                     via: Via = "cli") -> PendingApproval:
        """An answer from the host, sent through `via` (recorded as `ANSWERED_BY[via]`).
        Raises UserError if no such approval is pending."""
        b = self._boxes.get(box)
        p = b.pending.get(approval_id) if b else None
        if b is None or p is None:
            raise UserError(
                f"no pending approval {approval_id} for box {box!r}; see tkbox approvals"
            )
        outcome: Literal["approved", "denied"] = "approved" if allow else "denied"
        by = ANSWERED_BY[via]
        await self._record(p, outcome, by=by)
        # the record is durable: only now may the connection learn the answer
        if b.pending.pop(approval_id, None) is not None and not p.future.done():
            p.future.set_result(Answer(approval_id, outcome, by))
        return p.info

    async def stop_box(self, box: str) -> None:
        """The box is stopping: every pending approval of it ends, unanswered."""
        b = self._boxes.pop(box, None)
        if b is None:
            return
        stopped = list(b.pending.values())
        b.pending.clear()  # ended here: a waiter leaving now must not end them again
        for p in stopped:
            if not p.future.done():
                p.future.set_result(Answer(p.info.id, "stopped"))
            await self._record(p, "stopped", by="tkbox (the box stopped)")

    async def wait_for_answer(self, box: str, run_id: str, host: str, port: int,
                              request: tuple[str, str] | None = None) -> Answer:
        """Open (or join) an approval and wait for its answer or its expiry.
        `request`: (method, path) of one HTTP request an `ask` rule holds.

        Raises `Refused` at once when the box has too many pending or opened
        too many in the last minute.
        """
        method = path = None
        if request is not None:  # guest bytes: shown to a person, so escaped and bounded
            method, path = excerpt(request[0], MAX_METHOD), excerpt(request[1], MAX_PATH)
        b = self._boxes.setdefault(box, _Box())
        for p in b.pending.values():
            if (p.info.host, p.info.port, p.info.method, p.info.path) == (host, port, method,
                                                                            path):
                return await self._wait(b, p)
        now = self._clock.monotonic()
        while b.opened and now - b.opened[0] >= 60.0:
            b.opened.popleft()
        what = (f"{host}:{port} is not allowed" if method is None else
                f"{method} {path} on {host}:{port} waits for a person")
        if len(b.pending) >= self.max_pending:
            raise Refused(
                f"refused: {what} and box {box} already has "
                f"{self.max_pending} approvals pending; answer them on the host (tkbox approvals)"
            )
        if len(b.opened) >= self.max_per_minute:
            raise Refused(
                f"refused: {what} and box {box} opened "
                f"{self.max_per_minute} approvals in the last minute; try again later or "
                "add it with --allow"
            )
        info = PendingApproval(box, b.next_id, host, port, self._clock.time(), method, path)
        b.next_id += 1
        b.opened.append(now)
        p = _Pending(info, run_id, now, asyncio.get_running_loop().create_future())
        b.pending[info.id] = p
        recorded = False
        try:
            await self._signer.event(
                run_id,
                "tkbox.approval",
                {
                    "id": info.id,
                    "host": host,
                    "port": port,
                    **_request_fields(info),
                    "state": "pending",
                    "wait_ms": int(self.wait_seconds * 1000),
                },
            )
            recorded = True
        finally:
            if not recorded:  # not in the record (signer down, or cancelled): never pending
                b.pending.pop(info.id, None)
        return await self._wait(b, p)

    async def _wait(self, b: _Box, p: _Pending) -> Answer:
        p.waiters += 1
        remaining = p.opened + self.wait_seconds - self._clock.monotonic()
        try:
            # the expiry timer is a task of this wait's own group: it ends with the wait
            async with asyncio.TaskGroup() as tg:
                timer = tg.create_task(self._clock.sleep(max(0.0, remaining)))
                waits: set[asyncio.Future[Any]] = {p.future, timer}
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                timer.cancel()
        except asyncio.CancelledError:
            # the connection went away; the last one to leave ends the approval
            if (p.waiters == 1 and b.pending.pop(p.info.id, None) is not None
                    and not p.future.done()):
                p.future.set_result(Answer(p.info.id, "abandoned"))
                await self._record(p, "abandoned", by="the connection ended before an answer")
            raise
        finally:
            p.waiters -= 1
        if p.future.done():
            return p.future.result()
        # expired: the first waiter to notice ends it, for everyone
        if b.pending.pop(p.info.id, None) is not None:
            p.future.set_result(Answer(p.info.id, "expired"))
            await self._record(p, "expired", by="nobody answered in time")
        return p.future.result()

    async def _record(self, p: _Pending, outcome: str, by: str) -> None:
        await self._signer.event(
            p.run_id,
            "tkbox.approval",
            {
                "id": p.info.id,
                "host": p.info.host,
                "port": p.info.port,
                **_request_fields(p.info),
                "state": outcome,
                "by": by,
                "waited_ms": int((self._clock.monotonic() - p.opened) * 1000),
            },
        )


def _request_fields(info: PendingApproval) -> dict[str, str]:
    """The request an approval is for, in its records (none for a host's approval)."""
    if info.method is None or info.path is None:
        return {}
    return {"method": info.method, "path": info.path}
