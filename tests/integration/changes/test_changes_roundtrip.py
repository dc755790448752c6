"""The guest's patch, applied by the door, turns the first tree into the second.

A property test over random pairs of trees (upper layers built as overlayfs
builds them), a kernel overlay mount when this host allows one, and plain
`git apply` of the guest's patches.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "doors" / "changes"))
from changes_trees import (  # noqa: E402
    Tree,
    build_upper,
    dirs_of,
    file,
    link,
    make_tree,
    read_tree,
    whiteout,
)

from tkbox.doors.changes import PatchRefused, apply_patch  # noqa: E402
from tkbox.doors.changes.patch import parse_patch  # noqa: E402
from tkbox.guest.diff import write_patch  # noqa: E402
from tkbox.record.testing import FakeSigner  # noqa: E402

pytestmark = pytest.mark.integration

NAMES = ["a", "b", "c d", "é", 'q"', "x.txt", "_"]
CONTENTS = [b"", b"a\n", b"a\nb\n", b"no newline", b"a\r\nb\r\n", b"\x00bin\xff",
            bytes(range(256)), b"".join(b"line %d\n" % i for i in range(40))]


@st.composite
def trees(draw: st.DrawFn) -> Tree:
    paths = draw(st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3)
                          .map("/".join), max_size=8, unique=True))
    tree: Tree = {}
    for p in sorted(paths, key=len):
        parts = p.split("/")
        if any("/".join(parts[:i]) in tree for i in range(1, len(parts))):
            continue  # an ancestor is a file already
        if any(q.startswith(p + "/") for q in tree):
            continue
        if draw(st.integers(0, 5)) == 0:
            tree[p] = link(draw(st.sampled_from([b"a", b"x.txt", b"../b" if "/" in p else b"b"])))
        else:
            tree[p] = file(draw(st.sampled_from(CONTENTS)), draw(st.booleans()))
    return tree


def final_from(draw: st.DrawFn, lower: Tree) -> Tree:
    final: Tree = {}
    for p, e in lower.items():
        choice = draw(st.integers(0, 3))
        if choice == 0:
            continue  # deleted
        if choice == 1 and e[0] == "file":
            final[p] = file(draw(st.sampled_from(CONTENTS)), draw(st.booleans()))
        else:
            final[p] = e
    for p, e in draw(trees()).items():
        parts = p.split("/")
        clash = any("/".join(parts[:i]) in final for i in range(1, len(parts))) or \
            any(q.startswith(p + "/") for q in final)
        if not clash:
            final[p] = e
    return final


@st.composite
def pairs(draw: st.DrawFn) -> tuple[Tree, Tree, set[str], bool]:
    lower = draw(trees())
    final = final_from(draw, lower)
    both = sorted(dirs_of(lower) & dirs_of(final))
    opaque = set(draw(st.lists(st.sampled_from(both), unique=True))) if both else set()
    return lower, final, opaque, draw(st.booleans())


def apply_to(co: Path, patch: bytes) -> None:
    async def go() -> None:
        s = FakeSigner()
        await s.open_run("r", {})
        await apply_patch(patch, co, s, "r", allow_sensitive=True)
    asyncio.run(go())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs())
def test_guest_patch_applied_by_the_door_gives_the_final_tree(
        case: tuple[Tree, Tree, set[str], bool]) -> None:
    lower, final, opaque, xattr = case
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        make_tree(tmp / "lower", lower)
        build_upper(tmp / "upper", lower, final, opaque_dirs=opaque, xattr_whiteouts=xattr)
        out = io.BytesIO()
        write_patch(tmp / "lower", tmp / "upper", out, max_bytes=1 << 22)
        co = tmp / "co"
        shutil.copytree(tmp / "lower", co, symlinks=True)
        subprocess.run(["git", "init", "-q"], cwd=co, check=True)
        if any(e[0] == "link" and any(q.startswith(p + "/") for q in final)
               for p, e in lower.items()):
            # documented: a checkout symlink replaced by a directory is refused
            with pytest.raises(PatchRefused, match="replaces the checkout's symlink"):
                apply_to(co, out.getvalue())
            assert read_tree(co) == lower
            return
        apply_to(co, out.getvalue())
        assert read_tree(co) == final


def test_plain_git_apply_reproduces_the_guest_patch(tmp_path: Path) -> None:
    lower = {"t": file(b"1\n2\n3\n"), "b": file(b"\x00" * 100), "l": link(b"t"),
             "d/x": file(b"x\n"), "m": file(b"m\n")}
    final = {"t": file(b"1\n3\n4"), "b": file(bytes(range(256)) * 4), "l": file(b"now\n"),
             "d": file(b"d\n"), "m": file(b"m\n", True), "é q": file(b"\x00")}
    make_tree(tmp_path / "lower", lower)
    build_upper(tmp_path / "upper", lower, final)
    out = io.BytesIO()
    write_patch(tmp_path / "lower", tmp_path / "upper", out, max_bytes=1 << 20)
    parse_patch(out.getvalue())
    co = tmp_path / "co"
    shutil.copytree(tmp_path / "lower", co, symlinks=True)
    (tmp_path / "p.diff").write_bytes(out.getvalue())
    r = subprocess.run(["git", "apply", "--whitespace=nowarn", str(tmp_path / "p.diff")], cwd=co,
                       capture_output=True)
    assert r.returncode == 0 and r.stderr == b""
    assert read_tree(co) == final


def _can_mount_overlay(tmp: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    for d in ("l", "u", "w", "m"):
        (tmp / d).mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={tmp/'l'},upperdir={tmp/'u'},workdir={tmp/'w'}", str(tmp / "m")],
                       capture_output=True)
    if r.returncode != 0:
        return False
    subprocess.run(["umount", str(tmp / "m")], check=True)
    return True


def test_kernel_overlay_upper_layer(tmp_path: Path) -> None:
    """Changes made through a real overlay mount, diffed from its upper dir alone."""
    if not _can_mount_overlay(tmp_path / "probe"):
        pytest.skip("cannot mount overlayfs here")
    lower = {"keep": file(b"k\n"), "mod": file(b"a\nb\n"), "del": file(b"d\n"),
             "dir/a": file(b"a\n"), "dir/b": file(b"b\n"), "gone/x": file(b"x\n"),
             "l": link(b"keep"), "re/old": file(b"o\n"), "exe": file(b"#!/bin/sh\n")}
    lo, up, wk, mnt = (tmp_path / n for n in ("lower", "upper", "work", "mnt"))
    make_tree(lo, lower)
    for d in (up, wk, mnt):
        d.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lo},upperdir={up},workdir={wk}", str(mnt)], check=True)
    try:
        (mnt / "mod").write_bytes(b"a\nB\n")
        (mnt / "del").unlink()
        (mnt / "dir" / "b").unlink()
        (mnt / "dir" / "new").write_bytes(b"\x00\x01")
        shutil.rmtree(mnt / "gone")
        shutil.rmtree(mnt / "re")
        (mnt / "re").mkdir()
        (mnt / "re" / "new").write_bytes(b"n\n")
        (mnt / "l").unlink()
        os.symlink("dir/a", mnt / "l")
        os.chmod(mnt / "exe", 0o755)
        (mnt / "keep").write_bytes(b"k\n")  # copied up, unchanged
        expected = read_tree(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert os.getxattr(up / "re", "trusted.overlay.opaque") == b"y"
    out = io.BytesIO()
    write_patch(lo, up, out, max_bytes=1 << 20)
    assert b"a/keep" not in out.getvalue()
    co = tmp_path / "co"
    shutil.copytree(lo, co, symlinks=True)
    apply_to(co, out.getvalue())
    assert read_tree(co) == expected


def test_whiteout_helper_matches_the_kernel(tmp_path: Path) -> None:
    """Our hand-made whiteout hides a lower file in a real mount, as the kernel's does."""
    if not _can_mount_overlay(tmp_path / "probe"):
        pytest.skip("cannot mount overlayfs here")
    lo, up, wk, mnt = (tmp_path / n for n in ("lower", "upper", "work", "mnt"))
    make_tree(lo, {"x": file(b"x\n"), "y": file(b"y\n")})
    whiteout(up / "x")
    for d in (wk, mnt):
        d.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lo},upperdir={up},workdir={wk}", str(mnt)], check=True)
    try:
        assert sorted(os.listdir(mnt)) == ["y"]
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
