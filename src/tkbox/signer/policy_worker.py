"""Policy evaluation in worker processes, off the signer's event loop.

The signer's event loop is one thread, and deciding requests it has not seen
before it spent about half of its time in the shell reader and Cedar, while
the host's other core sat mostly idle (the writer thread and the client took
little of it). Cedar holds the GIL while it evaluates, so a thread would not
help; a process does. Each worker is `python -m tkbox.signer.policy_worker`
with its own `PolicyEngine` on the same policy file and packs: the same pure
function of the request and the policy text (it re-reads the file when it
changes, as the signer's own engine does).

What stays on the loop: the exact decision cache (a repeated request never
leaves the loop), the run's state (held, quarantined, closed: checked again
when the answer comes back, so an operator's hold that lands while a request
is being evaluated refuses it), the record and its order. What a worker does
is only `PolicyEngine.decide`.

Nothing is refused because of a worker: while none is ready (starting, or
restarting after it died), or if one fails to answer, answers garbage or dies
with requests in it, those requests are evaluated on the loop as before. A
worker that exits is started again, at most once per `RESTART_AFTER` seconds.

The channel is the worker's stdin and stdout, in the signer's own framing
(`formats.wire`: a 4-byte length and one canonical JSON object). Signer to worker:
`{"id", "run", "action", "resource", "context"}`; worker to signer: first
`{"ready": true}` once its engine is loaded, then for each request `{"id",
"decision": <Decision.record_body()>}`, or `{"id",
"error": <exception type>}` when `decide` raised (the signer then evaluates
it itself, and so answers exactly as it would have without workers). A
worker reads its stdin until EOF, so it ends with the signer, even a killed
one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from tkbox._clock import Clock, SystemClock
from tkbox._tasks import TaskOwner
from tkbox.formats import wire
from tkbox.signer.cedarpolicy import DEFAULT_PACKS, Decision, PolicyEngine

log = logging.getLogger("tkbox.signer")

RESTART_AFTER = 5.0  # seconds between starts of one worker slot


#: What `PolicyWorkers.status()` says of a signer without workers.
NONE = {"count": 0, "ready": 0, "evaluated": 0, "fell_back": 0}


def default_count() -> int:
    """One worker per core beyond the loop's own, at most 4; none on one core."""
    return max(0, min(4, (os.cpu_count() or 1) - 1))


def decision_from_json(obj: Any) -> Decision:
    """The worker's decision; ValueError if it is not one."""
    if not isinstance(obj, dict):
        raise ValueError("not an object")
    allowed, reason = obj.get("allowed"), obj.get("reason")
    policies, diagnostics = obj.get("policies"), obj.get("diagnostics")
    analysis = obj.get("analysis")
    if type(allowed) is not bool or not isinstance(reason, str) or \
            not isinstance(policies, list) or not all(isinstance(p, str) for p in policies) or \
            not isinstance(diagnostics, list) or \
            not all(isinstance(p, str) for p in diagnostics) or not isinstance(analysis, dict):
        raise ValueError("not a decision")
    return Decision(allowed, reason, tuple(policies), tuple(diagnostics), analysis)


