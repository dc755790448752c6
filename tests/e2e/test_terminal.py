"""`tkbox exec -t` and `tkbox shell`, driven through a real terminal (tmux): keys, the
window size and its changes, Ctrl-C, Ctrl-D and the exit status."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from e2e_stack import TKBOX, Box

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed "
                                "(scripts/setup.sh installs it)")


class Tmux:
    def __init__(self, sock: Path, name: str, err: Path) -> None:
        self.base = ["tmux", "-S", str(sock)]
        self.name = name
        self.err = err

    def run(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout

    def screen(self) -> str:
        try:
            return self.run("capture-pane", "-p", "-t", self.name)
        except subprocess.CalledProcessError:
            return "(the terminal is gone)"

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.name, *keys)

    def wait_for(self, text: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while True:
            s = self.screen()
            if text in s:
                return s
            if time.monotonic() > deadline:
                st = self.err.with_suffix(".status")
                raise AssertionError(f"{text!r} never showed on the terminal:\n{s}\n"
                                     f"{self.err.read_text() if self.err.exists() else ''}"
                                     f"{st.read_text() if st.exists() else ''}")
            time.sleep(0.3)


def start(box: Box, tmp_path: Path, command: list[str], name: str) -> tuple[Tmux, Path]:
    status = tmp_path / f"{name}.status"
    script = tmp_path / f"{name}.sh"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in box.stack.env.items()
                   if k.startswith(("TKBOX_", "PATH", "HOME", "PYTHON")))
    script.write_text(f"#!/bin/sh\nexport {env}\n{shlex.join([*TKBOX, *command])} "
                      f"2>{tmp_path / (name + '.err')}\n"
                      f"echo $? > {status}\nsleep 600\n")
    script.chmod(0o755)
    t = Tmux(tmp_path / f"{name}.sock", name, tmp_path / f"{name}.err")
    t.run("-f", "/dev/null", "new-session", "-d", "-s", name, "-x", "100", "-y", "30",
          str(script))
    t.run("set-option", "-g", "status", "off")
    return t, status


def wait_status(path: Path, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, "the command did not end"
        time.sleep(0.3)
    return int(path.read_text())


def test_a_terminal_in_the_box_behaves_like_a_local_one(box: Box, tmp_path: Path) -> None:
    t, status = start(box, tmp_path, ["exec", "-t", box.name, "--", "sh", "-i"], "execsh")
    try:
        t.wait_for("#")  # capture-pane drops the prompt's trailing space
        t.keys("stty size; tty", "Enter")
        screen = t.wait_for("/dev/pts/")
        assert "30 100" in screen  # the local terminal's size
        t.run("resize-window", "-t", "execsh", "-x", "120", "-y", "40")
        time.sleep(1)
        t.keys("clear; stty size", "Enter")
        t.wait_for("40 120")  # a resize reaches the box
        t.keys("sleep 300", "Enter")
        time.sleep(2)
        t0 = time.monotonic()
        t.keys("C-c")
        t.keys("echo after-$((6*7))", "Enter")
        t.wait_for("after-42", timeout=60)  # Ctrl-C stopped sleep, not the shell
        assert time.monotonic() - t0 < 60
        t.keys("exit 7", "Enter")
        assert wait_status(status) == 7  # the command's own status
    finally:
        subprocess.run([*t.base, "kill-server"], capture_output=True)

    t, status = start(box, tmp_path, ["shell", box.name], "shell")
    try:
        t.wait_for("#", timeout=120)
        t.keys("echo shell-is-$0", "Enter")
        t.wait_for("shell-is-bash")  # the default image has bash
        t.keys("C-d")
        assert wait_status(status) == 0  # Ctrl-D ends the shell
    finally:
        subprocess.run([*t.base, "kill-server"], capture_output=True)

    r = box.stack.tk("exec", "-t", box.name, "--", "true", check=False)
    assert r.returncode == 2 and "needs a terminal" in r.stderr
    box.stack.tk("stop", box.name)
    lines = [json.loads(x) for x in box.stack.tk("logs", box.name, "--json").stdout.splitlines()]
    ttys = [e for e in lines if e.get("op") == "decide" and e.get("action") == "Bash"]
    assert len(ttys) >= 2 and all(e["allowed"] for e in ttys)
