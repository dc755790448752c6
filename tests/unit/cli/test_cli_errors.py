"""One error voice: every `tkbox` sub-app says an error the same way.

Each failing command below runs as a person runs it (`python -m tkbox.cli …`, no
daemon, an empty home) and must print exactly one line on stderr,
`tkbox: error: MESSAGE`, and exit with the status of the error's class
(docs/exit-status.md). Usage errors click finds (an unknown option, a missing
argument) are said the same way, with status 2, in the main app and in a sub-app.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tkbox
from tkbox import _exit
from tkbox.errors import (
    BundleError,
    GuestError,
    HostError,
    InternalError,
    Refused,
    SignerUnavailable,
    TkboxError,
    UserError,
)

NO_DAEMON = "the tkbox daemon is not running"


@pytest.mark.parametrize("argv, status, said", [
    (["ls"], HostError.exit_code, NO_DAEMON),                         # the main app
    (["ls", "--bogus"], 2, "No such option: --bogus; see 'tkbox ls --help'"),
    (["exec"], 2, "Missing argument 'name'; see 'tkbox exec --help'"),
    (["run", "--memory", "lots"], 2, "Invalid value for '--memory'"),
    (["egress", "check", "b", "example.org"], HostError.exit_code, NO_DAEMON),
    (["tools", "pull", "nosuchagent"], UserError.exit_code, "no agent tool named"),
    (["guest", "build", "--bogus"], 2, "see 'tkbox guest build --help'"),
    (["image", "inspect", "nope"], UserError.exit_code, "no image 'nope'"),
    (["image", "pull"], 2, "Missing argument 'ref'"),
    (["signer", "status", "--socket", "{tmp}/none.sock"], SignerUnavailable.exit_code,
     "no signer at"),
    (["signer", "init", "--dev", "--system"], UserError.exit_code,
     "choose one of --dev and --system"),
    (["signer", "status", "--bogus"], 2, "see 'tkbox signer status --help'"),
    (["witness", "serve", "--listen", "nowhere"], UserError.exit_code,
     "--listen 'nowhere': expected host:port"),
    (["verify", "{tmp}/none.tkb", "--trust", "{tmp}/t.json"], UserError.exit_code,
     "cannot read the bundle"),
    (["mcp", "--workspace-root", "{tmp}/none"], UserError.exit_code, "is not a directory"),
    (["daemon", "--vmm", "bochs"], UserError.exit_code, "--vmm 'bochs': use qemu or"),
])
def test_every_sub_app_says_an_error_in_one_line_with_its_status(
        argv: list[str], status: int, said: str, tmp_path: Path) -> None:
    env = {**os.environ, "TKBOX_HOME": str(tmp_path / "home"),
           "TKBOX_RUNTIME": str(tmp_path / "run"),
           "PYTHONPATH": str(Path(tkbox.__file__).resolve().parents[1])}
    env.pop("TKBOX_SIGNER_SOCKET", None)
    r = subprocess.run([sys.executable, "-m", "tkbox.cli",
                        *(a.replace("{tmp}", str(tmp_path)) for a in argv)],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("tkbox: error: ") and said in lines[0], lines[0]
    assert r.returncode == status, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "╭" not in r.stderr


def test_a_sub_app_run_alone_says_it_the_same_way(tmp_path: Path) -> None:
    """The signer's app, driven without the main one (as `python -m tkbox.signer.cli`
    and tests do), ends on the same printer: one line, the class's status."""
    from tkbox.signer.cli import signer_app

    r = CliRunner().invoke(signer_app, ["status", "--socket", str(tmp_path / "none.sock")])
    assert r.exit_code == SignerUnavailable.exit_code
    assert r.stderr.splitlines() == [
        f"tkbox: error: no signer at {tmp_path / 'none.sock'}; start one with "
        "`tkbox signer serve`"]


@pytest.mark.parametrize("cls", [TkboxError, UserError, HostError, GuestError, BundleError,
                                 SignerUnavailable, Refused, InternalError])
def test_exit_with_prints_one_line_and_exits_with_the_class_status(
        cls: type[TkboxError]) -> None:
    out = io.StringIO()
    with pytest.raises(SystemExit) as ended:
        _exit.exit_with(cls("the disk\nis full"), out)
    assert ended.value.code == cls.exit_code
    assert out.getvalue() == "tkbox: error: the disk is full\n"


def test_what_a_message_quotes_cannot_drive_the_terminal() -> None:
    """A message that quotes hostile bytes (a guest's error, a registry's answer) shows
    every control and format character as its escape: no colour, no bell, no cursor
    moved, no bidi override, no second line forged with a carriage return."""
    line = _exit.error_line(GuestError("bad \x1b[31mred\x07 \u202eevil\x00\r"))
    assert line == "tkbox: error: bad \\x1b[31mred\\x07 \\u202eevil\\x00"
    assert line.isprintable()
    long = _exit.error_line(UserError("x" * (_exit.MAX_ERROR_LINE + 50)))
    assert len(long) == len("tkbox: error: ") + _exit.MAX_ERROR_LINE + 1
