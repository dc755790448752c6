"""The secrets door's reading path, beside mitmproxy, on the same transfers in one run.

One TLS origin on loopback (HTTP/1.1, keep-alive) and two intercepting proxies,
each its own process on a loopback port:

- tkbox: an `EgressDoor` handing the tunnel to a `SecretsDoor` (a fake signer
  in memory; the origin's name mapped to 127.0.0.1 by an operator hosts file
  and permitted): TLS terminated with the box CA, every request parsed by
  h11, the placeholder swapped into `Authorization`, headers, URL and body
  scanned for the value and the placeholder in every form, the response
  redacted in a stream;
- mitmproxy (`mitmdump`, from its PyPI package): TLS terminated with its CA,
  and an addon that does the same swap and a `bytes.replace` redaction of
  the response (mitmproxy reads whole bodies unless told to stream, so its
  redaction sees the whole body at once).

The client is the same for both (blocking sockets and `ssl`, in this process):
CONNECT, TLS to the proxy's leaf, then requests with `Authorization: Bearer
<placeholder>`. Measured:

- throughput: one `GET` of a `--mib` MiB body (MiB/s, TLS on both legs, the
  whole body through the redactor), the best of `--repeat` runs;
- requests/s: `--requests` sequential small `GET`s on one keep-alive
  connection (each: swap, scans, a 200 with a 2 KiB body, redaction).

A third process is the tkbox door again with the host *ruled* (`HOST:PORT GET
HEAD /**`, docs/network.md): every request also goes through the matcher, an
`Http` decision (the fake signer in memory, as for the plain door) and a
`tkbox.http.request` record. Goal: requests/s with rules at least 0.9x without.
`--skip-mitmproxy` measures the two doors only.

The HTTP/2 row: a fourth process is the door again before an HTTP/2 origin (the
`h2` library, the same 2 KiB answer), and a client that speaks HTTP/2 (the `h2`
library over the same blocking sockets): `--requests` sequential small `GET`s on
one connection, one stream each, measured in rounds alternating with the
HTTP/1.1 client through the plain door; printed as requests/s over HTTP/2 /
over HTTP/1.1 (median of pairs), with each door's CPU per request.

Figures include the client's own TLS and parsing, which is the same for both.

mitmproxy is installed at run time into its own venv (`--mitm-venv`, created
with `python3 -m venv` and `pip install mitmproxy` if `mitmdump` is missing):
it pins versions of its own dependencies that the project's do not share.

    .venv/bin/python benchmarks/mitm.py [--mib 64] [--requests 500]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tkbox.image.testing import ScratchCA, free_port

VALUE = b"ghp_BenchmarkSecretValue0123456789"
PH = b"tkbox_GH_0123456789abcdef0123456789abcdef"
HOST = "localhost"
SMALL = b"x" * 2048


# --- certificates -------------------------------------------------------------------


def make_origin_cert(d: Path) -> tuple[Path, Path, Path]:
    """The origin's CA, certificate and key (for HOST), in `d`."""
    ca = ScratchCA.create(d / "origin", [HOST])
    return ca.ca_pem, ca.cert_pem, ca.key_pem


# --- the origin (its own process) -----------------------------------------------------


async def serve_origin(cert: str, key: str, mib: int) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    big = b"\x00" * (1 << 20)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET /big"):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (mib << 20))
                    for _ in range(mib):
                        writer.write(big)
                        await writer.drain()
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(SMALL)
                                 + SMALL)
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx, backlog=256)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


async def serve_h2_origin(cert: str, key: str) -> None:
    import h2.config
    import h2.connection
    import h2.events

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["h2"])

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding=None))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        try:
            while data := await reader.read(65536):
                for ev in conn.receive_data(data):
                    if isinstance(ev, h2.events.StreamEnded):
                        conn.send_headers(ev.stream_id, [
                            (b":status", b"200"), (b"content-length", b"%d" % len(SMALL))])
                        conn.send_data(ev.stream_id, SMALL, end_stream=True)
                    elif isinstance(ev, h2.events.DataReceived):
                        conn.acknowledge_received_data(ev.flow_controlled_length,
                                                       ev.stream_id)
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx, backlog=256)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


