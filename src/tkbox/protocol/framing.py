"""Frames on ports 1024 and 1026: a 4-byte big-endian length, then a msgpack map.

At most 1 MiB a frame (DESIGN §3). Large payloads (files, the patch, output)
travel as a sequence of frames. `FrameDecoder` is sans-IO: feed it bytes, take
whole frames out; anything malformed raises `FrameError` and the stream is dead.

Used by both the host and the guest: standard library plus `msgpack` only.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from tkbox.protocol.streams import ByteStream

MAX_FRAME = 1 << 20  # 1 MiB, length prefix excluded
_LEN = struct.Struct(">I")


class FrameError(Exception):
    """The peer sent something that is not a valid frame. The stream is unusable."""


def encode(message: dict[str, Any]) -> bytes:
    """One frame: length prefix + msgpack map. Raises FrameError past 1 MiB."""
    if not isinstance(message, dict):
        raise FrameError("a frame must carry a map")
    body: bytes = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds the 1 MiB limit")
    return _LEN.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """Parse one frame body strictly: a single msgpack map with string keys."""
    try:
        obj = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=MAX_FRAME,
            max_bin_len=MAX_FRAME,
            max_array_len=65536,
            max_map_len=4096,
            max_ext_len=0,
        )
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types; all mean "bad bytes"
        raise FrameError(f"frame is not valid msgpack ({exc.__class__.__name__})") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise FrameError("frame is not a map with string keys")
    return obj


class FrameDecoder:
    """Sans-IO frame reassembly with a hard bound on buffered bytes."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        out: list[dict[str, Any]] = []
        while len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf)
            if n > self._max:
                raise FrameError(f"frame of {n} bytes announced; the limit is {self._max}")
            if len(self._buf) < 4 + n:
                break
            body = bytes(self._buf[4 : 4 + n])
            del self._buf[: 4 + n]
            out.append(decode_body(body))
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


class FramedStream:
    """Frames over a ByteStream: `send(map)`, `receive() -> map | None` (None at EOF)."""

    def __init__(self, stream: ByteStream, max_frame: int = MAX_FRAME) -> None:
        self.stream = stream
        self._dec = FrameDecoder(max_frame)
        self._ready: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        await self.stream.send_all(encode(message))

    async def receive(self) -> dict[str, Any] | None:
        while not self._ready:
            data = await self.stream.receive(65536)
            if not data:
                if self._dec.pending:
                    raise FrameError(f"stream ended inside a frame ({self._dec.pending} bytes)")
                return None
            self._ready.extend(self._dec.feed(data))
        return self._ready.pop(0)

    async def aclose(self) -> None:
        await self.stream.aclose()
