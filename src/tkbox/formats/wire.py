"""The signer's wire protocol, sans-IO (both the signer and its clients use it).

It lives in `formats`, below both `tkbox.signer` (the process) and
`tkbox.record` (the daemon's client), so neither imports the other to speak
it: the signer shares no code with the daemon beyond the formats.

A frame is a 4-byte big-endian length N (1 <= N <= MAX_FRAME), then N bytes
of RFC 8785 canonical JSON holding one object.

Requests (client to signer) carry `id` (a non-negative integer, echoed in
the answer) and `op`:

| op          | arguments                               | result |
| ----------- | --------------------------------------- | ------ |
| ping        |                                         | `{key, origin, vkey, isolation, ...}` |
| open        | `run`, `facts`                          | `{seq}` |
| decide      | `run`, `action`, `resource`, `context`  | `{allowed, reason, decision}` |
| complete    | `run`, `decision`, `outcome`            | `{seq}` |
| event       | `run`, `kind`, `body`                   | `{seq}` |
| close       | `run`                                   | `{seq}` |
| export      | `run`                                   | `{bundle, trust}` (base64) |
| hold, release, quarantine | `run`, `reason`           | `{seq}` |
| status      |                                         | `{size, runs, ...}` |
| subscribe   |                                         | `{}`, then pushes on this connection |
| auth        | `token` (network listener only)         | `{workload, time_ms}` |

Answers: `{id, ok: true, result}` or `{id, ok: false, error, kind}`, where
`kind` is `refused` (a request the signer will not take: the run is closed,
the id is malformed, ...) or `failed` (the signer could not do it). Pushes:
`{push: "hold"|"release"|"quarantine", run, reason}`.

Every answer is sent only after what it reports is durable in the log.
"""

from __future__ import annotations

import struct
from typing import Any

from tkbox.errors import RemoteError
from tkbox.formats import canonjson
from tkbox.formats.errors import FormatError

MAX_FRAME = 1 << 20
OPS = frozenset({"ping", "open", "decide", "complete", "event", "close", "export", "hold",
                 "release", "quarantine", "status", "subscribe", "auth"})


class WireError(RemoteError):
    """The peer broke the framing or sent something that is not a frame (or we were
    asked to encode something that cannot be one)."""


def encode(obj: dict[str, Any]) -> bytes:
    try:
        body = canonjson.dumps(obj)
    except FormatError as exc:
        raise WireError(f"cannot encode: {exc.what}") from None
    if len(body) > MAX_FRAME:
        raise WireError(f"a frame of {len(body)} bytes is larger than {MAX_FRAME}")
    return struct.pack(">I", len(body)) + body


class Decoder:
    """Feed bytes, take whole frames out. Bounded: never buffers more than one frame."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) >= 4:
            (n,) = struct.unpack(">I", self._buf[:4])
            if n == 0 or n > self._max:
                raise WireError(f"a frame length of {n} (1..{self._max} allowed)")

    def next(self) -> dict[str, Any] | None:
        if len(self._buf) < 4:
            return None
        (n,) = struct.unpack(">I", self._buf[:4])
        if n == 0 or n > self._max:
            raise WireError(f"a frame length of {n} (1..{self._max} allowed)")
        if len(self._buf) < 4 + n:
            return None
        body = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        try:
            obj = canonjson.loads(body, max_size=self._max)
        except FormatError as exc:
            raise WireError(f"a frame that is not canonical JSON: {exc.what}") from None
        if not isinstance(obj, dict):
            raise WireError("a frame that is not a JSON object")
        return obj

    @property
    def buffered(self) -> int:
        return len(self._buf)


def need(obj: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """A request argument of the given type, or WireError naming it."""
    value = obj.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise WireError(f"{obj.get('op', '?')}: {key} must be a {name}")
    return value
