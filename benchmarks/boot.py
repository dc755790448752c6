"""Box start-to-ready (cold and from a booted template), `exec true`, 8 boxes at once.

Every figure is measured in the same run, beside its baseline:

- **bare boot**: QEMU booting the same kernel and initramfs with the same
  machine, stopping where the guest would start its init (`rdinit=` names no
  file, the kernel panics, `-no-reboot` ends QEMU): the VMM and the kernel alone.
- **cold start-to-ready**: `BoxManager.create` with templates off: disks
  built, QEMU started, kernel boot, guest agent, boot config, mounts, ready.
- **template build**: booting the template machine to the guest's park point
  and saving it (once per kernel, initramfs, memory, vCPUs, QEMU, layout).
- **template start-to-ready**: `BoxManager.create` restoring that template:
  disks built, QEMU started with `-incoming`, the state loaded, the guest
  woken, boot config (host entropy reseeded, clock set), disks probed and
  mounted, ready. Ratios are to the bare boot of the same run.
- **exec true**: one `BoxManager.exec` round trip (the Bash decision, mux
  stream, RPC, the guest's `tkbox-spawn` joins the cgroup, chroots and execs
  `true`, exit status back, the completion), printed beside a **mux echo**:
  one RPC `ping` over a fresh mux stream (the floor an exec stands on), and
  beside the signer's decision and completion alone (the record's part).
  Medians and minimums: on a busy host the emulated guest gets little CPU.
- **8 at once**: eight `create`s started together from the template: time until
  all are ready, then each idle QEMU's resident and proportional memory.
- **the VMM's cell**: start-to-ready from the template with each QEMU in its cell
  (`tkbox.vm.jail`: its own uid, namespaces, root and cgroup, as `tkbox daemon`
  runs it wherever it can) and without, alternated in the same run; the cell's
  cost is their difference over the start without it (goal: at most 10 %). The
  first start in a cell also loads the template's memory into a sealed memfd,
  once per daemon: printed on its own, not in the medians.

Every box above runs as the daemon runs it here: in a cell where this host allows
one (the output says which).

The signer is a real signer process (`tkbox signer serve`, each answer durable
in its log first), over its Unix socket: every start includes opening the run
there, every `exec` a `Bash` decision and its completion. `--signer fake` uses
the in-process `FakeSigner` instead, for the VM's own figures; the output says
which.

    .venv/bin/python benchmarks/boot.py [--runs N] [--boxes 8] [--signer real|fake]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tkbox import paths
from tkbox.daemon.manager import BoxManager, BoxSpec, Options
from tkbox.image.initramfs import build
from tkbox.image.kernel import find_kernel
from tkbox.image.store import ImageStore
from tkbox.record.client import SignerClient
from tkbox.record.testing import FakeSigner
from tkbox.record.unix import UnixSignerClient
from tkbox.vm.base import Disk, VMSpec
from tkbox.vm.jail import Jail, JailConfig, decide
from tkbox.vm.qemu import QemuLauncher, _Handles, build_argv, decide_accel, qemu_binary
from tkbox.vm.template import TemplateStore


def bare_boot(gb: Any, accel: str, tmp: Path) -> float:
    tmp.mkdir()
    spec = VMSpec(name="bare", kernel=gb.kernel, initramfs=gb.initramfs, workdir=tmp,
                  cmdline="rdinit=/tkbox-benchmark-no-init")
    # QEMU's console, mux and QMP chardevs are socketpairs whose other ends the daemon
    # holds: hold them here too, or QEMU ends at once and the baseline is void.
    cell = Jail("off", JailConfig(mode="off")).cell("bare", memory_mib=spec.memory_mib,
                                                    vcpus=1, accel=accel)
    handles = _Handles(spec, cell)
    argv = build_argv(spec, accel, qemu_binary(), wiring=handles.wiring)
    t0 = time.monotonic()
    try:
        subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=300, check=False,
                       pass_fds=handles.pass_fds())
    finally:
        elapsed = time.monotonic() - t0
        handles.close()
    return elapsed


SIGNER: list[SignerClient] = []  # the signer every manager of this run uses


def manager(launcher: QemuLauncher, images: Any, gb: Any, home: Path) -> BoxManager:
    return BoxManager(launcher=launcher, signer=SIGNER[0], options=Options(),
                      images=images, guest_build=lambda: gb, home=home)


def memory_kib(pid: int) -> tuple[int, int]:
    """(resident, proportional) memory of a process, KiB."""
    rss = pss = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1])
        elif line.startswith("Pss:"):
            pss = int(line.split()[1])
    return rss, pss


async def starts(m: BoxManager, ws: Path, runs: int, prefix: str,
                 exec_rtt: list[float] | None = None, echo_rtt: list[float] | None = None,
                 kinds: list[str] | None = None) -> list[float]:
    ready = []
    for i in range(runs):
        name = f"{prefix}{i}"
        t0 = time.monotonic()
        box = await m.create(BoxSpec(name=name, image="tkbox/default", workspace=str(ws)))
        ready.append(time.monotonic() - t0)
        if kinds is not None:
            kinds.append((box.info.start or {}).get("kind", "?"))
        for _ in range(5 if exec_rtt is not None else 0):
            assert box.guest is not None
            t1 = time.monotonic()
            await box.guest.ping()
            if echo_rtt is not None:
                echo_rtt.append(time.monotonic() - t1)
            t1 = time.monotonic()
            async for _ev in m.exec(name, ["true"], None, None, None):
                pass
            if exec_rtt is not None:
                exec_rtt.append(time.monotonic() - t1)
        await m.stop(name)
        await m.rm(name)
    return ready


async def record_floor(n: int = 15) -> list[float]:
    """A Bash decision and its completion alone, at this run's signer: the part of an
    exec's round trip that is the record's (in a run of its own, so no box's record
    holds a decision for a command that never ran)."""
    signer = SIGNER[0]
    run = f"bench-floor-{time.monotonic_ns()}"
    await signer.open_run(run, {"benchmark": "boot"})
    out = []
    for _ in range(n):
        t = time.monotonic()
        v = await signer.decide(run, "Bash", {"command": "true"}, {"benchmark": True})
        await signer.complete(run, v.decision_id, {"status": 0})
        out.append(time.monotonic() - t)
    await signer.close_run(run)
    return out


async def together(m: BoxManager, ws: Path, n: int) -> tuple[float, list[tuple[int, int]]]:
    names = [f"many{i}" for i in range(n)]
    t0 = time.monotonic()
    boxes = await asyncio.gather(*(m.create(BoxSpec(name=x, image="tkbox/default",
                                                    workspace=str(ws))) for x in names))
    all_ready = time.monotonic() - t0
    await asyncio.sleep(2)  # idle
    mem = [memory_kib(b.vm.vmm_pid) for b in boxes]  # type: ignore[union-attr]
    await asyncio.gather(*(m.stop(x) for x in names))
    for x in names:
        await m.rm(x)
    return all_ready, mem


async def cell_cost(launchers: dict[str, QemuLauncher], images: Any, gb: Any, ws: Path,
                    tmp: Path, runs: int) -> dict[str, list[float]]:
    """Start-to-ready from the template with and without the cell, alternated."""
    managers = {k: manager(launcher, images, gb, tmp / f"cost-{k}")
                for k, launcher in launchers.items()}
    times: dict[str, list[float]] = {k: [] for k in launchers}
    for i in range(runs):
        for k, m in (managers.items() if i % 2 == 0 else reversed(managers.items())):
            times[k] += await starts(m, ws, 1, f"{k}{i}-")
    return times


async def figures(gb: Any, accel: Any, jail: Jail, tmp: Path, runs: int,
                  n: int) -> dict[str, Any]:
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "f").write_text("x\n")
    out: dict[str, Any] = {}
    with ImageStore(paths.images()) as images:
        cold = manager(QemuLauncher(accel, templates=None, jail=jail), images, gb, tmp / "cold")
        out["cold"] = await starts(cold, ws, max(1, runs // 2), "cold")
        store = TemplateStore(tmp / "templates")
        launcher = QemuLauncher(accel, templates=store, build_templates=False, jail=jail)
        m = manager(launcher, images, gb, tmp / "home")
        # The machine every box of this manager gets (BoxManager._boot): same key.
        box = BoxSpec(name="t", image="tkbox/default", workspace=str(ws))
        spec = VMSpec(name="t", kernel=gb.kernel, initramfs=gb.initramfs, workdir=tmp / "tw",
                      disks=(Disk(ws, True, "root"), Disk(ws, True, "lower"),
                             Disk(ws, False, "upper")),
                      memory_mib=box.memory_mib, vcpus=box.vcpus)
        t0 = time.monotonic()
        await launcher.build_template(spec)
        out["build"] = time.monotonic() - t0
        out["exec"], out["echo"], out["kinds"] = [], [], []
        out["template"] = await starts(m, ws, runs + (1 if jail.on else 0), "tpl",
                                       out["exec"], out["echo"], out["kinds"])
        if jail.on:  # the first start in a cell loads the template's memfd, once
            out["first"] = out["template"].pop(0)
        out["together"], out["memory"] = await together(m, ws, n)
        if jail.on:
            bare = QemuLauncher(accel, templates=store, build_templates=False)
            out["cost"] = await cell_cost({"jailed": launcher, "bare": bare}, images, gb, ws,
                                          tmp, max(4, runs))
            await bare.aclose()
        out["floor"] = await record_floor()
        await launcher.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--boxes", type=int, default=8)
    ap.add_argument("--signer", choices=("real", "fake"), default="real")
    args = ap.parse_args()
    kernel = find_kernel()
    gb = build(paths.private_dir(paths.guest_build()), kernel=kernel)
    accel = decide_accel(kernel.version)
    print(f"host acceleration: {accel.accel} ({accel.reason})")
    jail = decide(JailConfig(), qemu_binary(), paths.private_dir(paths.guest_build()))
    print(f"VMM isolation: {jail.summary()}")
    with tempfile.TemporaryDirectory(prefix="tkbb") as t, contextlib.ExitStack() as stack:
        tmp = Path(t)
        if args.signer == "real":
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from real_stack import real_stack

            rs = stack.enter_context(real_stack(tmp / "signer", daemon=False))
            SIGNER.append(UnixSignerClient(rs.signer_socket))
            print("signer: a real signer process; starts include opening the run there "
                  "(durable), each exec a Bash decision and its completion (durable)")
        else:
            SIGNER.append(FakeSigner())
            print("signer: the in-process fake; these figures are the VM's alone")
        bare = [bare_boot(gb, accel.accel, tmp / f"bare{i}") for i in range(args.runs)]
        f = asyncio.run(figures(gb, accel, jail, tmp, args.runs, args.boxes))
    b = statistics.median(bare)
    cold, tpl = statistics.median(f["cold"]), statistics.median(f["template"])
    e, echo = statistics.median(f["exec"]), statistics.median(f["echo"])
    rss = statistics.median(r for r, _ in f["memory"]) / 1024
    pss = statistics.median(p for _, p in f["memory"]) / 1024
    print(f"bare QEMU boot (same kernel+initramfs, to init):     median {b:.2f}s "
          f"over {len(bare)}")
    print(f"box start-to-ready, cold (disks, boot, agent, mounts): median {cold:.2f}s "
          f"over {len(f['cold'])}   ratio {cold / b:.2f}x bare")
    print(f"template build (once per machine key):                 {f['build']:.2f}s")
    print(f"box start-to-ready, from template (disks, restore,     median {tpl:.2f}s "
          f"over {len(f['template'])}   ratio {tpl / b:.2f}x bare  (goal <= 0.35x)")
    print(f"  wake, entropy, clock, mounts; started as: {', '.join(sorted(set(f['kinds'])))})")
    print(f"exec true round trip (decision, mux, RPC, spawn,       median {e * 1000:.0f}ms "
          f"(min {min(f['exec']) * 1000:.0f}ms) over {len(f['exec'])}   (goal <= 50ms)")
    print("  chroot, exec, exit status, completion)")
    print(f"mux echo round trip (RPC ping on a new mux stream):    median {echo * 1000:.0f}ms "
          f"(min {min(f['echo']) * 1000:.0f}ms) over {len(f['echo'])}   "
          f"exec / echo {e / echo:.1f}x")
    print(f"  of exec: the signer's decision + completion alone:   median "
          f"{statistics.median(f['floor']) * 1000:.0f}ms over {len(f['floor'])}")
    if "cost" in f:
        cells, bares = f["cost"]["jailed"], f["cost"]["bare"]
        with_cell, without = statistics.median(cells), statistics.median(bares)
        # Each pair ran back to back: their difference cancels the host's drift (this
        # host is shared; a busy minute slows both of a pair, not one side).
        paired = statistics.median(c - b for c, b in zip(cells, bares, strict=True))
        print(f"box start-to-ready from template, QEMU in its cell:   median {with_cell:.2f}s "
              f"over {len(cells)}")
        print(f"box start-to-ready from template, no cell:            median {without:.2f}s "
              f"over {len(bares)}   (alternated in this run)")
        print(f"  the cell costs {paired * 1000:+.0f}ms, {paired / without * 100:+.1f}% of a "
              f"box's start (median of {len(cells)} back-to-back pairs; goal <= 10%); "
              f"medians apart: {(with_cell - without) * 1000:+.0f}ms")
        print(f"  first start in a cell (loads the template's memory once): {f['first']:.2f}s")
    print(f"{args.boxes} boxes created at once from the template: all ready in "
          f"{f['together']:.2f}s ({f['together'] / b:.2f}x one bare boot); "
          f"per idle box: RSS median {rss:.0f} MiB, PSS median {pss:.0f} MiB")


if __name__ == "__main__":
    main()
