"""Failing closed, end to end: real signer, real daemon, real VMs.

Each test names the failure it injects and what must then be true: nothing
crosses a door without a record, and what could not be recorded stops the box
and is said so (to the person, in `inspect`, and in the bundle when the signer
can take it). Boxes are shared where a check allows it (a boot costs ~9 s of
CPU under emulation): the "signer killed" checks share one stack with two boxes.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e_stack import TKBOX, Stack, export_verified, fresh_name, make_home, stack_env

from tkbox.record.unix import UnixSignerClient


def qemu_pids(run_id: str) -> list[int]:
    """QEMU processes whose command line names `run_id` (read from /proc: no pgrep needed)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"qemu-system-x86_64") and \
                any(run_id.encode() in a for a in argv):
            pids.append(int(d.name))
    return pids


def info(s: Stack, name: str) -> dict[str, object]:
    return s.tkjson("inspect", name)  # type: ignore[return-value]


def wait_state(s: Stack, name: str, want: str, within: float = 30) -> dict[str, object]:
    deadline = time.monotonic() + within
    while True:
        i = info(s, name)
        if i["state"] == want:
            return i
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} is {i['state']}, not {want}: {i}")
        time.sleep(0.2)


def wait_no_vm(run_id: str, within: float = 20) -> None:
    deadline = time.monotonic() + within
    while qemu_pids(run_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert qemu_pids(run_id) == [], f"QEMU of {run_id} outlived its box"


def kinds(records: list[dict[str, Any]]) -> list[str]:
    return [str(r["kind"]) for r in records]


# ---- the signer killed mid-box -------------------------------------------------------


@dataclass
class Killed:
    stack: Stack
    live: str          # a running box, allowed to reach `origin` before the kill
    done: str          # a stopped box whose patch changes `checkout`
    checkout: Path
    origin: str        # host:port of a loopback HTTP origin
    hits: list[str]    # paths the origin served


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Killed]:
    """Two boxes, a working door to a loopback origin, then SIGKILL of the signer."""
    tmp = tmp_path_factory.mktemp("killed")
    hits: list[str] = []

    class Origin(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            hits.append(self.path)
            body = b"origin says hi\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    origin = f"fc.test:{httpd.server_address[1]}"
    hosts = tmp / "hosts"
    hosts.write_text("127.0.0.1 fc.test\n")
    home = make_home(tmp)
    s = Stack(home, stack_env(home))
    s.start_signer()
    s.start_daemon("--egress-permit", "127.0.0.1/32", "--egress-hosts", str(hosts))
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "file.txt").write_text("before\n")
    live, done = fresh_name("fclive"), fresh_name("fcdone")
    try:
        s.tk("run", "--name", live, "--workspace", str(ws), "--allow", origin)
        s.tk("run", "--name", done, "--workspace", str(ws))
        s.tk("exec", done, "--", "sh", "-c", "echo after > /workspace/file.txt")
        s.tk("stop", done)
        # The door works while the signer answers: the refusals below are the signer's.
        r = s.tk("exec", live, "--", "curl", "-sS", "-m", "60", f"http://{origin}/before")
        assert r.stdout == "origin says hi\n"
        proc = s.procs.pop("signer")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        yield Killed(s, live, done, ws, origin, hits)
    finally:
        for n in (live, done):
            s.tk("rm", "--force", n, check=False)
        for p in list(s.procs):
            s.stop(p)
        httpd.shutdown()
        httpd.server_close()


def test_signer_killed_refuses_the_next_exec(killed: Killed) -> None:
    """No decision can be recorded, so no command runs: the guest never sees it."""
    s = killed.stack
    r = s.tk("exec", killed.live, "--", "sh", "-c", "echo must-not-run", check=False)
    assert r.returncode != 0 and "must-not-run" not in r.stdout
    assert "signer did not answer" in r.stderr and "tkbox signer serve" in r.stderr


