"""The workspace copy leaves out credentials, hooks and git credentials."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tkbox.daemon.workspace import _tar_checkout, build_lower, is_credential
from tkbox.errors import UserError


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



def _swap_before_listing(monkeypatch: pytest.MonkeyPatch, name: str,
                         swap: Callable[[], None]) -> None:
    """`swap` runs just before the copy's walk lists the directory `name` (the second
    listing: the first is the search for git configs), after os.walk has seen it is
    not a link, as another process moving files mid-copy can."""
    real = os.scandir
    seen: list[str] = []

    def scandir(path: Any = ".") -> Any:
        if isinstance(path, str) and os.path.basename(path) == name:
            seen.append(path)
            if len(seen) == 2:
                swap()
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def _outside(tmp_path: Path) -> Path:
    """A directory of the host outside the checkout, with a file the box must not get."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("PRIVATE of the daemon's user")
    return home


def test_a_file_swapped_for_a_symlink_mid_copy_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the walk's look at `src/notes.txt` and its open, it becomes a link out."""
    outside = _outside(tmp_path)
    co = tmp_path / "co"
    (co / "src").mkdir(parents=True)
    (co / "src" / "notes.txt").write_text("ordinary")
    real_lstat = Path.lstat
    looks: list[Path] = []

    def lstat(p: Path) -> os.stat_result:
        st = real_lstat(p)
        if p.name == "notes.txt" and p.parent.name == "src":
            looks.append(p)
            if len(looks) == 2:  # the copy's own look, just before it opens the file
                p.unlink()
                p.symlink_to(outside / "notes.txt")
        return st

    monkeypatch.setattr(Path, "lstat", lstat)
    buf = io.BytesIO()
    with pytest.raises(UserError, match="the checkout changed while it was copied"):
        _tar_checkout(co, buf)  # type: ignore[arg-type]
    assert b"PRIVATE" not in buf.getvalue()


def _pkg_swapped_mid_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout whose directory `pkg` becomes a link to a directory outside just
    before the copy's walk lists it; the checkout."""
    outside = _outside(tmp_path)
    co = tmp_path / "co"
    (co / "pkg").mkdir(parents=True)
    (co / "pkg" / "notes.txt").write_text("ordinary")

    def swap() -> None:
        shutil.rmtree(co / "pkg")
        (co / "pkg").symlink_to(outside)

    _swap_before_listing(monkeypatch, "pkg", swap)
    return co


def test_a_directory_swapped_for_a_symlink_mid_copy_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk lists `pkg` as a directory, then reads it by its path: swapped for a link
    to a directory outside, its files would be the outside's."""
    co = _pkg_swapped_mid_copy(tmp_path, monkeypatch)
    buf = io.BytesIO()
    with pytest.raises(UserError, match="the checkout changed while it was copied"):
        _tar_checkout(co, buf)  # type: ignore[arg-type]
    assert b"PRIVATE" not in buf.getvalue()


def test_a_copy_refused_mid_way_leaves_no_disk_behind(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal ends the real tar2sqfs and removes what it had written."""
    co = _pkg_swapped_mid_copy(tmp_path, monkeypatch)
    target = tmp_path / "lower.sqfs"
    with pytest.raises(UserError, match="the checkout changed while it was copied"):
        build_lower(co, target)
    assert not target.exists()
