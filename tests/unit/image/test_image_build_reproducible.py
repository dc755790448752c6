"""The default image is built reproducibly: two machines with the same package versions and
APT sources make the same bytes (measured here: two builds, one sha256; the build itself
downloads packages, so no test runs it). These check what makes it so."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tkbox.image import build


@pytest.fixture
def sources(tmp_path: Path) -> list[Path]:
    s = tmp_path / "debian.sources"
    s.write_text("Types: deb\nURIs: http://mirror.invalid/debian\nSuites: bookworm\n")
    return [s]


def test_host_files_that_differ_between_machines_are_left_out(sources: list[Path],
                                                              tmp_path: Path) -> None:
    cmd = build.mmdebstrap_command(tmp_path / "out.tar", sources=sources, suite="bookworm")
    hooks = [c for c in cmd if c.startswith("--customize-hook=")]
    assert hooks and "etc/resolv.conf" in hooks[0] and "etc/hostname" in hooks[0]


class _Proc:
    def __init__(self, *a: Any, env: dict[str, str], **kw: Any) -> None:
        _Proc.env = env
        self.stderr = iter(())

    def wait(self) -> int:
        return 0


@pytest.mark.parametrize("given,expected", [(None, str(build.REPRODUCIBLE_EPOCH)),
                                            ("1234567890", "1234567890")])
def test_file_times_are_fixed_unless_the_builder_fixes_them(
        monkeypatch: pytest.MonkeyPatch, sources: list[Path], tmp_path: Path,
        given: str | None, expected: str) -> None:
    if given is None:
        monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    else:
        monkeypatch.setenv("SOURCE_DATE_EPOCH", given)
    monkeypatch.setattr(build, "host_sources", lambda *a: sources)
    monkeypatch.setattr(build, "host_codename", lambda *a: "bookworm")
    monkeypatch.setattr(build.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(subprocess, "Popen", _Proc)
    build.build_rootfs(tmp_path / "out.tar")
    assert _Proc.env["SOURCE_DATE_EPOCH"] == expected
