"""The signer's figures, each beside the limits measured in the same run.

    python benchmarks/signer.py [--decisions 2000] [--concurrency 32] [--records 5000] [--json]

Measures, against a real `tkbox signer serve` process in a temporary home:

- durable decisions per second through the socket (one client, `--concurrency`
  requests in flight), and p50/p99 latency of one decision at a time;
- bundle verification in records per second (`verify_bundle` of one run);

and, in the same process and on the same disk, the limits they stand on:

- raw Ed25519 signatures per second (`cryptography`, a 300-byte message);
- raw SQLite durable inserts per second (WAL, synchronous=FULL, one commit each).

Each figure is printed with its ratio to both limits. The signer commits in
groups, so decisions per second may exceed one durable insert per decision.

With `tracekit-ai` installed (the test extras), the same figures for the
second backend, `TracekitSignerClient` in front of a real Tracekit 1.4.2
signer (`tracekit signer serve --config`, written by tkbox's `init_dev`), are
measured in the same run and printed beside tkbox's with their ratio
(tkbox ÷ Tracekit), plus for both the time from an operator's hold call
starting (in this process) to the daemon's client receiving the push (tkbox: its push
connection; Tracekit: its signed incident webhook). Tracekit's verification is
its own verifier in this process (`tracekit.verify.v2.verify`, files on disk);
tkbox's is `verify_bundle` on bytes. `--no-tracekit` skips the second backend.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tkbox.errors import SignerUnavailable
from tkbox.record.unix import UnixSignerClient
from tkbox.verify import verify_bundle


def raw_ed25519(seconds: float = 1.0) -> float:
    key = Ed25519PrivateKey.generate()
    msg = os.urandom(300)
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        for _ in range(200):
            key.sign(msg)
        n += 200
    return n / elapsed


def raw_sqlite(directory: Path, seconds: float = 2.0) -> float:
    path = directory / "raw.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (i INTEGER PRIMARY KEY, b BLOB)")
    row = os.urandom(400)
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        db.execute("BEGIN")
        db.execute("INSERT INTO t (b) VALUES (?)", (row,))
        db.execute("COMMIT")
        n += 1
    db.close()
    return n / elapsed


class Signer:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tkbb-", dir=os.environ.get("TMPDIR", "/tmp")))
        self.env = {**os.environ, "TKBOX_HOME": str(self.root / "home"),
                    "TKBOX_RUNTIME": str(self.root / "run")}
        self.env.pop("TKBOX_SIGNER_SOCKET", None)
        self.socket = self.root / "run" / "signer.sock"
        cli = [sys.executable, "-m", "tkbox.signer.cli", "signer"]
        subprocess.run([*cli, "init", "--dev"], env=self.env, check=True, capture_output=True)
        self.proc = subprocess.Popen([*cli, "serve"], env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.socket.exists() and asyncio.run(self._ping()):
                return
            time.sleep(0.05)
        raise RuntimeError("the signer did not start")

    async def _ping(self) -> bool:
        c = UnixSignerClient(self.socket, timeout=1)
        try:
            await c.ping()
            return True
        except SignerUnavailable:
            return False
        finally:
            await c.aclose()

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)
        shutil.rmtree(self.root, ignore_errors=True)


async def decisions(sock: Path, n: int, concurrency: int) -> dict[str, float]:
    c = UnixSignerClient(sock, timeout=30)
    try:
        await c.open_run("bench-latency", {})
        lat = []
        for i in range(min(n, 500)):  # one at a time: latency
            t = time.perf_counter()
            await c.decide("bench-latency", "Bash", {"command": f"make test-{i}"},
                           {"cwd": "/workspace"})
            lat.append(time.perf_counter() - t)
        await c.open_run("bench-throughput", {})
        counter = iter(range(n))

        async def worker() -> None:
            for i in counter:
                await c.decide("bench-throughput", "Bash", {"command": f"make test-{i}"},
                               {"cwd": "/workspace"})

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        lat.sort()
        return {"per_second": n / elapsed,
                "p50_ms": statistics.median(lat) * 1000,
                "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000}
    finally:
        await c.aclose()


async def verification(sock: Path, records: int) -> dict[str, float]:
    c = UnixSignerClient(sock, timeout=60, export_timeout=600)
    try:
        await c.open_run("bench-bundle", {"image": "sha256:" + "0" * 64})
        pending = []
        for i in range(records - 2):
            pending.append(c.event("bench-bundle", "tkbox.model.call",
                                   {"host": "api.anthropic.com", "path": "/v1/messages",
                                    "status": 200, "bytes": 1000 + i}))
            if len(pending) == 64:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
        await c.close_run("bench-bundle")
        e = await c.export("bench-bundle")
    finally:
        await c.aclose()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        report = verify_bundle(e.bundle, e.trust)
        best = min(best, time.perf_counter() - t)
    assert report.records == records
    return {"per_second": records / best, "bundle_bytes": float(len(e.bundle))}


class TracekitSigner:
    """A real Tracekit signer on a config from tkbox's `init_dev`."""

    def __init__(self) -> None:
        import re

        from tkbox.record.tracekit_setup import init_dev, tracekit_command

        self.root = Path(tempfile.mkdtemp(prefix="tkbt-", dir=os.environ.get("TMPDIR", "/tmp")))
        self.setup = init_dev(self.root / "tk")
        self.log = self.root / "signer.log"
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(
                [*tracekit_command(), "signer", "serve", "--config", str(self.setup.config)],
                stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = re.search(r"serving on 127\.0\.0\.1:(\d+)", self.log.read_text())
            if m and self.setup.socket.exists():
                return
            time.sleep(0.05)
        raise RuntimeError(f"the Tracekit signer did not start: {self.log.read_text()}")

    def client(self) -> Any:
        from tkbox.record.tracekit import TracekitSignerClient

        return TracekitSignerClient.from_setup(self.setup)

    def hold(self, run: str) -> None:
        from tracekit.sdk.client import Client

        c = Client(f"http://127.0.0.1:{self.setup.http_port}",
                   token_file=str(self.setup.operator_token))
        try:
            c.call("run_hold", {"request_id": os.urandom(16).hex(), "run_id": run,
                                "reason": "bench"})
        finally:
            c.close()

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)
        shutil.rmtree(self.root, ignore_errors=True)


