"""The workspace copy leaves out credentials, hooks and git credentials."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tkbox.daemon.workspace import _tar_checkout, is_credential


@pytest.mark.parametrize("path", [
    ".env", ".env.local", "prod.env", "config/.env.production", "server.pem", "tls/site.key",
    ".netrc", ".npmrc", ".pypirc", "id_rsa", "id_ed25519.pub", "deploy/id_ecdsa",
    ".git-credentials", ".docker/config.json", "a/credentials.json", "STORE.P12",
    ".git/hooks/pre-commit", ".pgpass",
])
def test_credential_files_are_never_copied(path: str) -> None:
    assert is_credential(path, False)


@pytest.mark.parametrize("path", [".ssh", "home/.aws", ".gnupg", ".git/hooks", ".kube"])
def test_credential_directories_are_never_copied(path: str) -> None:
    assert is_credential(path, True)


@pytest.mark.parametrize("path", ["main.py", ".env.example", "docs/keys.md", "environment.yml",
                                  ".github/workflows/ci.yml", ".git/config", "monkey.txt"])
def test_ordinary_files_are_copied(path: str) -> None:
    assert not is_credential(path, False)


def test_tar_of_checkout_skips_credentials_specials_and_keeps_links(tmp_path: Path) -> None:
    import os

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("a")
    (tmp_path / ".env").write_text("TOKEN=x")
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("x")
    (tmp_path / "link").symlink_to("/etc/passwd")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / ".git" / "hooks").mkdir(parents=True)
    (tmp_path / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh")
    (tmp_path / ".git" / "config").write_text('[remote "o"]\n\turl = https://u:p@h.invalid/r\n')
    buf = io.BytesIO()
    stats = _tar_checkout(tmp_path, buf)  # type: ignore[arg-type]
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        names = {m.name: m for m in tar.getmembers()}
        config = tar.extractfile(names[".git/config"]).read().decode()  # type: ignore[union-attr]
    assert set(names) == {"src", "src/a.py", "link", ".git", ".git/config"}
    assert names["link"].issym() and names["link"].linkname == "/etc/passwd"
    assert "u:p" not in config and "h.invalid" not in config  # the whole remote section went
    assert stats["skipped_credentials"] == 3  # .env, .ssh, .git/hooks
    assert stats["git_config_sections_dropped"] == 1