# --- the tkbox door (its own process) ---------------------------------------------------


async def serve_door(origin_ca: str, hosts: str, port: int, box_ca_out: str,
                     rules: str = "") -> None:
    from tkbox.doors.network import (
        ApprovalBoard,
        EgressDoor,
        OperatorConfig,
        SystemClock,
        SystemResolver,
        serve_tcp,
    )
    from tkbox.doors.secrets import Secret, SecretsDoor, SecretSpec
    from tkbox.record.testing import FakeSigner

    signer = FakeSigner()
    await signer.open_run("bench", {})
    sec = Secret(SecretSpec("GH", "env", "GH", (HOST,), ports=((HOST, port),)), VALUE, PH)

    async def record(kind: str, body: dict[str, object]) -> None:
        return None  # the signer's cost is the signer benchmark's business

    entry = f"{HOST}:{port}" + (f" {rules}" if rules else "")
    mitm = SecretsDoor("bench", [sec], ca_pems=[Path(origin_ca).read_text()], record=record,
                       ruled_hosts=[HOST] if rules else [])
    Path(box_ca_out).write_text(mitm.ca_pem or "")
    op = OperatorConfig.from_flags(permit=["127.0.0.1/32"], hosts_file=Path(hosts))
    clock = SystemClock()
    door = EgressDoor("bench", signer, [entry], op, SystemResolver(),
                      ApprovalBoard(signer, clock), clock, box="bench", mitm=mitm)
    server = await serve_tcp(door)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


MITM_ADDON = f'''
from mitmproxy import http
PH, VALUE = {PH!r}, {VALUE!r}
def request(flow: http.HTTPFlow) -> None:
    a = flow.request.headers.get("authorization", "")
    if a == "Bearer " + PH.decode():
        flow.request.headers["authorization"] = "Bearer " + VALUE.decode()
    flow.request.headers["accept-encoding"] = "identity"
def response(flow: http.HTTPFlow) -> None:
    if flow.response.raw_content and VALUE in flow.response.raw_content:
        flow.response.raw_content = flow.response.raw_content.replace(VALUE, b"*" * len(VALUE))
'''


# --- the client ----------------------------------------------------------------------------


class Client:
    def __init__(self, proxy_port: int, origin_port: int, ca: Path) -> None:
        raw = socket.create_connection(("127.0.0.1", proxy_port))
        raw.sendall(f"CONNECT {HOST}:{origin_port} HTTP/1.1\r\nHost: {HOST}:{origin_port}"
                    "\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += raw.recv(4096)
        if b" 200" not in head.split(b"\r\n")[0]:
            raise SystemExit(f"CONNECT failed: {head[:200]!r}")
        ctx = ssl.create_default_context(cafile=str(ca))
        ctx.set_alpn_protocols(["http/1.1"])
        self.s = ctx.wrap_socket(raw, server_hostname=HOST)
        self.origin_port = origin_port
        self.buf = bytearray(1 << 20)

    def get(self, path: str) -> int:
        self.s.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}:{self.origin_port}\r\n"
                       f"Authorization: Bearer {PH.decode()}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.s.recv(65536)
            if not chunk:
                raise SystemExit("proxy closed the connection")
            head += chunk
        h, _, rest = head.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in h.split(b"\r\n")[1:]
                      if line.lower().startswith(b"content-length:"))
        got = len(rest)
        view = memoryview(self.buf)
        while got < length:
            n = self.s.recv_into(view, min(len(view), length - got))
            if not n:
                raise SystemExit("short body")
            got += n
        return got

    def close(self) -> None:
        self.s.close()


