"""`tkbox exec`: one command, decided before it starts and completed after.

A command needs an allowed `Bash` decision before it starts (a signer that does
not answer refuses it); its exit status (or how it ended) is the decision's
completion. Keystrokes for a terminal pass the secrets door's input guard first.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from tkbox._tasks import being_cancelled
from tkbox.daemon import lifecycle
from tkbox.daemon.core import ManagerCore
from tkbox.daemon.guest_client import ExecInput, ExecResult
from tkbox.doors.commands.core import build_request
from tkbox.doors.secrets import prestart
from tkbox.errors import (
    GuestError,
    Refused,
    SignerUnavailable,
    TkboxError,
    UserError,
)
from tkbox.guest import rpc


class CommandVerbs(ManagerCore):
    """exec, its input, resize and signals."""

    async def exec(self, name: str, argv: list[str], cwd: str | None, env: dict[str, str] | None,
                   stdin: bytes | None,
                   tty: dict[str, int] | None = None) -> AsyncIterator[dict[str, Any]]:
        """Run one command; yields events: started, out, exit (or error).

        With `tty` (rows, cols) the command gets a terminal; its keystrokes arrive by
        `exec_input` and size changes by `exec_resize`. The decision records that it was
        a terminal; the keystrokes themselves are not in the record (docs/limits.md).
        """
        box = self.get(name)
        guest = box.guest
        if not lifecycle.takes_crossings(box.state) or guest is None:
            raise UserError(f"cannot exec in box {name}: it is {box.state}; "
                            f"{lifecycle.HINTS.get(box.state, '')}")
        try:
            prestart.check_command(box.secrets, argv, env, stdin)
        except Refused as exc:
            # A secret's value in the command: the record names the secret, not the argv.
            await self.record(box, "tkbox.command.refused", {
                "reason": str(exc)[:500], "env_names": sorted(env or {})})
            raise
        try:
            req = build_request(argv, cwd, env, stdin)
        except Refused as exc:
            # Refused before the signer was asked: still part of the record.
            await self.record(box, "tkbox.command.refused", {
                "argv0": argv[0][:256] if argv else "", "reason": str(exc)[:500],
                "env_names": sorted(env or {})})
            raise
        decision_id = None
        if not box.unrecorded:
            try:
                context = req.context()
                if tty is not None:
                    context["tty"] = True
                verdict = await self.signer.decide(box.run_id, "Bash", req.resource(),
                                                   context)
            except SignerUnavailable as exc:
                raise Refused(f"refused: the signer did not answer, so no command may run "
                              f"({exc}); start it with 'tkbox signer serve'") from None
            if not verdict.allowed:
                raise Refused(f"refused by the signer: {verdict.reason}")
            decision_id = verdict.decision_id
        exec_id = secrets.token_hex(4)
        signals: asyncio.Queue[ExecInput] = asyncio.Queue(maxsize=64)
        box.execs[exec_id] = signals
        out_q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=8)
        counts = {1: 0, 2: 0}

        async def output(fd: int, data: bytes) -> None:
            counts[fd] += len(data)
            await out_q.put({"ev": "out", "fd": fd, "data": data})

        async def run() -> ExecResult:
            try:
                return await guest.exec(list(req.argv), cwd=req.cwd, env=req.env,
                                            stdin=stdin, output=output, signals=signals,
                                            tty=tty)
            finally:
                await out_q.put(None)

        t0 = time.monotonic()
        task = box.tasks.spawn(run(), name=f"exec {exec_id}", awaited=True)
        result: ExecResult | None = None
        error: str | None = None
        try:
            yield {"ev": "started", "exec_id": exec_id, "command": req.command}
            while (item := await out_q.get()) is not None:
                yield item
            try:
                result = await task
            except GuestError as exc:
                error = str(exc)
            except asyncio.CancelledError:
                if being_cancelled():
                    raise
                error = "the command ended with its box"  # `rm --force`, daemon shutdown
            if result is not None:
                yield {"ev": "exit", "status": result.status, "signal": result.signal,
                       "error": result.error}
            else:
                yield {"ev": "error", "message": error or "the command did not finish"}
        finally:
            box.execs.pop(exec_id, None)
            box.input_guards.pop(exec_id, None)
            cancelled: asyncio.CancelledError | None = None
            if not task.done():
                # The client went away (Ctrl-C): stop the command in the guest.
                with contextlib.suppress(asyncio.QueueFull):
                    signals.put_nowait(15)
                with contextlib.suppress(Exception):  # how it ended is recorded below
                    try:
                        await asyncio.wait_for(asyncio.shield(task), 3)
                    except asyncio.CancelledError as exc:
                        if being_cancelled():
                            cancelled = exc  # ours: raised again once the outcome is recorded
                task.cancel()
            outcome = {"status": result.status if result else None,
                       "signal": result.signal if result else None,
                       "error": (error or (result.error if result else "client went away"))[:300],
                       "stdout_bytes": counts[1], "stderr_bytes": counts[2],
                       "duration_ms": int((time.monotonic() - t0) * 1000)}
            if decision_id is not None:
                try:
                    await self.signer.complete(box.run_id, decision_id, outcome)
                except TkboxError as exc:
                    self._gap(box, {"reason": f"completion not recorded: {exc}"})
                    await self.contain(box, f"a completion could not be recorded ({exc})")
            if cancelled is not None:
                raise cancelled

    def _exec_queue(self, name: str, exec_id: str) -> asyncio.Queue[ExecInput]:
        q = self.get(name).execs.get(exec_id)
        if q is None:
            raise UserError(f"no running command {exec_id} in box {name}")
        return q

    async def exec_input(self, name: str, exec_id: str, data: bytes) -> None:
        """Keystrokes for a command that has a terminal (bounded by the API's body)."""
        box = self.get(name)
        self._exec_queue(name, exec_id)
        guard = box.input_guards.setdefault(exec_id, prestart.InputGuard(box.secrets))
        try:
            data = guard.feed(data)  # no secret's value is typed into the box
        except Refused as exc:
            await self.record(box, "tkbox.command.refused", {"reason": str(exc)[:500]})
            raise
        if not data:
            return
        await asyncio.wait_for(self._exec_queue(name, exec_id).put(
            rpc.Stdin(data)), 10)

    async def exec_resize(self, name: str, exec_id: str, rows: int, cols: int) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._exec_queue(name, exec_id).put_nowait(rpc.Resize(rows, cols))

    async def signal(self, name: str, exec_id: str, sig: int) -> None:
        box = self.get(name)
        q = box.execs.get(exec_id)
        if q is None:
            raise UserError(f"no running command {exec_id} in box {name}")
        if sig not in (1, 2, 3, 9, 15):
            raise UserError("signal must be one of HUP, INT, QUIT, KILL, TERM")
        with contextlib.suppress(asyncio.QueueFull):
            q.put_nowait(sig)
