"""A stranger's first try (issue 31): from nothing of tkbox cached to a verified bundle.

What runs: the Action's own `action/action.yml`, step by step, as GitHub's runner runs a
composite action (`action/testing/composite.run_action`: the kernel decision and cache
keys, the actions/cache steps against a local cache directory, the guest build,
`action/run.py` with its own signer and daemon, the artifact step, the post-job cache
saves). The job is the real Claude Code (the native program of its npm package,
fetched by tkbox from an npm registry stand-in on loopback that serves the real
tarball) in the Action's default image, `python:3.12-slim` by its Docker Hub name,
pulled through the daemon's registry mirror (Debian's docker-registry on loopback
holding a Debian image with Python under that name), against a scripted stand-in of
the Messages API on loopback: Read, Edit, Bash (`python3 test_calc.py`), done. Then
`tkbox verify` on the bundle.

Cold: an empty RUNNER_TEMP (so an empty TKBOX_HOME) and an empty cache directory,
as a new runner's first run of a workflow. Warm: the next run of the same workflow,
an empty RUNNER_TEMP again, the cache directory the cold run's post steps filled.

What is outside the figures (prepared first, once): the system packages and tkbox
itself (the Action's `install: false`, with this checkout's Python: as after the apt
and pip steps; `--install` times them too, with a fresh venv from the package
registry), the npm tarball (fetched once with `npm pack` into a benchmark cache, then
served on loopback: a runner downloads it from the registry's CDN), the image pushed
to the loopback registry, the TLS stand-ins.

    .venv/bin/python benchmarks/first_try.py [--install] [--keep]

Printed: each phase, cold and warm, as the Action's job summary reports it (its own
steps, and `tkbox agent`'s `phases`); the agent's own time apart; the totals beside
the write-up's 61 s (one Action step on a free GitHub runner, with KVM) and this
issue's goals on this machine (cold <= 120 s, warm <= 45 s). What differs here:
software emulation (TCG) instead of KVM, 2 cores, and other work on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from action.testing.composite import ActionRun, run_action  # noqa: E402

from tkbox.agents.testing import MessagesStandIn, failing_checkout, fix_script  # noqa: E402
from tkbox.image import tools  # noqa: E402
from tkbox.image.testing import (  # noqa: E402
    LocalRegistry,
    NpmRegistry,
    ScratchCA,
    integrity,
    push_image,
)

KEY = "sk-ant-benchFirstTryKey-1f7e"
PROMPT = "Make the failing test in test_calc.py pass. Do not change the test."
WRITE_UP_SECONDS = 61.0
GOAL_COLD, GOAL_WARM = 120.0, 45.0


def tarball(cache: Path) -> tuple[str, str, bytes]:
    """Claude Code's pinned glibc package tarball, fetched once with npm itself."""
    tool = tools.TOOLS["claude-code"]
    package, version = tool.packages["glibc"], tool.version
    name = f"{package.lstrip('@').replace('/', '-')}-{version}.tgz"
    path = cache / name
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"first_try: fetching {package}@{version} once (npm pack) into {cache}",
              flush=True)
        subprocess.run(["npm", "pack", f"{package}@{version}", "--pack-destination",
                        str(cache)], check=True, capture_output=True)
    data = path.read_bytes()
    pinned = tool.pinned.get(("glibc", version))
    if pinned is not None and integrity(data) != pinned:
        raise SystemExit(f"first_try: {path} is not the tarball tkbox pins; remove it")
    return package, version, data


def python_image(reg: LocalRegistry) -> str:
    """`library/python:3.12-slim` on the loopback registry: the Debian root the setup
    built (Python, a shell), as one layer."""
    from tkbox.image.store import ImageStore

    with ImageStore() as store:
        rootfs = store.inspect("tkbox/default").rootfs
    tar = subprocess.run(["sqfs2tar", str(rootfs)], capture_output=True, check=True).stdout
    config = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
              "Cmd": ["python3"]}
    with reg.client() as c:
        return push_image(c, "library/python", "3.12-slim", [tar], compression="zstd",
                          config=config).digest


