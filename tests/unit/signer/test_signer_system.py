"""`tkbox signer init --system`, without systemd or new users: the plan, the
unit (checked by systemd-analyze when it is installed), the files it writes."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tkbox.errors import UserError
from tkbox.signer import config, system


def test_the_unit_runs_the_signer_as_its_own_user_in_a_sandbox() -> None:
    text = system.plan().unit_text()
    for line in ("User=tkbox-signer", "Group=tkbox", "UMask=0117", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "ProtectHome=yes", "RuntimeDirectoryMode=0750",
                 "StateDirectoryMode=0700", "CapabilityBoundingSet="):
        assert line in text.splitlines(), line
    assert "signer serve --home /var/lib/tkbox-signer --socket /run/tkbox-signer/signer.sock" \
        in text


def test_bad_names_are_refused() -> None:
    for bad in ("", "-x", "a b", "root;rm"):
        with pytest.raises(UserError):
            system.plan(user=bad)


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    lines = list(system.apply(system.plan(), root=tmp_path, dry_run=True))
    assert any("would write" in line for line in lines)
    assert not any(tmp_path.iterdir())


def test_apply_under_a_root(tmp_path: Path) -> None:
    p = system.plan(origin="example.test/system-signer")
    lines = list(system.apply(p, root=tmp_path))
    home = tmp_path / "var/lib/tkbox-signer"
    unit = tmp_path / "etc/systemd/system/tkbox-signer.service"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "signer.key").stat().st_mode) == 0o600
    assert config.load(home).mode == "system"
    assert config.load(home).signer().name == "example.test/system-signer"
    assert unit.read_text() == p.unit_text()
    assert any("usermod -aG tkbox" in line for line in lines)
    if shutil.which("systemd-analyze"):
        r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr


def test_a_python_under_a_home_directory_is_warned_about(tmp_path: Path) -> None:
    import dataclasses

    p = dataclasses.replace(system.plan(), python=str(Path("/home/someone/venv/bin/python")))
    lines = list(system.apply(p, root=tmp_path, dry_run=True))
    assert lines[0].startswith("warning:") and "ProtectHome" in lines[0]
