"""`UnixSignerClient`: the real `SignerClient`, over the signer's Unix socket.

One connection carries every request, pipelined (each has an id; answers
may come in any order). A second connection, opened by `pushes()`, carries
the signer's holds, releases and quarantines. Frames are `tkbox.formats.wire`:
requests are built from its request classes (`wire.Decide(...)`, the same ones
the signer parses into), answers read by `wire.parse_answer`.

Fail closed: no socket, a connection that breaks, an answer that does not
come within `timeout`, a frame we cannot read, or a request the signer will
not take, all raise `SignerUnavailable` (one line for a person). After a
timeout or a broken connection the connection is dropped (what it was doing
is unknown); the next call connects again.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from tkbox._tasks import TaskOwner
from tkbox.errors import SignerRefused, SignerUnavailable
from tkbox.formats import wire
from tkbox.record.client import JSON, Action, Export, Push, SignerClient, Verdict

EXPORT_LIMIT = 512 << 20

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Pending:
    def __init__(self, fut: asyncio.Future[dict[str, Any]]) -> None:
        self.fut = fut
        self.result: dict[str, Any] | None = None
        self.parts: list[bytes] = []
        self.expect = 0


class UnixSignerClient(SignerClient):
    def __init__(self, socket_path: str | Path, *, timeout: float = 10.0,
                 connect_timeout: float = 2.0, export_timeout: float = 120.0,
                 connector: Callable[[], Awaitable[Streams]] | None = None) -> None:
        """`connector` replaces opening `socket_path` (tests give it a socket pair)."""
        self.socket_path = Path(socket_path)
        self._connector = connector
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.export_timeout = export_timeout
        self._ids = itertools.count(1)
        self._writer: asyncio.StreamWriter | None = None
        # Each connection's reader; owned here: one ends with its connection, and
        # `aclose` cancels and awaits any still running.
        self._readers = TaskOwner("signer client")
        self._pending: dict[int, _Pending] = {}
        self._connect_lock = asyncio.Lock()
        self._push_writer: asyncio.StreamWriter | None = None

    # --- the connection ------------------------------------------------------

    async def _open(self) -> Streams:
        try:
            if self._connector is not None:
                return await asyncio.wait_for(self._connector(), self.connect_timeout)
            return await asyncio.wait_for(
                asyncio.open_unix_connection(str(self.socket_path), limit=wire.MAX_FRAME + 4),
                self.connect_timeout)
        except FileNotFoundError:
            raise SignerUnavailable(
                f"no signer at {self.socket_path}; start one with `tkbox signer serve`") from None
        except (TimeoutError, OSError) as exc:
            raise SignerUnavailable(
                f"the signer at {self.socket_path} does not answer ({_why(exc)}); "
                "check `tkbox signer status`") from None

    async def _connection(self) -> asyncio.StreamWriter:
        async with self._connect_lock:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            reader, writer = await self._open()
            self._writer = writer
            self._readers.spawn(self._read_loop(reader, writer), "reader")
            return writer

    async def _read_loop(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        decoder = wire.Decoder()
        why = "the signer closed the connection"
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                decoder.feed(data)
                while (frame := decoder.next()) is not None:
                    self._deliver(frame)
        except wire.WireError as exc:
            why = f"the signer sent a bad frame ({exc})"
        except (ConnectionError, OSError) as exc:
            why = f"the connection to the signer broke ({_why(exc)})"
        finally:
            self._drop(writer, why)

    def _deliver(self, frame: dict[str, Any]) -> None:
        try:
            answer = wire.parse_answer(frame)
        except wire.BadSignerAnswer as exc:
            p = self._pending.get(exc.id) if exc.id is not None else None
            if p is not None and not p.fut.done():
                p.fut.set_exception(SignerUnavailable(str(exc)))
            return
        if isinstance(answer, wire.Pushed):  # not asked for on this connection
            return
        p = self._pending.get(answer.id)
        if p is None or p.fut.done():
            return
        match answer:
            case wire.Part(part=part, data=data):
                if p.result is None or part != len(p.parts):
                    p.fut.set_exception(SignerUnavailable(
                        "the signer sent export parts out of order"))
                    return
                try:
                    p.parts.append(base64.b64decode(data, validate=True))
                except ValueError:
                    p.fut.set_exception(SignerUnavailable("the signer sent a bad export part"))
                    return
                if len(p.parts) == p.expect:
                    p.fut.set_result(p.result)
            case wire.Ok(result=result):
                parts = result.get("parts")
                if isinstance(parts, int) and not isinstance(parts, bool) and parts > 0:
                    p.result, p.expect = result, parts
                    return
                p.fut.set_result(result)
            case wire.Refused(error=error):
                p.fut.set_exception(SignerRefused(f"the signer refused: {error}"))
            case wire.Failed(error=error):
                p.fut.set_exception(SignerUnavailable(f"the signer refused: {error}"))

    def _drop(self, writer: asyncio.StreamWriter, why: str) -> None:
        if self._writer is writer:
            self._writer = None
        writer.close()
        pending, self._pending = self._pending, {}
        for p in pending.values():
            if not p.fut.done():
                p.fut.set_exception(SignerUnavailable(why))

    async def _call(self, make: Callable[[int], wire.Request],
                    timeout: float | None = None) -> tuple[dict[str, Any], list[bytes]]:
        """One request, built by `make` from its id (a `wire` request class), answered."""
        rid = next(self._ids)
        req = make(rid)
        op = req.OP
        try:
            frame = req.encode()
        except wire.WireError as exc:
            raise SignerUnavailable(f"{op} cannot be recorded: {exc} (records hold JSON "
                                    "objects, strings, booleans and integers only)") from None
        writer = await self._connection()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        p = self._pending[rid] = _Pending(fut)
        # One timer for the whole call, instead of wait_for's task and shield's future
        # around every answer (the daemon makes a call per command, connection and file).
        limit = timeout or self.timeout
        expire = loop.call_later(limit, _expire, fut)
        try:
            writer.write(frame)
            if writer.transport.get_write_buffer_size() > 0:  # else drain has nothing to wait for
                await asyncio.wait_for(writer.drain(), limit)
            result = await fut
        except TimeoutError:
            self._drop(writer, "timed out")
            raise SignerUnavailable(
                f"the signer did not answer {op} within {limit:g} s") from None
        except (ConnectionError, OSError) as exc:
            self._drop(writer, _why(exc))
            raise SignerUnavailable(f"the connection to the signer broke ({_why(exc)})") from None
        finally:
            expire.cancel()
            self._pending.pop(rid, None)
            if fut.done() and not fut.cancelled():
                fut.exception()  # retrieved: the caller got a SignerUnavailable already
        return result, p.parts

    # --- SignerClient ----------------------------------------------------------

    async def ping(self) -> JSON:
        result, _ = await self._call(wire.Ping)
        return result

    async def status(self) -> JSON:
        result, _ = await self._call(wire.Status)
        return result

    async def open_run(self, run_id: str, facts: JSON) -> None:
        await self._call(lambda rid: wire.Open(rid, run_id, dict(facts)))

    async def decide(self, run_id: str, action: Action, resource: JSON, context: JSON) -> Verdict:
        result, _ = await self._call(
            lambda rid: wire.Decide(rid, run_id, action, dict(resource), dict(context)))
        allowed, reason, did = result.get("allowed"), result.get("reason"), result.get("decision")
        if not isinstance(allowed, bool) or not isinstance(reason, str) or not isinstance(did, str):
            raise SignerUnavailable("the signer's decision is malformed; refusing")
        return Verdict(allowed, reason, did)

    async def complete(self, run_id: str, decision_id: str, outcome: JSON) -> None:
        await self._call(lambda rid: wire.Complete(rid, run_id, decision_id, dict(outcome)))

    async def event(self, run_id: str, kind: str, body: JSON) -> None:
        await self._call(lambda rid: wire.Event(rid, run_id, kind, dict(body)))

    async def close_run(self, run_id: str) -> None:
        await self._call(lambda rid: wire.Close(rid, run_id))

    async def export(self, run_id: str) -> Export:
        result, parts = await self._call(lambda rid: wire.Export(rid, run_id),
                                         timeout=self.export_timeout)
        bundle = b"".join(parts)
        try:
            trust = base64.b64decode(str(result.get("trust", "")), validate=True)
        except ValueError:
            raise SignerUnavailable("the signer sent a malformed trust file") from None
        if len(bundle) != result.get("size") or len(bundle) > EXPORT_LIMIT:
            raise SignerUnavailable("the signer's export is incomplete")
        return Export(bundle, trust)

    async def hold(self, run_id: str, reason: str = "") -> None:
        await self._call(lambda rid: wire.Hold(rid, run_id, reason))

    async def release(self, run_id: str, reason: str = "") -> None:
        await self._call(lambda rid: wire.Release(rid, run_id, reason))

    async def quarantine(self, run_id: str, reason: str = "") -> None:
        await self._call(lambda rid: wire.Quarantine(rid, run_id, reason))

    async def pushes(self) -> AsyncIterator[Push]:
        """Holds, releases and quarantines. Raises SignerUnavailable when the
        subscription breaks (the caller decides whether to subscribe again)."""
        reader, writer = await self._open()
        self._push_writer = writer
        try:
            writer.write(wire.Subscribe(0).encode())
            await writer.drain()
            decoder = wire.Decoder()
            subscribed = False
            while True:
                try:
                    data = await reader.read(1 << 16)
                except (ConnectionError, OSError) as exc:
                    raise SignerUnavailable(f"the signer's push connection broke ({_why(exc)})"
                                            ) from None
                if not data:
                    raise SignerUnavailable("the signer closed its push connection")
                try:
                    decoder.feed(data)
                    frames = []
                    while (f := decoder.next()) is not None:
                        frames.append(f)
                except wire.WireError as exc:
                    raise SignerUnavailable(f"the signer sent a bad push frame ({exc})") from None
                for f in frames:
                    try:
                        msg: wire.Answer | wire.Pushed | None = wire.parse_answer(f)
                    except wire.BadSignerAnswer:
                        msg = None
                    if not subscribed:
                        if isinstance(msg, wire.Ok) and msg.id == 0:
                            subscribed = True
                            continue
                        error = msg.error if isinstance(msg, wire.Refused | wire.Failed) \
                            else None
                        raise SignerUnavailable(f"the signer refused the subscription: "
                                                f"{error}")
                    if isinstance(msg, wire.Pushed):
                        yield Push(msg.push, msg.run, msg.reason)
        finally:
            writer.close()
            if self._push_writer is writer:
                self._push_writer = None

    async def aclose(self) -> None:
        if self._writer is not None:
            self._drop(self._writer, "the client was closed")
        if self._push_writer is not None:
            self._push_writer.close()
        # The readers end; a cancellation of aclose itself still goes through. The
        # client may connect again after (a reader per connection, a new owner).
        readers, self._readers = self._readers, TaskOwner("signer client")
        await readers.aclose()


def _expire(fut: asyncio.Future[dict[str, Any]]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


def _why(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or exc.__class__.__name__
