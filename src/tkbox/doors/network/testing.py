"""Builders and fakes for testing the network door (shipped with it).

- TLS messages built byte by byte (`client_hello`, `server_hello`,
  `records`), so tests can say exactly what an attacker sends: a second
  server name, ECH, a HelloRetryRequest, a hello split across records.
- `MemoryOrigin`: a dialer whose "connections" are memory streams served by
  an async handler, recording exactly which address and port were dialed.
- `make_door(...)`: an `EgressDoor` with a `FakeSigner` run opened, a
  `FakeResolver`, a `FakeClock` and a `MemoryOrigin`, for unit tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import ipaddress
import os
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tkbox._clock import FakeClock
from tkbox._tasks import TaskOwner
from tkbox.doors.network.approvals import ApprovalBoard
from tkbox.doors.network.config import OperatorConfig
from tkbox.doors.network.door import EgressDoor
from tkbox.doors.network.resolver import FakeResolver
from tkbox.doors.network.tls import (
    CT_HANDSHAKE,
    EXT_ECH,
    EXT_SERVER_NAME,
    HRR_RANDOM,
    HS_CLIENT_HELLO,
    HS_SERVER_HELLO,
)
from tkbox.protocol.streams import ByteStream, MemoryStream, memory_stream_pair
from tkbox.record.testing import FakeSigner

#: the origins `make_door` built in the running `aiotest`, closed when it ends
_ORIGINS: contextvars.ContextVar[list[MemoryOrigin]] = contextvars.ContextVar("origins")


def aiotest(
    fn: Callable[..., Coroutine[Any, Any, None]],
) -> Callable[..., None]:
    """Run an async test function in a fresh event loop, bounded to 20 s; then close
    (cancel and await the handlers of) every `MemoryOrigin` that `make_door` built."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        async def main() -> None:
            origins: list[MemoryOrigin] = []
            token = _ORIGINS.set(origins)
            try:
                async with asyncio.timeout(20):
                    await fn(*args, **kwargs)
            finally:
                _ORIGINS.reset(token)
                for origin in origins:
                    await origin.aclose()

        asyncio.run(main())

    return wrapper


def _vec(data: bytes, n: int) -> bytes:
    return len(data).to_bytes(n, "big") + data


def ext(etype: int, data: bytes) -> bytes:
    return etype.to_bytes(2, "big") + _vec(data, 2)


def sni_ext(*names: bytes) -> bytes:
    entries = b"".join(b"\x00" + _vec(n, 2) for n in names)
    return ext(EXT_SERVER_NAME, _vec(entries, 2))


def client_hello(
    server_name: str | bytes | None = "example.org",
    extra: Iterable[bytes] = (),
    *,
    names: Iterable[bytes] | None = None,
    version: int = 0x0303,
    padding: int = 0,
) -> bytes:
    """A ClientHello handshake message (type, length, body)."""
    exts = b""
    if names is not None:
        exts += sni_ext(*names)
    elif server_name is not None:
        n = server_name.encode() if isinstance(server_name, str) else server_name
        exts += sni_ext(n)
    exts += ext(0x002B, b"\x02\x03\x04")  # supported_versions: TLS 1.3
    for e in extra:
        exts += e
    if padding:
        exts += ext(0x0015, b"\x00" * padding)
    body = (
        version.to_bytes(2, "big")
        + os.urandom(32)
        + _vec(os.urandom(32), 1)
        + _vec(b"\x13\x01\x13\x02", 2)
        + _vec(b"\x00", 1)
        + _vec(exts, 2)
    )
    return bytes([HS_CLIENT_HELLO]) + _vec(body, 3)


def ech_ext() -> bytes:
    return ext(EXT_ECH, b"\x00" + os.urandom(40))


def server_hello(retry: bool = False) -> bytes:
    random = HRR_RANDOM if retry else os.urandom(32)
    body = b"\x03\x03" + random + _vec(b"", 1) + b"\x13\x01" + b"\x00" + _vec(b"", 2)
    return bytes([HS_SERVER_HELLO]) + _vec(body, 3)


def records(message: bytes, ctype: int = CT_HANDSHAKE, size: int = 1 << 14) -> bytes:
    """`message` framed as TLS records of at most `size` payload bytes."""
    out = b""
    for i in range(0, len(message), size):
        chunk = message[i : i + size]
        out += bytes([ctype, 3, 1]) + _vec(chunk, 2)
    return out


CCS = bytes([20, 3, 3, 0, 1, 1])

OriginHandler = Callable[[ByteStream], Coroutine[Any, Any, None]]


@dataclass
class MemoryOrigin:
    """A dialer to in-memory origins; records every (address, port) dialed.

    Each dialed connection is served by `handler` in a task this origin owns:
    it ends when the handler returns, or at `aclose()`, which cancels and awaits
    every one still running (`aiotest` closes the origins `make_door` built)."""

    handler: OriginHandler
    dialed: list[tuple[str, int]] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)
    tasks: TaskOwner = field(default_factory=lambda: TaskOwner("origin"))
    streams: list[MemoryStream] = field(default_factory=list)

    async def __call__(self, address: str, port: int) -> ByteStream:
        self.dialed.append((address, port))
        if address in self.refuse:
            raise ConnectionRefusedError(address)
        ours, theirs = memory_stream_pair(limit=64 * 1024)
        self.streams.append(theirs)
        self.tasks.spawn(self.handler(theirs), f"{address}:{port}")
        return ours

    async def aclose(self) -> None:
        """Cancel every handler still running and wait until each has ended."""
        await self.tasks.aclose()


async def echo(stream: ByteStream) -> None:
    """An origin that sends back what it receives."""
    try:
        while data := await stream.receive():
            await stream.send_all(data)
        await stream.send_eof()
    except Exception:  # noqa: BLE001,S110 - a test origin; the door's side is under test
        pass


def make_door(
    allow: Iterable[str] = (),
    *,
    dns: Mapping[str, Any] | None = None,
    handler: OriginHandler = echo,
    operator: OperatorConfig | None = None,
    signer: FakeSigner | None = None,
    board: ApprovalBoard | None = None,
    clock: FakeClock | None = None,
    own: Iterable[str] = (),
    run_id: str = "run-1",
    box: str | None = None,
    **kwargs: Any,
) -> tuple[EgressDoor, FakeSigner, MemoryOrigin, FakeClock]:
    """A door wired to fakes, with its run opened at the fake signer."""
    signer = signer if signer is not None else FakeSigner()
    if run_id not in signer._open:
        signer._open.add(run_id)
    clock = clock if clock is not None else FakeClock()
    board = board if board is not None else ApprovalBoard(signer, clock)
    origin = MemoryOrigin(handler)
    with contextlib.suppress(LookupError):  # outside an `aiotest`, the caller closes it
        _ORIGINS.get().append(origin)
    own_set = frozenset(ipaddress.ip_address(a) for a in own)
    door = EgressDoor(
        run_id,
        signer,
        allow,
        operator or OperatorConfig(),
        FakeResolver(dns or {}),
        board,
        clock,
        box=box,
        dial=origin,
        own_addresses=lambda: own_set,
        **kwargs,
    )
    return door, signer, origin, clock
