"""The signer's figures, each beside a baseline measured in the same run.

    python benchmarks/signer.py [--decisions 4000] [--concurrency 32]
                                [--records 1000,20000,100000] [--json] [--no-tracekit]

Against a real `tkbox signer serve` process in a temporary home (real socket,
real SQLite store with synchronous=FULL, real Cedar and shell reader), and in
this process on the same disk:

- durable decisions/s with `--concurrency` in flight: a client's `decide`
  calls through the socket (framing, the shell reader, Cedar, the record
  made, hashed and committed to disk before the answer). Baseline: raw SQLite
  durable inserts, one commit each (WAL, synchronous=FULL). Rows marked (3):
  three rounds, the decisions and the inserts alternated in each, new
  requests each round; the medians.
- the same, a signer with its policy workers (the default: one per core
  beyond the first) against one with `--policy-workers 0` (every new request
  evaluated on its event loop), side by side, three rounds alternated with new
  requests each round; the medians and their ratio.
- the same with agent-like requests: an agent repeats commands (`git status`,
  the same test), which the signer's exact decision cache answers. Same
  baseline.
- durable events/s with `--concurrency` in flight: the same socket, framing,
  record and group commit, without a policy to evaluate (an `event` call, as
  the network door records a connection): what the record path alone can
  carry. Same baseline.
- CPU per new decision, by process: one more round of all-different requests
  with `--concurrency` in flight, each process's user and system CPU divided
  by the decisions: the client (this process), the signer (its event loop and
  log writer) and its policy workers; and the most decisions/s the host's
  cores could carry at that cost, all of them busy (the kernel's own share,
  the disk's threads among it, not counted).
- policy evaluation alone, µs per request: `PolicyEngine.decide` in this
  process over the same all-different requests (the shell reader and Cedar,
  no cache hits, no socket, no record): the CPU a new decision costs before
  it is recorded, and so the most decisions one core can evaluate.
- the remote signer (`tkbox signer serve --listen`, mutual TLS): from 1, 4 and
  16 daemons (each its own process and connection, with `--concurrency` split
  between them), all-different decisions/s and the p50/p99 of every decision
  under that load, over TLS beside the same over the Unix socket (alternated,
  one signer serving both), and the µs of CPU each decision costs in every
  process: the signer, its policy workers, the daemons together. Goals (issue
  32): TLS ≥ 0.8× the socket's rate; ≤ 150 µs of CPU per decision in all.
- one decision at a time, p50/p99: all of the above, one call at a time
  (500 of them, after 50 not timed).
  Baseline: raw `write` + `fdatasync` of 300 bytes to a file on the same
  disk, p50/p99: the disk's own floor for anything durable.
- bundle verification, records/s, for each of `--records`: `verify_bundle`
  of a run the signer exported (its records interleaved with another run's),
  from bytes: the checkpoint's signatures, every record's inclusion, schema
  and chain. Baseline: only reading the same records (base64-decode,
  `json.loads` and SHA-256 of each, no checks). And once in a fresh process,
  as `tkbox verify` does (the interpreter started, the verifier imported, the
  bundle read from a file, then verified once: records/s of that one
  verification), with the process's peak RSS (VmHWM) beside the peak RSS of
  one that imports the same and only reads the bundle.

Everything durable is on the filesystem of $TMPDIR, printed first. The raw
inserts' baseline is mostly the disk's fsync: on an ext4 without a journal
(this project's test host) that is far cheaper than on a journaled one, and
the decisions' ratio to it reads lower than on a user's disk (benchmarks/disk.py).

Requests in the decision runs are all different (`--decisions` distinct
command lines, hosts and paths: the cache never answers), except in the
agent-like run, where about half repeat. Goals (issue 14): ≥ 5,000 durable
decisions/s and ≥ 1.5× the raw inserts; p99 ≤ 2 ms one at a time (not below
the disk's own fdatasync p99: a decision is acknowledged only once durable);
≥ 100,000 records/s verified.

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
import base64
import contextlib
import hashlib
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tkbox.record.unix import UnixSignerClient
from tkbox.verify import verify_bundle

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disk import filesystem  # noqa: E402


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


def raw_fdatasync(directory: Path, n: int = 500) -> dict[str, float]:
    """p50/p99 of appending 300 bytes to a file and fdatasync'ing it, on this disk."""
    fd = os.open(directory / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    buf = os.urandom(300)
    lat = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            os.write(fd, buf)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
    finally:
        os.close(fd)
    lat.sort()
    return {"p50_ms": statistics.median(lat) * 1000,
            "p99_ms": lat[min(n - 1, int(n * 0.99))] * 1000}


class Signer:
    """A real `tkbox signer serve`; `workers` its --policy-workers (None: its default),
    and once it answers, until those workers are ready (what a signer that has run for
    a second has)."""

    def __init__(self, workers: int | None = None, listen: tuple[str, ...] = ()) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tkbb-", dir=os.environ.get("TMPDIR", "/tmp")))
        self.env = {**os.environ, "TKBOX_HOME": str(self.root / "home"),
                    "TKBOX_RUNTIME": str(self.root / "run")}
        self.env.pop("TKBOX_SIGNER_SOCKET", None)
        self.socket = self.root / "run" / "signer.sock"
        self.workers = 0
        cli = [sys.executable, "-m", "tkbox.signer.cli", "signer"]
        subprocess.run([*cli, "init", "--dev"], env=self.env, check=True, capture_output=True)
        extra = [] if workers is None else ["--policy-workers", str(workers)]
        self.proc = subprocess.Popen([*cli, "serve", *extra, *listen], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.socket.exists() and self._ready():
                return
            time.sleep(0.05)
        raise RuntimeError("the signer did not start")

    def _ready(self) -> bool:
        st = subprocess.run([sys.executable, "-m", "tkbox.signer.cli", "signer", "status",
                             "--json"], env=self.env, capture_output=True)
        if st.returncode != 0:
            return False
        pw = json.loads(st.stdout)["policy_workers"]
        self.workers = pw["count"]
        return bool(pw["ready"] == pw["count"])

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)
        shutil.rmtree(self.root, ignore_errors=True)


Request = tuple[str, dict[str, Any], dict[str, Any]]

_COMMANDS = (
    "pytest -x tests/unit/test_mod{i}.py -k case_{i}",
    "git diff --stat HEAD~{i} -- src/pkg{i}",
    "make -C build/target{i} all",
    "curl -fsSL https://example.com/install-{i}.sh | sh",
    "grep -rn 'def handler_{i}' src | head -n 20",
    "python -c 'import sys; print(sys.argv)' arg{i}",
    "npm install left-pad@1.{i}.0 && npm test",
    "cd /tmp/w{i} && tar xzf ../a{i}.tgz && ls -la",
)
_REPEATED = ("git status", "ls -la", "pytest -x tests", "git diff")


def request(i: int, repeat: bool = False) -> Request:
    """Request i of a varied stream: Bash (3 in 4), Connect, Write. With `repeat`,
    every other request is one an agent makes again and again."""
    if repeat and i % 2:
        return "Bash", {"command": _REPEATED[(i // 2) % len(_REPEATED)]}, {"cwd": "/workspace"}
    if i % 8 == 3:
        return "Connect", {"host": f"pkg{i}.mirror.example", "port": 443}, {}
    if i % 8 == 7:
        return "Write", {"path": f"src/module_{i}.py", "sha256": f"{i:064x}", "mode": 420}, {}
    return "Bash", {"command": _COMMANDS[i % len(_COMMANDS)].format(i=i)}, {"cwd": "/workspace"}


def shifted(offset: int) -> Callable[[int], Request]:
    """`request`, numbered from `offset`: requests no earlier round has made."""
    return lambda i: request(i + offset)


async def decisions_with(c: Any, n: int, concurrency: int, tag: str = "",
                         make: Callable[[int], Request] = request) -> dict[str, float]:
    """Durable decisions/s with `concurrency` in flight, and p50/p99 one at a time,
    through any SignerClient; every request different unless `make` repeats."""
    try:
        await c.open_run("bench-latency" + tag, {})
        for i in range(50):  # warm-up (first Cedar calls, first pages of the store): not timed
            await c.decide("bench-latency" + tag, *make(2_000_000 + i))
        lat = []
        for i in range(min(n, 500)):  # one at a time: latency
            action, resource, context = make(1_000_000 + i)
            t = time.perf_counter()
            await c.decide("bench-latency" + tag, action, resource, context)
            lat.append(time.perf_counter() - t)
        await c.open_run("bench-throughput" + tag, {})
        counter = iter(range(n))

        async def worker() -> None:
            for i in counter:
                action, resource, context = make(i)
                await c.decide("bench-throughput" + tag, action, resource, context)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        lat.sort()
        return {"per_second": n / elapsed, "p50_ms": statistics.median(lat) * 1000,
                "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000}
    finally:
        await c.aclose()


def _cpu_seconds(pid: int) -> float:
    """User and system CPU of process `pid` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def cpu_per_decision(signer: Signer, n: int, concurrency: int) -> dict[str, float]:
    """µs of CPU per new decision in each process, over one more round of `n`
    all-different requests with `concurrency` in flight (no one-at-a-time calls):
    the client (this process), the signer (its event loop and its log writer) and
    its policy workers."""

    async def burst() -> None:
        c: Any = UnixSignerClient(signer.socket, timeout=30)
        try:
            await c.open_run("bench-cpu", {})
            counter = iter(range(n))
            make = shifted(30_000_000)

            async def worker() -> None:
                for i in counter:
                    await c.decide("bench-cpu", *make(i))

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        finally:
            await c.aclose()

    pid = signer.proc.pid
    kids = _children(pid)
    before = {p: _cpu_seconds(p) for p in (pid, *kids)}
    t0 = os.times()
    asyncio.run(burst())
    t1 = os.times()
    us = {"signer": (_cpu_seconds(pid) - before[pid]) / n * 1e6,
          "workers": sum(_cpu_seconds(k) - before[k] for k in kids) / n * 1e6,
          "client": ((t1.user - t0.user) + (t1.system - t0.system)) / n * 1e6}
    us["total"] = us["signer"] + us["workers"] + us["client"]
    return us


def decisions_beside_inserts(signer: Signer, n: int, concurrency: int,
                             rounds: int = 3) -> tuple[dict[str, float], float]:
    """All-different decisions (`decisions_with`) and raw durable SQLite inserts,
    `rounds` rounds in alternated order, new requests each round (no cache
    answers); the medians of each figure. One round of 4,000 decisions lasts under
    a second, and on a shared host one such round swung by 2× from run to run."""
    got: dict[str, list[float]] = {"per_second": [], "p50_ms": [], "p99_ms": []}
    inserts: list[float] = []
    for r in range(rounds):
        for step in ("decide", "insert") if r % 2 == 0 else ("insert", "decide"):
            if step == "insert":
                (signer.root / f"raw{r}").mkdir()
                inserts.append(raw_sqlite(signer.root / f"raw{r}"))
                continue
            d = asyncio.run(decisions_with(UnixSignerClient(signer.socket, timeout=30), n,
                                           concurrency, f"-r{r}",
                                           shifted((r + 1) * 20_000_000)))
            for k, v in got.items():
                v.append(d[k])
    return ({k: statistics.median(v) for k, v in got.items()}, statistics.median(inserts))


async def agent_like(sock: Path, n: int, concurrency: int) -> dict[str, float]:
    return await decisions_with(UnixSignerClient(sock, timeout=30), n, concurrency, "-agent",
                                lambda i: request(i, repeat=True))


async def events(sock: Path, n: int, concurrency: int) -> dict[str, float]:
    """Durable events/s with `concurrency` in flight: the record path without a policy."""
    c = UnixSignerClient(sock, timeout=30)
    try:
        await c.open_run("bench-events", {})
        counter = iter(range(n))

        async def worker() -> None:
            for i in counter:
                _, resource, context = request(i)
                await c.event("bench-events", "tkbox.bench.event",
                              {"resource": resource, "context": context})

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return {"per_second": n / (time.perf_counter() - t0)}
    finally:
        await c.aclose()


def evaluation(n: int) -> dict[str, float]:
    """Microseconds of CPU per new decision in `PolicyEngine.decide`, in this process."""
    from tkbox.signer.cedarpolicy import PolicyEngine

    engine = PolicyEngine(None)
    for i in range(50):  # warm-up, as above
        engine.decide("bench-eval", *request(3_000_000 + i))
    reqs = [request(4_000_000 + i) for i in range(n)]
    t0 = time.process_time()
    for action, resource, context in reqs:
        engine.decide("bench-eval", action, resource, context)
    elapsed = time.process_time() - t0
    assert engine.hits == 0, "the evaluation figure must not come from the cache"
    return {"us": elapsed / n * 1e6}


async def export_run(sock: Path, run: str, records: int, others: int = 1) -> tuple[bytes, bytes]:
    """A run of `records` records (open, model calls, close), each followed by another
    run's record every `others`-th time (the log of a signer serving several boxes),
    exported as a bundle."""
    c = UnixSignerClient(sock, timeout=60, export_timeout=600)
    try:
        await c.open_run(run, {"image": "sha256:" + "0" * 64})
        await c.open_run(run + "-other", {})
        pending = []
        for i in range(records - 2):
            pending.append(c.event(run, "tkbox.model.call",
                                   {"host": "api.anthropic.com", "path": "/v1/messages",
                                    "status": 200, "bytes": 1000 + i}))
            if i % 8 == 0:
                pending.append(c.event(run + "-other", "tkbox.gap", {"i": i}))
            if len(pending) >= 200:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
        await c.close_run(run)
        e = await c.export(run)
    finally:
        await c.aclose()
    return e.bundle, e.trust


def workers_or_not(n: int, concurrency: int, rounds: int = 3) -> tuple[int, float, float]:
    """All-different decisions/s with the signer's policy workers (its default count)
    and with none (`--policy-workers 0`: every request evaluated on its event loop):
    two signers side by side, `rounds` rounds alternated, new requests each round
    (so that no cache answers). Returns the worker count and the two medians."""
    with_w, without = Signer(), Signer(workers=0)
    try:
        got: dict[int, list[float]] = {0: [], 1: []}
        for r in range(rounds):
            order = [(1, with_w), (0, without)] if r % 2 == 0 else [(0, without), (1, with_w)]
            for k, s in order:
                d = asyncio.run(decisions_with(UnixSignerClient(s.socket, timeout=30), n,
                                               concurrency, f"-ab{r}",
                                               shifted((r + 1) * 10_000_000)))
                got[k].append(d["per_second"])
        return with_w.workers, statistics.median(got[1]), statistics.median(got[0])
    finally:
        with_w.close()
        without.close()


def verification(bundle: bytes, trust: bytes, records: int) -> dict[str, float]:
    """Best of 3 `verify_bundle` against best of 3 of reading the same records."""
    raws = [base64.b64decode(line[6:]) for line in bundle.split(b"\n")
            if line.startswith(b"extra ")]
    assert len(raws) == records

    def read() -> None:
        for raw in raws:
            json.loads(raw)
            hashlib.sha256(b"\x00" + raw).digest()

    best = floor = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        report = verify_bundle(bundle, trust)
        best = min(best, time.perf_counter() - t)
        t = time.perf_counter()
        for line in bundle.split(b"\n"):
            if line.startswith(b"extra "):
                base64.b64decode(line[6:])
        read()
        floor = min(floor, time.perf_counter() - t)
    assert report.records == records
    return {"per_second": records / best, "read_per_second": records / floor,
            "bundle_bytes": float(len(bundle)), **fresh_verification(bundle, trust)}


# (Peak RSS as VmHWM, this process's own: getrusage's ru_maxrss keeps the high
# mark of the parent it was forked from across exec.)
_FRESH = """
import re, sys, time
from tkbox.verify import verify_bundle
bundle, trust = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
t = time.perf_counter()
n = verify_bundle(bundle, trust).records if sys.argv[3] == "verify" else 1
rate = n / (time.perf_counter() - t)
hwm = re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1)
print(rate, hwm)
"""


def fresh_verification(bundle: bytes, trust: bytes) -> dict[str, float]:
    """What `tkbox verify` does once: a fresh process reads the bundle and verifies it;
    the verification's records/s (the imports and the reading not timed) and the
    process's peak RSS, beside the peak RSS of a process that imports the same and
    only reads the bundle."""
    with tempfile.TemporaryDirectory() as d:
        paths = [Path(d) / "b.tkb", Path(d) / "t.json"]
        paths[0].write_bytes(bundle)
        paths[1].write_bytes(trust)
        out = {}
        for what in ("verify", "read"):
            r = subprocess.run([sys.executable, "-c", _FRESH, *map(str, paths), what],
                               capture_output=True, text=True, check=True)
            out[what] = [float(x) for x in r.stdout.split()]
    return {"fresh_per_second": out["verify"][0], "fresh_rss_mb": out["verify"][1] / 1024,
            "read_rss_mb": out["read"][1] / 1024}


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


# --- the remote signer: many daemons over TLS beside the same over the socket ---------


def _pki(root: Path, daemons: int) -> dict[str, Any]:
    """A CA, the signer's certificate (127.0.0.1) and one client certificate per daemon."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def save(stem: str, cert: x509.Certificate, key: Any) -> tuple[str, str]:
        c, k = root / f"{stem}.pem", root / f"{stem}.key"
        c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        k.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
        return str(c), str(k)

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("bench-ca")).issuer_name(name("bench-ca"))
          .public_key(ca_key.public_key()).serial_number(1)
          .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, server: bool) -> tuple[str, str]:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(hours=1))
             .not_valid_after(now + dt.timedelta(days=1)))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        b = b.add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            False)
        return save(cn, b.sign(ca_key, hashes.SHA256()), key)

    ca_path = root / "ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return {"ca": str(ca_path), "server": leaf("signer", True),
            "clients": [leaf(f"daemon-{i}", False) for i in range(daemons)]}