class H2Client:
    """The same requests over HTTP/2: one connection, one stream per request."""

    def __init__(self, proxy_port: int, origin_port: int, ca: Path) -> None:
        import h2.config
        import h2.connection

        raw = socket.create_connection(("127.0.0.1", proxy_port))
        # as HTTP/2 clients do (curl, nghttp2): a WINDOW_UPDATE and the next request's
        # HEADERS go in two writes, which Nagle would hold for a delayed ACK
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        raw.sendall(f"CONNECT {HOST}:{origin_port} HTTP/1.1\r\nHost: {HOST}:{origin_port}"
                    "\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += raw.recv(4096)
        if b" 200" not in head.split(b"\r\n")[0]:
            raise SystemExit(f"CONNECT failed: {head[:200]!r}")
        ctx = ssl.create_default_context(cafile=str(ca))
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        self.s = ctx.wrap_socket(raw, server_hostname=HOST)
        if self.s.selected_alpn_protocol() != "h2":
            raise SystemExit("the door did not offer h2 to an h2 client of an h2 origin")
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None))
        self.conn.initiate_connection()
        self.s.sendall(self.conn.data_to_send())
        self.authority = f"{HOST}:{origin_port}".encode()

    def get(self, path: str) -> int:
        import h2.events

        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [
            (b":method", b"GET"), (b":scheme", b"https"), (b":authority", self.authority),
            (b":path", path.encode()), (b"authorization", b"Bearer " + PH)], end_stream=True)
        self.s.sendall(self.conn.data_to_send())
        got = 0
        while True:
            data = self.s.recv(65536)
            if not data:
                raise SystemExit("proxy closed the connection")
            for ev in self.conn.receive_data(data):
                if isinstance(ev, h2.events.DataReceived):
                    got += len(ev.data)
                    self.conn.acknowledge_received_data(ev.flow_controlled_length,
                                                        ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                    out = self.conn.data_to_send()
                    if out:
                        self.s.sendall(out)
                    return got
                elif isinstance(ev, h2.events.StreamReset):
                    raise SystemExit("the door reset the stream")
            out = self.conn.data_to_send()
            if out:
                self.s.sendall(out)

    def close(self) -> None:
        self.s.close()


def h2_against_h1(h1: Client, h2c: H2Client, requests: int, rounds: int = 20,
                  pids: tuple[int, int] | None = None) -> float:
    """Requests/s over HTTP/2 / over HTTP/1.1, from alternating rounds (as
    `interleaved`): the median ratio of each pair."""
    clients: list[Client | H2Client] = [h1, h2c]
    for c in clients:
        for _ in range(20):
            assert c.get("/small") == len(SMALL)
    per = max(1, requests // rounds)
    ratios: list[float] = []
    cpu0 = [cpu_seconds(p) for p in pids] if pids else []
    for k in range(rounds):
        rps = [0.0, 0.0]
        for i in ((0, 1) if k % 2 == 0 else (1, 0)):
            t = time.perf_counter()
            for _ in range(per):
                clients[i].get("/small")
            rps[i] = per / (time.perf_counter() - t)
        ratios.append(rps[1] / rps[0])
    if pids:
        used = [cpu_seconds(p) - c0 for p, c0 in zip(pids, cpu0, strict=True)]
        n = per * rounds
        print(f"  door CPU per request: HTTP/1.1 {used[0] / n * 1e6:.0f} us, HTTP/2 "
              f"{used[1] / n * 1e6:.0f} us (CPU-bound requests/s HTTP/2 / HTTP/1.1: "
              f"{used[0] / used[1]:.2f}x)", flush=True)
    ratios.sort()
    print(f"  {rounds} pairs of {per} requests; HTTP/2 / HTTP/1.1 per pair: min "
          f"{ratios[0]:.2f}, median {statistics.median(ratios):.2f}, max {ratios[-1]:.2f}",
          flush=True)
    return statistics.median(ratios)


def measure(name: str, proxy: int, origin: int, ca: Path, mib: int, requests: int,
            repeat: int) -> tuple[float, float]:
    best = 0.0
    for _ in range(repeat):
        c = Client(proxy, origin, ca)
        t = time.perf_counter()
        n = c.get("/big")
        dt = time.perf_counter() - t
        c.close()
        assert n == mib << 20
        best = max(best, mib / dt)
    c = Client(proxy, origin, ca)
    c.get("/small")  # warm
    t = time.perf_counter()
    for _ in range(requests):
        c.get("/small")
    rps = requests / (time.perf_counter() - t)
    c.close()
    print(f"  {name:9s} {best:8.1f} MiB/s   {rps:8.0f} requests/s", flush=True)
    return best, rps


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def interleaved(plain: int, ruled: int, origin: int, plain_ca: Path, ruled_ca: Path,
                requests: int, rounds: int = 20,
                pids: tuple[int, int] | None = None) -> float:
    """Requests/s with rules over without, from rounds that alternate between the two
    doors, each pair of adjacent rounds giving one ratio (a machine whose load changes
    during the run loads both rounds of a pair alike): the median ratio."""
    clients = [Client(plain, origin, plain_ca), Client(ruled, origin, ruled_ca)]
    for c in clients:
        for _ in range(20):
            c.get("/small")
    per = max(1, requests // rounds)
    ratios: list[float] = []
    cpu0 = [cpu_seconds(p) for p in pids] if pids else []
    for k in range(rounds):
        rps = [0.0, 0.0]
        order = (0, 1) if k % 2 == 0 else (1, 0)  # neither door always goes first
        for i in order:
            t = time.perf_counter()
            for _ in range(per):
                clients[i].get("/small")
            rps[i] = per / (time.perf_counter() - t)
        ratios.append(rps[1] / rps[0])
    for c in clients:
        c.close()
    if pids:
        # the doors' own CPU per request: what the rules cost, whatever else the
        # machine runs meanwhile (wall-clock ratios swing with other load)
        used = [cpu_seconds(p) - c0 for p, c0 in zip(pids, cpu0, strict=True)]
        n = per * rounds
        print(f"  door CPU per request: without {used[0] / n * 1e6:.0f} us, with rules "
              f"{used[1] / n * 1e6:.0f} us (CPU-bound requests/s with / without: "
              f"{used[0] / used[1]:.2f}x)", flush=True)
    ratios.sort()
    print(f"  interleaved: {rounds} pairs of {per} requests; with rules / without per pair: "
          f"min {ratios[0]:.2f}, median {statistics.median(ratios):.2f}, "
          f"max {ratios[-1]:.2f}", flush=True)
    return statistics.median(ratios)


def start(argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.strip().isdigit():
        p.kill()
        raise SystemExit(f"{argv[0]} did not start: {line!r}")
    return p, int(line)


def mitmdump(venv: Path) -> Path:
    exe = venv / "bin" / "mitmdump"
    if not exe.exists():
        print(f"installing mitmproxy into {venv} (pip, once)...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "mitmproxy"], check=True)
    return exe


def wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"mitmdump exited {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("mitmdump did not listen")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mitm-venv", type=Path, default=Path(tempfile.gettempdir())
                    / "tkbox-bench-mitmproxy")
    ap.add_argument("--skip-mitmproxy", action="store_true")
    ap.add_argument("--role", default="main", help=argparse.SUPPRESS)
    ap.add_argument("--args", nargs="*", default=[], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "origin":
        asyncio.run(serve_origin(a.args[0], a.args[1], a.mib))
        return
    if a.role == "h2origin":
        asyncio.run(serve_h2_origin(a.args[0], a.args[1]))
        return
    if a.role == "door":
        asyncio.run(serve_door(a.args[0], a.args[1], int(a.args[2]), a.args[3],
                               " ".join(a.args[4:])))
        return
    exe = None if a.skip_mitmproxy else mitmdump(a.mitm_venv)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        origin_ca, cert, key = make_origin_cert(d)
        hosts = d / "hosts"
        hosts.write_text(f"127.0.0.1 {HOST}\n")
        me = [sys.executable, __file__, "--mib", str(a.mib)]
        procs: list[subprocess.Popen[str] | subprocess.Popen[bytes]] = []
        try:
            origin, oport = start([*me, "--role", "origin", "--args", str(cert), str(key)])
            procs.append(origin)
            box_ca = d / "box-ca.pem"
            door, dport = start([*me, "--role", "door", "--args", str(origin_ca), str(hosts),
                                 str(oport), str(box_ca)])
            procs.append(door)
            ruled_ca = d / "box-ca-ruled.pem"
            ruled, rport = start([*me, "--role", "door", "--args", str(origin_ca), str(hosts),
                                  str(oport), str(ruled_ca), "GET", "HEAD", "/**"])
            procs.append(ruled)
            print(f"transfer: GET of {a.mib} MiB (best of {a.repeat}); {a.requests} small GETs "
                  "on one keep-alive connection; TLS on both legs; same client", flush=True)
            t_mib, t_rps = measure("tkbox", dport, oport, box_ca, a.mib, a.requests, a.repeat)
            r_mib, r_rps = measure("tkbox+rules", rport, oport, ruled_ca, a.mib, a.requests,
                                   a.repeat)
            print(f"tkbox with rules / without: requests/s {r_rps / t_rps:.2f}x, "
                  f"throughput {r_mib / t_mib:.2f}x (one after the other)")
            ratio = interleaved(dport, rport, oport, box_ca, ruled_ca, a.requests,
                                pids=(door.pid, ruled.pid))
            print(f"tkbox with rules / without, interleaved (median of pairs): requests/s "
                  f"{ratio:.2f}x (goal: at least 0.9x)")
            h2origin, h2oport = start([*me, "--role", "h2origin", "--args", str(cert),
                                       str(key)])
            procs.append(h2origin)
            h2_ca = d / "box-ca-h2.pem"
            h2door, h2dport = start([*me, "--role", "door", "--args", str(origin_ca),
                                     str(hosts), str(h2oport), str(h2_ca)])
            procs.append(h2door)
            print(f"HTTP/2: {a.requests} small GETs, one stream each, on one connection, "
                  "through the door to an HTTP/2 origin; against HTTP/1.1 through the door",
                  flush=True)
            h2c = H2Client(h2dport, h2oport, h2_ca)
            h1c = Client(dport, oport, box_ca)
            h2ratio = h2_against_h1(h1c, h2c, a.requests, pids=(door.pid, h2door.pid))
            h1c.close()
            h2c.close()
            print(f"tkbox HTTP/2 / HTTP/1.1, interleaved (median of pairs): requests/s "
                  f"{h2ratio:.2f}x")
            if exe is None:
                return
            addon = d / "addon.py"
            addon.write_text(MITM_ADDON)
            mport = free_port()
            conf = d / "mitm"
            mproc = subprocess.Popen(
                [str(exe), "-q", "--listen-host", "127.0.0.1", "--listen-port", str(mport),
                 "--set", f"confdir={conf}", "--set", f"ssl_verify_upstream_trusted_ca={origin_ca}",
                 "--set", "connection_strategy=lazy", "-s", str(addon)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(mproc)
            wait_port(mport, mproc)
            mitm_ca = conf / "mitmproxy-ca-cert.pem"
            m_mib, m_rps = measure("mitmproxy", mport, oport, mitm_ca, a.mib, a.requests,
                                   a.repeat)
            print(f"tkbox / mitmproxy: throughput {t_mib / m_mib:.2f}x, "
                  f"requests/s {t_rps / m_rps:.2f}x (goal: at least 2x)")
        finally:
            for p in procs:
                p.kill()
                p.wait()
            os.sync()


if __name__ == "__main__":
    main()
