"""TLS over any `ByteStream` with `ssl.MemoryBIO` and `SSLObject` (DESIGN §3).

A port stream is not a socket, so TLS runs in memory: bytes the SSL object
wants to send are drained from its outgoing BIO to the stream, bytes from the
stream are written to its incoming BIO. `receive` returns `b""` at the peer's
close_notify or at a bare EOF (HTTP framing, checked by h11, decides whether
the message was complete). Errors from the peer are `TLSError`.

One task may receive while another sends (the HTTP/2 relay's reader and
writer): the bytes each takes from the outgoing BIO are sent under one lock,
in the order they were taken, so records never interleave on the stream.
Renegotiation is off in the door's contexts, so a send never waits to read.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable
from typing import TypeVar

from tkbox.errors import RemoteError
from tkbox.protocol.streams import ByteStream, StreamClosed

T = TypeVar("T")
CHUNK = 64 * 1024


class TLSError(RemoteError):
    """The TLS peer (guest or origin) failed the handshake or broke the stream."""


class TLSStream(ByteStream):
    def __init__(self, raw: ByteStream, ctx: ssl.SSLContext, *, server_side: bool,
                 server_hostname: str | None = None) -> None:
        self.raw = raw
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self._in, self._out, server_side=server_side,
                                server_hostname=server_hostname)
        self._eof = False
        self.bytes_in = 0
        self._sending = asyncio.Lock()

    async def _flush(self) -> None:
        data = self._out.read()
        if data:
            # taken before the lock, sent in the order taken (the lock is FIFO, and an
            # uncontended acquire does not yield)
            async with self._sending:
                await self.raw.send_all(data)

    async def _run(self, fn: Callable[[], T]) -> T:
        while True:
            try:
                result = fn()
            except ssl.SSLWantReadError:
                await self._flush()
                if self._eof:
                    raise TLSError("the peer closed the connection during TLS") from None
                data = await self.raw.receive(CHUNK)
                if not data:
                    self._eof = True
                    self._in.write_eof()
                else:
                    self.bytes_in += len(data)
                    self._in.write(data)
                continue
            except ssl.SSLZeroReturnError:
                await self._flush_quietly()
                raise
            except ssl.SSLError as exc:
                await self._flush_quietly()
                raise TLSError(f"TLS failed: {exc.reason or exc.__class__.__name__}") from None
            await self._flush()
            return result

    async def _flush_quietly(self) -> None:
        try:
            await self._flush()
        except (StreamClosed, OSError):
            pass

    async def handshake(self) -> None:
        await self._run(self.obj.do_handshake)

    async def receive(self, max_bytes: int = CHUNK) -> bytes:
        try:
            first = await self._run(lambda: self.obj.read(max_bytes))
            # SSL_read gives one record (16 KiB) at a time: take what is already here,
            # so the layers above work on whole chunks, not a quarter of one.
            parts, n = [first], len(first)
            while first and n < max_bytes:
                try:
                    more = self.obj.read(max_bytes - n)
                except ssl.SSLError:
                    break  # wants more bytes, or the peer closed: the next call sees it
                if not more:
                    break
                parts.append(more)
                n += len(more)
            return first if len(parts) == 1 else b"".join(parts)
        except TLSError:
            if self._eof:
                return b""  # a bare EOF: framing decides whether anything was cut short
            raise
        except ssl.SSLZeroReturnError:
            return b""

    async def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = await self._run(functools.partial(self.obj.write, view))
            view = view[n:]

    async def send_eof(self) -> None:
        try:
            self.obj.unwrap()
        except ssl.SSLError:
            pass
        await self._flush_quietly()
        await self.raw.send_eof()

    async def aclose(self) -> None:
        await self.raw.aclose()
