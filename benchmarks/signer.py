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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decisions", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    signer = Signer()
    try:
        sign = raw_ed25519()
        insert = raw_sqlite(signer.root)
        dec = asyncio.run(decisions(signer.socket, args.decisions, args.concurrency))
        ver = asyncio.run(verification(signer.socket, args.records))
    finally:
        signer.close()

    out: dict[str, Any] = {
        "raw_ed25519_signs_per_second": sign,
        "raw_sqlite_durable_inserts_per_second": insert,
        "decisions_per_second": dec["per_second"],
        "decision_p50_ms": dec["p50_ms"],
        "decision_p99_ms": dec["p99_ms"],
        "verify_records_per_second": ver["per_second"],
        "bundle_bytes": ver["bundle_bytes"],
        "concurrency": args.concurrency,
        "decisions": args.decisions,
        "records": args.records,
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


if __name__ == "__main__":
    main()