class _Worker:
    """One worker process and the requests it holds."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.ready = False
        self.ended = asyncio.Event()  # set once its reader has seen it go
        # request id -> (its future, when it was sent); in the order sent
        self.pending: dict[int, tuple[asyncio.Future[Decision | None], float]] = {}


class PolicyWorkers:
    """`count` worker processes evaluating `PolicyEngine(user_file, packs).decide`."""

    def __init__(self, user_file: Path | None, count: int,
                 packs: tuple[str, ...] = DEFAULT_PACKS,
                 command: Sequence[str] | None = None, timeout: float = 10.0,
                 clock: Clock | None = None) -> None:
        self.timeout = timeout
        self._clock = clock or SystemClock()
        # The watchdog, each start and each worker's reader: all end by `aclose`.
        self._tasks = TaskOwner("policy workers", log)
        self._watch: asyncio.Task[None] | None = None
        self.count = count
        self._command = list(command) if command is not None else [
            sys.executable, "-m", "tkbox.signer.policy_worker",
            "--packs", ",".join(packs),
            *(["--policy", str(user_file)] if user_file is not None else [])]
        self._slots: list[_Worker | None] = [None] * count
        self._started: list[float] = [float("-inf")] * count  # when each slot last started
        self._starting: dict[int, asyncio.Task[None]] = {}  # slot -> its worker being started
        self._readers: set[asyncio.Task[None]] = set()  # one per worker, until it is reaped
        self._any_ready = asyncio.Event()  # set while a worker is ready
        self._next_id = 0
        self._turn = 0
        self._closed = False
        self.evaluated = 0  # answers that came from a worker
        self.fell_back = 0  # requests a worker took but did not answer

    def start(self) -> None:
        """Start every worker in the background (decisions go on meanwhile, on the loop)."""
        for i in range(self.count):
            self._start(i)
        self._watch = self._tasks.spawn(self._watchdog(), "watchdog")

    async def _watchdog(self) -> None:
        """A worker that holds a request longer than `timeout` is stopped: its requests
        go back to the loop (evaluating one request takes milliseconds; a worker that
        takes seconds is stuck, stopped by someone, or starved)."""
        while True:
            await self._clock.sleep(min(1.0, self.timeout / 2))
            now = self._clock.monotonic()
            for w in self._slots:
                if w is not None and w.pending and \
                        now - next(iter(w.pending.values()))[1] > self.timeout:
                    log.warning("policy worker pid %d held a request over %.0f s; stopping it",
                                w.proc.pid, self.timeout)
                    with contextlib.suppress(ProcessLookupError):
                        w.proc.kill()

    def _start(self, i: int) -> None:
        """Start slot `i`'s worker, unless it has one or one is starting."""
        if self._closed or self._slots[i] is not None or i in self._starting:
            return
        self._started[i] = self._clock.monotonic()
        self._starting[i] = self._tasks.spawn(self._spawn(i), f"start {i}")  # until it ends

    def _start_later(self, i: int) -> None:
        """Start slot `i` again RESTART_AFTER after it last started (at once if longer ago)."""
        if not self._closed:
            wait = self._started[i] + RESTART_AFTER - self._clock.monotonic()
            asyncio.get_running_loop().call_later(max(0.0, wait), self._start, i)

    async def _spawn(self, i: int) -> None:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=None, close_fds=True)
        except OSError as exc:
            log.warning("policy worker %d did not start (%s); evaluating on the loop", i,
                        exc.__class__.__name__)
            self._start_later(i)  # (scheduled: it runs once this slot is no longer starting)
            return
        finally:
            self._starting.pop(i, None)
        w = _Worker(proc)
        self._slots[i] = w
        reader = self._tasks.spawn(self._read(i, w), f"reader {i}")
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)

    async def _read(self, i: int, w: _Worker) -> None:
        frames = wire.Decoder()
        assert w.proc.stdout is not None
        broken = False
        try:
            while data := await w.proc.stdout.read(65536):
                frames.feed(data)
                while (obj := frames.next()) is not None:
                    self._answer(w, obj)
        except (wire.WireError, ValueError, OSError) as exc:
            broken = True
            log.warning("policy worker %d answered something unreadable (%s); stopping it",
                        i, exc.__class__.__name__)
        finally:
            self._lost(i, w)
            # It closed its output (it is ending, or ended) or broke the protocol (kill it).
            # Not killed before it had a moment to end: Popen.kill() reaps an ended child
            # itself, and asyncio's own watcher then logs a child it cannot find.
            if not broken:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(w.proc.wait(), 2)
            if w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.kill()
            await w.proc.wait()

    def _answer(self, w: _Worker, obj: dict[str, Any]) -> None:
        if obj.get("ready") is True and not w.ready:
            w.ready = True
            self._any_ready.set()
            return
        rid = obj.get("id")
        held = w.pending.pop(rid, None) if isinstance(rid, int) else None
        if held is None:
            raise ValueError("an answer to no request")
        fut = held[0]
        try:
            d = decision_from_json(obj["decision"]) if "decision" in obj else None
        except ValueError:
            if not fut.done():
                self.fell_back += 1
                fut.set_result(None)
            raise
        if not fut.done():
            fut.set_result(d)
            if d is None:
                self.fell_back += 1
            else:
                self.evaluated += 1

    def _lost(self, i: int, w: _Worker) -> None:
        """The worker ended or broke: its requests go back to the loop; start another."""
        if self._slots[i] is w:
            self._slots[i] = None
        w.ready = False
        w.ended.set()
        if not self.ready():
            self._any_ready.clear()
        for fut, _ in w.pending.values():
            if not fut.done():
                self.fell_back += 1
                fut.set_result(None)
        w.pending.clear()
        if not self._closed:
            log.warning("policy worker %d ended; what it held is evaluated on the loop, "
                        "and it is started again", i)
            self._start_later(i)

    def ready(self) -> bool:
        return any(w is not None and w.ready for w in self._slots)

    async def wait_ready(self) -> None:
        """Until a worker is ready (a test's signal; the signer never waits for one)."""
        await self._any_ready.wait()

    async def wait_started(self) -> None:
        """Until every start under way has ended (started a worker, or failed to)."""
        while self._starting:
            await asyncio.wait(list(self._starting.values()))

    def status(self) -> dict[str, int]:
        return {"count": self.count,
                "ready": sum(1 for w in self._slots if w is not None and w.ready),
                "evaluated": self.evaluated, "fell_back": self.fell_back}

    async def decide(self, run: str, action: str, resource: dict[str, Any],
                     context: dict[str, Any]) -> Decision | None:
        """A worker's decision, or None when no worker gave one (evaluate it yourself)."""
        w = self._pick()
        if w is None:
            return None
        rid = self._next_id
        self._next_id += 1
        try:
            data = wire.encode({"id": rid, "run": run, "action": action, "resource": resource,
                                "context": context})
        except wire.WireError:
            return None
        assert w.proc.stdin is not None
        fut: asyncio.Future[Decision | None] = asyncio.get_running_loop().create_future()
        w.pending[rid] = (fut, self._clock.monotonic())
        try:
            w.proc.stdin.write(data)
        except (ConnectionError, RuntimeError):
            w.pending.pop(rid, None)
            return None
        return await fut

    def _pick(self) -> _Worker | None:
        """The ready worker holding the fewest requests (round robin among equals)."""
        best: _Worker | None = None
        for k in range(self.count):
            i = (self._turn + k) % self.count
            w = self._slots[i]
            if w is not None and w.ready and (best is None or len(w.pending) < len(best.pending)):
                best = w
        self._turn += 1
        return best

    async def aclose(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.wait({self._watch})
        if self._starting:  # a process being started is let start, then stopped below
            await asyncio.wait(list(self._starting.values()))
        for i, w in enumerate(self._slots):
            if w is not None:
                await self._stop(w)
                self._slots[i] = None
        if self._readers:  # each ends once its worker is reaped
            await asyncio.wait(list(self._readers))
        await self._tasks.aclose()

    async def _stop(self, w: _Worker) -> None:
        if w.proc.stdin is not None:
            w.proc.stdin.close()  # EOF: the worker ends
        try:
            await asyncio.wait_for(w.proc.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()
            await w.proc.wait()


def serve(engine: PolicyEngine, inp: BinaryIO, out: BinaryIO) -> None:
    """The worker's side: answer each request on `inp` with `engine`'s decision."""
    out.write(wire.encode({"ready": True}))
    out.flush()
    frames = wire.Decoder()
    while data := inp.read1(65536):  # type: ignore[attr-defined]
        frames.feed(data)
        while (req := frames.next()) is not None:
            rid = req.get("id")
            try:
                d = engine.decide(req["run"], req["action"], req["resource"], req["context"])
                answer = wire.encode({"id": rid, "decision": d.record_body()})
            except Exception as exc:  # noqa: BLE001 - the signer evaluates it itself
                answer = wire.encode({"id": rid, "error": exc.__class__.__name__})
            out.write(answer)
        out.flush()


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - a subprocess
    ap = argparse.ArgumentParser(prog="python -m tkbox.signer.policy_worker")
    ap.add_argument("--policy", type=Path, default=None)
    ap.add_argument("--packs", default=",".join(DEFAULT_PACKS))
    args = ap.parse_args(argv)
    # Ctrl-C in the signer's terminal reaches the whole process group: the worker ends
    # when the signer closes its stdin, not before (and without a traceback).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="policy worker: %(message)s")
    # The signer's own engine logs the policy's loads and errors; each worker would
    # say them again.
    logging.getLogger("tkbox.signer.cedarpolicy").addFilter(
        lambda r: not r.getMessage().startswith(("policy loaded", "policy error")))
    packs = tuple(p for p in args.packs.split(",") if p)
    serve(PolicyEngine(args.policy, packs), sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":  # pragma: no cover
    main()
