"""Box start-to-ready and `exec true` round trip, beside a bare QEMU boot.

The baseline is QEMU booting the same kernel and initramfs with the same
machine, stopping where the guest would start its init (`rdinit=` names no
file, the kernel panics, `-no-reboot` ends QEMU): the cost of the VMM and the
kernel alone. All figures come from the same run on this host.

    .venv/bin/python benchmarks/boot.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tkbox import paths
from tkbox.daemon.manager import BoxManager, BoxSpec, Options
from tkbox.image.initramfs import build
from tkbox.image.kernel import find_kernel
from tkbox.image.store import ImageStore
from tkbox.record.client import FakeSigner
from tkbox.vm.base import VMSpec
from tkbox.vm.qemu import QemuLauncher, build_argv, decide_accel


def bare_boot(gb, accel: str, tmp: Path) -> float:
    spec = VMSpec(name="bare", kernel=gb.kernel, initramfs=gb.initramfs, workdir=tmp,
                  cmdline="rdinit=/tkbox-benchmark-no-init")
    argv = build_argv(spec, accel)
    t0 = time.monotonic()
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300, check=False)
    return time.monotonic() - t0


async def box_figures(gb, accel, tmp: Path, runs: int) -> tuple[list[float], list[float]]:
    ready, rtt = [], []
    ws = tmp / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "f").write_text("x\n")
    with ImageStore(paths.images()) as images:
        m = BoxManager(launcher=QemuLauncher(accel), signer=FakeSigner(), options=Options(),
                       images=images, guest_build=lambda: gb, home=tmp / "home")
        for i in range(runs):
            t0 = time.monotonic()
            await m.create(BoxSpec(name=f"bench{i}", image="tkbox/default", workspace=str(ws)))
            ready.append(time.monotonic() - t0)
            for _ in range(5):
                t1 = time.monotonic()
                async for _ev in m.exec(f"bench{i}", ["true"], None, None, None):
                    pass
                rtt.append(time.monotonic() - t1)
            await m.stop(f"bench{i}")
            await m.rm(f"bench{i}")
    return ready, rtt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    kernel = find_kernel()
    gb = build(paths.private_dir(paths.guest_build()), kernel=kernel)
    accel = decide_accel(kernel.version)
    print(f"host acceleration: {accel.accel} ({accel.reason})")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        bare = [bare_boot(gb, accel.accel, tmp / f"bare{i}") for i in range(args.runs)
                if (tmp / f"bare{i}").mkdir() is None]
        ready, rtt = asyncio.run(box_figures(gb, accel, tmp, args.runs))
    b, r, e = statistics.median(bare), statistics.median(ready), statistics.median(rtt)
    print(f"bare QEMU boot (same kernel+initramfs, to init): median {b:.2f}s over {len(bare)}")
    print(f"box start-to-ready (disks, boot, guest agent):   median {r:.2f}s over {len(ready)}")
    print(f"exec true round trip (through the mux and RPC):  median {e * 1000:.0f}ms "
          f"over {len(rtt)}")
    print(f"ratio start-to-ready / bare boot: {r / b:.2f}")
    print(f"ratio exec round trip / bare boot: {e / b:.3f}")


if __name__ == "__main__":
    sys.exit(main())
