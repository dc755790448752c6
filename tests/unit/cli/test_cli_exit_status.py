"""The CLI's exit statuses (docs/exit-status.md): `tkbox apply`'s, and a bad option's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tkbox.cli.main import EXIT_NEEDS_PERSON, apply_status
from tkbox.errors import Refused


def report(*statuses: str) -> dict[str, object]:
    return {"files": [{"path": f"f{i}", "status": s} for i, s in enumerate(statuses)]}


@pytest.mark.parametrize("statuses,code", [
    ((), 0),
    (("applied", "applied"), 0),
    (("would apply",), 0),
    (("applied", "set apart"), 0),  # ignored files (build output, caches) are not a failure
    (("applied", "held back"), EXIT_NEEDS_PERSON),
    (("held back", "refused"), Refused.exit_code),
    (("refused",), Refused.exit_code),
])
def test_apply_exits_0_only_when_every_file_was_written(statuses: tuple[str, ...],
                                                         code: int) -> None:
    assert apply_status(report(*statuses)) == code


def test_the_statuses_are_distinct_from_the_error_tree() -> None:
    assert EXIT_NEEDS_PERSON == 6 and Refused.exit_code == 5


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("15m", 900), ("2H", 7200)])
def test_timeout_durations(text: str, seconds: int) -> None:
    from tkbox.cli.main import parse_duration

    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "1.5m", "10d", "m", "9999999999s"])
def test_a_bad_timeout_is_a_user_error(text: str) -> None:
    from tkbox.cli.main import parse_duration
    from tkbox.errors import UserError

    with pytest.raises(UserError, match="--timeout"):
        parse_duration(text)


@pytest.mark.parametrize("argv", [
    ["run", "--workspace", ".", "--env", "NOEQUALS"],
    ["agent", "command", "--agent-command", "true", "--env", "A=1", "--env", "NOEQUALS"],
])
def test_an_env_option_without_a_value_is_refused_before_anything_starts(
        argv: list[str], tmp_path: Path) -> None:
    """`run` and `agent` read --env the same way: NAME=VALUE, else one line and exit 2
    (a user error), before any daemon is asked (there is none here)."""
    env = {**os.environ, "TKBOX_HOME": str(tmp_path / "home"),
           "TKBOX_RUNTIME": str(tmp_path / "run")}
    r = subprocess.run([sys.executable, "-m", "tkbox.cli", *argv], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--env 'NOEQUALS' must be NAME=VALUE" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("argv,said", [
    (["--vmm-jail", "sometimes"], "--vmm-jail 'sometimes': use one of auto, on, off"),
    (["--vmm-uids", "61183-61000"], "--vmm-uids '61183-61000': FIRST < LAST"),
    (["--vmm-uids", "0-65535"], "--vmm-uids '0-65535': FIRST < LAST, from 1000"),
    (["--vmm-memory-overhead", "-1"], "--vmm-memory-overhead must be 0 to 65536 MiB"),
    (["--vmm-pids", "2"], "--vmm-pids must be 4 to 65536"),
])
def test_a_bad_vmm_cell_option_is_one_line_and_exit_2(argv: list[str], said: str,
                                                       tmp_path: Path) -> None:
    """The daemon's VMM-cell settings are the operator's: a bad one stops the daemon
    before anything starts, saying which and what it takes."""
    import tkbox

    env = {**os.environ, "TKBOX_HOME": str(tmp_path / "home"),
           "TKBOX_RUNTIME": str(tmp_path / "run"),
           "PYTHONPATH": str(Path(tkbox.__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-m", "tkbox.cli", "daemon", *argv], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert said in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
