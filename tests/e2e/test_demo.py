"""`scripts/demo.sh` shows what it claims: each step it narrates checks its own outcome,
and a step whose outcome does not happen fails the demo (issue 31).

The demo's first version said "the door swaps the token in for api.github.com only"
while the token was bound to port 443 and the stand-in listened on another port: every
swap was refused, the bundle said `Secrets: 0 uses`, and the demo exited 0. This test
makes that same mistake on purpose (`TKBOX_DEMO_GH_BINDING`) and checks that the demo
now stops at that step, non-zero, with one line naming it. One run (real VMs, slow):
the steps before it boot the box, install from the mirror through the door and read the
placeholder, so they are shown to pass on the way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from e2e_stack import make_home

ROOT = Path(__file__).resolve().parents[2]
SWAP_STEP = "$GH in the box is a placeholder; the door swaps the token in for api.github.com only"


def test_the_demo_fails_at_a_step_whose_outcome_does_not_happen(tmp_path: Path):
    home = make_home(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TKBOX_")}
    env.update({"TKBOX_HOME": str(home), "TKBOX_DEMO_SETUP": "0",
                "TKBOX_DEMO_PYTHON": sys.executable, "TMPDIR": str(tmp_path),
                "PYTHONPATH": str(ROOT / "src"),
                # the demo's old mistake: bound to api.github.com:443, while the
                # stand-in of api.github.com listens on another port
                "TKBOX_DEMO_GH_BINDING": "api.github.com"})
    r = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    failed = [line for line in r.stderr.splitlines() if line.startswith("demo: FAILED")]
    assert r.returncode != 0, r.stdout[-3000:]
    assert len(failed) == 1, r.stderr[-3000:]
    assert re.fullmatch(re.escape(f'demo: FAILED at "{SWAP_STEP}": the token was not swapped '
                                  "in for api.github.com:") + r"\d+" +
                        re.escape(" (the secret is bound to api.github.com)"), failed[0])
    # the steps before it happened, and were checked; none after it ran
    assert "tkdemo 42" in r.stdout.splitlines()
    assert any(line.startswith("GH=tkbox_GH_") for line in r.stdout.splitlines())
    assert "== a host nobody allowed waits for a person" not in r.stdout
    assert "Authorization held the real token: True" not in r.stdout
    # the token (made by the demo: ghp_demo + 32 hex digits) is in no output
    assert "ghp_demo" not in r.stdout + r.stderr
    # and nothing it started outlives it (a daemon left running keeps its VMs, its
    # sockets and whatever file descriptors it inherited)
    assert leftovers(home) == []


def leftovers(home: Path) -> list[str]:
    """Processes still running with the demo's TKBOX_HOME in their environment."""
    mark = f"TKBOX_HOME={home}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found