def test_signer_killed_refuses_the_next_connection_and_stops_the_box(killed: Killed) -> None:
    """An allowed origin is refused at the door once the signer is gone; it sees nothing.

    No new command can run without the signer, so the connection comes from a shell
    started (and recorded) while the signer answered, which waits, then dials after
    the signer is killed: what a process already running in the box would do. The
    refusal itself cannot be recorded either, so the box is stopped (fail closed).
    """
    s = killed.stack
    hits_before = list(killed.hits)
    s.start_signer()
    with subprocess.Popen([*TKBOX, "exec", killed.live, "--", "sh", "-c",
                           "echo ready; read go; curl -sS -i -m 60 "
                           f"http://{killed.origin}/after 2>&1; echo rc=$?"],
                          env=s.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == b"ready\n"
        sp = s.procs.pop("signer")
        os.killpg(sp.pid, signal.SIGKILL)
        sp.wait()
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        proc.stdin.close()
        out = proc.stdout.read().decode()
        proc.wait(120)
    # The VM may be gone before the guest reads the door's answer; if it read anything,
    # it is the door's refusal (503: the signer did not answer), never the origin's.
    # (curl exits 0 on any HTTP answer, the refusal included: its status says nothing.)
    assert "origin says hi" not in out
    if out:
        assert "HTTP/1.1 503" in out and "signer did not answer" in out, out
    assert killed.hits == hits_before  # the origin was never dialled
    i = wait_state(s, killed.live, "failed", 30)
    assert "egress record could not be kept" in str(i["error"]), i
    wait_no_vm(str(i["run_id"]))


def test_signer_killed_refuses_the_file_write_of_apply(killed: Killed) -> None:
    """`tkbox apply` writes nothing without the signer's Write decisions."""
    s = killed.stack
    r = s.tk("apply", killed.done, check=False)
    assert r.returncode != 0
    assert "signer" in r.stderr and "nothing applied" in r.stderr, r.stderr
    assert (killed.checkout / "file.txt").read_text() == "before\n"
    assert sorted(p.name for p in killed.checkout.iterdir()) == ["file.txt"]


def test_signer_killed_refuses_a_new_box(killed: Killed, tmp_path: Path) -> None:
    """A run cannot be opened without the signer, so no VM boots and nothing is left."""
    s = killed.stack
    before = sorted(p.name for p in (s.home / "boxes").iterdir())
    r = s.tk("run", "--name", fresh_name("fcnew"), "--workspace", str(killed.checkout),
             check=False)
    assert r.returncode != 0 and "signer" in r.stderr, r.stderr
    assert sorted(p.name for p in (s.home / "boxes").iterdir()) == before


def test_signer_back_apply_writes_and_the_lost_records_are_gaps(killed: Killed,
                                                                tmp_path: Path) -> None:
    """Runs last in this group: with the signer back the same daemon serves again:
    the refused apply now writes, and the stopped box's run, its losses recorded as
    gaps, exports and verifies."""
    s = killed.stack
    s.start_signer()
    report = s.tkjson("apply", killed.done)
    assert {f["path"]: f["status"] for f in report["files"]} == {  # type: ignore[index]
        "file.txt": "applied"}
    assert (killed.checkout / "file.txt").read_text() == "after\n"
    recs = export_verified(s, killed.live, tmp_path)
    gaps = [r["body"] for r in recs if r["kind"] == "tkbox.gap"]
    assert gaps and any("egress" in json.dumps(g) or "completion" in json.dumps(g)
                        for g in gaps), gaps


# ---- a signer that died before the daemon started --------------------------------------


def test_a_dead_signers_leftover_socket_does_not_start_a_daemon(tmp_path: Path) -> None:
    """SIGKILL leaves the signer's socket file behind; the daemon must ask, not look,
    and refuse to start (no box could be recorded)."""
    home = make_home(tmp_path)
    s = Stack(home, stack_env(home))
    s.start_signer()
    proc = s.procs.pop("signer")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (home / "run" / "signer.sock").exists()
    r = subprocess.run([*TKBOX, "daemon"], env=s.env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    assert "no signer answers" in r.stderr and "tkbox signer serve" in r.stderr
    assert not (home / "run" / "daemon.sock").exists()


# ---- the signer refuses a record -------------------------------------------------------


def test_a_record_the_signer_refuses_stops_the_box(own_stack: Stack, workspace: Path) -> None:
    """The run is closed at the signer behind the daemon's back (an operator, or a
    signer that will not take the record): the running command's completion is
    refused, so the box stops at once, says why, and runs nothing more."""
    s = own_stack
    name = fresh_name("refrec")
    s.tk("run", "--name", name, "--workspace", str(workspace))
    run_id = str(info(s, name)["run_id"])
    with subprocess.Popen([*TKBOX, "exec", name, "--", "sh", "-c", "echo go; sleep 3"],
                          env=s.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"go\n"

        async def close() -> None:
            c = UnixSignerClient(s.home / "run" / "signer.sock")
            try:
                await c.close_run(run_id)
            finally:
                await c.aclose()

        asyncio.run(close())
        proc.communicate(timeout=120)
    i = wait_state(s, name, "failed", 30)
    assert "completion could not be recorded" in str(i["error"]), i
    assert "closed" in str(i["error"])
    wait_no_vm(run_id)
    r = s.tk("exec", name, "--", "echo", "no", check=False)
    assert r.returncode != 0 and "failed" in r.stderr


# ---- the VM under the box -----------------------------------------------------------------


def test_qemu_killed_under_a_box_fails_it_and_is_recorded(stack: Stack, workspace: Path,
                                                          tmp_path: Path) -> None:
    """SIGKILL of QEMU (the OOM killer, an operator): the box fails, says why, refuses
    commands, and the bundle records the containment."""
    name = fresh_name("qkill")
    stack.tk("run", "--name", name, "--workspace", str(workspace))
    try:
        run_id = str(info(stack, name)["run_id"])
        pids = qemu_pids(run_id)
        assert len(pids) == 1
        os.kill(pids[0], signal.SIGKILL)
        i = wait_state(stack, name, "failed", 30)
        assert "VM ended unexpectedly" in str(i["error"])
        r = stack.tk("exec", name, "--", "true", check=False)
        assert r.returncode != 0 and "it failed" in r.stderr
        recs = export_verified(stack, name, tmp_path)
        cont = [r["body"] for r in recs if r["kind"] == "tkbox.containment"]
        assert cont and "VM ended unexpectedly" in str(cont[0]["reason"]), cont
    finally:
        stack.tk("rm", "--force", name, check=False)


def test_guest_out_of_memory_kills_the_command_not_the_box(stack: Stack,
                                                           workspace: Path) -> None:
    """A command that eats all the guest's memory is killed; the box (its agent, its
    record) survives: the next command runs and the stop still yields a patch."""
    name = fresh_name("oom")
    stack.tk("run", "--name", name, "--workspace", str(workspace), "--memory", "256")
    try:
        r = stack.tk("exec", name, "--", "python3", "-c",
                     "a = []\nwhile True: a.append(bytearray(8 << 20))", check=False,
                     timeout=600)
        assert r.returncode != 0
        assert "MemoryError" in r.stderr or r.returncode in (137, -9, 128 + 9), \
            (r.returncode, r.stderr[-500:])
        stack.tk("exec", name, "--", "sh", "-c", "echo survived > /workspace/after-oom")
        assert info(stack, name)["state"] == "running"
        stack.tk("stop", name)
        assert "after-oom" in stack.tk("patch", name).stdout
    finally:
        stack.tk("rm", "--force", name, check=False)


def test_workspace_disk_full_is_an_error_in_the_box_and_the_patch_survives(
        stack: Stack, workspace: Path) -> None:
    """A full workspace disk is ENOSPC for the command, nothing worse: the box answers,
    and the patch holds what fits."""
    name = fresh_name("full")
    stack.tk("run", "--name", name, "--workspace", str(workspace), "--disk", "64")
    try:
        r = stack.tk("exec", name, "--", "sh", "-c",
                     "dd if=/dev/zero of=/workspace/big bs=1M count=200 2>&1", check=False,
                     timeout=600)
        assert r.returncode != 0 and "No space left" in r.stdout, r.stdout
        stack.tk("exec", name, "--", "sh", "-c",
                 "rm /workspace/big && echo fits > /workspace/small.txt")
        stack.tk("stop", name)
        patch = stack.tk("patch", name).stdout
        assert "small.txt" in patch and "+fits" in patch and "big" not in patch
    finally:
        stack.tk("rm", "--force", name, check=False)


# ---- concurrency --------------------------------------------------------------------------


def test_four_boxes_at_once_each_keep_their_own_files_and_record(stack: Stack,
                                                                 workspace: Path,
                                                                 tmp_path: Path) -> None:
    """Four boxes boot, run, stop and export at the same time; none sees another's
    files and each run is its own verified bundle."""
    names = [fresh_name("four") for _ in range(4)]
    procs = [subprocess.Popen([*TKBOX, "run", "--name", n, "--workspace", str(workspace)],
                              env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for n in names]
    try:
        for p in procs:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err
        execs = [subprocess.Popen([*TKBOX, "exec", n, "--", "sh", "-c",
                                   f"echo {n} > /workspace/who; cat /workspace/who"],
                                  env=stack.env, stdout=subprocess.PIPE) for n in names]
        for n, p in zip(names, execs, strict=True):
            assert p.communicate(timeout=300)[0].decode() == f"{n}\n"
        stops = [subprocess.Popen([*TKBOX, "stop", n], env=stack.env) for n in names]
        assert [p.wait(300) for p in stops] == [0, 0, 0, 0]
        run_ids = set()
        for n in names:
            patch = stack.tk("patch", n).stdout
            assert f"+{n}\n" in patch
            assert not any(f"+{o}\n" in patch for o in names if o != n)
            run_ids.add(str(info(stack, n)["run_id"]))
            assert "tkbox.box.stop" in kinds(export_verified(stack, n, tmp_path))
        assert len(run_ids) == 4
    finally:
        for n in names:
            stack.tk("rm", "--force", n, check=False)


def test_stop_racing_an_exec_ends_both_and_the_run_verifies(stack: Stack, workspace: Path,
                                                            tmp_path: Path) -> None:
    """A command running and new ones starting while `stop` runs: the stop wins, no
    client hangs, the patch is whole, and no command runs unseen after it was taken."""
    name = fresh_name("race")
    stack.tk("run", "--name", name, "--workspace", str(workspace))
    try:
        with subprocess.Popen([*TKBOX, "exec", name, "--", "sh", "-c",
                               "echo started; while :; do echo t >> /workspace/ticks; "
                               "sleep 0.1; done"],
                              env=stack.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) as running:
            assert running.stdout is not None
            assert running.stdout.readline() == b"started\n"
            stop = subprocess.Popen([*TKBOX, "stop", name], env=stack.env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            late = [subprocess.Popen([*TKBOX, "exec", name, "--", "sh", "-c",
                                      "echo late >> /workspace/late"], env=stack.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                    for _ in range(3)]
            stop_err = stop.communicate(timeout=300)[1]
            assert stop.returncode == 0, stop_err
            assert running.wait(120) != 0  # the command did not finish on its own
            late_rcs = [p.wait(120) for p in late]
        for p in late:
            p.communicate()
        assert wait_state(stack, name, "stopped", 5)["state"] == "stopped"
        patch = stack.tk("patch", name).stdout
        assert "ticks" in patch
        # A late exec either ran before the patch was taken (its line is in the patch) or
        # was refused; it never ran unseen after.
        ran = sum(1 for rc in late_rcs if rc == 0)
        assert patch.count("+late") == ran, (late_rcs, patch[-800:])
        r = stack.tk("exec", name, "--", "true", check=False)
        assert r.returncode != 0 and "stopped" in r.stderr
        recs = export_verified(stack, name, tmp_path)
        assert "tkbox.box.stop" in kinds(recs)
        # every command the signer allowed has its completion: none was lost in the race
        decided = {r["seq"] for r in recs if r["kind"] == "tkbox.decision"
                   and r["body"].get("allowed")}
        completed = {r["body"]["decision"] for r in recs if r["kind"] == "tkbox.complete"}
        assert decided and decided == completed, (decided, completed)
    finally:
        stack.tk("rm", "--force", name, check=False)