def checkout(root: Path) -> Path:
    ws = root / "repo"
    shutil.rmtree(ws, ignore_errors=True)
    return failing_checkout(ws)


def summary_table(run: ActionRun, heading: str) -> dict[str, str]:
    """A table of the job summary after `heading`: first cell -> second cell."""
    if heading not in run.summary:
        return {}
    part = run.summary.split(heading, 1)[1].split("\n\n", 2)
    text = part[1] if len(part) > 1 else ""
    rows = [line.strip("|").split("|") for line in text.splitlines()[2:]
            if line.startswith("|")]
    return {r[0].strip(): r[1].strip() for r in rows if len(r) >= 2}


def _steps(run: ActionRun) -> dict[str, float]:
    """Each step's seconds by name (a name that repeats is numbered)."""
    out: dict[str, float] = {}
    for name, secs in run.timings():
        key, n = name, 2
        while key in out:
            key, n = f"{name} ({n})", n + 1
        out[key] = secs
    return out


def one_run(label: str, work: Path, cache: Path, machine: dict[str, str],
            inputs: dict[str, str]) -> dict[str, Any]:
    runner_temp = work / "runner-temp"
    shutil.rmtree(runner_temp, ignore_errors=True)
    ws = checkout(work / label)
    t0 = time.monotonic()
    run = run_action(ROOT / "action", inputs, workspace=ws, runner_temp=runner_temp,
                     cache_dir=cache, env={"ANTHROPIC_API_KEY": KEY}, os_env=machine,
                     runner_environment="self-hosted", step_timeout=3600)
    action_s = time.monotonic() - t0
    if not run.ok:
        raise SystemExit(f"first_try: the {label} run failed:\n{run.log[-6000:]}")
    bundle, trust = run.outputs["bundle"], run.outputs["trust"]
    t1 = time.monotonic()
    v = subprocess.run([sys.executable, "-m", "tkbox.cli", "verify", bundle, "--trust", trust],
                       capture_output=True, text=True, env={**os.environ,
                                                            "PYTHONPATH": str(ROOT / "src")})
    verify_s = time.monotonic() - t1
    if "Integrity: VERIFIED." not in v.stdout:
        raise SystemExit(f"first_try: the {label} bundle does not verify: {v.stdout}{v.stderr}")
    fixed = "return a + b" in (ws / "calc.py").read_text()
    return {"label": label, "action": action_s, "verify": verify_s,
            "total": action_s + verify_s, "steps": _steps(run), "fixed": fixed,
            "phases": summary_table(run, "Where the time went"),
            "caches": summary_table(run, "Caches")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--install", action="store_true",
                    help="time the Action's install step too (a fresh venv from the "
                         "package registry)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args()
    bench_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
        "tkbox-bench"
    package, version, tgz = tarball(bench_cache)
    work = Path(tempfile.mkdtemp(prefix="tkbox-first-try-"))
    ca = ScratchCA.create(work / "tls", ["api.anthropic.com"])
    reg = LocalRegistry(work / "registry", ca).start()
    npm = NpmRegistry(ca)
    npm.add(package, version, tgz)
    npm.start()
    model = MessagesStandIn(ca, KEY, lambda: fix_script(
        "python3 -B test_calc.py && echo TESTS-PASSED"),
        markers={"passed": b"TESTS-PASSED"}).start()
    try:
        print("first_try: pushing the image to the loopback registry (not timed)",
              flush=True)
        python_image(reg)
        hosts = work / "hosts"
        hosts.write_text("127.0.0.1 api.anthropic.com\n")
        machine = {k: v for k, v in os.environ.items()
                   if not k.startswith(("TKBOX_", "GITHUB_", "RUNNER_", "INPUT_"))}
        machine.update({
            **npm.env(),
            "SSL_CERT_FILE": str(ca.ca_pem),  # the registry mirror's CA, for the daemon
            "TKBOX_DAEMON_ARGS": " ".join([
                "--egress-permit", "127.0.0.1/32", "--egress-hosts", str(hosts),
                "--ca-cert", str(ca.ca_pem), "--registry-mirror",
                f"docker.io=https://{reg.host}", "--registry-mirror-only"])})
        if not args.install:
            machine.update({"TKBOX_PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src")})
        inputs = {"agent": "claude-code", "prompt": PROMPT,
                  "model-host": f"api.anthropic.com:{model.port}",
                  "install": "true" if args.install else "false", "timeout": "1200"}
        cache = work / "actions-cache"
        runs = [one_run(label, work, cache, machine, inputs) for label in ("cold", "warm")]
    finally:
        model.stop()
        npm.stop()
        reg.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    raw = bench_cache / "first_try-last.json"
    raw.write_text(json.dumps({"runs": runs, "model_log": model.log}, indent=1, default=str))
    print(f"first_try: the raw figures are in {raw}", flush=True)
    report(runs, model.log, args.install)


