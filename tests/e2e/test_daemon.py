"""The daemon's life: restarts, SIGTERM, missing parts, and failing closed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from e2e_stack import TKBOX, Stack, fresh_name, make_home, stack_env

from tkbox.formats import bundle, record


def qemu_pids_for(run_id: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"qemu-system-x86_64.*{run_id}"], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split()]


def run_id_of(s: Stack, name: str) -> str:
    return str(s.tkjson("inspect", name)["run_id"])  # type: ignore[index]


def test_sigterm_stops_every_box_cleanly_and_no_vm_outlives_the_daemon(own_stack: Stack,
                                                                        workspace: Path) -> None:
    name = fresh_name("term")
    own_stack.tk("run", "--name", name, "--workspace", str(workspace))
    own_stack.tk("exec", name, "--", "sh", "-c", "echo kept > /workspace/kept.txt")
    run_id = run_id_of(own_stack, name)
    assert qemu_pids_for(run_id)
    assert own_stack.stop("daemon") == 0
    assert qemu_pids_for(run_id) == []
    # State survives the restart; the box was stopped cleanly, with its patch.
    own_stack.start_daemon()
    info = own_stack.tkjson("inspect", name)
    assert info["state"] == "stopped"
    assert "kept.txt" in own_stack.tk("patch", name).stdout


def test_killed_daemon_leaves_no_vm_and_the_loss_is_recorded_as_a_gap(own_stack: Stack,
                                                                     workspace: Path,
                                                                     tmp_path: Path) -> None:
    name = fresh_name("kill")
    own_stack.tk("run", "--name", name, "--workspace", str(workspace))
    run_id = run_id_of(own_stack, name)
    assert qemu_pids_for(run_id)
    proc = own_stack.procs.pop("daemon")
    os.killpg(proc.pid, 9)
    proc.wait()
    deadline = time.monotonic() + 20
    while qemu_pids_for(run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert qemu_pids_for(run_id) == []  # PR_SET_PDEATHSIG
    own_stack.start_daemon()
    info = own_stack.tkjson("inspect", name)
    assert info["state"] == "failed" and "daemon stopped" in info["error"]
    r = own_stack.tk("exec", name, "--", "true", check=False)
    assert r.returncode != 0 and "it failed" in r.stderr
    out = tmp_path / "kill.tkb"
    own_stack.tk("export", name, "-o", str(out))
    v = own_stack.tk("verify", str(out), "--trust", str(tmp_path / "kill.trust.json"), "--json")
    report = json.loads(v.stdout)
    assert "tkbox.gap" in json.dumps(report)
    # the gap says what was lost, and the run is closed after it: nothing can be added
    recs = [record.parse(e.extra) for e in bundle.parse(out.read_bytes()).entries
            if e.extra is not None]
    gaps = [r.body for r in recs if r.kind == "tkbox.gap"]
    assert gaps and gaps[0]["reason"] == "daemon restart", gaps
    assert recs[-1].kind == record.CLOSE


def test_no_signer_no_daemon(tmp_path: Path) -> None:
    """Fail closed: without a signer the daemon refuses to start (unless --unrecorded)."""
    home = make_home(tmp_path)
    s = Stack(home, stack_env(home))
    r = subprocess.run([*TKBOX, "daemon"], env=s.env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert "no signer answers" in r.stderr and "tkbox signer serve" in r.stderr


def test_signer_stopped_mid_box_refuses_the_next_exec(own_stack: Stack, workspace: Path) -> None:
    name = fresh_name("fc")
    own_stack.tk("run", "--name", name, "--workspace", str(workspace))
    own_stack.tk("exec", name, "--", "true")
    own_stack.stop("signer")
    r = own_stack.tk("exec", name, "--", "sh", "-c", "echo must-not-run", check=False)
    assert r.returncode != 0
    assert "must-not-run" not in r.stdout
    assert "signer did not answer" in r.stderr


@pytest.mark.parametrize("what, env_change, needle", [
    ("kernel", {"TKBOX_KERNEL": "/nonexistent/vmlinuz-0"}, "kernel"),
    ("qemu", {"PATH": "/nonexistent"}, "qemu-system-x86"),
])
def test_missing_kernel_or_qemu_is_a_one_line_error(tmp_path: Path, what: str,
                                                    env_change: dict[str, str],
                                                    needle: str) -> None:
    home = make_home(tmp_path)
    env = {**stack_env(home), **env_change}
    import sys

    r = subprocess.run([sys.executable, "-m", "tkbox.cli", "daemon", "--unrecorded"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.startswith("tkbox: error:")]
    assert lines and needle in lines[0], r.stderr
    assert not (home / "run" / "daemon.sock").exists()
    assert shutil.which("qemu-system-x86_64")  # the host itself still has it


def test_the_daemon_and_the_signer_keep_other_processes_of_their_user_out(
        stack: Stack) -> None:
    """The daemon's environment holds the secrets door's real values and the signer
    holds the key: another process of the same user (a VMM a guest has exploited)
    must not read them through /proc/PID/environ, /proc/PID/mem or ptrace. Both
    make themselves undumpable at start, and say so; before, both said nothing
    and were readable."""
    from tkbox.sdk import Client

    signer = stack.tkjson("signer", "status")
    assert signer["undumpable"] is True  # type: ignore[index]
    assert "not readable by other processes" in stack.tk("signer", "status").stdout
    with Client(stack.home / "run" / "daemon.sock") as client:
        assert client.call("GET", "/v1/info")["undumpable"] is True
