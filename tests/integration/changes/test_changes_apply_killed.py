"""An apply killed at any step of its writes is put right by the next one.

`changes_killed_child.py` kills the apply (SIGKILL, nothing of ours runs after)
before each call that changes the filesystem in turn, from the first step of
its writes to the last, on a checkout where the patch modifies, adds, deletes,
makes and empties directories, and turns a file into a directory. After each
kill, the next `tkbox apply` (here of an empty patch) must leave the checkout
exactly as it was before, or (once every file was placed and durable, and so
possibly recorded as written) exactly as the patch makes it: never a mix, no
`.tkbox` names, no journal left. Applying the patch again then gives the
patch's result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from changes_apply_kit import apply, setup  # noqa: E402
from changes_killed_child import snapshot  # noqa: E402
from changes_trees import file, link, make_tree  # noqa: E402

from tkbox.doors.changes import door  # noqa: E402
from tkbox.doors.changes import journal as journal_mod  # noqa: E402
from tkbox.doors.changes.journal import Journal, Plan  # noqa: E402
from tkbox.errors import HostError, UserError  # noqa: E402

LOWER = {
    "a.txt": file(b"a old\n"),
    "b.sh": file(b"#!/bin/sh\necho b\n", exec=True),
    "gone/only.txt": file(b"the only file here\n"),
    "keep/x.txt": file(b"x\n"),
    "keep/y.txt": file(b"y old\n"),
    "was-file": file(b"becomes a directory\n"),
    "ln": link(b"a.txt"),
}
FINAL = {
    "a.txt": file(b"a new\n"),
    "b.sh": file(b"#!/bin/sh\necho b2\n", exec=True),
    "keep/x.txt": file(b"x\n"),
    "new/deep/n.txt": file(b"new file\n"),
    "was-file/inside.txt": file(b"now below it\n"),
    "ln": link(b"b.sh"),
}


@pytest.mark.parametrize("way", ["renameat2", "moved-aside"])
def test_an_apply_killed_at_any_step_is_undone_or_finished_by_the_next(
        tmp_path: Path, way: str) -> None:
    co, patch = setup(tmp_path, LOWER, FINAL)
    (tmp_path / "patch").write_bytes(patch)
    (co / "keep").chmod(0o750)  # its bits must come back if it is emptied and made again
    before = snapshot(co)
    child = subprocess.run([sys.executable, str(Path(__file__).with_name(
        "changes_killed_child.py")), str(tmp_path), way], capture_output=True, timeout=600,
        env={**os.environ, "TKBOX_HOME": str(tmp_path / "home")})
    assert child.returncode == 0, child.stderr.decode()[-2000:]
    trials: list[dict[str, Any]] = [json.loads(line) for line in child.stdout.splitlines()]
    assert trials and not trials[-1]["killed"], "the last trial ran the apply to its end"
    after = trials[-1]["recovered"]
    assert after != before and after["keep"] == ["dir", "0o750"]
    undone = finished = 0
    for t in trials:
        k = t["k"]
        assert t["error"] is None, (k, t["error"])
        assert t["recovered"] in (before, after), (k, _diff(before, after, t["recovered"]))
        assert t["journals_after"] == [], k
        assert t["final"] == after, k
        if t["recovered"] == before:  # applied again, in full (+2: the deletions)
            assert t["reapplied"] == len(FINAL) + 2, (k, t["reapplied"])
        if not t["killed"]:
            continue
        if t["recovered"] == before:
            undone += 1
            if t["journals_left"]:
                assert any("was undone" in n or "holds nothing of it" in n  # (no stage yet)
                           for n in t["notes"]), (k, t["notes"])
        elif t["journals_left"]:  # killed once every file was placed, before the end
            finished += 1
            assert any("originals it kept were removed" in n  # (or all but the journal)
                       or "removing the originals it kept" in n for n in t["notes"]), k
    # killed before its first write, mid-way, and after every file was placed
    assert undone >= 10 and finished >= 2, (undone, finished)


def _diff(before: dict[str, Any], after: dict[str, Any], got: dict[str, Any]) -> list[str]:
    return [f"{p}: {got.get(p)} (before {before.get(p)}, after {after.get(p)})"
            for p in sorted(set(before) | set(after) | set(got))
            if got.get(p) not in (before.get(p), after.get(p))]


def _killed_at(tmp: Path, point: str = "first-put", way: str = "renameat2"
               ) -> tuple[Path, bytes, Path]:
    """A checkout whose apply was killed at `point` (`changes_killed_child.py`):
    (the checkout, the patch, the journals' directory)."""
    co, patch = setup(tmp, LOWER, FINAL)
    (tmp / "patch").write_bytes(patch)
    journals = tmp / "journals"
    journals.mkdir(mode=0o700)
    child = subprocess.run([sys.executable, str(Path(__file__).with_name(
        "changes_killed_child.py")), str(tmp), way, "--killed-at", point],
        capture_output=True, timeout=120)
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    assert len(_journals(journals)) == 1
    return co, patch, journals


def _journals(where: Path) -> list[Path]:
    """The journals in `where` (not the checkouts' lock files beside them)."""
    return sorted(where.glob("*.journal"))


def _killed_after_first_put(tmp: Path) -> tuple[Path, bytes, Path]:
    """A checkout whose apply was killed once `a.txt` (the first file) had its new
    content."""
    co, patch, journals = _killed_at(tmp)
    assert (co / "a.txt").read_bytes() == b"a new\n"
    return co, patch, journals


def _original_at_temporary(co: Path, content: bytes) -> Path:
    """The original, exchanged with the new file, under its temporary name."""
    found = [p for p in co.glob(".tkbox-*.tmp") if not p.is_symlink()
             and p.read_bytes() == content]
    assert len(found) == 1, found
    return found[0]


def test_a_dry_run_refuses_while_a_killed_apply_is_not_put_right(tmp_path: Path) -> None:
    co, patch, journals = _killed_after_first_put(tmp_path)
    with pytest.raises(UserError, match="cut short and is not put right yet; run tkbox "
                                        "apply without --dry-run"):
        apply(patch, co, dry_run=True, journals=journals)
    assert (co / "a.txt").read_bytes() == b"a new\n"  # a dry run changes nothing
    report = apply(patch, co, journals=journals)  # undone first, then applied in full
    assert any("was cut short; it was undone" in n for n in report.notes)
    assert report.count("applied") == len(FINAL) + 2
    assert snapshot(co) == _final_snapshot(tmp_path)
    assert _journals(journals) == []


def test_a_file_changed_after_the_kill_is_left_and_named(tmp_path: Path) -> None:
    """Someone edits the half-applied file before the next apply: their edit is not
    thrown away with the new file; the next apply refuses, names it, keeps the
    journal, and puts right everything else."""
    co, patch, journals = _killed_after_first_put(tmp_path)
    (co / "a.txt").write_bytes(b"edited by hand meanwhile\n")
    with pytest.raises(HostError) as got:
        apply(patch, co, journals=journals)
    msg = str(got.value)
    assert "a.txt: could not be put back (changed since; its original is .tkbox-" in msg
    [journal] = _journals(journals)
    assert f"fix these by hand, then remove {str(journal)!r}" in msg
    assert (co / "a.txt").read_bytes() == b"edited by hand meanwhile\n"
    original = next(co.glob(".tkbox-*.tmp"))
    assert original.read_bytes() == b"a old\n"
    # the user puts it right as told; the next apply goes ahead
    original.replace(co / "a.txt")
    journal.unlink()
    report = apply(patch, co, journals=journals)
    assert report.count("applied") == len(FINAL) + 2


def test_a_running_apply_is_waited_for_and_its_journals_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A journal whose apply still runs (the checkout's lock held), and one it is
    still writing (`.part`), are not taken for dead ones: the next apply into the
    checkout waits for it to end, and refuses if it does not in time."""
    co, patch = setup(tmp_path, LOWER, FINAL)
    journals = tmp_path / "journals"
    journals.mkdir(mode=0o700)
    root = co.resolve()
    running = Journal.begin(journals, Plan(str(root), ".tkbox-apply-0", 0.0, (), (), ()))
    part = journals / f".{journal_mod.key(root)}-0000000000000000{journal_mod.PART}"
    part.write_bytes(b"")  # another journal being written (by the running apply)
    try:
        monkeypatch.setattr(journal_mod, "LOCK_WAIT", 0.3, raising=False)
        with pytest.raises(HostError, match="another tkbox apply into .* has been writing "
                                            "for 0.3 s; nothing was applied"):
            apply(patch, co, journals=journals)
        assert running.path.exists() and part.exists()
        assert (co / "a.txt").read_bytes() == b"a old\n"
        monkeypatch.setattr(journal_mod, "LOCK_WAIT", 30.0)
        ended = threading.Timer(0.3, running.done)
        ended.start()
        report = apply(patch, co, journals=journals)  # waits for it, then applies
        ended.join()
        assert report.count("applied") == len(FINAL) + 2 and report.notes == ()
        assert not running.path.exists() and not part.exists()
    finally:
        running.done() if running.path.exists() else None


def test_an_apply_beside_one_that_is_then_killed_is_not_undone_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Apply A is stopped once its first file has its name; apply C, of a patch that
    adds A's new file with the same content, runs meanwhile; then A is killed. C's
    file must never be taken for A's and removed when A is undone: C waits for A
    (here: refuses, the wait cut short), and the checkout is put back as it was."""
    co, patch = setup(tmp_path, LOWER, FINAL)
    before = snapshot(co)
    (tmp_path / "patch").write_bytes(patch)
    journals = tmp_path / "journals"
    journals.mkdir(mode=0o700)
    a = subprocess.Popen([sys.executable, str(Path(__file__).with_name(
        "changes_killed_child.py")), str(tmp_path), "renameat2", "--stopped-at", "first-put"])
    try:
        deadline = time.monotonic() + 60
        while Path(f"/proc/{a.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline and a.poll() is None, "A never stopped"
            time.sleep(0.02)
        _, patch_c = setup(tmp_path / "c", LOWER, {**LOWER,
                                                   "new/deep/n.txt": FINAL["new/deep/n.txt"]})
        monkeypatch.setattr(journal_mod, "LOCK_WAIT", 0.5, raising=False)
        try:
            c_applied = apply(patch_c, co, journals=journals).count("applied")
        except HostError as e:
            assert "another tkbox apply into" in str(e) and "has been writing" in str(e)
            c_applied = 0
    finally:
        a.kill()
        a.wait()
    report = apply(b"", co, journals=journals)  # A undone
    assert any("was cut short; it was undone" in n for n in report.notes), report.notes
    if c_applied:  # reported written: it must still be there
        assert (co / "new/deep/n.txt").read_bytes() == b"new file\n"
    assert c_applied == 0 and snapshot(co) == before


def test_an_apply_killed_while_another_was_being_prepared_makes_that_one_refuse(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An apply killed after the next one put the checkout right, while that one
    read the checkout and decided (its decision made on a half-written checkout):
    that one refuses to write, and the one after puts it right and applies."""
    co, patch = setup(tmp_path, LOWER, FINAL)
    journals = tmp_path / "journals"
    journals.mkdir(mode=0o700)
    real = door.place_all

    def killed_meanwhile(*a: Any, **kw: Any) -> Any:
        Journal.begin(journals, Plan(str(co.resolve()), ".tkbox-apply-0", 0.0, (), (),
                                     ())).keep()  # (its apply is gone)
        return real(*a, **kw)
    monkeypatch.setattr(door, "place_all", killed_meanwhile)
    with pytest.raises(HostError, match="an earlier apply into this checkout was cut short "
                                        "while this one was being prepared; nothing was "
                                        "applied; run tkbox apply again"):
        apply(patch, co, journals=journals)
    assert (co / "a.txt").read_bytes() == b"a old\n"
    monkeypatch.setattr(door, "place_all", real)
    report = apply(patch, co, journals=journals)
    assert any("holds nothing of it" in n for n in report.notes), report.notes
    assert report.count("applied") == len(FINAL) + 2 and _journals(journals) == []


def test_a_journal_this_version_cannot_read_is_kept_and_named(tmp_path: Path) -> None:
    """A journal of another version (or damaged) is the only record of what an apply
    left: it is not dropped as if there were nothing to put right."""
    co, patch = setup(tmp_path, LOWER, FINAL)
    journals = tmp_path / "journals"
    journals.mkdir(mode=0o700)
    other = journals / f"{journal_mod.key(co.resolve())}-0000000000000000.journal"
    other.write_bytes(b'{"version":99}\n')
    with pytest.raises(HostError, match="is not one this version of tkbox reads; check the "
                                        "checkout, then remove that file"):
        apply(patch, co, journals=journals)
    assert other.exists() and (co / "a.txt").read_bytes() == b"a old\n"


def _final_snapshot(tmp: Path) -> dict[str, Any]:
    other = tmp / "other"
    co, patch = setup(other, LOWER, FINAL)
    apply(patch, co, journals=other / "j")
    return snapshot(co)


@pytest.mark.parametrize("point", ["first-put", "cleanup"])
def test_an_original_written_to_after_the_kill_is_kept_and_named(
        tmp_path: Path, point: str) -> None:
    """Exchanged with the new file, the original sits under its temporary name; a
    process holding it open (a log being appended to) writes to it before the next
    apply. That is someone's data: recovery neither removes it (undoing, or
    finishing once every file was placed) nor says all was put right."""
    co, patch, journals = _killed_at(tmp_path, point)
    original = _original_at_temporary(co, b"a old\n")
    with original.open("ab") as f:  # what the process that held it open wrote
        f.write(b"appended since\n")
    with pytest.raises(HostError) as got:
        apply(b"", co, journals=journals)
    msg = str(got.value)
    what = "could not be put back" if point == "first-put" else "its original was not removed"
    assert f"a.txt: {what}" in msg, msg
    assert f"{original.name}" in msg and "changed since the apply began" in msg, msg
    assert original.read_bytes() == b"a old\nappended since\n"
    assert (co / "a.txt").read_bytes() == b"a new\n"
    assert len(_journals(journals)) == 1  # kept until the user has sorted it out


@pytest.mark.parametrize(("point", "way"), [("placed", "renameat2"), ("placed", "moved-aside"),
                                            ("cleanup", "renameat2")])
def test_a_recovery_killed_at_any_step_is_completed_by_the_next(
        tmp_path: Path, point: str, way: str) -> None:
    """The recovery is itself killed before each call that changes the filesystem
    in turn: undoing an apply killed once every file had its name (before the
    journal said so: every path to put back, directories to remove and make again
    with their bits), or finishing one killed after. The next apply completes it,
    exactly as an unbroken recovery would, no journal left."""
    co, patch = setup(tmp_path, LOWER, FINAL)
    (tmp_path / "patch").write_bytes(patch)
    (co / "keep").chmod(0o750)
    (co / "gone").chmod(0o710)  # emptied: made again with these bits
    before = snapshot(co)
    child = subprocess.run([sys.executable, str(Path(__file__).with_name(
        "changes_killed_child.py")), str(tmp_path), way, "--recovery", point],
        capture_output=True, timeout=600,
        env={**os.environ, "TKBOX_HOME": str(tmp_path / "home")})
    assert child.returncode == 0, child.stderr.decode()[-2000:]
    trials: list[dict[str, Any]] = [json.loads(line) for line in child.stdout.splitlines()]
    assert len(trials) >= 3 and not trials[-1]["killed"], trials[-1:]
    after = trials[-1]["final"]
    expected = before if point == "placed" else after
    for t in trials:
        k = t["k"]
        assert t["error"] is None, (k, t["error"])
        assert t["recovered"] == expected, (k, _diff(before, after, t["recovered"]))
        assert t["journals_after"] == [] and t["final"] == after, k


@pytest.mark.parametrize("point", ["placed", "cleanup"])
def test_a_new_checkout_at_a_moved_one_s_path_is_not_put_right_from_its_journal(
        tmp_path: Path, point: str) -> None:
    """The checkout an apply was killed in is moved away; another is made at its path
    (a fresh clone), holding a file with the content the killed apply's new file had
    (committed upstream since). The journal is found by the path, but the new
    checkout holds nothing of that apply: nothing in it is removed or made."""
    co, patch, journals = _killed_at(tmp_path, point)
    co.rename(tmp_path / "moved")
    make_tree(co, {"README": file(b"a fresh clone\n"),
                   "new/deep/n.txt": file(b"new file\n")})
    clone = snapshot(co)
    report = apply(b"", co, journals=journals)
    assert snapshot(co) == clone
    assert any("nothing of it" in n or "nothing was left" in n for n in report.notes), report.notes
    assert _journals(journals) == []


def test_a_staging_directory_replaced_by_a_symlink_is_one_clear_error(tmp_path: Path) -> None:
    """Never followed, and no traceback: one line naming it, the journal kept."""
    co, patch, journals = _killed_after_first_put(tmp_path)
    stage = next(co.glob(".tkbox-apply-*"))
    elsewhere = tmp_path / "elsewhere"
    stage.rename(elsewhere)
    stage.symlink_to(elsewhere)
    inside = sorted(p.name for p in elsewhere.iterdir())
    with pytest.raises(HostError, match=f"putting right an earlier apply into this checkout "
                                        f"failed \\(Not a directory: {stage.name}\\); check "
                                        f"the checkout, then remove"):
        apply(patch, co, journals=journals)
    assert sorted(p.name for p in elsewhere.iterdir()) == inside
    assert len(_journals(journals)) == 1