def _client_main(spec: dict[str, Any]) -> None:
    """One daemon's process (`--client JSON`): waits for a line on stdin, then makes its
    decisions with its share in flight, and prints its latencies and CPU as JSON."""
    from tkbox.record.remote import RemoteSignerClient

    async def go() -> dict[str, Any]:
        if spec["mode"] == "tls":
            c: Any = RemoteSignerClient(spec["url"], ca=Path(spec["ca"]),
                                        cert=Path(spec["cert"]), key=Path(spec["key"]),
                                        timeout=60)
        else:
            c = UnixSignerClient(spec["socket"], timeout=60)
        run = spec["run"]
        try:
            await c.open_run(run, {})
            for i in range(20):  # warm-up: the connection, the first Cedar calls
                await c.decide(run, *request(spec["offset"] + 9_000_000 + i))
            print("ready", flush=True)
            sys.stdin.readline()
            t0c, lat = os.times(), []
            counter = iter(range(spec["n"]))

            async def worker() -> None:
                for i in counter:
                    t = time.perf_counter()
                    await c.decide(run, *request(spec["offset"] + i))
                    lat.append(time.perf_counter() - t)

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(spec["inflight"])))
            wall = time.perf_counter() - t0
            t1c = os.times()
            return {"lat": lat, "wall": wall, "n": spec["n"],
                    "cpu_s": (t1c.user - t0c.user) + (t1c.system - t0c.system)}
        finally:
            await c.aclose()

    print(json.dumps(asyncio.run(go())), flush=True)


