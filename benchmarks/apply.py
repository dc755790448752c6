"""Benchmark: `apply_patch` (fake signer) beside plain `git apply`, one 1,000-file patch.

Builds a checkout of 1,000 files, a guest patch changing all of them (800
modified text files, 100 new files, 50 binary, 50 deleted), then times, in
the same run, `git apply` of that patch on one copy and `apply_patch` on
another, and prints the ratio. Both results are checked to be identical.

    .venv/bin/python benchmarks/apply.py [--files N] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tkbox.doors.changes import apply_patch
from tkbox.guest.diff import write_patch
from tkbox.record.testing import FakeSigner


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


async def door(patch: bytes, co: Path) -> float:
    signer = FakeSigner()
    await signer.open_run("bench", {})
    t = time.perf_counter()
    report = await apply_patch(patch, co, signer, "bench")
    dt = time.perf_counter() - t
    assert report.count("applied") == len(report.files), report.summary()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        patch = build(root, args.files)
        (root / "p.diff").write_bytes(patch)
        sections = patch.count(b"\ndiff --git ") + 1
        git_times, door_times = [], []
        for r in range(args.repeat):
            a, b = root / f"git{r}", root / f"door{r}"
            shutil.copytree(root / "lower", a)
            shutil.copytree(root / "lower", b)
            subprocess.run(["git", "init", "-q"], cwd=b, check=True)
            t = time.perf_counter()
            subprocess.run(["git", "apply", "--whitespace=nowarn", str(root / "p.diff")], cwd=a,
                           check=True)
            git_times.append(time.perf_counter() - t)
            door_times.append(asyncio.run(door(patch, b)))
            assert tree(a) == tree(b), "git apply and apply_patch disagree"
        g, t = min(git_times), min(door_times)
        print(f"patch: {len(patch)} bytes, {sections} sections")
        print(f"git apply:   {g * 1000:8.1f} ms (best of {args.repeat})")
        print(f"apply_patch: {t * 1000:8.1f} ms (best of {args.repeat}; parse, git cross-checks, "
              "scratch build, 1 decision per file, fsync'd writes)")
        print(f"ratio apply_patch / git apply: {t / g:.1f}x")


if __name__ == "__main__":
    main()
