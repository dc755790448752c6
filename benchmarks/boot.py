"""Box start-to-ready and `exec true` round trip, beside a bare QEMU boot.

The baseline is QEMU booting the same kernel and initramfs with the same
machine, stopping where the guest would start its init (`rdinit=` names no
file, the kernel panics, `-no-reboot` ends QEMU): the cost of the VMM and the
kernel alone. All figures come from the same run on this host.

The box figures use the real parts: a real signer process (`tkbox signer
serve`, its log durable on disk before each answer) reached over its Unix
socket, the daemon's own `BoxManager` (in this process, so no CLI start-up is
counted), QEMU, and the guest agent over the serial mux. What each figure
includes is printed beside it.

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
from tkbox.record.unix import UnixSignerClient
from tkbox.vm.base import VMSpec
from tkbox.vm.qemu import QemuLauncher, build_argv, decide_accel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_stack import real_stack  # noqa: E402


def bare_boot(gb, accel: str, tmp: Path) -> float:
    spec = VMSpec(name="bare", kernel=gb.kernel, initramfs=gb.initramfs, workdir=tmp,
                  cmdline="rdinit=/tkbox-benchmark-no-init")
    argv = build_argv(spec, accel)
    t0 = time.monotonic()
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300, check=False)
    return time.monotonic() - t0


async def box_figures(gb, accel, tmp: Path, runs: int,
                      signer_socket: Path) -> tuple[list[float], list[float]]:
    ready, rtt = [], []
    ws = tmp / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "f").write_text("x\n")
    signer = UnixSignerClient(signer_socket)
    with ImageStore(paths.images()) as images:
        m = BoxManager(launcher=QemuLauncher(accel), signer=signer, options=Options(),
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
    await signer.aclose()
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
        with real_stack(tmp / "stack", daemon=False) as stack:
            ready, rtt = asyncio.run(box_figures(gb, accel, tmp, args.runs,
                                                 stack.signer_socket))
    b, r, e = statistics.median(bare), statistics.median(ready), statistics.median(rtt)
    print(f"bare QEMU boot: median {b:.2f}s over {len(bare)}")
    print("  includes: QEMU start, the same kernel and initramfs, up to where init would run")
    print(f"box start-to-ready: median {r:.2f}s over {len(ready)}")
    print("  includes: the workspace disks (squashfs + ext4), the run opened at the real "
          "signer (durable), QEMU, kernel, guest init and agent, the boot handshake over the "
          "serial mux")
    print(f"exec true round trip: median {e * 1000:.0f}ms over {len(rtt)}")
    print("  includes: the Bash decision at the real signer (durable), the RPC over the "
          "serial mux, fork+exec of `true` in the guest, its completion record at the signer")
    print(f"ratio start-to-ready / bare boot: {r / b:.2f}")
    print(f"ratio exec round trip / bare boot: {e / b:.3f}")


if __name__ == "__main__":
    sys.exit(main())
