"""How fast the signer's operator stops a box: hold → VM paused, quarantine → VM gone.

Real parts only: a signer process, a daemon process subscribed to its pushes,
a booted box (QEMU). The hold, release and quarantine are sent from this
process over the signer's socket (as `tkbox signer hold` does, without the CLI's
start-up), and the clock starts when the request is sent:

- hold → paused: until the daemon reports the box `held`, which it does only
  after QEMU's QMP `stop` returned (the VM is paused), polled every 5 ms
  through the daemon's API; includes the signer's durable write, the push,
  the daemon's QMP round trip, and up to one poll;
- release → running: the same, back to `running` (QMP `cont`);
- quarantine → VM gone: until the QEMU process no longer exists (polled every
  5 ms in /proc); includes the durable write, the push, the daemon closing the
  box's door and killing QEMU, and the kernel reaping it.

Baselines in the same run: a signer round trip (`status`, not durable) and a
daemon API round trip (`GET /v1/boxes/NAME`, which asks QMP for the VM's
status). Goal: each latency under 1 s.

    .venv/bin/python benchmarks/holds.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tkbox.record.unix import UnixSignerClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_stack import RealStack, real_stack  # noqa: E402


def qemu_pid(run_id: str) -> int:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"qemu-system-x86_64") and any(run_id.encode() in a
                                                                for a in argv):
                return int(d.name)
    raise SystemExit(f"no QEMU process for {run_id}")


async def until(pred: Any, within: float = 30.0) -> float:
    t0 = time.perf_counter()
    while not await pred():
        if time.perf_counter() - t0 > within:
            raise SystemExit("timed out waiting")
        await asyncio.sleep(0.005)
    return time.perf_counter() - t0


async def measure(s: RealStack, runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in
                                   ("signer rtt", "api rtt", "hold", "release", "quarantine")}
    ws = s.home.parent / "ws"
    ws.mkdir()
    (ws / "f").write_text("x\n")
    signer = UnixSignerClient(s.signer_socket)
    api = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(s.daemon_socket)),
                            base_url="http://tkbox", timeout=30)
    try:
        for i in range(runs):
            name = f"hold{i}"
            s.tk("run", "--name", name, "--workspace", str(ws))
            box = (await api.get(f"/v1/boxes/{name}")).json()
            run_id = box["run_id"]

            async def state(want: str, name: str = name) -> bool:
                return bool((await api.get(f"/v1/boxes/{name}")).json()["state"] == want)

            for _ in range(10):
                t0 = time.perf_counter()
                await signer.ping()
                out["signer rtt"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await api.get(f"/v1/boxes/{name}")
                out["api rtt"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await signer.hold(run_id, "benchmark")
            await until(lambda: state("held"))
            out["hold"].append(time.perf_counter() - t0)
            assert (await api.get(f"/v1/boxes/{name}")).json()["vm_status"] == "paused"
            t0 = time.perf_counter()
            await signer.release(run_id, "benchmark")
            await until(lambda: state("running"))
            out["release"].append(time.perf_counter() - t0)
            pid = qemu_pid(run_id)

            async def gone(pid: int = pid) -> bool:
                return not Path(f"/proc/{pid}").exists()

            t0 = time.perf_counter()
            await signer.quarantine(run_id, "benchmark")
            await until(gone)
            out["quarantine"].append(time.perf_counter() - t0)
            await until(lambda: state("quarantined"))
            s.tk("rm", "--force", name)
    finally:
        await api.aclose()
        await signer.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as t, real_stack(Path(t)) as s:
        out = asyncio.run(measure(s, args.runs))
    med = {k: statistics.median(v) * 1000 for k, v in out.items()}
    print(f"{'figure':28} {'median ms':>10} {'max ms':>10}  n")
    for k, v in out.items():
        print(f"{k:28} {med[k]:10.1f} {max(v) * 1000:10.1f}  {len(v)}")
    print()
    print("signer rtt: one `status` request over the signer's socket (no disk write)")
    print("api rtt:    one GET /v1/boxes/NAME from the daemon (includes a QMP query-status)")
    print("hold:       hold request sent → daemon reports held (QMP stop returned)")
    print("release:    release request sent → daemon reports running (QMP cont returned)")
    print("quarantine: quarantine request sent → the QEMU process is gone")
    print()
    for k in ("hold", "release", "quarantine"):
        print(f"ratio {k} / signer rtt = {med[k] / med['signer rtt']:.1f};  "
              f"{k} / api rtt = {med[k] / med['api rtt']:.1f};  goal < 1000 ms: "
              f"{'met' if max(out[k]) < 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
