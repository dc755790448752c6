"""The byte-stream interface every port stream implements, and a memory fake.

A port stream (host → guest on 1024, guest → host on 1025/1026) is a plain,
ordered, reliable byte stream with half-close. Nothing above this interface may
assume a real socket: the network door splices two of them, the secrets door
runs TLS over one with `ssl.MemoryBIO`.

Standard library only: the guest agent imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod

from tkbox.protocol.errors import StreamClosed

__all__ = ["AsyncioStream", "ByteStream", "MemoryStream", "StreamClosed", "memory_stream_pair"]


class ByteStream(ABC):
    """An async, ordered byte stream with half-close.

    Every implementation in `src/` is run through the same checks of what these
    docstrings promise: tests/conformance/test_byte_streams.py.
    """

    @abstractmethod
    async def receive(self, max_bytes: int = 65536) -> bytes:
        """Between 1 and `max_bytes` (≥ 1) bytes, in the order sent, as soon as any
        are there; `b""` once the peer has sent EOF or closed, and from then on.

        After `aclose` (or pending when it is called) it does not wait: it returns
        `b""`, possibly after bytes that had already arrived. Cancelling a pending
        `receive` loses no bytes: the stream stays usable.
        """

    @abstractmethod
    async def send_all(self, data: bytes) -> None:
        """Send every byte (waits for flow-control credit). Raises StreamClosed after
        `aclose`, and once the peer is known to be gone (not necessarily at the first
        send after it closed: bytes may be buffered on the way)."""

    @abstractmethod
    async def send_eof(self) -> None:
        """Half-close: the peer's `receive` returns `b""` after what was sent, and
        this side can still receive. A stream whose carrier has no EOF (`FdStream`
        over a virtio-serial port) makes this a no-op and says so."""

    @abstractmethod
    async def aclose(self) -> None:
        """Close both directions: the peer reads EOF after what was sent. Idempotent."""

    async def receive_exactly(self, n: int) -> bytes:
        """Exactly `n` bytes, or raise EOFError if the stream ends first."""
        parts: list[bytes] = []
        need = n
        while need:
            chunk = await self.receive(min(need, 65536))
            if not chunk:
                raise EOFError(f"stream ended {need} bytes short")
            parts.append(chunk)
            need -= len(chunk)
        return b"".join(parts)


class AsyncioStream(ByteStream):
    """A ByteStream over an asyncio (reader, writer) pair: sockets, pipes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def receive(self, max_bytes: int = 65536) -> bytes:
        try:
            return await self._reader.read(max_bytes)
        except (ConnectionError, OSError):
            return b""

    async def send_all(self, data: bytes) -> None:
        if self._writer.is_closing():
            raise StreamClosed("stream is closed")
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise StreamClosed(f"peer closed the stream: {exc.__class__.__name__}") from None

    async def send_eof(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            if self._writer.can_write_eof():
                self._writer.write_eof()

    async def aclose(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


class MemoryStream(ByteStream):
    """One end of an in-memory stream pair with a bounded buffer (for tests)."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self._buf = bytearray()
        self._eof = False
        self._closed = False
        self._limit = limit
        self._cond = asyncio.Condition()
        self.peer: MemoryStream | None = None

    async def receive(self, max_bytes: int = 65536) -> bytes:
        async with self._cond:
            while not self._buf and not self._eof and not self._closed:
                await self._cond.wait()
            data = bytes(self._buf[:max_bytes])
            del self._buf[:max_bytes]
            self._cond.notify_all()
            return data

    async def _push(self, data: bytes) -> None:
        async with self._cond:
            view = memoryview(data)
            while view:
                while len(self._buf) >= self._limit and not self._closed:
                    await self._cond.wait()
                if self._closed:
                    raise StreamClosed("peer closed the stream")
                room = self._limit - len(self._buf)
                self._buf += view[:room]
                view = view[room:]
                self._cond.notify_all()

    async def _push_eof(self) -> None:
        async with self._cond:
            self._eof = True
            self._cond.notify_all()

    async def send_all(self, data: bytes) -> None:
        assert self.peer is not None
        if self._closed:
            raise StreamClosed("stream is closed")
        await self.peer._push(data)

    async def send_eof(self) -> None:
        assert self.peer is not None
        await self.peer._push_eof()

    async def aclose(self) -> None:
        if self._closed:
            return
        async with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self.peer is not None:
            await self.peer._push_eof()


def memory_stream_pair(limit: int = 1 << 20) -> tuple[MemoryStream, MemoryStream]:
    """Two connected in-memory streams: what one sends, the other receives."""
    a, b = MemoryStream(limit), MemoryStream(limit)
    a.peer, b.peer = b, a
    return a, b
