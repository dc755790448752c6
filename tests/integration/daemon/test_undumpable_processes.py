"""`not_dumpable`, what the daemon and the signer call at start, keeps another
process of the same (unprivileged) user from reading their environment.

Run as `nobody`: root reads any process's /proc files. The module's own text is
run by the system's Python (the checkout may not be readable by `nobody`); the
reader is `cat`, as any process of that user could be. A process that did not
call it, started the same way, is the control: readable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import tkbox._process

pytestmark = pytest.mark.integration

NOBODY = 65534
PYTHON = shutil.which("python3", path="/usr/bin:/bin")


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _started(call: str) -> subprocess.Popen[str]:
    """The system Python as `nobody`, with tkbox/_process.py's text, `call` made,
    then waiting (it says `ready` first)."""
    assert PYTHON is not None
    src = Path(tkbox._process.__file__).read_text()
    code = f"{src}\n{call}\nprint('ready', flush=True)\nimport time\ntime.sleep(60)\n"
    proc = subprocess.Popen([PYTHON, "-c", code], preexec_fn=_as_nobody,  # noqa: PLW1509
                            stdout=subprocess.PIPE, text=True, cwd="/",
                            env={"SECRET_LIKE": "value-in-the-environment"})
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _read_by_nobody(pid: int) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["cat", f"/proc/{pid}/environ"], preexec_fn=_as_nobody,  # noqa: PLW1509
                          capture_output=True, cwd="/")


@pytest.mark.skipif(os.geteuid() != 0 or PYTHON is None,
                    reason="needs root to start processes as nobody, and a system python3")
def test_a_process_that_made_itself_undumpable_is_not_read_by_its_own_user() -> None:
    control = _started("pass")
    guarded = _started("not_dumpable('test')")
    try:
        seen = _read_by_nobody(control.pid)
        assert seen.returncode == 0 and b"value-in-the-environment" in seen.stdout
        refused = _read_by_nobody(guarded.pid)
        assert refused.returncode != 0 and refused.stdout == b""
        assert b"Permission denied" in refused.stderr
    finally:
        for p in (control, guarded):
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
