"""Crash-safe files for the image store: temporaries, atomic publication, locks.

Every entry of the store appears by `rename(2)` of a fully written, fsynced
temporary file (`tkbox._fs.publish`, the one atomic-publication helper of
tkbox), so a reader sees either nothing or the whole verified entry, whatever
happens in between (a crash, a kill, a full disk).

Temporaries live in `tmp/<owner>/` where `<owner>` is a directory private to
one `ImageStore` instance, guarded by an exclusive `flock` on `tmp/<owner>.lock`
held for the store's lifetime. A later store that can take that lock knows the
owner is gone and removes its leftovers; one that cannot leaves them alone (a
pull in another process is still writing there).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tkbox._fs import fsync_dir, publish
from tkbox.errors import HostError

__all__ = ["Lock", "TempArea", "fsync_dir", "host_error", "publish", "temp_file"]

_ORPHAN_AGE = 600.0  # seconds


def host_error(exc: OSError, what: str) -> HostError:
    """Turn an `OSError` into a one-line `HostError` saying what to do."""
    if exc.errno == errno.ENOSPC:
        return HostError(f"no space left while {what}; free some disk or run `tkbox image prune`")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return HostError(f"permission denied while {what} ({exc.filename}); check TKBOX_HOME")
    return HostError(f"{what} failed: {exc.strerror or exc}")


class Lock:
    """An `flock` on a file, taken without blocking the event loop's thread forever.

    `acquire` polls with LOCK_NB so an asyncio caller can wrap it in a thread or
    call `try_acquire` in a loop with `asyncio.sleep`; both are cancellable.
    """

    def __init__(self, path: Path, *, shared: bool = False) -> None:
        self.path = path
        self.shared = shared
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            raise RuntimeError("lock already held")  # our bug, not input
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            # A sweeper may have unlinked the file between our open and our flock:
            # then we hold a lock nobody else can see. Check, and start again.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return True
            os.close(fd)

    def acquire(self, *, timeout: float | None = None, poll: float = 0.05) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.try_acquire():
            if deadline is not None and time.monotonic() > deadline:
                raise HostError(f"timed out waiting for the lock {self.path.name}; is another "
                                "tkbox stuck? try again")
            time.sleep(poll)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class TempArea:
    """A private directory for one store's temporaries, swept when its owner is gone."""

    def __init__(self, tmp_root: Path) -> None:
        self.root = tmp_root
        tmp_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.sweep()
        name = f"{os.getpid()}-{secrets.token_hex(6)}"
        self._lock = Lock(tmp_root / f"{name}.lock")
        if not self._lock.try_acquire():  # pragma: no cover - random name collision
            raise HostError("could not lock a fresh temporary directory; try again")
        self.dir = tmp_root / name
        self.dir.mkdir(mode=0o700)

    def sweep(self) -> list[Path]:
        """Remove temporaries of owners that are gone; return what was removed."""
        removed: list[Path] = []
        for lock_path in sorted(self.root.glob("*.lock")):
            probe = Lock(lock_path)
            if not probe.try_acquire():
                continue  # alive: another store is using it
            try:
                d = lock_path.with_suffix("")
                if d.exists():
                    shutil.rmtree(d, ignore_errors=True)
                    removed.append(d)
                lock_path.unlink(missing_ok=True)
            finally:
                probe.release()
        # A directory whose lock file is gone (a person removed it) is swept once it
        # is old enough that no owner can still be starting up.
        for d in self.root.iterdir():
            if d.is_dir() and not d.with_suffix(".lock").exists():
                with contextlib.suppress(FileNotFoundError):
                    if time.time() - d.stat().st_mtime > _ORPHAN_AGE:
                        shutil.rmtree(d, ignore_errors=True)
                        removed.append(d)
        return removed

    def path(self, hint: str) -> Path:
        return self.dir / f"{hint}.{secrets.token_hex(4)}"

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self.root / f"{self.dir.name}.lock").unlink()
        self._lock.release()


@contextlib.contextmanager
def temp_file(area: TempArea, hint: str) -> Iterator[tuple[Path, BinaryIO]]:
    """A temporary file opened for writing; removed unless the caller renamed it away."""
    path = area.path(hint)
    f = open(path, "xb")  # noqa: SIM115 - closed below
    try:
        yield path, f
    finally:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
