"""What an origin's tiny response chunks cost the secrets door, against one chunk.

A hostile origin can answer in 1-byte chunks (`1\\r\\nX\\r\\n`, written all at
once): the door's loop, which every box shares, then does the work of one
chunk per byte unless it takes the chunks already read together. Measured on
loopback, in this process: a TLS origin (a thread, raw sockets) behind an
`EgressDoor` handing the tunnel to a `SecretsDoor` (its own loop in a thread,
a fake signer; the origin's name mapped to 127.0.0.1), and a blocking client
that CONNECTs, sends `Authorization: Bearer <placeholder>` and reads the
answer, which the door redacts, to its end.

Each answer is a `--kib` KiB chunked body: `whole` in one chunk (the baseline)
and `tiny` in 1-byte chunks. Printed: the median wall time of `--runs` requests
each, in ms, the ratio tiny/whole, and the door's loop CPU time per tiny
chunk. Only the ratio is a result; the machine's other load is not controlled.

    .venv/bin/python benchmarks/tiny_chunks.py [--kib 64] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import ssl
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tkbox.doors.network import (
    ApprovalBoard,
    EgressDoor,
    OperatorConfig,
    SystemClock,
    SystemResolver,
    serve_tcp,
)
from tkbox.doors.secrets import Secret, SecretsDoor, SecretSpec
from tkbox.image.testing import ScratchCA
from tkbox.record.testing import FakeSigner

HOST = "origin.bench.test"
VALUE = b"ghp_BenchTokenValue0123456789"
PH = b"tkbox_GH_0123456789abcdef0123456789abcdef"


def origin(cert: Path, key: Path, kib: int) -> tuple[int, threading.Thread]:
    """A TLS origin: `/whole` and `/tiny`, each `kib` KiB, the answer written in one go."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    lst = socket.create_server(("127.0.0.1", 0))
    body = b"x" * (kib << 10)
    answers = {
        b"/whole": b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body),
        b"/tiny": b"1\r\nx\r\n" * len(body) + b"0\r\n\r\n",
    }

    def serve() -> None:
        while True:
            raw, _ = lst.accept()
            try:
                s = ctx.wrap_socket(raw, server_side=True)
                head = b""
                while b"\r\n\r\n" not in head:
                    got = s.recv(65536)
                    if not got:
                        break
                    head += got
                path = head.split(b" ")[1] if b" " in head else b""
                s.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n"
                          b"connection: close\r\n\r\n" + answers.get(path, b"0\r\n\r\n"))
                s.close()
            except (OSError, ssl.SSLError):
                raw.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return lst.getsockname()[1], t


class Door:
    """The network door with a secrets door, on its own loop in a thread."""

    def __init__(self, port: int, origin_ca: str, hosts: Path, box_ca: Path) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.loop_thread_cpu = 0.0

        async def setup() -> int:
            signer = FakeSigner()
            await signer.open_run("bench", {})

            async def record(kind: str, body: dict[str, Any]) -> None:
                return None

            sec = Secret(SecretSpec("GH", "env", "GH", (HOST,), ports=((HOST, port),)),
                         VALUE, PH)
            mitm = SecretsDoor("bench", [sec], ca_pems=[origin_ca], record=record)
            box_ca.write_text(mitm.ca_pem or "")
            op = OperatorConfig.from_flags(permit=["127.0.0.1/32"], hosts_file=hosts)
            clock = SystemClock()
            door = EgressDoor("bench", signer, [f"{HOST}:{port}"], op, SystemResolver(),
                              ApprovalBoard(signer, clock), clock, box="bench", mitm=mitm)
            server = await serve_tcp(door)
            return int(server.sockets[0].getsockname()[1])

        self.port = asyncio.run_coroutine_threadsafe(setup(), self.loop).result(30)

    def cpu(self) -> float:
        """CPU time of the door's loop thread so far."""
        async def get() -> float:
            return time.thread_time()
        return asyncio.run_coroutine_threadsafe(get(), self.loop).result(30)


def request(proxy: int, port: int, ca: Path, path: str) -> int:
    raw = socket.create_connection(("127.0.0.1", proxy))
    raw.sendall(f"CONNECT {HOST}:{port} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += raw.recv(4096)
    if b" 200" not in head.split(b"\r\n")[0]:
        raise SystemExit(f"CONNECT failed: {head[:200]!r}")
    s = ssl.create_default_context(cafile=str(ca)).wrap_socket(raw, server_hostname=HOST)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nAuthorization: Bearer "
              f"{PH.decode()}\r\nConnection: close\r\n\r\n".encode())
    n = 0
    while True:
        try:
            got = s.recv(1 << 20)
        except (OSError, ssl.SSLError):
            break
        if not got:
            break
        n += len(got)
    s.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ca = ScratchCA.create(d, [HOST])
        port, _ = origin(ca.cert_pem, ca.key_pem, a.kib)
        hosts = d / "hosts"
        hosts.write_text(f"127.0.0.1 {HOST}\n")
        box_ca = d / "box-ca.pem"
        door = Door(port, ca.ca_pem.read_text(), hosts, box_ca)
        figures: dict[str, tuple[float, float]] = {}
        for path in ("/whole", "/tiny"):
            request(door.port, port, box_ca, path)  # warm
            walls, cpus = [], []
            for _ in range(a.runs):
                c0, t0 = door.cpu(), time.perf_counter()
                n = request(door.port, port, box_ca, path)
                walls.append(time.perf_counter() - t0)
                cpus.append(door.cpu() - c0)
                assert n > a.kib << 10, n
            figures[path] = statistics.median(walls), statistics.median(cpus)
    (w_wall, w_cpu), (t_wall, t_cpu) = figures["/whole"], figures["/tiny"]
    chunks = a.kib << 10
    print(f"{a.kib} KiB answer, median of {a.runs}:")
    print(f"  one chunk     {w_wall * 1000:8.1f} ms wall  {w_cpu * 1000:8.1f} ms door loop CPU")
    print(f"  1-byte chunks {t_wall * 1000:8.1f} ms wall  {t_cpu * 1000:8.1f} ms door loop CPU"
          f"  ({(t_cpu - w_cpu) / chunks * 1e6:.1f} us a chunk more)")
    print(f"  ratio 1-byte/one: {t_wall / w_wall:.1f}x wall, {t_cpu / max(w_cpu, 1e-9):.1f}x CPU")


if __name__ == "__main__":
    main()
