"""Egress: a tunnel through the door, beside a direct connection and tinyproxy.

One run, three paths to the same loopback origin:

- direct: a TCP connection to the origin;
- door: `CONNECT` through an `EgressDoor` (its own process, behind the
  loopback TCP adapter, with a fake signer in memory), to an allowlist entry
  naming the origin's port (so the bytes are spliced, not inspected as TLS);
- tinyproxy: `CONNECT` through Debian's tinyproxy, started here with its own
  config file on a loopback port.

Measured: throughput of a 64 MiB download, and connection-setup time (connect,
CONNECT, a one-byte round trip) as the median of sequential connections.
Printed as ratios against direct and against tinyproxy.

    .venv/bin/python benchmarks/egress.py [--mib 64] [--setups 200]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 256 * 1024


# --- the servers (each run as its own process) -----------------------------------


async def serve_origin(mib: int) -> None:
    blob = b"\x00" * CHUNK

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            cmd = await reader.readexactly(1)
            if cmd == b"d":  # download
                for _ in range(mib * 1024 * 1024 // CHUNK):
                    writer.write(blob)
                    await writer.drain()
            else:  # ping: echo one byte
                writer.write(cmd)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


async def serve_door(origin_port: int) -> None:
    from tkbox.doors.network import (
        ApprovalBoard,
        EgressDoor,
        FakeResolver,
        OperatorConfig,
        SystemClock,
        serve_tcp,
    )
    from tkbox.record.client import FakeSigner

    signer = FakeSigner()
    await signer.open_run("bench", {})
    clock = SystemClock()
    op = OperatorConfig(
        permit=(ipaddress.ip_network("127.0.0.1/32"),),
        hosts={"origin.bench": (ipaddress.ip_address("127.0.0.1"),)},
    )
    door = EgressDoor(
        "bench",
        signer,
        [f"origin.bench:{origin_port}"],
        op,
        FakeResolver(),
        ApprovalBoard(signer, clock),
        clock,
    )
    server = await serve_tcp(door)
    print(server.sockets[0].getsockname()[1], flush=True)
    while True:  # keep the fake signer's records from growing without bound
        await asyncio.sleep(1)
        signer.records.clear()


def spawn(*args: str) -> tuple[subprocess.Popen[str], int]:
    p = subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
    )
    assert p.stdout is not None
    return p, int(p.stdout.readline())


def start_tinyproxy(directory: Path, origin_port: int) -> tuple[subprocess.Popen[bytes], int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = directory / "tinyproxy.conf"
    conf.write_text(
        f"Port {port}\nListen 127.0.0.1\nTimeout 600\nMaxClients 1024\nAllow 127.0.0.1\n"
        f'ConnectPort {origin_port}\nLogLevel Critical\nLogFile "{directory / "tp.log"}"\n'
    )
    p = subprocess.Popen(
        ["tinyproxy", "-d", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return p, port
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise SystemExit("tinyproxy did not start")


# --- the client -----------------------------------------------------------------


async def open_path(
    kind: str, origin_port: int, proxy_port: int | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if proxy_port is None:
        return await asyncio.open_connection("127.0.0.1", origin_port, limit=CHUNK)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port, limit=CHUNK)
    host = "origin.bench" if kind == "door" else "127.0.0.1"
    target = f"{host}:{origin_port}"
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise SystemExit(f"{kind}: CONNECT refused: {head[:200]!r}")
    return reader, writer


async def throughput(kind: str, origin_port: int, proxy_port: int | None, mib: int) -> float:
    reader, writer = await open_path(kind, origin_port, proxy_port)
    start = time.perf_counter()
    writer.write(b"d")
    total = 0
    while chunk := await reader.read(CHUNK):
        total += len(chunk)
    elapsed = time.perf_counter() - start
    writer.close()
    if total != mib * 1024 * 1024:
        raise SystemExit(f"{kind}: got {total} bytes")
    return total / elapsed / 1e6


async def setup_time(kind: str, origin_port: int, proxy_port: int | None, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        reader, writer = await open_path(kind, origin_port, proxy_port)
        writer.write(b"p")
        await reader.readexactly(1)
        times.append(time.perf_counter() - start)
        writer.close()
        await writer.wait_closed()
    return statistics.median(times) * 1000


async def measure(paths: dict[str, int | None], origin_port: int, mib: int, setups: int) -> None:
    tput: dict[str, float] = {}
    setup: dict[str, float] = {}
    for kind, pport in paths.items():  # warm up each path once
        await setup_time(kind, origin_port, pport, 5)
    for kind, pport in paths.items():
        tput[kind] = max([await throughput(kind, origin_port, pport, mib) for _ in range(2)])
        setup[kind] = await setup_time(kind, origin_port, pport, setups)
    print(f"{'path':10} {'MB/s':>10} {'setup ms':>10}")
    for kind in paths:
        print(f"{kind:10} {tput[kind]:10.1f} {setup[kind]:10.3f}")
    print()
    print(f"throughput  door/direct    = {tput['door'] / tput['direct']:.2f}")
    print(f"setup time  door/direct    = {setup['door'] / setup['direct']:.2f}")
    if "tinyproxy" in paths:
        print(f"throughput  door/tinyproxy = {tput['door'] / tput['tinyproxy']:.2f}")
        print(f"setup time  door/tinyproxy = {setup['door'] / setup['tinyproxy']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--setups", type=int, default=200)
    ap.add_argument("--serve-origin", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-door", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_origin:
        asyncio.run(serve_origin(args.mib))
        return
    if args.serve_door:
        asyncio.run(serve_door(args.serve_door))
        return
    procs: list[subprocess.Popen[str] | subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            origin, oport = spawn("--serve-origin", "--mib", str(args.mib))
            procs.append(origin)
            door, dport = spawn("--serve-door", str(oport))
            procs.append(door)
            paths: dict[str, int | None] = {"direct": None, "door": dport}
            if shutil.which("tinyproxy"):
                tp, tport = start_tinyproxy(Path(tmp), oport)
                procs.append(tp)
                paths["tinyproxy"] = tport
            else:
                print("tinyproxy not installed: comparing with direct only")
            asyncio.run(measure(paths, oport, args.mib, args.setups))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()
