"""VhostVsockHostPorts and GuestVsockPorts.

Two layers:

- Routing by peer CID, run everywhere: the vsock sockets are swapped for Unix
  sockets whose client binds to a path naming its "CID", so the code that
  shares one host listener per port between guests and sends each stream to
  the guest the kernel names is exercised for real.
- Real `AF_VSOCK` over the kernel's loopback transport (CID 1), run only where
  `vsock_loopback` is loaded (`modprobe vsock_loopback`); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from tkbox.protocol import vsock
from tkbox.protocol.ports import PortError
from tkbox.protocol.streams import ByteStream
from tkbox.protocol.vsock import (
    GuestVsockPorts,
    VhostVsockHostPorts,
    vhost_vsock_available,
)

pytestmark = pytest.mark.integration


def run(coro: Coroutine[Any, Any, None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(20):
            await coro

    asyncio.run(bounded())


async def read_all(stream: ByteStream) -> bytes:
    parts = []
    while chunk := await stream.receive():
        parts.append(chunk)
    return b"".join(parts)


# --- routing by peer CID, over Unix-socket stand-ins ------------------------------


@pytest.fixture
def fake_vsock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """AF_UNIX in place of AF_VSOCK: the listener for port P is `tmp/listen_P`;
    a peer's CID is the number in the name of the path its socket is bound to."""
    d = tmp_path / "vs"
    d.mkdir(mode=0o700)

    def listener(port: int) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(d / f"listen_{port}"))
        s.listen(16)
        s.setblocking(False)
        return s

    def peer_cid(conn: socket.socket) -> int | None:
        name = Path(conn.getpeername()).name
        return int(name.split("_")[1]) if name.startswith("cid_") else None

    serial = iter(range(1 << 30))

    async def connect(cid: int, port: int, timeout: float) -> socket.socket:
        # The kernel names the source: the host (2) when dialling a guest, else guest 3.
        source = 3 if cid == 2 else 2
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(d / f"cid_{source}_c{next(serial)}"))
        s.setblocking(False)
        await asyncio.get_running_loop().sock_connect(s, str(d / f"listen_{port}"))
        return s

    monkeypatch.setattr(vsock, "_vsock_listener", listener)
    monkeypatch.setattr(vsock, "_peer_cid", peer_cid)
    monkeypatch.setattr(vsock, "_vsock_connect", connect)
    yield d


async def dial_as(d: Path, cid: int, port: int, tag: int = 0) -> socket.socket:
    """Connect to host port `port` the way guest `cid` would."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(d / f"cid_{cid}_{tag}"))
    s.setblocking(False)
    await asyncio.get_running_loop().sock_connect(s, str(d / f"listen_{port}"))
    return s


async def recv_all(s: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    parts = []
    while chunk := await loop.sock_recv(s, 65536):
        parts.append(chunk)
    return b"".join(parts)


def named(label: bytes) -> Any:
    async def handler(stream: ByteStream) -> None:
        await stream.send_all(label)
        await stream.aclose()

    return handler


def test_two_guests_share_a_host_port_and_each_gets_only_its_own_streams(
    fake_vsock: Path,
) -> None:
    """Two boxes both serve port 1025 on the host's one vsock port space; a
    stream from one guest must never reach the other box's handler."""

    async def main() -> None:
        box3, box4 = VhostVsockHostPorts(3), VhostVsockHostPorts(4)
        box3.serve(1025, named(b"box3"))
        box4.serve(1025, named(b"box4"))
        for n, (cid, label) in enumerate([(3, b"box3"), (4, b"box4"), (3, b"box3")]):
            s = await dial_as(fake_vsock, cid, 1025, tag=n)
            with s:
                assert await recv_all(s) == label
        await box3.aclose()
        await box4.aclose()

    run(main())


def test_stream_from_an_unknown_cid_is_closed_at_once(fake_vsock: Path) -> None:
    """A guest (or anything else on the host) whose CID is no box's gets nothing."""

    async def main() -> None:
        box3 = VhostVsockHostPorts(3)
        box3.serve(1026, named(b"boot config for box 3"))
        s = await dial_as(fake_vsock, 7, 1026)
        with s:
            assert await recv_all(s) == b""
        await box3.aclose()

    run(main())


def test_listener_outlives_one_box_and_closes_with_the_last(fake_vsock: Path) -> None:
    async def main() -> None:
        box3, box4 = VhostVsockHostPorts(3), VhostVsockHostPorts(4)
        box3.serve(1025, named(b"box3"))
        box4.serve(1025, named(b"box4"))
        await box3.aclose()
        s = await dial_as(fake_vsock, 3, 1025, tag=1)
        with s:
            assert await recv_all(s) == b""  # box 3 is gone: its CID is unknown now
        s = await dial_as(fake_vsock, 4, 1025, tag=1)
        with s:
            assert await recv_all(s) == b"box4"
        await box4.aclose()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with s, pytest.raises(ConnectionRefusedError):
            s.connect(str(fake_vsock / "listen_1025"))

    run(main())


