"""In a real box: one large file never costs the agent's whole patch (issue 37).

The agent's one-line fix survives a 300 MiB file written beside it, a large file
under a path the checkout's git ignores, and `chown -R` over a checkout that already
holds a large ignored file; a stop whose guest is killed mid-diff keeps the files
that arrived whole, and says so. Every step goes through the real `tkbox` CLI.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path

from e2e_stack import Box, Stack, export_verified, fresh_name

MIB = 1 << 20


def _git(ws: Path, *argv: str) -> None:
    subprocess.run(["git", "-C", str(ws), "-c", "user.name=t", "-c", "user.email=t@t",
                    *argv], check=True, capture_output=True)


def _checkout(root: Path, ignored_big: int = 0) -> Path:
    ws = root / "co"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("def answer():\n    return 41\n")
    (ws / ".gitignore").write_text("cache/\n")
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    _git(ws, "add", "-A")
    _git(ws, "commit", "-qm", "init")
    if ignored_big:
        (ws / "cache").mkdir()
        with open(ws / "cache" / "old.bin", "wb") as f:
            f.write(os.urandom(ignored_big))
    return ws


def _run(stack: Stack, ws: Path, *extra: str) -> Box:
    name = fresh_name("apart")
    stack.tk("run", "--name", name, "--workspace", str(ws), "--image", "tkbox/default", *extra)
    return Box(stack, name, ws)


def _zeros_sha256(n: int) -> str:
    h = hashlib.sha256()
    for _ in range(n // MIB):
        h.update(bytes(MIB))
    return h.hexdigest()


FIX = "sed -i 's/return 41/return 42/' /workspace/src/app.py"


def test_a_300_mib_file_beside_a_one_line_fix_is_set_apart_and_the_fix_applied(
        stack: Stack, tmp_path: Path) -> None:
    """The agent writes a fix and a 300 MiB file, and `chown -R`s the workspace as the
    agent's script once did (copying a large ignored file it never changed up into the
    overlay): the patch holds the fix, the 300 MiB file is set apart (path, size,
    hash), the untouched file is nowhere, and the bundle holds both facts."""
    ws = _checkout(tmp_path, ignored_big=70 * MIB)
    box = _run(stack, ws)
    try:
        box.sh(f"{FIX} && dd if=/dev/zero of=/workspace/big.bin bs=1M count=300 2>/dev/null "
               "&& chown -R 1000:1000 /workspace")
        r = stack.tk("stop", box.name)
        assert "big.bin" in r.stderr and "set apart" in r.stderr and "old.bin" not in r.stderr
        patch = stack.tk("patch", box.name).stdout
        assert "+    return 42" in patch and "big.bin" not in patch and "old.bin" not in patch
        info = stack.tkjson("inspect", box.name)["patch"]  # type: ignore[index]
        assert info["partial"] is False
        assert info["set_apart"] == [{"path": "big.bin", "change": "added", "size": 300 * MIB,
                                      "sha256": _zeros_sha256(300 * MIB),
                                      "why": "file-too-large"}]
        human = stack.tk("apply", box.name, "--dry-run")
        assert "big.bin" in human.stdout and "set apart" in human.stdout
        r = stack.tk("apply", box.name, "--json")
        rows = {f["path"]: f for f in json.loads(r.stdout)["files"]}
        assert rows["src/app.py"]["status"] == "applied"
        assert rows["big.bin"]["status"] == "set apart"
        assert "return 42" in (ws / "src" / "app.py").read_text()
        assert not (ws / "big.bin").exists()
        recs = export_verified(stack, box.name, tmp_path)
        patch_rec = next(r["body"] for r in recs if r["kind"] == "tkbox.patch")
        assert [a["path"] for a in patch_rec["set_apart"]] == ["big.bin"]
        assert patch_rec["set_apart"][0]["sha256"] == _zeros_sha256(300 * MIB)
        writes = [r["body"] for r in recs if r["kind"] == "tkbox.decision"
                  and r["body"].get("action") == "Write"]
        assert [w["resource"]["path"] for w in writes] == ["src/app.py"]
    finally:
        stack.tk("rm", "--force", box.name, check=False)


def test_a_large_file_under_an_ignored_path_is_set_apart_as_ignored(
        stack: Stack, tmp_path: Path) -> None:
    """The box is made with the agent's uid owning the workspace (as `tkbox agent` makes
    it): that uid writes the fix and a 100 MiB file under `cache/` (ignored); only the
    fix is in the patch, the file is set apart as ignored, and nothing was copied up
    for the ownership (the patch holds one file)."""
    ws = _checkout(tmp_path)
    box = _run(stack, ws, "--workspace-owner", "1000:1000")
    try:
        box.sh(f"setpriv --reuid=1000 --regid=1000 --clear-groups sh -c \"{FIX} && "
               "mkdir -p /workspace/cache && head -c 104857600 /dev/zero > "
               "/workspace/cache/new.bin\"")
        stack.tk("stop", box.name)
        info = stack.tkjson("inspect", box.name)["patch"]  # type: ignore[index]
        assert [(a["path"], a["why"]) for a in info["set_apart"]] == [
            ("cache/new.bin", "ignored")]
        assert info["stats"]["modified"] == 1 and info["stats"]["added"] == 0
        report = json.loads(stack.tk("apply", box.name, "--json").stdout)
        assert [(f["path"], f["status"]) for f in report["files"]] == [
            ("src/app.py", "applied")]
        assert any("git ignores" in n for n in report["notes"])
        recs = export_verified(stack, box.name, tmp_path)
        opened = next(r["body"] for r in recs if r["kind"] == "tkbox.run.open")
        assert opened["facts"]["workspace_owner"] == [1000, 1000]
    finally:
        stack.tk("rm", "--force", box.name, check=False)


def _qemu_of(run_id: str) -> int:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"qemu-system" in cmd and run_id.encode() in cmd:
            return int(pid)
    raise AssertionError(f"no QEMU for {run_id}")


def test_a_guest_killed_mid_diff_leaves_a_partial_patch_that_applies(
        stack: Stack, tmp_path: Path) -> None:
    """QEMU is killed while the patch streams to the host: `tkbox stop` says the patch is
    partial (exit 4), the box is stopped, and what was kept applies, each file whole."""
    ws = _checkout(tmp_path)
    box = _run(stack, ws)
    try:
        # 100 new text files of 270 KiB: 27 MiB of patch (1.6 million lines, within
        # the door's 2 million), streamed a file at a time
        box.sh("cd /workspace && mkdir gen && i=0; while [ $i -lt 100 ]; do "
               "seq -f \"line %g of $i\" 1 16000 > gen/f$i.txt; i=$((i+1)); done")
        run_id = stack.tkjson("inspect", box.name)["run_id"]  # type: ignore[index]
        qemu = _qemu_of(str(run_id))
        tmp = stack.home / "boxes" / box.name / ".patch.diff.tmp"
        result: dict[str, subprocess.CompletedProcess[str]] = {}
        stopper = threading.Thread(target=lambda: result.update(
            stop=stack.tk("stop", box.name, check=False)))
        stopper.start()
        deadline = time.monotonic() + 300
        while not (tmp.exists() and tmp.stat().st_size > 4 * MIB):
            assert time.monotonic() < deadline and stopper.is_alive(), "no patch streamed"
            time.sleep(0.05)
        os.kill(qemu, 9)
        stopper.join(300)
        r = result["stop"]
        assert r.returncode == 4, r.stderr
        assert "the patch is partial" in r.stderr.strip().splitlines()[-1]
        info = stack.tkjson("inspect", box.name)
        assert info["state"] == "stopped" and info["patch"]["partial"] is True  # type: ignore[index]
        report = json.loads(stack.tk("apply", box.name, "--json").stdout)
        applied = [f["path"] for f in report["files"] if f["status"] == "applied"]
        assert 0 < len(applied) < 100, len(applied)
        assert any("partial" in n for n in report["notes"])
        for p in applied:
            n = p.removeprefix("gen/f").removesuffix(".txt")
            lines = (ws / p).read_text().splitlines()
            assert len(lines) == 16000 and lines[-1] == f"line 16000 of {n}"
        recs = export_verified(stack, box.name, tmp_path)
        assert next(r["body"] for r in recs if r["kind"] == "tkbox.patch")["partial"] is True
    finally:
        stack.tk("rm", "--force", box.name, check=False)
