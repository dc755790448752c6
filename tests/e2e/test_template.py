"""Boxes restored from one booted template: each its own randomness, clock and disks.

The daemon builds a template in the background after a cold boot; the boxes
after it are restored from that one saved guest. What a template must never
give away is tested on real VMs here.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

from e2e_stack import Stack, fresh_name


def _start(stack: Stack, name: str) -> dict[str, str]:
    info = stack.tkjson("inspect", name)
    assert isinstance(info, dict)
    start = info.get("start")
    assert isinstance(start, dict), info
    return start


def _wait_template(stack: Stack, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    root = stack.home / "guest" / "templates"
    while time.monotonic() < deadline:
        for meta in root.glob("*/meta.json"):
            if (meta.parent / "state").is_file():
                return
        time.sleep(1)
    raise AssertionError(f"no template was built under {root}; see {stack.log_tail('daemon')}")


def test_boxes_from_one_template_draw_different_randomness(stack: Stack,
                                                           workspace: Path) -> None:
    """Attack: two boxes cloned from one saved guest share its random generator, so
    one box could predict the keys, nonces and temporary names of another. Each box
    gets host entropy in its boot config and reseeds before anything runs."""
    first = fresh_name("tpl")
    stack.tk("run", "--name", first, "--workspace", str(workspace))
    try:
        start = _start(stack, first)
        assert start["kind"] in ("cold", "template") and start["reason"]
        _wait_template(stack)
    finally:
        stack.tk("rm", "--force", first, check=False)
    names = [fresh_name("tpl"), fresh_name("tpl")]
    draws = []
    try:
        for n in names:
            ran = stack.tk("run", "--name", n, "--workspace", str(workspace))
            assert "restored from template" in ran.stdout  # the person sees which start
            start = _start(stack, n)
            assert start["kind"] == "template", start
            assert start["reason"].startswith("restored from template"), start
            out = stack.tk("exec", n, "--", "sh", "-c",
                           "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; "
                           "python3 -c 'import os, random; print(os.urandom(16).hex(), "
                           "random.getrandbits(64))'; date +%s; cat /workspace/README.md")
            lines = out.stdout.splitlines()
            assert len(lines) == 4, out.stdout
            assert len(lines[0]) == 64
            draws.append(lines[:2])
            # The host's clock, not the template's.
            assert abs(int(lines[2]) - time.time()) < 120, lines[2]
            # Its own workspace disk, probed after the restore.
            assert lines[3] == "readme"
        assert draws[0][0] != draws[1][0], "two boxes drew the same bytes from /dev/urandom"
        assert draws[0][1] != draws[1][1], "two boxes' first Python processes drew alike"
    finally:
        for n in names:
            stack.tk("rm", "--force", n, check=False)


def test_ready_record_says_how_the_box_started(stack: Stack, workspace: Path) -> None:
    """A box restored from a template says so in its record; a person reading the
    bundle can tell a restored box from a cold one, and why."""
    _wait_template(stack)
    name = fresh_name("tpl")
    stack.tk("run", "--name", name, "--workspace", str(workspace))
    try:
        stack.tk("stop", name)
        out = stack.tk("export", name, "--output", str(workspace.parent / "b.tkb"), check=False)
        assert out.returncode == 0, out.stderr
        bundle = (workspace.parent / "b.tkb").read_bytes().decode()
        ready = [json.loads(base64.b64decode(line[6:]))
                 for line in bundle.splitlines() if line.startswith("extra ")]
        ready = [r for r in ready if r["kind"] == "tkbox.box.ready"]
        assert len(ready) == 1
        assert ready[0]["body"]["start"] == "template"
        assert ready[0]["body"]["start_reason"].startswith("restored from template")
    finally:
        stack.tk("rm", "--force", name, check=False)