def test_one_cid_cannot_be_served_twice_on_a_port(fake_vsock: Path) -> None:
    async def main() -> None:
        a, b = VhostVsockHostPorts(3), VhostVsockHostPorts(3)
        a.serve(1025, named(b"a"))
        with pytest.raises(PortError, match="already being served for CID 3"):
            b.serve(1025, named(b"b"))
        await a.aclose()
        await b.aclose()

    run(main())


def test_host_connect_reaches_guest_serve(fake_vsock: Path) -> None:
    async def main() -> None:
        guest = GuestVsockPorts()
        host = VhostVsockHostPorts(3)

        async def rpc(stream: ByteStream) -> None:
            await stream.send_all(b"pong:" + await read_all(stream))
            await stream.aclose()

        guest.serve(1024, rpc)
        stream = await host.connect(1024)
        await stream.send_all(b"ping")
        await stream.send_eof()
        assert await read_all(stream) == b"pong:ping"
        await host.aclose()
        await guest.aclose()

    run(main())


def test_guest_connect_reaches_its_own_box_on_the_host(fake_vsock: Path) -> None:
    async def main() -> None:
        guest = GuestVsockPorts()
        box3, box4 = VhostVsockHostPorts(3), VhostVsockHostPorts(4)
        box4.serve(1026, named(b"box4 config"))
        box3.serve(1026, named(b"box3 config"))
        stream = await guest.connect(1026)
        assert await read_all(stream) == b"box3 config"
        await guest.aclose()
        await box3.aclose()
        await box4.aclose()

    run(main())


def test_guest_accepts_streams_only_from_the_host(fake_vsock: Path) -> None:
    """Inside the VM, only the host (CID 2) may open RPC streams to the agent."""

    async def main() -> None:
        guest = GuestVsockPorts()
        guest.serve(1024, named(b"agent"))
        s = await dial_as(fake_vsock, 5, 1024)
        with s:
            assert await recv_all(s) == b""
        s = await dial_as(fake_vsock, 2, 1024)
        with s:
            assert await recv_all(s) == b"agent"
        await guest.aclose()

    run(main())


@pytest.mark.parametrize("cid", [0, 2, -1, 1 << 32, True, "3"])
def test_not_a_guest_cid_is_refused(cid: object) -> None:
    with pytest.raises(PortError, match="not a guest CID"):
        VhostVsockHostPorts(cid)  # type: ignore[arg-type]


def test_vhost_vsock_available_matches_the_device() -> None:
    expected = os.access("/dev/vhost-vsock", os.R_OK | os.W_OK) and hasattr(socket, "AF_VSOCK")
    assert vhost_vsock_available() is expected


# --- real AF_VSOCK over loopback ---------------------------------------------------

LOOPBACK = Path("/sys/module/vsock_loopback")
needs_loopback = pytest.mark.skipif(
    not (LOOPBACK.exists() and hasattr(socket, "AF_VSOCK")),
    reason="no vsock loopback transport here (modprobe vsock_loopback)",
)
VMADDR_CID_LOCAL = 1


def free_port() -> int:
    return 20000 + os.getpid() % 20000


@needs_loopback
def test_real_vsock_host_to_guest_over_loopback() -> None:
    async def main() -> None:
        port = free_port()
        guest = GuestVsockPorts(host_cid=VMADDR_CID_LOCAL)
        host = VhostVsockHostPorts(VMADDR_CID_LOCAL)

        async def rpc(stream: ByteStream) -> None:
            await stream.send_all(b"pong:" + await read_all(stream))
            await stream.aclose()

        guest.serve(port, rpc)
        stream = await host.connect(port)
        await stream.send_all(b"ping")
        await stream.send_eof()
        assert await read_all(stream) == b"pong:ping"
        await host.aclose()
        await guest.aclose()

    run(main())


@needs_loopback
def test_real_vsock_guest_to_host_over_loopback() -> None:
    async def main() -> None:
        port = free_port() + 1
        guest = GuestVsockPorts(host_cid=VMADDR_CID_LOCAL)
        host = VhostVsockHostPorts(VMADDR_CID_LOCAL)
        host.serve(port, named(b"boot config"))
        stream = await guest.connect(port)
        assert await read_all(stream) == b"boot config"
        await guest.aclose()
        await host.aclose()

    run(main())


@needs_loopback
def test_real_vsock_connect_to_nothing_is_port_error() -> None:
    async def main() -> None:
        host = VhostVsockHostPorts(VMADDR_CID_LOCAL, connect_timeout=2)
        with pytest.raises(PortError):
            await host.connect(free_port() + 2)
        await host.aclose()

    run(main())
