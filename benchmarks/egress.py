"""Egress: the network door, on the real path and beside a direct connection and tinyproxy.

One run, the same loopback origin, these paths:

- direct: a TCP connection from this process to the origin;
- door (TCP): `CONNECT` through an `EgressDoor` in its own process behind the
  loopback TCP adapter, deciding with the **real signer process** (each
  connection: a `Connect` decision and its completion, durable in the
  signer's log), to an allowlist entry naming the origin's port (so the bytes
  are spliced, not inspected as TLS). This isolates the door's own cost;
- tinyproxy: `CONNECT` through Debian's tinyproxy on a loopback port;
- box → door (serial mux): the real path. A box booted by the real daemon
  (real signer), `curl -p` inside the guest: the guest's proxy port, the
  serial mux to the host, the daemon's door, the real signer, the origin;
- box exec stdout (serial mux): the baseline for the real path in the same
  box: `head -c N /dev/zero` streamed out by `tkbox exec` through the same
  serial mux and the agent RPC, no door.

Measured: throughput of an N MiB download, and connection-setup time (the
median of sequential connections to the first response byte). Under software
emulation (TCG) the guest's own CPU bounds the box figures. Each figure's
contents are printed beside it.

    .venv/bin/python benchmarks/egress.py [--mib 64] [--setups 200] [--box-mib 16]
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


def serve_http(mib: int) -> None:
    """The origin for the box path: GET /blob (MIB MiB of zeros) and GET /small (1 byte)."""
    import http.server

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            n = mib * 1024 * 1024 if self.path == "/blob" else 1
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            blob = b"\x00" * CHUNK
            while n > 0:
                self.wfile.write(blob[: min(n, CHUNK)])
                n -= CHUNK

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()


async def serve_door(origin_port: int) -> None:
    import secrets

    from tkbox.doors.network import (
        ApprovalBoard,
        EgressDoor,
        FakeResolver,
        OperatorConfig,
        SystemClock,
        serve_tcp,
    )
    from tkbox.record.unix import UnixSignerClient

    signer = UnixSignerClient(os.environ["TKBOX_BENCH_SIGNER"])
    run = f"bench-{secrets.token_hex(4)}"
    await signer.open_run(run, {"benchmark": "egress"})
    clock = SystemClock()
    op = OperatorConfig(
        permit=(ipaddress.ip_network("127.0.0.1/32"),),
        hosts={"origin.bench": (ipaddress.ip_address("127.0.0.1"),)},
    )
    door = EgressDoor(
        run,
        signer,
        [f"origin.bench:{origin_port}"],
        op,
        FakeResolver(),
        ApprovalBoard(signer, clock),
        clock,
    )
    server = await serve_tcp(door)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


def spawn(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    p = subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {}),
             "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
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
    print(f"{'path':30} {'MB/s':>10} {'setup ms':>10}")
    for kind in paths:
        label = "door (TCP, real signer)" if kind == "door" else kind
        print(f"{label:30} {tput[kind]:10.1f} {setup[kind]:10.3f}")
    print()
    print(f"throughput  door/direct    = {tput['door'] / tput['direct']:.2f}")
    print(f"setup time  door/direct    = {setup['door'] / setup['direct']:.2f}")
    if "tinyproxy" in paths:
        print(f"throughput  door/tinyproxy = {tput['door'] / tput['tinyproxy']:.2f}")
        print(f"setup time  door/tinyproxy = {setup['door'] / setup['tinyproxy']:.2f}")
    print("  door (TCP) setup includes: CONNECT parsing, the allowlist, the Connect decision "
          "and its completion at the real signer (durable), the dial, one byte each way")


def box_figures(tmp: Path, http_port: int, mib: int, setups: int) -> None:
    """The real path: curl in a booted box, through the serial mux and the daemon's door."""
    from real_stack import real_stack

    hosts = tmp / "hosts"
    hosts.write_text("127.0.0.1 origin.bench\n")
    target = f"origin.bench:{http_port}"
    with real_stack(tmp / "box", daemon_args=("--egress-permit", "127.0.0.1/32",
                                              "--egress-hosts", str(hosts))) as s:
        ws = tmp / "ws"
        ws.mkdir()
        (ws / "f").write_text("x\n")
        s.tk("run", "--name", "egress", "--workspace", str(ws), "--allow", target)
        curl = "curl -sS -p -o /dev/null -w '%{size_download} %{time_total} " \
               "%{time_starttransfer}\\n'"
        s.tk("exec", "egress", "--", "sh", "-c", f"{curl} http://{target}/small")  # warm up
        runs = []
        for _ in range(2):
            out = s.tk("exec", "egress", "--", "sh", "-c", f"{curl} http://{target}/blob").stdout
            size, total, _ = out.split()
            if int(size) != mib * 1024 * 1024:
                raise SystemExit(f"box: got {size} bytes")
            runs.append(int(size) / float(total) / 1e6)
        box_tput = max(runs)
        out = s.tk("exec", "egress", "--", "sh", "-c",
                   f"for i in $(seq {setups}); do {curl} http://{target}/small; done").stdout
        box_setup = statistics.median(float(line.split()[2]) for line in out.splitlines()) * 1000
        execs = []
        for _ in range(2):
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "tkbox.cli", "exec", "egress", "--",
                                "head", "-c", str(mib * 1024 * 1024), "/dev/zero"],
                               env=s.env, capture_output=True, timeout=600, check=True)
            execs.append(len(r.stdout) / (time.perf_counter() - t0) / 1e6)
        exec_tput = max(execs)
        s.tk("rm", "--force", "egress")
    print()
    print(f"{'box path (serial mux)':30} {'MB/s':>10} {'setup ms':>10}")
    print(f"{'box → door → origin':30} {box_tput:10.1f} {box_setup:10.3f}")
    print(f"{'box exec stdout (baseline)':30} {exec_tput:10.1f} {'':>10}")
    print(f"throughput  box door / box exec stdout = {box_tput / exec_tput:.2f}")
    print(f"  box → door includes: curl in the guest (CONNECT via -p), the guest's proxy "
          f"port, the serial mux, the daemon's door, the Connect decision and completion at "
          f"the real signer (durable), the origin; {mib} MiB, time measured by curl in the "
          "guest; setup = curl's time to the first response byte of a 1-byte GET, median "
          f"of {setups}")
    print("  box exec stdout includes: the Bash decision and completion at the real signer, "
          "the agent RPC frames over the same serial mux, the CLI streaming to this process "
          "(timed here, CLI start-up included)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--setups", type=int, default=200)
    ap.add_argument("--box-mib", type=int, default=16, help="MiB for the in-box download")
    ap.add_argument("--box-setups", type=int, default=20)
    ap.add_argument("--no-box", action="store_true", help="skip the in-box (real path) figures")
    ap.add_argument("--serve-origin", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-http", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-door", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_origin:
        asyncio.run(serve_origin(args.mib))
        return
    if args.serve_http:
        serve_http(args.mib)
        return
    if args.serve_door:
        asyncio.run(serve_door(args.serve_door))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from real_stack import real_stack

    procs: list[subprocess.Popen[str] | subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp, \
            real_stack(Path(tmp) / "signer", daemon=False) as signer:
        try:
            origin, oport = spawn("--serve-origin", "--mib", str(args.mib))
            procs.append(origin)
            door, dport = spawn("--serve-door", str(oport),
                                env={"TKBOX_BENCH_SIGNER": str(signer.signer_socket)})
            procs.append(door)
            paths: dict[str, int | None] = {"direct": None, "door": dport}
            if shutil.which("tinyproxy"):
                tp, tport = start_tinyproxy(Path(tmp), oport)
                procs.append(tp)
                paths["tinyproxy"] = tport
            else:
                print("tinyproxy not installed: comparing with direct only")
            asyncio.run(measure(paths, oport, args.mib, args.setups))
            if not args.no_box:
                web, wport = spawn("--serve-http", "--mib", str(args.box_mib))
                procs.append(web)
                box_figures(Path(tmp), wport, args.box_mib, args.box_setups)
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