def many_daemons(signer: Signer, pki: dict[str, Any], url: str, mode: str, daemons: int,
                 n: int, inflight: int, offset: int) -> dict[str, float]:
    """`daemons` client processes, each its own connection (a daemon's), `inflight`
    decisions in flight in each, `n` all-different decisions in all: decisions/s from
    the moment all are told to go to the last answer, p50/p99 of every decision's
    latency under that load, and µs of CPU per decision in every process."""
    per = max(1, n // daemons)
    procs = []
    for d in range(daemons):
        cert, key = pki["clients"][d]
        spec = {"mode": mode, "url": url, "ca": pki["ca"], "cert": cert, "key": key,
                "socket": str(signer.socket), "run": f"bench-{mode}-{daemons}-{d}-{offset}",
                "n": per, "inflight": inflight, "offset": offset + d * 1_000_000}
        procs.append(subprocess.Popen([sys.executable, __file__, "--client", json.dumps(spec)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      env=signer.env, text=True))
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"a benchmark daemon did not start: {line!r}")
    pid = signer.proc.pid
    kids = _children(pid)
    before = {q: _cpu_seconds(q) for q in (pid, *kids)}
    t0 = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        results.append(json.loads(out.strip().splitlines()[-1]))
    wall = time.perf_counter() - t0
    total = sum(r["n"] for r in results)
    lat = sorted(x for r in results for x in r["lat"])
    signer_us = (_cpu_seconds(pid) - before[pid]) / total * 1e6
    workers_us = sum(_cpu_seconds(k) - before[k] for k in kids) / total * 1e6
    clients_us = sum(r["cpu_s"] for r in results) / total * 1e6
    return {"per_second": total / wall, "p50_ms": statistics.median(lat) * 1000,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
            "cpu_signer_us": signer_us, "cpu_workers_us": workers_us,
            "cpu_daemons_us": clients_us, "cpu_total_us": signer_us + workers_us + clients_us}


def remote_figures(n: int, concurrency: int, counts: tuple[int, ...] = (1, 4, 16)
                   ) -> dict[str, dict[str, dict[str, float]]]:
    """For 1, 4 and 16 daemons: the same decisions over TLS (mutual TLS, one client
    certificate per daemon) and over the Unix socket, alternated, one signer serving
    both (`--listen`), its store on the same disk."""
    root = Path(tempfile.mkdtemp(prefix="tkbr-", dir=os.environ.get("TMPDIR", "/tmp")))
    pki = _pki(root, max(counts))
    port = _free_port()
    signer = Signer(listen=("--listen", f"127.0.0.1:{port}", "--tls-cert", pki["server"][0],
                            "--tls-key", pki["server"][1], "--client-ca", pki["ca"]))
    url = f"https://127.0.0.1:{port}"
    out: dict[str, dict[str, dict[str, float]]] = {"tls": {}, "unix": {}}
    try:
        offset = 40_000_000
        for k in counts:
            inflight = max(2, concurrency // k)
            for mode in ("unix", "tls") if k % 2 else ("tls", "unix"):
                offset += 20_000_000
                out[mode][str(k)] = many_daemons(signer, pki, url, mode, k, n, inflight, offset)
    finally:
        signer.close()
        shutil.rmtree(root, ignore_errors=True)
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def print_remote(rem: dict[str, dict[str, dict[str, float]]]) -> None:
    print()
    print(f"{'remote signer (mutual TLS) beside the socket':44} {'TLS /s':>9} {'socket /s':>10} "
          f"{'ratio':>6} {'TLS p99':>8} {'sock p99':>9}   CPU µs/decision TLS: signer, "
          "workers, daemons = all  (goal: ratio ≥ 0.8, all ≤ 150)")
    for k in rem["tls"]:
        t, u = rem["tls"][k], rem["unix"][k]
        print(f"{k + ' daemon(s), all different':44} {t['per_second']:9.0f} "
              f"{u['per_second']:10.0f} {t['per_second'] / u['per_second']:6.2f} "
              f"{t['p99_ms']:8.2f} {u['p99_ms']:9.2f}   {t['cpu_signer_us']:.0f}, "
              f"{t['cpu_workers_us']:.0f}, {t['cpu_daemons_us']:.0f} = {t['cpu_total_us']:.0f}"
              f" (socket: {u['cpu_total_us']:.0f})")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        _client_main(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decisions", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--records", default="1000,20000,100000",
                    help="bundle sizes to verify, comma-separated")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-tracekit", action="store_true", help="skip the Tracekit backend")
    ap.add_argument("--remote-only", action="store_true",
                    help="only the remote signer's rows (TLS beside the socket)")
    args = ap.parse_args()
    if args.remote_only:
        rem = remote_figures(args.decisions, args.concurrency)
        if args.json:
            print(json.dumps({"remote": rem}, indent=2))
        else:
            print_remote(rem)
        return
    sizes = [int(n) for n in args.records.split(",")]

    signer = Signer()
    disk = filesystem(signer.root)
    try:
        sign = raw_ed25519()
        sync = raw_fdatasync(signer.root)
        dec, insert = decisions_beside_inserts(signer, args.decisions, args.concurrency)
        cpu = cpu_per_decision(signer, args.decisions, args.concurrency)
        agent = asyncio.run(agent_like(signer.socket, args.decisions, args.concurrency))
        ev = asyncio.run(events(signer.socket, args.decisions, args.concurrency))
        evaluate = evaluation(args.decisions)
        ver = {}
        for n in sizes:
            data, trust = asyncio.run(export_run(signer.socket, f"bench-bundle-{n}", n))
            ver[n] = verification(data, trust, n)
        push = asyncio.run(hold_push(UnixSignerClient(signer.socket, timeout=30),
                                     lambda run: asyncio.run(_tkbox_hold(signer.socket, run))))
    finally:
        signer.close()
    workers, with_workers, loop_only = workers_or_not(args.decisions, args.concurrency)
    rem = remote_figures(args.decisions, args.concurrency)
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
                tver = asyncio.run(tracekit_verification(tks, sizes[0]))
                tpush = asyncio.run(hold_push(tks.client(), tks.hold))
            finally:
                tks.close()
            tk = {"decisions_per_second": tdec["per_second"], "decision_p50_ms": tdec["p50_ms"],
                  "decision_p99_ms": tdec["p99_ms"], "verify_records_per_second":
                  tver["per_second"], "bundle_bytes": tver["bundle_bytes"],
                  "hold_push_s": tpush, "socket_decisions_per_second": sdec["per_second"],
                  "socket_decision_p50_ms": sdec["p50_ms"]}

    out: dict[str, Any] = {
        "filesystem": disk,
        "raw_ed25519_signs_per_second": sign,
        "raw_sqlite_durable_inserts_per_second": insert,
        "raw_fdatasync_p50_ms": sync["p50_ms"],
        "raw_fdatasync_p99_ms": sync["p99_ms"],
        "decisions_per_second": dec["per_second"],
        "cpu_per_decision_us": cpu,
        "policy_workers": workers,
        "worker_decisions_per_second": with_workers,
        "loop_only_decisions_per_second": loop_only,
        "decision_p50_ms": dec["p50_ms"],
        "decision_p99_ms": dec["p99_ms"],
        "agent_like_decisions_per_second": agent["per_second"],
        "events_per_second": ev["per_second"],
        "policy_evaluation_us": evaluate["us"],
        "verify": {str(n): v for n, v in ver.items()},
        "hold_push_s": push,
        "concurrency": args.concurrency,
        "decisions": args.decisions,
        "tracekit": tk,
        "remote": rem,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    c = args.concurrency
    print(f"the signer's store and the baselines' files: {disk}")
    print(f"{'figure':52} {'value':>10} {'baseline (same run)':>34} {'ratio':>7}  goal")
    rows = [
        (f"durable decisions/s, {c} in flight, all different (3)", dec["per_second"],
         f"raw SQLite durable inserts {insert:8.0f}/s", dec["per_second"] / insert,
         "≥ 5,000/s and ≥ 1.5×"),
        (f"the same, {workers} policy worker(s), 3 rounds' median", with_workers,
         f"none, alternated {loop_only:8.0f}/s", with_workers / loop_only,
         "(--policy-workers 0)"),
        (f"durable decisions/s, {c} in flight, agent-like", agent["per_second"],
         f"raw SQLite durable inserts {insert:8.0f}/s", agent["per_second"] / insert,
         "(half repeat: cache)"),
        (f"durable events/s, {c} in flight (no policy)", ev["per_second"],
         f"raw SQLite durable inserts {insert:8.0f}/s", ev["per_second"] / insert,
         "(the record path alone)"),
        ("one decision at a time, p99 ms (3)", dec["p99_ms"],
         f"raw fdatasync p99 {sync['p99_ms']:8.2f} ms", dec["p99_ms"] / sync["p99_ms"],
         "≤ 2 ms, not below the disk"),
        ("one decision at a time, p50 ms (3)", dec["p50_ms"],
         f"raw fdatasync p50 {sync['p50_ms']:8.2f} ms", dec["p50_ms"] / sync["p50_ms"], ""),
    ]
    for n, v in ver.items():
        rows.append((f"bundle verification, {n} records, records/s", v["per_second"],
                     f"read them (b64+JSON+SHA) {v['read_per_second']:8.0f}/s",
                     v["per_second"] / v["read_per_second"], "≥ 100,000/s"))
        rows.append(("  the same once, in a fresh process, records/s", v["fresh_per_second"],
                     "", v["fresh_per_second"] / v["read_per_second"], "(what tkbox verify does)"))
        rows.append((f"  its peak RSS, MB ({v['bundle_bytes'] / 2**20:.0f} MB bundle)",
                     v["fresh_rss_mb"], f"a process only reading it {v['read_rss_mb']:6.0f} MB",
                     v["fresh_rss_mb"] / v["read_rss_mb"], ""))
    for name, value, base, ratio, goal in rows:
        print(f"{name:52} {value:10.2f} {base:>34} {ratio:7.2f}  {goal}")
    print(f"(raw Ed25519 signatures {sign:.0f}/s; a decision signs nothing: the log's "
          "checkpoints are signed, not each record)")
    us = evaluate["us"]
    print(f"(policy evaluation alone, in this process: {us:.0f} µs of CPU per new request, "
          f"the shell reader and Cedar; one core evaluates at most {1e6 / us:.0f} new "
          "decisions/s)")
    cores = os.cpu_count() or 1
    print(f"(CPU per new decision, one more round: the client {cpu['client']:.0f} µs, the "
          f"signer's loop and log writer {cpu['signer']:.0f} µs, its policy workers "
          f"{cpu['workers']:.0f} µs: {cpu['total']:.0f} µs in all; at that cost {cores} "
          f"core(s) carry at most {cores * 1e6 / cpu['total']:.0f} decisions/s, every one "
          "of them busy)")
    print_remote(rem)
    if tk is None:
        return
    print()
    print(f"{'both backends, same run':44} {'tkbox':>12} {'Tracekit':>12} {'tkbox ÷ TK':>11}")
    both = [
        ("durable decisions/s", dec["per_second"], tk["decisions_per_second"]),
        ("decision p50 ms (lower is better)", dec["p50_ms"], tk["decision_p50_ms"]),
        ("decision p99 ms (lower is better)", dec["p99_ms"], tk["decision_p99_ms"]),
        (f"bundle verification records/s ({sizes[0]})", ver[sizes[0]]["per_second"],
         tk["verify_records_per_second"]),
        ("bundle bytes", ver[sizes[0]]["bundle_bytes"], tk["bundle_bytes"]),
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
