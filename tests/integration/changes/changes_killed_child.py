"""Kill `tkbox apply` at every step of its writes, put it right, check the checkout.

Run by test_changes_apply_killed.py: `python changes_killed_child.py DIR WAY`
(or with `--killed-at POINT`: one apply into DIR/co, killed at POINT, and nothing
put right: `first-put`, once its first file has its name; `placed`, once every
file has its name, before the journal says so; `cleanup`, once it says so,
before the originals are removed; `--stopped-at POINT`: SIGSTOP there instead,
for the test to run another apply beside it; or with `--recovery POINT`: for k = 1, 2, ...
an apply killed at POINT, then the recovery that puts it right killed just before
its k-th changing call, then the next apply, as above).
DIR holds `co` (a checkout, the template) and `patch`; WAY is `renameat2` or
`moved-aside` (the filesystem without renameat2's flags). Imports once, then for
k = 1, 2, ... forks a process that applies the patch to a fresh copy of the
checkout and SIGKILLs itself just before the k-th call that changes a file
system (a rename, link, unlink, mkdir, rmdir, symlink, chmod, fsync or syncfs),
from the moment the writes begin to the end of their last step (the originals
removed). This process then runs the next apply (an
empty patch: only the recovery), snapshots the checkout, applies the patch
again, and prints one JSON line per k. It stops at the first k the apply
outlives.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from tkbox.doors.changes import apply_patch, door, fs, recover
from tkbox.errors import TkboxError
from tkbox.record.testing import FakeSigner

RUN = "run-1"
_STEPS = ("rename", "link", "unlink", "mkdir", "rmdir", "symlink", "fchmod", "fsync")


def snapshot(root: Path) -> dict[str, Any]:
    """Every entry below `root` but .git: kind, bits, content or target."""
    out: dict[str, Any] = {}
    for here, dirs, files in os.walk(root):
        rel = Path(here).relative_to(root)
        if rel.parts[:1] == (".git",):
            continue
        for d in dirs:
            p = Path(here, d)
            if p.is_symlink():
                out[str(rel / d)] = ["link", os.readlink(p)]
            elif rel.parts or d != ".git":
                out[str(rel / d)] = ["dir", oct(p.lstat().st_mode & 0o7777)]
        for f in files:
            p = Path(here, f)
            if p.is_symlink():
                out[str(rel / f)] = ["link", os.readlink(p)]
            else:
                out[str(rel / f)] = ["file", oct(p.lstat().st_mode & 0o7777),
                                     p.read_bytes().decode("latin-1")]
    return out


def run(patch: bytes, co: Path, journals: Path) -> Any:
    async def go() -> Any:
        s = FakeSigner()
        await s.open_run(RUN, {})
        return await apply_patch(patch, co, s, RUN, journals=journals)
    return asyncio.run(go())


def killed_at(k: int, way: str, during: str = "writes") -> None:
    """In the forked child: SIGKILL before the k-th changing call once the writes
    begin (`during="writes"`) or once the recovery does (`"recovery"`)."""
    calls = [0]
    armed = [False]

    def step() -> None:
        if armed[0]:
            calls[0] += 1
            if calls[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)

    def wrap(fn: Any) -> Any:
        def inner(*a: Any, **kw: Any) -> Any:
            step()
            return fn(*a, **kw)
        return inner

    for name in _STEPS:
        setattr(os, name, wrap(getattr(os, name)))
    if way == "moved-aside":
        fs._RENAMEAT2 = None
    elif fs._RENAMEAT2 is not None:
        fs._RENAMEAT2 = wrap(fs._RENAMEAT2)
    if fs._SYNCFS is not None:
        fs._SYNCFS = wrap(fs._SYNCFS)
    if during == "recovery":
        real_recover = recover.recover

        def recover_armed(*a: Any, **kw: Any) -> Any:
            armed[0] = True
            try:
                return real_recover(*a, **kw)
            finally:
                armed[0] = False
        recover.recover = recover_armed  # type: ignore[assignment]
        return
    real, real_remove = door.place_all, fs.Placed.remove_originals

    def place_all(*a: Any, **kw: Any) -> Any:
        armed[0] = True
        return real(*a, **kw)

    def remove_originals(self: fs.Placed) -> None:
        real_remove(self)
        armed[0] = False  # the writes' last step: what follows is the apply's own cleanup
    door.place_all = place_all  # type: ignore[assignment]
    fs.Placed.remove_originals = remove_originals  # type: ignore[method-assign]


def _fork(then: Any) -> int:
    """Run `then()` in a forked child; its wait status."""
    assert threading.active_count() == 1, "fork only from one thread"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            then()
        except BaseException:  # noqa: BLE001
            os._exit(1)
        os._exit(0)
    return os.waitpid(pid, 0)[1]


def killed_at_point(point: str, sig: int = signal.SIGKILL) -> None:
    """SIGKILL (or `sig`) at `point` (see the module's docstring)."""
    def kill(*a: Any, **kw: Any) -> None:
        os.kill(os.getpid(), sig)
    if point == "first-put":  # in path order: the first put
        real = fs._put

        def put(*a: Any, **kw: Any) -> None:
            real(*a, **kw)
            kill()
        fs._put = put
    elif point == "placed":
        fs.jn.Journal.placed = kill  # type: ignore[method-assign]
    elif point == "cleanup":
        fs._cleanup = kill
    else:
        sys.exit(f"no such point: {point}")


def main() -> None:
    base, way = Path(sys.argv[1]), sys.argv[2]
    patch = (base / "patch").read_bytes()
    if sys.argv[3:4] in (["--killed-at"], ["--stopped-at"]):  # one apply; nothing put right
        if way == "moved-aside":
            fs._RENAMEAT2 = None
        killed_at_point(sys.argv[4], signal.SIGKILL if sys.argv[3] == "--killed-at"
                        else signal.SIGSTOP)
        run(patch, base / "co", base / "journals")
        sys.exit("the apply was not killed")
    recovering = sys.argv[3:4] == ["--recovery"]
    for k in range(1, 1000):
        trial = base / f"k{k}"
        co, journals = trial / "co", trial / "journals"
        shutil.copytree(base / "co", co, symlinks=True)
        journals.mkdir(mode=0o700)
        if recovering:  # the apply killed at a point, then its recovery at step k

            def apply_killed() -> None:
                if way == "moved-aside":
                    fs._RENAMEAT2 = None
                killed_at_point(sys.argv[4])
                run(patch, co, journals)
            status = _fork(apply_killed)
            assert os.WIFSIGNALED(status), "the apply was not killed"

        def killed_at_k() -> None:
            killed_at(k, way, "recovery" if recovering else "writes")
            run(b"" if recovering else patch, co, journals)
        status = _fork(killed_at_k)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        left_journals = sum(n.endswith(".journal") for n in os.listdir(journals))
        try:
            notes = list(run(b"", co, journals).notes)
            error = None
        except TkboxError as e:
            notes, error = [], str(e)
        after_recovery = snapshot(co)
        try:
            reapplied = run(patch, co, journals).count("applied")
        except TkboxError as e:
            reapplied = str(e)
        print(json.dumps({"k": k, "killed": killed, "exit": status,
                          "journals_left": left_journals, "notes": notes, "error": error,
                          "recovered": after_recovery, "reapplied": reapplied,
                          "final": snapshot(co), "journals_after": sorted(
                              n for n in os.listdir(journals) if not n.endswith(".lock"))}),
              flush=True)
        shutil.rmtree(trial)
        if not killed:
            return


if __name__ == "__main__":
    main()
