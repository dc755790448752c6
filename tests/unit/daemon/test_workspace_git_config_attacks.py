"""Credentials in a checkout's git configuration never reach the VM's copy.

Each test plants a credential where git would find it (a section header, a
quoted value, a submodule's, a worktree's or a nested clone's config, an
included file) and checks that no byte of it is in the tar stream the lower
disk is built from, and that every config that is copied is one git reads,
holding exactly the sections without credentials.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.daemon.workspace import (
    GitConfigCleaner,
    _tar_checkout,
    credential_reason,
    is_git_config,
    sanitize_entries,
)
from tkbox.gitconfig import Entry, parse_list, render

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

SECRET = "s3cr3tTOKENvalue"


def _git_list(path: Path) -> list[Entry]:
    out = subprocess.run(["git", "config", "--file", str(path), "--no-includes", "--list",
                          "--null"], capture_output=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(path.parent),
                              "GIT_CONFIG_NOSYSTEM": "1"}).stdout
    return parse_list(out)


def _copy(root: Path) -> tuple[dict[str, bytes], dict[str, int]]:
    buf = io.BytesIO()
    stats = _tar_checkout(root, buf)  # type: ignore[arg-type]
    assert SECRET.encode() not in buf.getvalue()
    buf.seek(0)
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=buf) as tar:
        for m in tar.getmembers():
            if m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                files[m.name] = f.read()
    return files, stats


def _repo(root: Path, config: str) -> Path:
    (root / ".git" / "objects").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".git" / "config").write_text(config)
    return root


def _reads_back(data: bytes, tmp: Path) -> list[Entry]:
    p = tmp / "readback.config"
    p.write_bytes(data)
    return _git_list(p)


def test_userinfo_in_a_section_header_is_dropped(tmp_path: Path) -> None:
    """Stops `url."https://user:TOKEN@host/".insteadOf` carrying a token in the header."""
    _repo(tmp_path, f'[core]\n\tbare = false\n[url "https://bot:{SECRET}@git.example/"]\n'
                    '\tinsteadOf = https://git.example/\n')
    files, stats = _copy(tmp_path)
    keys = [e.key for e in _reads_back(files[".git/config"], tmp_path)]
    assert keys == ["core.bare"] and stats["git_config_sections_dropped"] == 1


@pytest.mark.parametrize("value", [
    f'"https://bot:{SECRET}@git.example/r.git"',  # quoted
    f'https://bot:{SECRET}@git.example/r.git  ; comment',
    f'"https://{SECRET}@git.example/r.git"',  # token as the user name alone
    f'"ssh://git:{SECRET}@git.example/r.git"',
    f'bot:{SECRET}@git.example:org/r.git',  # scp form with a password
    f'"https://bot:{SECRET}@git.example/r.git" # quoted then a comment',
])
def test_userinfo_in_a_quoted_or_odd_value_is_dropped(tmp_path: Path, value: str) -> None:
    """Stops a credential in a remote URL hiding behind quotes, comments or URL forms."""
    _repo(tmp_path, f'[remote "origin"]\n\turl = {value}\n\tfetch = +refs/heads/*:refs/x/*\n'
                    '[user]\n\tname = A\n')
    files, _ = _copy(tmp_path)
    assert [e.key for e in _reads_back(files[".git/config"], tmp_path)] == ["user.name"]


@pytest.mark.parametrize("section", [
    f"[credential]\n\thelper = store --file /tmp/{SECRET}\n",
    f'[credential "https://git.example"]\n\tusername = {SECRET}\n',
    f'[http "https://git.example/"]\n\textraHeader = AUTHORIZATION: basic {SECRET}\n',
    f"[http]\n\textraheader = Authorization: Bearer {SECRET}\n",
    f"[sendemail]\n\tsmtpPass = {SECRET}\n",
    f"[github]\n\toauth-token = {SECRET}\n",
    f"[hub]\n\toauthtoken = {SECRET}\n",
    f"[mytool]\n\tapi = ghp_{SECRET}abcdefghijklmnop\n",
    f"[core]\n\taskPass = /home/u/{SECRET}.sh\n",
    f"[deploy]\n\tapiKey = {SECRET}\n",
    f'[remote "origin"]\n\turl = https://bot:{SECRET[:4]}\\\n{SECRET[4:]}@h.example/r\n',
    f"[include]\n\tpath = /home/u/{SECRET}.inc\n",
    f'[includeIf "gitdir:/x/"]\n\tpath = /home/u/{SECRET}.inc\n',
])
def test_every_credential_section_is_dropped_whole(tmp_path: Path, section: str) -> None:
    """Stops credential helpers, extra headers, passwords and includes reaching the VM."""
    _repo(tmp_path, "[user]\n\tname = A\n" + section + "[user]\n\temail = a@b.example\n")
    files, stats = _copy(tmp_path)
    kept = _reads_back(files[".git/config"], tmp_path)
    assert [e.key for e in kept] == ["user.name", "user.email"]
    assert stats["git_config_sections_dropped"] == 1


def test_submodule_worktree_and_nested_clone_configs_are_cleaned(tmp_path: Path) -> None:
    """Stops credentials in configs other than `.git/config` (every config under `.git`)."""
    bad = f'[remote "origin"]\n\turl = https://u:{SECRET}@h.example/r\n[core]\n\tbare = false\n'
    _repo(tmp_path, bad)
    for rel in (".git/config.worktree", ".git/modules/lib/config",
                ".git/modules/lib/modules/deep/config", ".git/worktrees/wt/config.worktree",
                "vendor/other/.git/config"):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(bad)
    files, stats = _copy(tmp_path)
    configs = [n for n in files if is_git_config(n)]
    assert len(configs) == 6
    for n in configs:
        assert [e.key for e in _reads_back(files[n], tmp_path)] == ["core.bare"], n
    assert stats["git_config_sections_dropped"] == 6


def test_included_files_are_left_out_of_the_copy(tmp_path: Path) -> None:
    """Stops `[include] path = creds.inc` moving the credential into a file copied as is."""
    _repo(tmp_path, "[include]\n\tpath = creds.inc\n[includeIf \"gitdir:x\"]\n"
                    "\tpath = ../tools/more.inc\n")
    (tmp_path / ".git" / "creds.inc").write_text(f"[http]\n\textraheader = {SECRET}\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "more.inc").write_text(f"[credential]\n\thelper = {SECRET}\n")
    (tmp_path / "tools" / "keep.txt").write_text("x")
    files, _ = _copy(tmp_path)
    assert ".git/creds.inc" not in files and "tools/more.inc" not in files
    assert "tools/keep.txt" in files


def test_hooks_of_submodules_and_nested_clones_are_left_out(tmp_path: Path) -> None:
    """Stops host hook scripts (which may embed tokens) of any repository being copied."""
    _repo(tmp_path, "[core]\n\tbare = false\n")
    for gitdir in (".git", ".git/modules/lib", "vendor/x/.git"):
        d = tmp_path / gitdir
        (d / "objects").mkdir(parents=True, exist_ok=True)
        (d / "HEAD").write_text("ref: refs/heads/main\n")
        (d / "hooks").mkdir()
        (d / "hooks" / "pre-push").write_text(f"#!/bin/sh\ncurl -H 'X: {SECRET}'\n")
    (tmp_path / ".git" / "refs" / "heads" / "hooks").mkdir(parents=True)
    (tmp_path / ".git" / "refs" / "heads" / "hooks" / "x").write_text("0" * 40 + "\n")
    files, _ = _copy(tmp_path)
    assert not [n for n in files if "/hooks/pre-push" in n]
    assert ".git/refs/heads/hooks/x" in files  # a branch named hooks/x is not a hooks dir


def test_a_config_git_cannot_read_is_left_out(tmp_path: Path) -> None:
    """Stops a config tkbox could not clean being copied as it is."""
    _repo(tmp_path, f"[core\n\turl = https://u:{SECRET}@h\n")
    files, stats = _copy(tmp_path)
    assert ".git/config" not in files and stats["skipped_credentials"] >= 1


def test_a_symlinked_config_is_left_out(tmp_path: Path) -> None:
    """Stops `.git/config -> ../cfg` leading the cleaner past a file copied as is."""
    _repo(tmp_path, "")
    (tmp_path / ".git" / "config").unlink()
    (tmp_path / ".git" / "config").symlink_to("/nonexistent/cfg")
    files, _ = _copy(tmp_path)
    assert ".git/config" not in files


def test_ordinary_settings_survive_with_their_exact_values(tmp_path: Path) -> None:
    cfg = ('[core]\n\tbare\n\tautocrlf = false\n[user]\n\tname = "  Ann ; #x \\"q\\" \\\\ "\n'
           '[remote "origin"]\n\turl = git@git.example:org/r.git\n'
           '[branch "feat/a.b"]\n\tremote = origin\n\tmerge = refs/heads/feat/a.b\n'
           '[alias]\n\tst = status -sb\n')
    _repo(tmp_path, cfg)
    files, stats = _copy(tmp_path)
    assert _reads_back(files[".git/config"], tmp_path) == _git_list(tmp_path / ".git" / "config")
    assert stats["git_config_sections_dropped"] == 0


def test_credential_reason_names_no_value() -> None:
    why = credential_reason([Entry("http", None, "extraheader", f"Bearer {SECRET}")])
    assert why is not None and SECRET not in why


_names = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True).filter(
    lambda n: not any(p in n for p in ("pass", "token", "secret", "cookie", "credential",
                                       "helper", "auth", "sslkey", "sslcert", "key")))
_values = st.one_of(st.none(), st.text(st.characters(blacklist_categories=["Cs"],
                                                     blacklist_characters="\x00"), max_size=40))
_subs = st.one_of(st.none(), st.text(st.characters(blacklist_categories=["Cs"],
                                                   blacklist_characters="\x00\n"), max_size=20))
_entries = st.lists(st.builds(Entry, _names, _subs, _names, _values), max_size=6)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_entries)
def test_what_tkbox_writes_git_reads_back_exactly(tmp_path: Path, entries: list[Entry]) -> None:
    """Stops a rewritten config that git reads differently (or not at all) from what we kept."""
    kept, _ = sanitize_entries(entries)
    back = _reads_back(render(kept), tmp_path)
    assert [(e.key, e.value) for e in back] == [(e.key, e.value) for e in kept]


def test_cleaner_refuses_nothing_it_cannot_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "config"
    p.write_text('[a "x\\"y"]\n\tb = "tab\\there"\n')
    with GitConfigCleaner() as c:
        out = c.clean(p)
    assert out.data is not None and _reads_back(out.data, tmp_path) == _git_list(p)
