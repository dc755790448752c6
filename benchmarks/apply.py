"""Benchmark: `tkbox apply` (`apply_patch`) beside plain `git apply` of the same patch.

Builds a checkout of N files (default 1,100), a guest patch changing all of
them (80% modified text files, 5% binary now, 5% deleted, 10% new files), and
in each round copies the checkout four times, flushes everything to disk (as a
person's checkout is: replacing a file that is on disk costs more than one that
is still in the page cache, on both sides), then times, in the same run:

- `git apply` of the patch on the first copy: the baseline the issue names;
- `git apply` then `sync -f` (syncfs) on the second: the same with its writes
  made durable, as the door's are;
- `apply_patch` on the third, deciding with the in-process `FakeSigner`: the
  door's own work (parse, git's reading compared with ours, the plan, git's
  scratch build compared with ours, one Write decision per file, the writes,
  made durable (one syncfs from 64 files), the staging directory removed);
- `apply_patch` on the fourth, deciding with a real signer process (`tkbox
  signer serve` over its Unix socket): the same plus every decision and
  completion durable in the signer's log before the files are written.

Once a round, untimed against the others, the door's patch parser alone
(`parse_patch`, in this process) beside `git apply`: one of the door's steps,
which by design also has git read the patch and build it in a scratch copy, so
the two together are a floor under the door's ratio before it reads or writes
a file of the checkout.

Before each timed step everything written so far is flushed, untimed: a
syncfs in one step must not pay for the pages an earlier step left dirty (git
apply does not flush its own). The order of the steps rotates from round to
round, so that no step always comes after the same other: on an ext4 without
a journal, for one, a new file costs a scan past every inode freed in the last
30 seconds, so a step pays for the files the step before it removed (the
filesystem is printed, with a warning for that case: benchmarks/disk.py). All
results are checked to be identical. Each figure is the best of `--repeat`
rounds, and each ratio is also given as the median of the rounds' own ratios
(both sides measured in the same round).

    .venv/bin/python benchmarks/apply.py [--files N] [--repeat R] [--signer real|fake]
                                         [--dir DIR] [--cached]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disk import filesystem  # noqa: E402

from tkbox.doors.changes import apply_patch
from tkbox.doors.changes.patch import parse_patch
from tkbox.guest.diff import write_patch
from tkbox.record.client import SignerClient
from tkbox.record.testing import FakeSigner
from tkbox.record.unix import UnixSignerClient


def build(root: Path, n: int) -> bytes:
    lower, upper = root / "lower", root / "upper"
    for i in range(n):
        d = lower / f"pkg{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"m{i}.py").write_bytes(b"".join(b"line %d of file %d\n" % (j, i) for j in range(60)))
    upper.mkdir()
    k = 0
    for i in range(n):
        rel = Path(f"pkg{i % 20}") / f"m{i}.py"
        kind = i % 20
        (upper / rel.parent).mkdir(parents=True, exist_ok=True)
        if kind == 0:
            os.mknod(upper / rel, 0o020000, 0)  # whiteout: deleted
        elif kind == 1:
            (upper / rel).write_bytes(os.urandom(2000) + b"\x00")  # binary now
        else:
            text = (lower / rel).read_bytes().replace(b"line 30 ", b"LINE 30 ")
            (upper / rel).write_bytes(text)
        if kind in (2, 3):
            (upper / rel.parent / f"new{k}.txt").write_bytes(b"new file %d\n" % k)
            k += 1
    out = io.BytesIO()
    write_patch(lower, upper, out, max_bytes=1 << 28)
    return out.getvalue()


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.parts}


async def door(patch: bytes, co: Path, signer: SignerClient) -> float:
    run = f"bench-{secrets.token_hex(4)}"
    await signer.open_run(run, {"benchmark": "apply"})
    t = time.perf_counter()
    report = await apply_patch(patch, co, signer, run)
    dt = time.perf_counter() - t
    assert report.count("applied") == len(report.files), report.summary()
    await signer.close_run(run)
    await signer.aclose()
    return dt


def settle(cached: bool) -> None:
    """Everything written so far on disk (untimed), so the next step pays only for its
    own writes; with `--cached`, nothing is flushed."""
    if not cached:
        os.sync()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1100)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--signer", choices=("real", "fake", "both"), default="both")
    ap.add_argument("--dir", help="where the checkouts are made (default: the temporary "
                    "directory, $TMPDIR)")
    ap.add_argument("--cached", action="store_true",
                    help="do not flush the copies first (files only in the page cache)")
    args = ap.parse_args()
    kinds = ["fake", "real"] if args.signer == "both" else [args.signer]
    with tempfile.TemporaryDirectory(dir=args.dir) as d, contextlib.ExitStack() as stack:
        root = Path(d)
        fs = filesystem(root)
        socket = None
        if "real" in kinds:
            from real_stack import real_stack

            socket = stack.enter_context(real_stack(root / "signer", daemon=False)).signer_socket
        patch = build(root, args.files)
        (root / "p.diff").write_bytes(patch)
        sections = patch.count(b"\ndiff --git ") + 1
        times: dict[str, list[float]] = {"git": [], "git+sync": [], **{k: [] for k in kinds}}
        parsing: list[float] = []  # the door's parser alone, once a round
        for r in range(args.repeat):
            copies = {k: root / f"{k}{r}" for k in times}
            for k, co in copies.items():
                shutil.copytree(root / "lower", co)
                if k in kinds:
                    subprocess.run(["git", "init", "-q"], cwd=co, check=True)
            steps = list(times)  # each step in each place of the order, round by round
            steps = steps[r % len(steps):] + steps[:r % len(steps)]
            for k in steps:
                settle(args.cached)
                if k in kinds:
                    signer: SignerClient = (FakeSigner() if k == "fake" else
                                            UnixSignerClient(socket))  # type: ignore[arg-type]
                    times[k].append(asyncio.run(door(patch, copies[k], signer)))
                    continue
                t = time.perf_counter()
                subprocess.run(["git", "apply", "--whitespace=nowarn", str(root / "p.diff")],
                               cwd=copies[k], check=True)
                if k == "git+sync":
                    subprocess.run(["sync", "-f", "."], cwd=copies[k], check=True)
                times[k].append(time.perf_counter() - t)
            for k in kinds:
                assert tree(copies["git"]) == tree(copies[k]), f"git apply and {k} disagree"
            t = time.perf_counter()
            parse_patch(patch)
            parsing.append(time.perf_counter() - t)
    g, gs = min(times["git"]), min(times["git+sync"])
    print(f"patch: {len(patch)} bytes, {sections} sections, {args.files} files in the checkout"
          + (" (page cache only: --cached)" if args.cached else " (on disk)"))
    print(f"filesystem: {fs}")
    print(f"git apply:                  {g * 1000:8.1f} ms (best of {args.repeat}; rounds: "
          + ", ".join(f"{x * 1000:.0f}" for x in times["git"]) + ")")
    print(f"git apply + syncfs:         {gs * 1000:8.1f} ms (its writes durable, as the door's)")
    what = {"fake": "in-process fake signer: the door's own work",
            "real": "real signer process: each decision and completion durable"}
    for k in kinds:
        t = min(times[k])
        per_round = statistics.median(a / b for a, b in zip(times[k], times["git"], strict=True))
        per_round_s = statistics.median(a / b for a, b in zip(times[k], times["git+sync"],
                                                              strict=True))
        print(f"apply_patch, {k} signer:    {t * 1000:8.1f} ms   ratio to git apply "
              f"{t / g:5.1f}x (rounds' median {per_round:.1f}x), to git apply + syncfs "
              f"{t / gs:5.1f}x (median {per_round_s:.1f}x)  ({what[k]})")
    p = min(parsing)
    print(f"the door's parser alone:    {p * 1000:8.1f} ms   ratio to git apply "
          f"{p / g:5.1f}x  (one step of the door, by design beside git's own reading "
          "and its scratch build of the same patch)")
    print("apply_patch includes: parse, git's reading compared (git apply --numstat), "
          "the plan, git's scratch build compared, one Write decision per file and its "
          "completion, the writes made durable (one syncfs from 64 files), the originals "
          "removed; goal <= 3x git apply")


if __name__ == "__main__":
    main()
