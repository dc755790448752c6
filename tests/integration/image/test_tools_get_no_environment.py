"""The tools tkbox runs on bytes a registry, an image or a checkout supplies get no
environment but PATH and the C locale: tar2sqfs building a root disk from an image's
layers and a workspace disk from a checkout, rdsquashfs reading an image's
/etc/passwd, mkfs.ext4 making a box's upper disk. The daemon's environment holds the
secrets door's real values (`--secret NAME=env:VAR@host`); a tool exploited by what it
parses must not find them in its own.

Each tool is a stand-in first on PATH that writes its environment to a file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tkbox.daemon import workspace
from tkbox.image import runconfig, squashfs

pytestmark = pytest.mark.integration

CANARY = "TKBOX_TEST_SECRET_VALUE"
#: what a shell adds to its own environment on its own
SHELL_OWN = {"PWD", "SHLVL", "_", "OLDPWD"}


@pytest.fixture
def seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Stand-ins for the tools on PATH; each run writes its environment to seen/NAME.PID."""
    out, bindir = tmp_path / "seen", tmp_path / "bin"
    out.mkdir()
    bindir.mkdir()
    for name in ("tar2sqfs", "rdsquashfs", "mkfs.ext4"):
        tool = bindir / name
        tool.write_text(f"#!/bin/sh\nenv -0 > {out / name}.$$\ncat > /dev/null\nexit 0\n")
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("ANTHROPIC_API_KEY", CANARY)
    return out


def _environment(path: Path) -> dict[str, str]:
    pairs = [e.split("=", 1) for e in path.read_text().split("\0") if e]
    return {k: v for k, v in pairs}


def test_each_tool_on_hostile_bytes_gets_only_path_and_the_locale(
        seen: Path, tmp_path: Path) -> None:
    squashfs.pack(lambda f: f.write(b"layer bytes"), tmp_path / "root.sqfs")
    runconfig.read_from_rootfs(tmp_path / "root.sqfs", "/etc/passwd")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "a.txt").write_text("a\n")
    workspace.build_lower(checkout, tmp_path / "lower.sqfs")
    workspace.build_upper(tmp_path / "upper.ext4", 1)
    runs = sorted(seen.iterdir())
    assert sorted(p.name.split(".")[0] for p in runs) == ["mkfs", "rdsquashfs", "tar2sqfs",
                                                          "tar2sqfs"]
    for run in runs:
        env = _environment(run)
        assert CANARY not in "".join(env.values()), run.name
        assert set(env) - SHELL_OWN == {"PATH", "LC_ALL"}, (run.name, sorted(env))
        assert env["PATH"] == os.environ["PATH"] and env["LC_ALL"] == "C"
