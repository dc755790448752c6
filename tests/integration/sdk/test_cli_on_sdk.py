"""The CLI is a client of the SDK: the same verbs, outputs and `--json` shapes,
driven as a subprocess against the real API (fake VMs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sdk_daemon import SdkDaemon


def tk(daemon: SdkDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TKBOX_HOME": str(daemon.home),
           "TKBOX_RUNTIME": str(daemon.socket.parent)}
    return subprocess.run([sys.executable, "-m", "tkbox.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_verbs_and_json_shapes(daemon: SdkDaemon, ws: Path, tmp_path: Path):
    # oci: references are left to the daemon, whose fake image store takes any name
    r = tk(daemon, "run", "--name", "c1", "--workspace", str(ws), "--image", "oci:/x",
           "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["state"] == "running"
    r = tk(daemon, "exec", "c1", "--", "echo", "hi")
    assert (r.returncode, r.stdout, r.stderr) == (0, "echo hi\n", "to stderr\n")
    r = tk(daemon, "exec", "--json", "c1", "--", "false")
    evs = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 3 and [e["ev"] for e in evs] == ["started", "out", "out", "exit"]
    assert [b["name"] for b in json.loads(tk(daemon, "ls", "--json").stdout)] == ["c1"]
    assert json.loads(tk(daemon, "stop", "c1", "--json").stdout)["state"] == "stopped"
    assert tk(daemon, "patch", "c1").stdout.startswith("diff --git a/hello.txt")
    rep = json.loads(tk(daemon, "apply", "c1", "--dry-run", "--json").stdout)
    assert rep["dry_run"] is True and rep["files"][0]["path"] == "hello.txt"
    out = json.loads(tk(daemon, "export", "c1", "-o", str(tmp_path / "c1.tkb"),
                        "--json").stdout)
    assert out == {"bundle": str(tmp_path / "c1.tkb"), "trust": str(tmp_path / "c1.trust.json")}
    assert json.loads(tk(daemon, "inspect", "c1", "--json").stdout)["state"] == "exported"
    r = tk(daemon, "rm", "c1")
    assert r.returncode == 0 and r.stdout.strip() == "removed c1"


def test_cli_errors_stay_one_line_with_their_exit_status(daemon: SdkDaemon, tmp_path: Path):
    r = tk(daemon, "stop", "nope")
    assert r.returncode == 2
    assert r.stderr == "tkbox: error: no box named 'nope'; see 'tkbox ls'\n"
    env = {**os.environ, "TKBOX_RUNTIME": str(tmp_path / "nowhere")}
    r = subprocess.run([sys.executable, "-m", "tkbox.cli", "ls"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and r.stderr.count("\n") == 1
    assert "daemon is not running" in r.stderr


def test_cli_approvals_show_a_time_a_person_reads(daemon: SdkDaemon, ws: Path):
    """`tkbox approvals` prints when each connection began to wait as a local clock time
    and how long ago (`14:03:07 (2 s ago)`), not seconds since the epoch; `--json`
    keeps the number for programs."""
    import asyncio
    import re

    assert tk(daemon, "run", "--name", "w1", "--workspace", str(ws), "--image", "oci:/x"
              ).returncode == 0
    run_id = json.loads(tk(daemon, "inspect", "w1", "--json").stdout)["run_id"]
    assert daemon.loop is not None
    waiting = asyncio.run_coroutine_threadsafe(
        daemon.approvals.wait_for_answer("w1", run_id, "held.test", 443), daemon.loop)
    try:
        [item] = json.loads(tk(daemon, "approvals", "--json").stdout)
        assert isinstance(item["since"], float) and item["host"] == "held.test"
        r = tk(daemon, "approvals")
        assert r.returncode == 0, r.stderr
        row = next(line for line in r.stdout.splitlines() if "held.test" in line)
        assert re.search(r"\b\d\d:\d\d:\d\d \(\d+ s ago\)", row), row
        assert str(int(item["since"])) not in r.stdout
    finally:
        tk(daemon, "deny", "w1", str(item["id"]))
        waiting.result(30)
