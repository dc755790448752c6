"""Crash-safe publication of a file: the one atomic-write helper of tkbox.

A reader of a path tkbox writes sees either the old file, or no file, or the
whole new file, whatever happens in between (a crash, a kill, a full disk):

1. the bytes go to a temporary file in the same directory (same filesystem,
   so the rename below is atomic), created `O_CREAT|O_EXCL|O_NOFOLLOW`, so a
   name planted in advance (a link, a file) is never written through;
2. the temporary is flushed and `fsync`ed;
3. it is renamed over the final name (`rename(2)` is atomic);
4. the directory is `fsync`ed, so the rename itself survives a crash.

`publish` is steps 2 to 4 for a temporary someone else streamed (the image
store's blobs and disks); `write_atomic` is all four for bytes in memory
(bundles, trust files, the signer's key and configuration, copied files).

This module sits at the bottom of the layers, beside `tkbox.errors` and
`tkbox.paths`: it imports nothing of tkbox but `errors`, so the signer, the
record client and the image store can all share it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from tkbox.errors import HostError


def fsync_dir(path: Path) -> None:
    """Make the entries of directory `path` (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """All of `data` to `fd` (a write may take less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def publish(tmp: Path, final: Path) -> None:
    """fsync `tmp`, rename it to `final` and fsync the directory (steps 2 to 4).

    `tmp` must be on the same filesystem as `final`. Raises `OSError`: the
    caller knows what it was doing and says so in its own error.
    """
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_dir(final.parent)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` atomically, created with `mode` (steps 1 to 4).

    On failure nothing is left behind but the old file (if any), and a
    one-line `HostError` names the path.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise HostError(f"cannot write {path}: {exc.strerror or exc}") from None