async def decisions_with(c: Any, n: int, concurrency: int,
                         tag: str = "") -> dict[str, float]:
    """As `decisions`, through any SignerClient."""
    try:
        await c.open_run("bench-latency" + tag, {})
        lat = []
        for i in range(min(n, 500)):
            t = time.perf_counter()
            await c.decide("bench-latency" + tag, "Bash", {"command": f"make test-{i}"},
                           {"cwd": "/workspace"})
            lat.append(time.perf_counter() - t)
        await c.open_run("bench-throughput" + tag, {})
        counter = iter(range(n))

        async def worker() -> None:
            for i in counter:
                await c.decide("bench-throughput" + tag, "Bash", {"command": f"make test-{i}"},
                               {"cwd": "/workspace"})

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        lat.sort()
        return {"per_second": n / elapsed, "p50_ms": statistics.median(lat) * 1000,
                "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000}
    finally:
        await c.aclose()


async def tracekit_verification(tk: TracekitSigner, records: int) -> dict[str, float]:
    from tracekit.verify import v2

    c = tk.client()
    try:
        await c.open_run("bench-bundle", {"image": "sha256:" + "0" * 64})
        pending = []
        for i in range(records - 2):
            pending.append(c.event("bench-bundle", "tkbox.model.call",
                                   {"host": "api.anthropic.com", "path": "/v1/messages",
                                    "status": 200, "bytes": 1000 + i}))
            if len(pending) == 64:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
        await c.close_run("bench-bundle")
        e = await c.export("bench-bundle")
    finally:
        await c.aclose()
    (tk.root / "b.tkb").write_bytes(e.bundle)
    (tk.root / "b.trust.json").write_bytes(e.trust)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        rep, code = v2.verify(str(tk.root / "b.tkb"), str(tk.root / "b.trust.json"))
        best = min(best, time.perf_counter() - t)
    assert code == 0, rep.integrity
    return {"per_second": records / best, "bundle_bytes": float(len(e.bundle))}


async def hold_push(c: Any, hold: Any, rounds: int = 5) -> float:
    """Median seconds from the operator's hold call starting to the push arriving."""
    got: asyncio.Queue[tuple[str, float]] = asyncio.Queue()

    async def listen() -> None:
        async for p in c.pushes():
            got.put_nowait((p.run_id, time.perf_counter()))

    task = asyncio.create_task(listen())
    await asyncio.sleep(0.3)
    times = []
    try:
        for i in range(rounds):
            run = f"bench-hold-{i}"
            await c.open_run(run, {})
            t0 = time.perf_counter()
            await asyncio.to_thread(hold, run)
            while True:
                r, t1 = await asyncio.wait_for(got.get(), 10)
                if r == run:
                    break
            times.append(t1 - t0)
    finally:
        task.cancel()
        await c.aclose()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decisions", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-tracekit", action="store_true", help="skip the Tracekit backend")
    args = ap.parse_args()

    signer = Signer()
    try:
        sign = raw_ed25519()
        insert = raw_sqlite(signer.root)
        dec = asyncio.run(decisions(signer.socket, args.decisions, args.concurrency))
        ver = asyncio.run(verification(signer.socket, args.records))
        push = asyncio.run(hold_push(UnixSignerClient(signer.socket, timeout=30),
                                     lambda run: asyncio.run(_tkbox_hold(signer.socket, run))))
    finally:
        signer.close()
    tk: dict[str, Any] | None = None
    if not args.no_tracekit:
        try:
            import tracekit  # noqa: F401
        except ImportError:
            print("tracekit-ai is not installed: the Tracekit backend is skipped", file=sys.stderr)
        else:
            tks = TracekitSigner()
            try:
                tdec = asyncio.run(decisions_with(tks.client(), args.decisions, args.concurrency))
                from tkbox.record.tracekit import TracekitSignerClient

                sdec = asyncio.run(decisions_with(TracekitSignerClient(tks.setup.socket),
                                                  args.decisions, args.concurrency, "-sock"))
                tver = asyncio.run(tracekit_verification(tks, args.records))
                tpush = asyncio.run(hold_push(tks.client(), tks.hold))
            finally:
                tks.close()
            tk = {"decisions_per_second": tdec["per_second"], "decision_p50_ms": tdec["p50_ms"],
                  "decision_p99_ms": tdec["p99_ms"], "verify_records_per_second":
                  tver["per_second"], "bundle_bytes": tver["bundle_bytes"],
                  "hold_push_s": tpush, "socket_decisions_per_second": sdec["per_second"],
                  "socket_decision_p50_ms": sdec["p50_ms"]}

    out: dict[str, Any] = {
        "raw_ed25519_signs_per_second": sign,
        "raw_sqlite_durable_inserts_per_second": insert,
        "decisions_per_second": dec["per_second"],
        "decision_p50_ms": dec["p50_ms"],
        "decision_p99_ms": dec["p99_ms"],
        "verify_records_per_second": ver["per_second"],
        "bundle_bytes": ver["bundle_bytes"],
        "hold_push_s": push,
        "concurrency": args.concurrency,
        "decisions": args.decisions,
        "records": args.records,
        "tracekit": tk,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    rows = [
        ("raw Ed25519 signatures", sign, "/s"),
        ("raw SQLite durable inserts", insert, "/s"),
        (f"durable decisions ({args.concurrency} in flight)", dec["per_second"], "/s"),
        ("bundle verification", ver["per_second"], "records/s"),
    ]
    print(f"{'figure':44} {'value':>12} {'':10} {'÷ Ed25519':>10} {'÷ SQLite':>10}")
    for name, value, unit in rows:
        print(f"{name:44} {value:12.0f} {unit:10} {value / sign:10.3f} {value / insert:10.3f}")
    print(f"decision latency, one at a time: p50 {dec['p50_ms']:.2f} ms, "
          f"p99 {dec['p99_ms']:.2f} ms (one durable SQLite insert: {1000 / insert:.2f} ms)")
    if tk is None:
        return
    print()
    print(f"{'both backends, same run':44} {'tkbox':>12} {'Tracekit':>12} {'tkbox ÷ TK':>11}")
    both = [
        ("durable decisions/s", dec["per_second"], tk["decisions_per_second"]),
        ("decision p50 ms (lower is better)", dec["p50_ms"], tk["decision_p50_ms"]),
        ("decision p99 ms (lower is better)", dec["p99_ms"], tk["decision_p99_ms"]),
        ("bundle verification records/s", ver["per_second"], tk["verify_records_per_second"]),
        ("bundle bytes", ver["bundle_bytes"], tk["bundle_bytes"]),
        ("hold call -> push, median s", push, tk["hold_push_s"]),
    ]
    for name, a, b in both:
        print(f"{name:44} {a:12.3f} {b:12.3f} {a / b:11.2f}")
    print("Tracekit with one identity for every box (no per-box token, no delegation): "
          f"{tk['socket_decisions_per_second']:.0f} decisions/s "
          f"(tkbox ÷ it {dec['per_second'] / tk['socket_decisions_per_second']:.2f}), "
          f"p50 {tk['socket_decision_p50_ms']:.2f} ms")


async def _tkbox_hold(sock: Path, run: str) -> None:
    """One hold through tkbox's signer socket, as the signer's own user sends it."""
    c = UnixSignerClient(sock)
    try:
        await c.hold(run, "bench")
    finally:
        await c.aclose()


if __name__ == "__main__":
    main()
