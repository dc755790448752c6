"""1,000 concurrent connections through one box's door, on loopback.

Memory stays bounded (measured as RSS growth per open connection), the box's
connection limit refuses the next one at once, and another box's door,
sharing the daemon's approval board and event loop, is unaffected.
"""

from __future__ import annotations

import asyncio
import ipaddress
import resource
from pathlib import Path

import pytest

from tkbox.doors.network import (
    ApprovalBoard,
    EgressDoor,
    FakeResolver,
    OperatorConfig,
    SystemClock,
    serve_tcp,
)
from tkbox.record.testing import FakeSigner

pytestmark = pytest.mark.integration

N = 1000
PAYLOAD = b"x" * 4096


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def through(port: int, target: str, hold: asyncio.Event | None = None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            return head
        writer.write(PAYLOAD)
        got = await reader.readexactly(len(PAYLOAD))
        if hold is not None:
            await hold.wait()
        return head + got
    finally:
        writer.close()


async def scenario() -> dict[str, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 6 * N:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8 * N), hard))
    origin = await asyncio.start_server(echo, "127.0.0.1", 0, backlog=2048)
    oport = origin.sockets[0].getsockname()[1]
    signer = FakeSigner()
    clock = SystemClock()
    board = ApprovalBoard(signer, clock)
    op = OperatorConfig(
        permit=(ipaddress.ip_network("127.0.0.1/32"),),
        hosts={"mirror.test": (ipaddress.ip_address("127.0.0.1"),)},
    )
    doors: list[EgressDoor] = []
    servers: list[asyncio.Server] = []
    ports: list[int] = []
    for box in ("a", "b"):
        await signer.open_run(f"run-{box}", {})
        door = EgressDoor(
            f"run-{box}",
            signer,
            [f"mirror.test:{oport}"],
            op,
            FakeResolver(),
            board,
            clock,
            box=box,
            max_connections=N,
        )
        server = await serve_tcp(door)
        doors.append(door)
        servers.append(server)
        ports.append(server.sockets[0].getsockname()[1])
    target = f"mirror.test:{oport}"
    # warm up both doors so the baseline includes code paths and caches
    for p in ports:
        assert (await through(p, target)).endswith(PAYLOAD)
    base = rss_kib()
    hold = asyncio.Event()
    clients = [asyncio.ensure_future(through(ports[0], target, hold)) for _ in range(N)]
    while doors[0].open_connections < N:
        await asyncio.sleep(0.05)
        if any(c.done() for c in clients):
            break
    peak = rss_kib()
    opened = doors[0].open_connections
    # the box's limit refuses the next connection at once
    extra = await through(ports[0], target)
    # another box is unaffected
    other = await asyncio.wait_for(through(ports[1], target), 30)
    hold.set()
    results = await asyncio.gather(*clients)
    for _ in range(200):
        if doors[0].open_connections == 0:
            break
        await asyncio.sleep(0.05)
    for d, srv in zip(doors, servers, strict=True):
        srv.close()
        await d.close()
        await srv.wait_closed()
    origin.close()
    await origin.wait_closed()
    return {
        "opened": opened,
        "ok": sum(r.endswith(PAYLOAD) for r in results),
        "growth_kib": peak - base,
        "extra_503": int(extra.startswith(b"HTTP/1.1 503")),
        "other_ok": int(other.endswith(PAYLOAD)),
        "left_open": doors[0].open_connections,
        "completes": len([r for r in signer.of_run("run-a", "tkbox.complete")]),
    }


def test_thousand_concurrent_connections_stay_bounded_and_other_boxes_unaffected() -> None:
    r = asyncio.run(asyncio.wait_for(scenario(), 240))
    print(r)
    assert r["opened"] == N and r["ok"] == N
    assert r["extra_503"] == 1 and r["other_ok"] == 1
    assert r["left_open"] == 0 and r["completes"] == N + 1
    # bounded: client, door and origin sides of each connection live in this process
    assert r["growth_kib"] < 64 * N, r
