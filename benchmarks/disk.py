"""What the disk under a benchmark is, since durable figures depend on it.

Run alone, it prints the filesystem of the temporary directory ($TMPDIR), which
the other benchmarks use by default:

    .venv/bin/python benchmarks/disk.py

An ext4 without a journal makes two of the baselines misleading. Its fsync
commits no journal, so durable SQLite inserts (the signer's baseline) cost a
fraction of what they cost on a journaled filesystem, and the ratios beside
them look worse than a user's. And when it makes a file, the kernel skips
every inode freed in the last 30 seconds in the same group (`recently_deleted`
in fs/ext4/ialloc.c), so a step that creates files pays for the files the step
before it removed: `git apply`, which removes and recreates each file, pays for
its own. The benchmarks print this line and the warning with their figures.
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from pathlib import Path


def filesystem(path: Path) -> str:
    """The type and device of the filesystem holding `path`, with a warning for an
    ext4 without a journal (Linux only: read from /proc and /sys)."""
    path = path.resolve()
    best = ("", "?", "?", "")  # mount point, type, device, major:minor
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 5 or len(rest) < 2:
                continue
            where = fields[4].replace("\\040", " ")
            inside = str(path) == where or str(path).startswith(where.rstrip("/") + "/")
            if inside and len(where) >= len(best[0]):
                best = (where, rest[0], rest[1], fields[2])
    _, kind, device, majmin = best
    if kind == "ext4":
        name = os.path.basename(os.path.realpath(f"/sys/dev/block/{majmin}"))
        if not glob.glob(f"/proc/fs/jbd2/{glob.escape(name)}-*"):
            return (f"ext4 on {device} WITHOUT A JOURNAL: its fsync is cheaper and its "
                    "file creation dearer than a journaled filesystem's (see "
                    "benchmarks/disk.py); prefer a journaled one (TMPDIR or --dir)")
    return f"{kind} on {device}"


if __name__ == "__main__":
    print(f"temporary directory {tempfile.gettempdir()}: "
          f"{filesystem(Path(tempfile.gettempdir()))}")
