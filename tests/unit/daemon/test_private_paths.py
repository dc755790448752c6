"""Local paths: VM directories (and their sockets) cannot be planted or swapped by another user."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tkbox import paths
from tkbox.errors import HostError

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another user")


def mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def test_every_directory_created_is_0700_parents_included(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        made = paths.private_dir(tmp_path / "a" / "b" / "c")
    finally:
        os.umask(old)
    for p in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert mode(p) == 0o700, p


def test_parent_writable_by_other_users_is_refused(tmp_path: Path) -> None:
    """Attack: another user renames our directory away inside a parent they can write,
    and puts their own in its place (to read or answer the VMs' sockets)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(HostError, match="can be written by other users"):
        paths.private_dir(shared / "vms")
    assert not (shared / "vms").exists()


def test_sticky_world_writable_parent_like_tmp_is_accepted(tmp_path: Path) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert mode(paths.private_dir(sticky / "mine")) == 0o700


def test_a_file_in_place_of_our_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "vms").write_text("")
    with pytest.raises(HostError, match="not a directory"):
        paths.private_dir(tmp_path / "vms")


def test_our_own_link_to_a_shared_cache_is_followed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (tmp_path / "images").symlink_to(cache)
    assert paths.private_dir(tmp_path / "images") == tmp_path / "images"


@root_only
def test_a_link_planted_by_another_user_is_refused(tmp_path: Path) -> None:
    """Attack: plant a symlink where tkbox will make its VM directory (in a sticky
    directory such as /tmp, anyone may create entries)."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (sticky / "vms").symlink_to(elsewhere)
    os.lchown(sticky / "vms", 65534, 65534)
    with pytest.raises(HostError, match="link made by user 65534"):
        paths.private_dir(sticky / "vms")


@root_only
def test_parent_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """Attack: another user owns a directory on the way, so can swap what is below."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(HostError, match="belongs to user 65534"):
        paths.private_dir(theirs / "vms")


@root_only
def test_tmp_fallback_made_by_another_user_first_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: squat /tmp/tkbox-<uid> before tkbox makes it (its name is predictable)."""
    monkeypatch.setattr(os, "getuid", lambda: 4242)
    squat = Path("/tmp/tkbox-4242")
    squat.mkdir(mode=0o777, exist_ok=True)
    os.chown(squat, 65534, 65534)
    try:
        long_home = tmp_path / ("h" * 90)
        with pytest.raises(HostError, match="not a directory of yours"):
            paths.vms(long_home)
        os.chown(squat, 4242, 4242)  # ours, but opened to everyone: contents untrustworthy
        squat.chmod(0o777)
        with pytest.raises(HostError, match="can be written by other users"):
            paths.vms(long_home)
        squat.chmod(0o755)  # ours, readable by others only: made private again
        assert paths.vms(long_home) == squat / "vms"
        assert mode(squat) == 0o700
    finally:
        os.rmdir(squat)


def test_short_home_needs_no_fallback(tmp_path: Path) -> None:
    assert paths.vms(Path("/h")) == Path("/h/run/vms")
