"""tkbox.guest.diff: the patch computed from an overlay upper layer, without VMs.

Each test builds a lower and an upper directory by hand (whiteouts with
mknod, opaque directories with setxattr: these tests run as root), computes
the patch, parses it with the door's parser and applies it with the door's
exact applier; `tests/integration/changes/` also applies them with git.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
from pathlib import Path

import pytest
from changes_trees import Tree, build_upper, file, link, make_tree, opaque, whiteout

from tkbox.doors.changes.patch import MODE_LINK, Limits, apply_section, git_blob_sha1, parse_patch
from tkbox.guest import rpc
from tkbox.guest.diff import (
    WHY_FILE,
    WHY_IGNORED,
    WHY_TOTAL,
    PatchLimits,
    PatchStats,
    SetApart,
    UnsupportedOverlay,
    WorkspaceDiff,
    quote_path,
    write_patch,
)
from tkbox.guest.diff import git_blob_sha1 as guest_sha1

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for whiteouts/xattrs")


def diff(tmp: Path, **kw: object) -> bytes:
    out = io.BytesIO()
    write_patch(tmp / "lower", tmp / "upper", out, max_bytes=int(kw.get("max_bytes", 1 << 20)))
    return out.getvalue()


def pure_apply(lower: Tree, patch: bytes) -> Tree:
    """Apply with the door's parser and exact applier to a dict tree."""
    tree = dict(lower)
    for s in parse_patch(patch).sections:
        old = tree.get(s.path)
        content = None if old is None else old[1]
        new = apply_section(s, content, 1 << 20)
        if new is None:
            tree.pop(s.path)
        elif s.new_mode == MODE_LINK:
            tree[s.path] = link(new)
        else:
            tree[s.path] = file(new, s.new_mode == 0o100755)
    return tree


def roundtrip(tmp: Path, lower: Tree, final: Tree, **kw: object) -> bytes:
    make_tree(tmp / "lower", lower)
    build_upper(tmp / "upper", lower, final, **kw)  # type: ignore[arg-type]
    patch = diff(tmp)
    assert pure_apply(lower, patch) == final
    return patch


