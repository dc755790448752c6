"""`tkbox-spawn`, the step between the guest agent and every command, run on the host.

Built exactly as the initramfs build does (`compile_spawn`), started exactly as
the agent starts it (`spawn_argv`, vfork+exec, an empty environment, the error
pipe passed by number). What it must hold: the command is in the cgroup before
any of its own code runs, gets exactly the environment, directory and user it
was given, is found on its own `PATH` as CPython's subprocess finds it, and a
command that cannot start is reported on the error pipe, never run half-set-up.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tkbox.guest import spawn as guest_spawn
from tkbox.image.initramfs import compile_spawn

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="tkbox-spawn chroots, which needs root"),
]


@pytest.fixture(scope="module")
def spawn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = Path(guest_spawn.__file__).with_name("spawn.c")
    out = tmp_path_factory.mktemp("spawn") / "tkbox-spawn"
    out.write_bytes(compile_spawn(src))
    out.chmod(0o755)
    return out


def run(spawn: Path, argv: list[str], env: dict[str, str], cwd: str, *,
        user: tuple[int, int, list[int]] | None = None,
        procs: str = "") -> tuple[int, bytes, str | None]:
    """(exit status, stdout, the agent's error message) for one command."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        proc = subprocess.Popen(guest_spawn.spawn_argv(argv, env, w, "/", cwd, user, procs=procs),
                                executable=str(spawn), env={}, stdout=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                close_fds=True, pass_fds=(w,))
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as errpipe:
        report = errpipe.read()
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out, guest_spawn.spawn_error(argv[0], report)


def test_the_command_joins_the_cgroup_before_its_own_code_runs(spawn: Path,
                                                                tmp_path: Path) -> None:
    """The OOM guarantee: the pid in cgroup.procs is written before exec, so the
    command's first instruction already runs confined (here a file stands in for
    cgroup.procs, and the command reads it back as its own pid)."""
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    status, out, err = run(spawn, ["sh", "-c", f'echo "$$ $(cat {procs})"'],
                           {"PATH": "/usr/bin:/bin"}, str(tmp_path), procs=str(procs))
    assert (status, err) == (0, None)
    mine, written = out.decode().split()
    assert mine == written


def test_exactly_the_given_environment_and_directory(spawn: Path, tmp_path: Path) -> None:
    """Nothing of the agent's environment leaks in (the helper itself runs with none)."""
    env = {"PATH": "/usr/bin:/bin", "ONLY": "this one"}
    status, out, err = run(spawn, ["sh", "-c", "pwd; env | sort"], env, str(tmp_path))
    assert (status, err) == (0, None)
    lines = out.decode().splitlines()
    assert lines[0] == str(tmp_path)
    names = {ln.split("=", 1)[0] for ln in lines[1:]}
    assert names <= {"PATH", "ONLY", "PWD", "SHLVL", "_"}, names
    assert "ONLY=this one" in lines


def test_path_is_searched_like_subprocess(spawn: Path, tmp_path: Path) -> None:
    """Each PATH entry in turn; a missing directory or file is skipped; the first
    other error (here: not executable) is the one reported."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "hello").write_text("#!/bin/sh\necho hello from bin\n")
    (bindir / "hello").chmod(0o755)
    (bindir / "noexec").write_text("#!/bin/sh\n")
    env = {"PATH": f"/nonexistent:{tmp_path / 'missing'}:{bindir}:/usr/bin:/bin"}
    assert run(spawn, ["hello"], env, "/")[:2] == (0, b"hello from bin\n")
    status, _, err = run(spawn, ["noexec"], env, "/")
    assert status == 127 and err == "cannot start 'noexec': Permission denied"
    status, _, err = run(spawn, ["no-such-command"], env, "/")
    assert status == 127 and err == "cannot start 'no-such-command': No such file or directory"


def test_a_missing_working_directory_is_reported_and_nothing_runs(spawn: Path,
                                                                 tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    status, _, err = run(spawn, ["sh", "-c", f"touch {marker}"], {"PATH": "/usr/bin:/bin"},
                         str(tmp_path / "gone"))
    assert status == 127 and not marker.exists()
    assert err == ("cannot start 'sh': No such file or directory "
                   "(entering the working directory)")


def test_the_command_runs_as_the_images_user_with_only_its_groups(spawn: Path) -> None:
    status, out, err = run(spawn, ["sh", "-c", "id -u; id -g; id -G"],
                           {"PATH": "/usr/bin:/bin"}, "/",
                           user=(65534, 65534, [65534, 4242]))
    assert (status, err) == (0, None)
    assert out.decode().split("\n")[:3] == ["65534", "65534", "65534 4242"]


def test_malformed_helper_arguments_are_refused_not_guessed(spawn: Path) -> None:
    """The agent is its only caller; a count that does not match, or a number with a
    sign, is refused (exit 127, 'usage') rather than read some other way."""
    for bad in (["0", "", "/", "/", "", "", "", "0", "1", "--", "true"],
                ["0", "", "/", "/", "-1", "0", "", "0", "0", "--", "true"],
                ["0", "", "/", "/", "", "", "", "2", "0", "--", "true"]):
        r, w = os.pipe2(os.O_CLOEXEC)
        bad = [str(w) if i == 0 else a for i, a in enumerate(bad)]
        proc = subprocess.Popen([str(spawn), *bad], env={}, pass_fds=(w,))
        os.close(w)
        with os.fdopen(r, "rb") as errpipe:
            report = errpipe.read()
        assert proc.wait(timeout=30) == 127
        assert report.endswith(b" usage"), (bad, report)