def seconds(text: str) -> float | None:
    try:
        return float(text.rstrip("s").strip())
    except ValueError:
        return None


def report(runs: list[dict[str, Any]], log: list[dict[str, Any]], install: bool) -> None:
    cold, warm = runs
    print("\nfirst_try: the Action's action.yml, as GitHub's runner runs it, to a verified "
          "bundle")
    print("  (includes: kernel choice, cache restore, guest build, image pull through the "
          "mirror, the agent's tool disk, box start, the agent, stop, apply, export, the "
          "cache saves; then tkbox verify)")
    if not install:
        print("  (excludes: apt and pip, as after the install step: install: false)")
    print(f"\n{'step or phase':44} {'cold s':>9} {'warm s':>9}")
    names = list(dict.fromkeys([*cold["steps"], *warm["steps"]]))
    for n in names:
        print(f"  step: {n[:36]:36} {cold['steps'].get(n, 0.0):9.1f} "
              f"{warm['steps'].get(n, 0.0):9.1f}")
    for n in dict.fromkeys([*cold["phases"], *warm["phases"]]):
        c, w = seconds(cold["phases"].get(n, "")), seconds(warm["phases"].get(n, ""))
        print(f"  phase: {n[:35]:35} {c if c is not None else float('nan'):9.1f} "
              f"{w if w is not None else float('nan'):9.1f}")
    print(f"  {'tkbox verify':42} {cold['verify']:9.1f} {warm['verify']:9.1f}")
    print(f"  {'TOTAL (the Action + verify)':42} {cold['total']:9.1f} {warm['total']:9.1f}")
    agent = [seconds(r["phases"].get("agent", "")) for r in runs]
    print(f"  {'of which the agent itself':42} "
          + " ".join(f"{a if a is not None else float('nan'):9.1f}" for a in agent))
    for r in runs:
        print(f"  {r['label']}: caches {json.dumps(r['caches'])}; fix applied: {r['fixed']}")
    passed = sum(1 for e in log if e.get("passed"))
    print(f"  the model stand-in saw the test pass in the box {passed} time(s)")
    print(f"\nwrite-up: {WRITE_UP_SECONDS:.0f} s (one Action step on a free GitHub runner, "
          "KVM). Here: software emulation (TCG), 2 cores, other work on the host.")
    for label, r, goal in (("cold", cold, GOAL_COLD), ("warm", warm, GOAL_WARM)):
        verdict = "met" if r["total"] <= goal else "NOT met"
        print(f"goal {label} <= {goal:.0f} s: {r['total']:.1f} s ({verdict}); "
              f"x write-up: {r['total'] / WRITE_UP_SECONDS:.2f}")
    print(f"warm / cold: {warm['total'] / cold['total']:.2f}")


if __name__ == "__main__":
    main()
