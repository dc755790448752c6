"""`tkbox apply` makes every new file durable before any of them takes its real name.

A crash half-way must never leave a checkout file that names bytes still only in
memory. A few files are fsync'd one each (together, from a thread pool); from
`fs.SYNCFS_FROM` files one syncfs per filesystem does it. Either way, every flush
happens before the first file takes its name (exchanged or put with renameat2, or
linked where the filesystem lacks its flags), and the result is exactly the patch.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "doors" / "changes"))
from changes_trees import file, make_tree, read_tree  # noqa: E402

from tkbox.doors.changes import apply_patch  # noqa: E402
from tkbox.doors.changes import fs as fs_mod  # noqa: E402
from tkbox.guest.diff import write_patch  # noqa: E402
from tkbox.record.testing import FakeSigner  # noqa: E402

pytestmark = pytest.mark.integration


def _patch_and_checkout(tmp: Path, lower: dict[str, Any], final: dict[str, Any]
                        ) -> tuple[bytes, Path]:
    """The guest's patch from `lower` to `final`, and a checkout at `tmp/co` holding
    `lower`."""
    make_tree(tmp / "lower", lower)
    make_tree(tmp / "upper", final)
    out = io.BytesIO()
    write_patch(tmp / "lower", tmp / "upper", out, max_bytes=1 << 24)
    make_tree(tmp / "co", lower)
    return out.getvalue(), tmp / "co"


def _apply(tmp: Path, n: int, monkeypatch: pytest.MonkeyPatch,
           placing: Any) -> tuple[list[str], Path, dict[str, Any]]:
    lower = {f"d{i % 7}/f{i}.txt": file(b"old %d\n" % i) for i in range(n)}
    final = {p: file(b"new %d\n" % i) for i, p in enumerate(lower)}
    final.update({f"new/n{i}": file(b"n\n") for i in range(n // 4)})
    patch, co = _patch_and_checkout(tmp, lower, final)
    events: list[str] = []
    real_fsync, real_syncfs = os.fsync, fs_mod._SYNCFS
    assert real_syncfs is not None, "this libc has syncfs"

    def fsync(fd: int) -> None:  # the journal's, a directory's, or a new file's
        target = os.readlink(f"/proc/self/fd/{fd}")
        events.append("fsync-journal" if target.startswith(os.environ["TKBOX_HOME"])
                      else "fsync-dir" if os.path.isdir(target) else "fsync")
        real_fsync(fd)

    def syncfs(fd: int) -> None:
        events.append("syncfs")
        real_syncfs(fd)

    monkeypatch.setattr(fs_mod.os, "fsync", fsync)
    placing.before_each(lambda: events.append("place"))
    monkeypatch.setattr(fs_mod, "_SYNCFS", syncfs)

    async def go() -> None:
        signer = FakeSigner()
        await signer.open_run("r", {})
        report = await apply_patch(patch, co, signer, "r")
        assert report.count("applied") == len(report.files)

    asyncio.run(go())
    assert [p for p in co.rglob("*") if p.name.startswith(".tkbox")] == []  # nothing left
    return events, co, final


def test_a_few_files_are_each_fsynced_before_any_takes_its_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, placing: Any) -> None:
    n = fs_mod.SYNCFS_FROM // 2
    events, co, final = _apply(tmp_path, n, monkeypatch, placing)
    assert read_tree(co) == final
    written = n + n // 4
    assert events.count("fsync") == written and "syncfs" not in events
    assert events.count("place") == written
    assert events.index("place") > _last(events, "fsync")
    # first the root, the staging directory made in it (before anything else changes);
    # then the renames: the root and each directory written in (d0..d6, new), and
    # only then the journal says the files are placed
    assert events.count("fsync-dir") == 10 and events.index("fsync-dir") < events.index("fsync")
    assert events[events.index("place"):].count("fsync-dir") == 9
    assert events.index("fsync-dir", events.index("fsync-dir") + 1) > _last(events, "place")
    assert events[0] == "fsync-journal" and _last(events, "fsync-journal") > _last(
        events, "fsync-dir")


def _last(events: list[str], what: str) -> int:
    return max(i for i, e in enumerate(events) if e == what)


def test_many_files_are_flushed_by_one_syncfs_before_any_takes_its_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, placing: Any) -> None:
    events, co, final = _apply(tmp_path, fs_mod.SYNCFS_FROM * 2, monkeypatch, placing)
    assert read_tree(co) == final
    # one filesystem here: one syncfs for the files' bytes, one for the renames (and
    # before them, one fsync: the root, the staging directory made in it)
    assert events.count("syncfs") == 2 and "fsync" not in events
    assert events.count("fsync-dir") == 1 and events.index("fsync-dir") < events.index("syncfs")
    assert events.index("syncfs") < events.index("place")
    assert _last(events, "syncfs") > _last(events, "place")


def test_many_files_failing_half_way_leave_the_checkout_as_it_was(
        tmp_path: Path, placing: Any) -> None:
    """The syncfs path keeps the all-or-nothing rule: a write failing after some files
    took their names undoes every step, temporaries included."""
    from tkbox.doors.changes import ApplyFailed

    n = fs_mod.SYNCFS_FROM * 2
    lower = {f"d{i % 7}/f{i}.txt": file(b"old %d\n" % i) for i in range(n)}
    final = {p: file(b"new %d\n" % i) for i, p in enumerate(lower)}
    patch, co = _patch_and_checkout(tmp_path, lower, final)
    calls = {"n": 0}

    def half_way() -> None:
        calls["n"] += 1
        if calls["n"] == n // 2:
            raise OSError(28, "No space left on device")

    placing.before_each(half_way)

    async def go() -> None:
        signer = FakeSigner()
        await signer.open_run("r", {})
        await apply_patch(patch, co, signer, "r")

    with pytest.raises(ApplyFailed, match="No space left on device"):
        asyncio.run(go())
    assert read_tree(co) == lower
    leftovers = [p for p in co.rglob("*") if p.name.startswith(".tkbox")]
    assert leftovers == []


def test_deep_directories_are_each_walked_to_once_not_from_the_root_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stops a patch of files at the bottom of deep directories costing the square of
    their depth in opens (the journal's look at each directory above a write, and the
    renames made durable, walked from the root to every one of them): 300 levels
    took ~90,000 opens; the whole apply now takes a few per level."""
    deep = "/".join(["d"] * 300)
    lower = {f"{deep}/old": file(b"old\n")}
    final = {**lower, f"{deep}/new": file(b"new\n")}
    patch, co = _patch_and_checkout(tmp_path, lower, final)
    opens = [0]
    real_open = os.open

    def counting(*a: Any, **k: Any) -> int:
        opens[0] += 1
        return real_open(*a, **k)

    monkeypatch.setattr(fs_mod.os, "open", counting)

    async def go() -> None:
        signer = FakeSigner()
        await signer.open_run("r", {})
        report = await apply_patch(patch, co, signer, "r")
        assert report.count("applied") == 1

    asyncio.run(go())
    assert read_tree(co) == final
    assert opens[0] < 20 * 300, opens[0]