def test_blob_sha1_matches_git() -> None:
    # git hash-object of an empty file and of "hello\n", well known values
    assert guest_sha1(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert guest_sha1(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"
    assert git_blob_sha1(b"hello\n") == guest_sha1(b"hello\n")


def test_quoting_is_gits() -> None:
    assert quote_path(b"a/plain name") == b"a/plain name"
    assert quote_path(b'a/q"\\\t\n\x7f\xc3\xa9') == b'"a/q\\"\\\\\\t\\n\\177\\303\\251"'


def test_added_modified_deleted(tmp_path: Path) -> None:
    lower = {"keep": file(b"k\n"), "mod": file(b"1\n2\n3\n4\n5\n6\n7\n8\n9\n"), "del": file(b"x\n")}
    final = {"keep": file(b"k\n"), "mod": file(b"1\n2\n3\n4\nV\n6\n7\n8\n9\n"), "new": file(b"n\n")}
    patch = roundtrip(tmp_path, lower, final)
    assert b"diff --git a/keep" not in patch
    assert b"@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+V\n 6\n" in patch


def test_sections_sorted_by_path_bytes(tmp_path: Path) -> None:
    final = {"b": file(b"b\n"), "a.txt": file(b"x\n"), "a/b": file(b"y\n"), "a0": file(b"z\n")}
    patch = roundtrip(tmp_path, {}, final)
    names = [s.path for s in parse_patch(patch).sections]
    assert names == sorted(names, key=str.encode) == ["a.txt", "a/b", "a0", "b"]


def test_binary_file_is_a_literal_git_patch(tmp_path: Path) -> None:
    data = bytes(range(256)) * 10
    old = b"\x00old"
    patch = roundtrip(tmp_path, {"bin": file(old)}, {"bin": file(data)})
    assert b"GIT binary patch\nliteral 2560\n" in patch
    assert f"index {git_blob_sha1(old)}..{git_blob_sha1(data)} 100644".encode() in patch


def test_empty_files_no_trailing_newline_and_cr(tmp_path: Path) -> None:
    lower = {"e": file(b""), "cr": file(b"a\r\nb\rc"), "nl": file(b"x\ny")}
    final = {"e2": file(b""), "cr": file(b"a\r\nb\rC"), "nl": file(b"x\ny\n")}
    patch = roundtrip(tmp_path, lower, final)
    assert b"\\ No newline at end of file\n" in patch
    assert b"deleted file mode 100644\nindex e69de29" in patch


def test_mode_change_only(tmp_path: Path) -> None:
    patch = roundtrip(tmp_path, {"x": file(b"#!/bin/sh\n")}, {"x": file(b"#!/bin/sh\n", True)})
    assert b"old mode 100644\nnew mode 100755\n" in patch and b"@@" not in patch


def test_symlinks_and_type_changes(tmp_path: Path) -> None:
    lower = {"l": link(b"target"), "f": file(b"was a file\n"), "t": file(b"t\n")}
    final = {"l": link(b"other"), "f": link(b"t"), "t": file(b"t\n"), "n": link(b"t")}
    patch = roundtrip(tmp_path, lower, final)
    assert b"new file mode 120000" in patch
    # file -> symlink: a deletion and a creation, as git writes it
    assert patch.count(b"diff --git a/f b/f\n") == 2


def test_quoted_names(tmp_path: Path) -> None:
    final = {"sp ace": file(b"1\n"), 'é "q"': file(b"2\n")}
    patch = roundtrip(tmp_path, {"sp ace": file(b"0\n")}, final)
    assert b"--- a/sp ace\t\n+++ b/sp ace\t\n" in patch
    assert b'"b/\\303\\251 \\"q\\""' in patch


def test_copied_up_but_identical_is_omitted(tmp_path: Path) -> None:
    lower = {"same": file(b"s\n"), "d/same2": link(b"x")}
    patch = roundtrip(tmp_path, lower, dict(lower), copy_up_same={"same", "d/same2"})
    assert patch == b""


def test_whiteouts_delete_files_and_whole_directories(tmp_path: Path) -> None:
    lower = {"d/a": file(b"a\n"), "d/e/b": link(b"../a"), "k": file(b"k\n"), "x": file(b"x\n")}
    final = {"k": file(b"k\n")}
    patch = roundtrip(tmp_path, lower, final)
    assert [s.path for s in parse_patch(patch).sections] == ["d/a", "d/e/b", "x"]


def test_xattr_whiteouts(tmp_path: Path) -> None:
    lower = {"d/a": file(b"a\n"), "x": file(b"x\n"), "y": file(b"y\n")}
    roundtrip(tmp_path, lower, {"y": file(b"y\n")}, xattr_whiteouts=True)


def test_opaque_directory_deletes_everything_below_not_re_added(tmp_path: Path) -> None:
    lower = {"o/gone": file(b"g\n"), "o/sub/gone2": file(b"h\n"), "o/kept": file(b"k\n")}
    final = {"o/kept": file(b"k\n"), "o/new": file(b"n\n")}
    patch = roundtrip(tmp_path, lower, final, opaque_dirs={"o"})
    paths = [s.path for s in parse_patch(patch).sections]
    assert paths == ["o/gone", "o/new", "o/sub/gone2"]  # o/kept: same content, omitted


def test_directory_replaced_by_file_and_file_by_directory(tmp_path: Path) -> None:
    lower = {"d/a": file(b"a\n"), "f": file(b"f\n")}
    final = {"d": file(b"now a file\n"), "f/in": file(b"in\n")}
    roundtrip(tmp_path, lower, final)


def test_git_state_and_special_files_are_skipped(tmp_path: Path) -> None:
    make_tree(tmp_path / "lower", {"a": file(b"a\n")})
    up = tmp_path / "upper"
    (up / ".git").mkdir(parents=True)
    (up / ".git" / "HEAD").write_bytes(b"ref: x\n")
    os.mkfifo(up / "fifo")
    out = io.BytesIO()
    stats = write_patch(tmp_path / "lower", up, out, max_bytes=1 << 20)
    assert out.getvalue() == b""
    assert sorted(p for p, _ in stats.skipped) == [".git", "fifo"]


def test_never_follows_a_symlink_in_the_upper(tmp_path: Path) -> None:
    """A symlink in the upper layer is diffed as a symlink, never read through."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"host secret\n")
    make_tree(tmp_path / "lower", {})
    (tmp_path / "upper").mkdir()
    os.symlink(secret, tmp_path / "upper" / "l")
    patch = diff(tmp_path)
    assert b"host secret" not in patch and str(secret).encode() in patch


def set_apart_patch(tmp: Path, lower: Tree, final: Tree, *, max_bytes: int = 1 << 20,
                    max_file: int = 1 << 20, ignored: frozenset[bytes] = frozenset(),
                    **kw: object) -> tuple[bytes, PatchStats]:
    """The patch and its stats; the patch must apply and give `final` with every
    set-apart path left as it was in `lower`."""
    make_tree(tmp / "lower", lower)
    build_upper(tmp / "upper", lower, final, **kw)  # type: ignore[arg-type]
    out = io.BytesIO()
    stats = write_patch(tmp / "lower", tmp / "upper", out, max_bytes=max_bytes,
                        max_file=max_file, ignored=ignored)
    apart = {a.path.decode() for a in stats.set_apart}
    expected = {p: e for p, e in final.items() if p not in apart}
    expected.update({p: e for p, e in lower.items() if p in apart})
    assert pure_apply(lower, out.getvalue()) == expected
    assert len(out.getvalue()) <= max_bytes
    return out.getvalue(), stats


def test_a_file_past_the_per_file_limit_is_set_apart_and_the_fix_kept(tmp_path: Path) -> None:
    """A 373 MB binary beside a one-line fix once cost the whole patch (issue 37)."""
    big = b"\x00" * 5000
    patch, stats = set_apart_patch(
        tmp_path, {"fix.py": file(b"x = 1\n")},
        {"fix.py": file(b"x = 2\n"), ".tools/agent": file(big, True)}, max_file=4096)
    assert b"+x = 2\n" in patch and b".tools" not in patch
    assert stats.set_apart == [SetApart(b".tools/agent", "added", 5000,
                                        hashlib.sha256(big).hexdigest(), WHY_FILE)]
    assert stats.to_dict()["apart_file-too-large"] == 1
    assert stats.to_dict()["apart_file-too-large_bytes"] == 5000
    assert (stats.added, stats.modified) == (0, 1)


def test_a_large_file_deleted_or_changed_is_set_apart_with_what_it_holds(
        tmp_path: Path) -> None:
    old, new = b"o" * 3000, b"n" * 3000
    _, stats = set_apart_patch(
        tmp_path, {"gone.bin": file(old), "mod.bin": file(old), "a": file(b"a\n")},
        {"mod.bin": file(new), "a": file(b"b\n")}, max_file=2048)
    assert {(a.path, a.change, a.sha256) for a in stats.set_apart} == {
        (b"gone.bin", "deleted", hashlib.sha256(old).hexdigest()),
        (b"mod.bin", "modified", hashlib.sha256(new).hexdigest())}


def test_past_the_patch_limit_the_largest_changes_are_set_apart(tmp_path: Path) -> None:
    """Smallest first: the patch keeps the most small changes its limit allows."""
    final = {f"f{n:02d}": file(b"%d\n" % n * (n * 40)) for n in range(1, 13)}
    sizes = {p: len(e[1]) for p, e in final.items()}
    patch, stats = set_apart_patch(tmp_path, {}, final, max_bytes=8000)
    kept = {s.path for s in parse_patch(patch).sections}
    apart = {a.path.decode() for a in stats.set_apart}
    assert kept | apart == set(final) and not kept & apart
    assert max(sizes[p] for p in kept) < min(sizes[p] for p in apart)
    assert {a.why for a in stats.set_apart} == {WHY_TOTAL}
    # the listed order: the largest first
    assert [a.size for a in stats.set_apart] == sorted((a.size for a in stats.set_apart),
                                                       reverse=True)
    # the sections are still in path order
    assert [s.path for s in parse_patch(patch).sections] == sorted(kept)


def test_paths_the_checkout_ignores_are_set_apart_whatever_their_size(tmp_path: Path) -> None:
    patch, stats = set_apart_patch(
        tmp_path, {"src/a.py": file(b"a\n")},
        {"src/a.py": file(b"b\n"), "node_modules/x.js": file(b"x\n")},
        ignored=frozenset({b"node_modules/x.js"}))
    assert b"node_modules" not in patch
    assert [(a.path, a.why) for a in stats.set_apart] == [(b"node_modules/x.js", WHY_IGNORED)]


def test_a_large_file_copied_up_unchanged_is_not_a_change(tmp_path: Path) -> None:
    """`chown -R /workspace` copies every file up: none of them is a change, however
    large (the comparison reads a chunk at a time), so nothing is set apart."""
    lower = {".tools/claude": file(b"\x7fELF" + b"\x00" * 50_000, True), "a": file(b"a\n"),
             "l": link(b"a")}
    patch, stats = set_apart_patch(tmp_path, lower, dict(lower), max_file=1024,
                                   copy_up_same={".tools/claude", "a", "l"})
    assert patch == b"" and stats.set_apart == [] and stats.apart == {}


def test_a_copied_up_file_that_differs_late_is_a_change(tmp_path: Path) -> None:
    """Same size, same mode, one byte apart past the first chunk: still a change."""
    old = b"a" * (3 << 20)
    new = old[:-1] + b"b"
    _, stats = set_apart_patch(tmp_path, {"big": file(old)}, {"big": file(new)},
                               max_file=1024)
    assert [(a.path, a.change, a.why) for a in stats.set_apart] == [
        (b"big", "modified", WHY_FILE)]


def test_set_apart_listing_and_hashing_are_bounded(tmp_path: Path) -> None:
    make_tree(tmp_path / "lower", {})
    make_tree(tmp_path / "upper", {f"n{i}": file(b"y" * (100 + i)) for i in range(10)})
    out = io.BytesIO()
    with WorkspaceDiff(tmp_path / "lower", tmp_path / "upper", max_bytes=1 << 20,
                       max_file=50, max_listed=4, max_hashed=220) as d:
        d.changes()
        listed = d.plan()
        for s in d.sections():
            out.write(s)
    assert out.getvalue() == b""
    assert [a.size for a in listed] == [109, 108, 107, 106]
    assert [bool(a.sha256) for a in listed] == [True, True, False, False]
    assert d.stats.apart == {WHY_FILE: [10, sum(100 + i for i in range(10))]}


def test_metacopy_and_redirect_are_refused(tmp_path: Path) -> None:
    make_tree(tmp_path / "lower", {"f": file(b"f\n")})
    make_tree(tmp_path / "upper", {"f": file(b"")})
    os.setxattr(tmp_path / "upper" / "f", "trusted.overlay.metacopy", b"")
    with pytest.raises(UnsupportedOverlay):
        diff(tmp_path)
    os.removexattr(tmp_path / "upper" / "f", "trusted.overlay.metacopy")
    (tmp_path / "upper" / "d").mkdir()
    os.setxattr(tmp_path / "upper" / "d", "trusted.overlay.redirect", b"/x")
    with pytest.raises(UnsupportedOverlay):
        diff(tmp_path)


def test_whiteout_helpers_make_what_overlayfs_makes(tmp_path: Path) -> None:
    whiteout(tmp_path / "w")
    st = os.lstat(tmp_path / "w")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
    opaque(tmp_path / "o")
    assert os.getxattr(tmp_path / "o", "trusted.overlay.opaque") == b"y"


def test_the_guest_keeps_within_the_limits_the_door_reads() -> None:
    """A patch the box makes is one `tkbox apply` reads: the limits are the same."""
    door = Limits()
    ours = PatchLimits()
    assert (ours.size, ours.sections, ours.lines, ours.binary_bytes, ours.content_bytes) == (
        door.max_patch_bytes, door.max_sections, door.max_lines, door.max_binary_bytes,
        door.max_total_bytes)
    assert rpc.MAX_PATCH == door.max_patch_bytes
    assert rpc.MAX_PATCH_FILE == door.max_file_bytes


def test_past_the_doors_section_count_the_rest_are_set_apart(tmp_path: Path) -> None:
    """Many small files: the patch stops at the door's section limit, not past it."""
    make_tree(tmp_path / "lower", {})
    make_tree(tmp_path / "upper", {f"f{i:03d}": file(b"%d\n" % i) for i in range(30)})
    out = io.BytesIO()
    with WorkspaceDiff(tmp_path / "lower", tmp_path / "upper", max_bytes=1 << 20,
                       max_file=1 << 20, limits=PatchLimits(sections=20)) as d:
        d.changes()
        d.plan()
        for s in d.sections():
            out.write(s)
    assert len(parse_patch(out.getvalue()).sections) == 20
    assert d.stats.apart == {WHY_TOTAL: [10, sum(len(b"%d\n" % i) for i in range(20, 30))]}
