"""Frames on ports 1024 and 1026: a 4-byte big-endian length, then a msgpack map.

At most 1 MiB a frame (DESIGN §3). Large payloads (files, the patch, output)
travel as a sequence of frames. `FrameDecoder` is sans-IO: feed it bytes, take
whole frames out; anything malformed raises `FrameError` and the stream is dead.

Nothing is decoded without a budget. Before msgpack builds a single object,
`scan` walks the frame's headers (no values are built, strings and bins are
skipped by length) and refuses it past `FrameLimits`: the number of objects,
the nesting depth, and each map's and array's length. A 1 MiB frame of tiny
containers (about a million objects, half a second of the host's event loop
to build) is refused after `max_objects` headers instead. The host reads the
guest with `GUEST_FRAMES` (its answers are flat maps: a few hundred objects at
most); the guest reads the host with `HOST_FRAMES` (an `exec` request carries
up to 4,096 arguments). A `FramedStream` given a `Budget` also pays for each
frame (one unit, plus one per object), so a guest sending many small frames
is read more slowly rather than taking the loop (`tkbox.protocol.budget`).

Used by both the host and the guest: standard library plus `msgpack` only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from tkbox.protocol import errors
from tkbox.protocol.budget import Budget
from tkbox.protocol.streams import ByteStream

MAX_FRAME = 1 << 20  # 1 MiB, length prefix excluded
_LEN = struct.Struct(">I")


FrameError = errors.FrameError  # re-exported: callers import it from here


@dataclass(frozen=True)
class FrameLimits:
    """What one frame may hold, checked by `scan` before anything is built."""

    max_objects: int
    max_depth: int
    max_map_len: int
    max_array_len: int


#: What the host accepts from the guest: flat answer maps (patch stats: 64 entries).
GUEST_FRAMES = FrameLimits(max_objects=256, max_depth=3, max_map_len=64, max_array_len=64)
#: What the guest accepts from the host (argv of 4,096 arguments, the boot config).
HOST_FRAMES = FrameLimits(max_objects=16_384, max_depth=6, max_map_len=4096,
                          max_array_len=8192)

# msgpack spec (github.com/msgpack/msgpack/blob/master/spec.md), "Formats":
# header bytes whose whole size is fixed (nil, bool, ints, floats): byte -> extra bytes
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
          0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
# str 8/16/32 and bin 8/16/32: byte -> width of the length that follows
_SIZED = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}
# array 16/32 and map 16/32: byte -> (width of the count, is a map)
_CONTAINERS = {0xDC: (2, False), 0xDD: (4, False), 0xDE: (2, True), 0xDF: (4, True)}


def scan(body: bytes, limits: FrameLimits) -> int:
    """Walk one msgpack object's headers within `limits`; return how many objects it holds.

    Raises FrameError past a limit, on an extension type, a reserved byte
    (0xc1), a length running past the end, or bytes after the object.
    """
    n = len(body)
    pos = 0
    objects = 0
    # remaining[i]: objects still to read at depth i (a map entry counts as two)
    remaining = [1]
    while remaining:
        if remaining[-1] == 0:
            remaining.pop()
            continue
        remaining[-1] -= 1
        if pos >= n:
            raise FrameError("frame ends inside a msgpack object")
        objects += 1
        if objects > limits.max_objects:
            raise FrameError(f"frame holds more than {limits.max_objects} msgpack objects")
        b = body[pos]
        pos += 1
        count = -1
        is_map = False
        if b <= 0x7F or b >= 0xE0:  # positive/negative fixint
            continue
        if 0x80 <= b <= 0x8F:  # fixmap
            count, is_map = b & 0x0F, True
        elif 0x90 <= b <= 0x9F:  # fixarray
            count = b & 0x0F
        elif 0xA0 <= b <= 0xBF:  # fixstr
            pos += b & 0x1F
        elif b in _FIXED:
            pos += _FIXED[b]
        elif b in _SIZED:
            w = _SIZED[b]
            if pos + w > n:
                raise FrameError("frame ends inside a msgpack length")
            pos += w + int.from_bytes(body[pos:pos + w], "big")
        elif b in _CONTAINERS:
            w, is_map = _CONTAINERS[b]
            if pos + w > n:
                raise FrameError("frame ends inside a msgpack length")
            count = int.from_bytes(body[pos:pos + w], "big")
            pos += w
        else:  # 0xc1 (never used) and every extension type
            raise FrameError(f"msgpack type byte 0x{b:02x} is not accepted")
        if pos > n:
            raise FrameError("a msgpack string or bin runs past the end of the frame")
        if count < 0:
            continue
        limit = limits.max_map_len if is_map else limits.max_array_len
        if count > limit:
            raise FrameError(f"a msgpack {'map' if is_map else 'array'} of {count} entries "
                             f"(at most {limit})")
        if len(remaining) > limits.max_depth:
            raise FrameError(f"msgpack nesting deeper than {limits.max_depth}")
        remaining.append(count * 2 if is_map else count)
    if pos != n:
        raise FrameError(f"{n - pos} bytes after the msgpack map")
    return objects


def encode(message: dict[str, Any]) -> bytes:
    """One frame: length prefix + msgpack map. Raises FrameError past 1 MiB."""
    if not isinstance(message, dict):
        raise FrameError("a frame must carry a map")
    body: bytes = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds the 1 MiB limit")
    return _LEN.pack(len(body)) + body


def decode_body(body: bytes, limits: FrameLimits = HOST_FRAMES) -> dict[str, Any]:
    """Parse one frame body strictly: a single msgpack map with string keys, within `limits`."""
    return _decode(body, limits)[0]


def _decode(body: bytes, limits: FrameLimits) -> tuple[dict[str, Any], int]:
    if not body or not (0x80 <= body[0] <= 0x8F or body[0] in (0xDE, 0xDF)):
        raise FrameError("frame is not a map with string keys")
    objects = scan(body, limits)
    try:
        obj = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=MAX_FRAME,
            max_bin_len=MAX_FRAME,
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            max_ext_len=0,
        )
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types; all mean "bad bytes"
        raise FrameError(f"frame is not valid msgpack ({exc.__class__.__name__})") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise FrameError("frame is not a map with string keys")
    return obj, objects


class FrameDecoder:
    """Sans-IO frame reassembly with a hard bound on buffered bytes.

    `cost` adds up the work units of the frames decoded so far (one a frame,
    plus one an object), for the owner's `Budget`.
    """

    def __init__(self, max_frame: int = MAX_FRAME, limits: FrameLimits = HOST_FRAMES) -> None:
        self._buf = bytearray()
        self._max = max_frame
        self._limits = limits
        self.cost = 0

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
            msg, objects = _decode(body, self._limits)
            self.cost += 1 + objects
            out.append(msg)
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


class FramedStream:
    """Frames over a ByteStream: `send(map)`, `receive() -> map | None` (None at EOF).

    With a `budget`, each received frame is paid for before the next read.
    """

    def __init__(self, stream: ByteStream, max_frame: int = MAX_FRAME, *,
                 limits: FrameLimits = HOST_FRAMES, budget: Budget | None = None) -> None:
        self.stream = stream
        self._dec = FrameDecoder(max_frame, limits)
        self._ready: list[dict[str, Any]] = []
        self._budget = budget

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
            if self._budget is not None and self._dec.cost:
                cost, self._dec.cost = self._dec.cost, 0
                await self._budget.wait_spend(cost)
        return self._ready.pop(0)

    async def aclose(self) -> None:
        await self.stream.aclose()
