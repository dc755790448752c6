"""`tkbox daemon --vmm`: the Firecracker launcher is reachable, and refused clearly
where it cannot run. Real daemon processes; no VM is booted (see
tests/conformance/test_launcher.py for the launchers themselves)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tkbox.vm.firecracker import firecracker_problem

pytestmark = pytest.mark.integration

TKBOX = [sys.executable, "-m", "tkbox.cli"]
FAKE_FC = Path(__file__).resolve().parents[2] / "unit" / "vm" / "fake_firecracker.py"


def env_for(home: Path, path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TKBOX_")}
    env.update({"TKBOX_HOME": str(home), "PATH": path, "PYTHONUNBUFFERED": "1"})
    return env


def home_dir(tmp_path: Path) -> Path:
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    return home


def test_firecracker_missing_is_a_one_line_refusal_naming_what_to_install(
    tmp_path: Path,
) -> None:
    home = home_dir(tmp_path)
    empty = tmp_path / "bin"
    empty.mkdir()
    path = f"{empty}:/usr/bin:/bin"
    done = subprocess.run([*TKBOX, "daemon", "--vmm", "firecracker", "--unrecorded"],
                          env=env_for(home, path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [lines[-1]] and lines[-1].startswith("tkbox: error: --vmm firecracker: "
                                                         "firecracker is not on PATH"), lines
    assert "Firecracker project" in lines[-1] and "--vmm qemu" in lines[-1]
    assert not (home / "run" / "daemon.sock").exists()


def test_unknown_vmm_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run([*TKBOX, "daemon", "--vmm", "xen", "--unrecorded"],
                          env=env_for(home_dir(tmp_path), os.environ["PATH"]),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "use qemu or firecracker" in done.stderr


def test_daemon_with_firecracker_reports_its_vmm_and_transport(tmp_path: Path) -> None:
    """With a firecracker on PATH, the daemon runs every box under it over hybrid
    vsock, and says so at start, in /v1/info and in `tkbox doctor`."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "firecracker").write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_FC} \"$@\"\n")
    (bindir / "firecracker").chmod(0o755)
    problem = firecracker_problem(bindir / "firecracker")
    if problem is not None:
        pytest.skip(f"this host cannot run Firecracker at all: {problem}")
    home = home_dir(tmp_path)
    env = env_for(home, f"{bindir}:{os.environ['PATH']}")
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*TKBOX, "daemon", "--vmm", "firecracker", "--unrecorded"],
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            doctor = subprocess.run([*TKBOX, "doctor", "--json"], env=env,
                                    capture_output=True, text=True, timeout=120)
            rows = json.loads(doctor.stdout) if doctor.stdout.strip() else []
            in_use = [r for r in rows if r.get("what") == "VMM in use"]
            if in_use:
                break
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        assert in_use[0]["detail"].startswith("firecracker, ports over hybrid-vsock: "), in_use
        fc = next(r for r in rows if r.get("what") == "VMM firecracker")
        assert fc["ok"] and fc["transport"] == "hybrid-vsock"
        assert "tkbox: VMM firecracker, ports over hybrid-vsock" in log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
