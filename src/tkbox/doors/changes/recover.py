"""Putting right an apply that died half-way, from its journal (`journal`).

`recover` runs at the start of every apply into a checkout, before anything of
the new patch is read: each journal left for that checkout by an apply that is
no longer running (its lock is free) is undone, or finished if it says
`placed`. How each path's fate is read back from the checkout is in
`journal`'s docstring; here, the order: the new files first (each back to its
original, or removed where nothing was), then the directories the apply made
(removed if empty, deepest first), the directories it may have removed (made
again, shallowest first, with their bits), the deleted files (back from the
staging directory), and the staging directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import time
from pathlib import Path
from typing import Any

from tkbox.doors.changes import fs
from tkbox.doors.changes.journal import (
    PART,
    Entry,
    Journal,
    Plan,
    ident,
    listing,
    lock_checkout,
    read,
)
from tkbox.errors import HostError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def pending(where: Path, root: Path) -> bool:
    """Whether an apply into `root` died half-way (a journal no apply holds)."""
    for name in listing(where, root):
        try:
            fd = os.open(where / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # running
        finally:
            os.close(fd)
        return True
    return False


def _drop_parts(where: Path, root: Path) -> None:
    """Journals cut short while being written (the checkout's lock held: by an apply
    that is not running): it died before its first step, so there is nothing to undo."""
    for name in listing(where, root, PART):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(where / name)


def recover(where: Path, root: Path, root_fd: int) -> list[str]:
    """Undo (or finish) every apply into `root` that died half-way; one note for each.
    HostError naming what is left, if one could not be put right. Waits (up to
    `journal.LOCK_WAIT`) for an apply writing into `root` to end."""
    if not listing(where, root) and not listing(where, root, PART):
        return []
    lock = lock_checkout(where, root)
    try:
        _drop_parts(where, root)
        return [n for name in listing(where, root)
                for n in _recover_file(where / name, root, root_fd)]
    finally:
        os.close(lock)


def _recover_file(path: Path, root: Path, root_fd: int) -> list[str]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    journal = Journal(path, fd)
    try:
        # blocking: with the checkout's lock held, only a dry run's look (`pending`)
        # can hold a journal's, for an instant
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            plan, placed = read(fd)
        except (OSError, ValueError) as e:
            raise HostError(f"cannot read the journal {str(path)!r} of an earlier "
                            f"apply into this checkout ({e}); check the checkout, then "
                            "remove that file") from None
        if plan is None:  # never left so by an apply: written in full before its name
            raise HostError(f"the journal {str(path)!r} of an earlier apply into this "
                            "checkout is not one this version of tkbox reads; check the "
                            "checkout, then remove that file")
        if plan.root != str(root):
            return []  # another checkout's, its key alike by chance: left to it
        try:
            note = _recover_one(plan, placed, root_fd, path)
        except OSError as e:  # beyond a path's step: its staging directory, say
            raise HostError(f"putting right an earlier apply into this checkout failed "
                            f"({e.strerror or e}{f': {e.filename}' if e.filename else ''}); "
                            f"check the checkout, then remove {str(path)!r} and run tkbox "
                            f"apply again") from None
        journal.done()
        return [note]
    finally:
        journal.keep()


def _recover_one(plan: Plan, placed: bool, root_fd: int, path: Path) -> str:
    """Undo or finish one apply. Its staging directory, made (durably) before anything
    else in the checkout changes and removed after everything else (by the apply's
    cleanup, its own undo, or a recovery that left nothing), is what shows that this
    checkout holds the apply's work: without it, nothing is touched. So a checkout
    moved away since, and another made at its path, is never "put right" from the
    other's journal (a file there with the same content as a new one is not the
    apply's)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(plan.started))
    r = _Recovery(plan, root_fd)
    if placed:
        r.finish()
    else:
        r.undo()
    if r.left:
        shown = "; ".join(r.left[:20]) + (f"; and {len(r.left) - 20} more" if len(r.left) > 20
                                           else "")
        raise HostError(f"an apply into this checkout begun {when} was cut short, and putting "
                        f"it right left: {shown}; fix these by hand, then remove "
                        f"{str(path)!r} and run tkbox apply again")
    if r.untouched and placed:  # the originals removed, the staging directory last
        return (f"an apply into this checkout begun {when} was cut short after writing every "
                f"file and removing the originals it kept; nothing was left to put right")
    if r.untouched:
        return (f"an apply into this checkout begun {when} was cut short; this checkout holds "
                f"nothing of it (no {plan.stage}/ in it: it ended before changing anything, "
                f"or the checkout it wrote into was moved away since), so nothing was put "
                f"right")
    if placed:
        return (f"an apply into this checkout begun {when} was cut short after writing every "
                f"file; the originals it kept were removed")
    return (f"an apply into this checkout begun {when} was cut short; it was undone "
            f"({r.restored} path(s) put back as they were) before this one")


class _Recovery:
    def __init__(self, plan: Plan, root_fd: int) -> None:
        self.plan = plan
        self.root_fd = root_fd
        self.left: list[str] = []
        self.restored = 0
        self.untouched = False  # no staging directory: nothing of the apply's here

    # -- the walk (never through a symlink) --

    def _dir(self, dirs: list[str]) -> int | None:
        """A descriptor on `dirs`, or None if it is not there, or a file is in its place
        (nothing of the apply's happened below: it makes directories, never files,
        where they were missing). OSError for a symlink in the way: never followed."""
        fd = os.dup(self.root_fd)
        try:
            for d in dirs:
                nfd = os.open(d, _DIR, dir_fd=fd)
                os.close(fd)
                fd = nfd
        except (FileNotFoundError, NotADirectoryError):
            os.close(fd)
            return None
        except OSError:
            os.close(fd)
            raise
        return fd

    def _stage(self) -> int | None:
        try:
            return os.open(self.plan.stage, _DIR, dir_fd=self.root_fd)
        except FileNotFoundError:
            return None

    def _step(self, what: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except OSError as e:
            self.left.append(f"{what} ({e.strerror or e})")

    # -- undo: the checkout as it was --

    def undo(self) -> None:
        stage = self._stage()
        if stage is None:  # see `_recover_one`
            self.untouched = True
            return
        try:
            puts = [e for e in self.plan.entries if e.new_kind != "absent"]
            for e in reversed(puts):
                self._step(f"{e.path}: could not be put back", self._undo_put, e, stage)
            for d in reversed(self.plan.made):
                self._step(f"{d}/: could not be removed", self._rmdir_if_empty, d)
            for i, (d, perm) in enumerate(self.plan.kept):
                self._step(f"{d}/: could not be made again", self._mkdir_if_missing, i, d,
                           perm)
            for e in self.plan.entries:
                if e.new_kind == "absent" and e.present and e.backup is not None:
                    self._step(f"{e.path}: could not be put back (its original is "
                               f"{self.plan.stage}/{e.backup})", self._undo_delete, e, stage)
        finally:
            os.close(stage)
        if not self.left:  # else kept: what says this checkout holds the apply's
            self._step(f"{self.plan.stage}/: could not be removed", self._rmdir_stage)

    def _undo_put(self, e: Entry, stage: int) -> None:
        dirs, name = _split(e.path)
        fd = self._dir(dirs)
        if fd is None:
            return  # its directory was never made: nothing was put
        try:
            tmp = _lstat(fd, e.tmp) if e.tmp else None
            here = _lstat(fd, name)
            bak = _lstat(stage, e.backup)
            if e.present and tmp is not None and tmp.st_ino == e.old[0]:
                assert e.tmp is not None  # exchanged: exchange back, drop the new one
                if ident(tmp) != e.old:  # written to since (an open descriptor, a hard link)
                    raise OSError(errno.EEXIST, f"its original, changed since the apply "
                                                f"began, is {_join(dirs, e.tmp)}")
                if here is None or not self._is_new(fd, name, here, None, e):
                    raise OSError(errno.EEXIST, f"changed since; its original is "
                                                f"{_join(dirs, e.tmp)}")
                _exchange(fd, e.tmp, name)
                os.unlink(e.tmp, dir_fd=fd)
                self.restored += 1
                return
            # `tmp`, if there, is not the original (another inode): the new file, or
            # part of it (killed while writing it); never anything but the apply's
            if e.present and bak is not None and bak.st_ino == e.old[0]:
                assert e.backup is not None
                if ident(bak) != e.old:
                    raise OSError(errno.EEXIST, f"its original, changed since the apply "
                                                f"began, is {self.plan.stage}/{e.backup}")
                if here is not None and _same(here, bak):  # given back by a recovery killed
                    os.unlink(e.backup, dir_fd=stage)      # before it removed the backup
                    if tmp is not None:
                        assert e.tmp is not None
                        os.unlink(e.tmp, dir_fd=fd)
                    self.restored += 1
                    return
                if here is not None and self._is_new(fd, name, here, tmp, e):
                    os.unlink(name, dir_fd=fd)
                    here = None
                if tmp is not None:
                    assert e.tmp is not None
                    os.unlink(e.tmp, dir_fd=fd)
                if here is not None:
                    raise OSError(errno.EEXIST, f"something else took its name; its original "
                                                f"is {self.plan.stage}/{e.backup}")
                _give_name(stage, e.backup, fd, name)
                self.restored += 1
                return
            if here is not None and stat.S_ISDIR(here.st_mode):
                here = None  # (the directory the file replaces, not yet removed)
            if not e.present and here is not None and self._is_new(fd, name, here, tmp, e):
                os.unlink(name, dir_fd=fd)  # put where nothing was: removed
                self.restored += 1
                here = None
            if tmp is not None:
                assert e.tmp is not None
                os.unlink(e.tmp, dir_fd=fd)  # written, never given its name
            if not e.present and here is not None:
                raise OSError(errno.EEXIST, "not the file the apply put there; left as it is")
            if (e.present and here is not None and here.st_ino != e.old[0]
                    and self._is_new(fd, name, here, None, e)):
                raise OSError(errno.ENOENT, "its original is gone (removed since the apply "
                                            "began); the new file is left at its name")
        finally:
            os.close(fd)

    def _is_new(self, fd: int, name: str, st: os.stat_result, tmp: os.stat_result | None,
                e: Entry) -> bool:
        """Whether `name` holds the apply's new file: the temporary file linked there,
        or the same content (a link: the same target)."""
        if tmp is not None and (st.st_dev, st.st_ino) == (tmp.st_dev, tmp.st_ino):
            return True
        if e.new_kind == "link":
            if not stat.S_ISLNK(st.st_mode):
                return False
            data = os.fsencode(os.readlink(name, dir_fd=fd))
        else:
            if not stat.S_ISREG(st.st_mode) or st.st_size != e.new_size:
                return False
            rfd = os.open(name, _READ, dir_fd=fd)
            try:
                data = _read_exactly(rfd, e.new_size)
            finally:
                os.close(rfd)
        return hashlib.sha256(data).hexdigest() == e.new_sha256

    def _rmdir_if_empty(self, path: str) -> None:
        dirs, name = _split(path)
        fd = self._dir(dirs)
        if fd is None:
            return
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
        finally:
            os.close(fd)

    def _mkdir_if_missing(self, i: int, path: str, perm: int) -> None:
        """Make the directory again with its bits, in one step: made with them under a
        name of the apply's own beside it (`<stage>.d<i>`, kept by a recovery killed
        before its rename), then renamed into place; so a recovery killed half-way
        never leaves it with other bits."""
        dirs, name = _split(path)
        fd = self._dir(dirs)
        if fd is None:
            raise OSError(errno.ENOENT, "its parent is missing")
        made = f"{self.plan.stage}.d{i}"
        try:
            if _lstat(fd, name) is not None:  # there (made by a recovery killed since)
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(made, dir_fd=fd)
                return
            with contextlib.suppress(FileExistsError):
                os.mkdir(made, 0o700, dir_fd=fd)
            dfd = os.open(made, _DIR, dir_fd=fd)
            try:
                os.fchmod(dfd, stat.S_IMODE(perm))
            finally:
                os.close(dfd)
            try:
                _rename_noreplace(fd, made, name)
            except FileExistsError:  # made meanwhile by someone else: theirs is kept
                os.rmdir(made, dir_fd=fd)
        finally:
            os.close(fd)

    def _undo_delete(self, e: Entry, stage: int) -> None:
        assert e.backup is not None
        bak = _lstat(stage, e.backup)
        if bak is None or bak.st_ino != e.old[0]:
            return  # never moved aside, or given back already
        if ident(bak) != e.old:
            raise OSError(errno.EEXIST, "changed since the apply began; left there")
        dirs, name = _split(e.path)
        fd = self._dir(dirs)
        if fd is None:
            raise OSError(errno.ENOENT, "its directory is missing")
        try:
            here = _lstat(fd, name)
            if here is not None and _same(here, bak):  # given back by a recovery killed
                os.unlink(e.backup, dir_fd=stage)      # before it removed the backup
            else:
                _give_name(stage, e.backup, fd, name)
            self.restored += 1
        finally:
            os.close(fd)

    def _rmdir_stage(self) -> None:
        try:
            os.rmdir(self.plan.stage, dir_fd=self.root_fd)
        except FileNotFoundError:
            pass

    # -- finish: the new files stay, the originals go --

    def finish(self) -> None:
        stage = self._stage()
        if stage is None:  # see `_recover_one`
            self.untouched = True
            return
        try:
            for e in self.plan.entries:
                if not e.present:
                    continue
                self._step(f"{e.path}: its original was not removed",
                           self._drop_original, e, stage)
        finally:
            os.close(stage)
        if not self.left:  # else kept: what says this checkout holds the apply's
            self._step(f"{self.plan.stage}/: could not be removed", self._rmdir_stage)

    def _drop_original(self, e: Entry, stage: int) -> None:
        """The original kept for undo removed, if it is still as it was; one written to
        since (through an open descriptor or a hard link) is someone's data: kept, named."""
        if e.backup is not None:
            bak = _lstat(stage, e.backup)
            if bak is not None and bak.st_ino == e.old[0]:
                if ident(bak) != e.old:
                    raise OSError(errno.EEXIST, f"changed since the apply began; kept at "
                                                f"{self.plan.stage}/{e.backup}")
                os.unlink(e.backup, dir_fd=stage)
                return
        if e.tmp is None:
            return
        dirs, _ = _split(e.path)
        fd = self._dir(dirs)
        if fd is None:
            return
        try:
            tmp = _lstat(fd, e.tmp)
            if tmp is not None and tmp.st_ino == e.old[0]:
                if ident(tmp) != e.old:
                    raise OSError(errno.EEXIST, f"changed since the apply began; kept at "
                                                f"{_join(dirs, e.tmp)}")
                os.unlink(e.tmp, dir_fd=fd)
        finally:
            os.close(fd)


def _join(dirs: list[str], name: str) -> str:
    return "/".join([*dirs, name])


def _split(path: str) -> tuple[list[str], str]:
    *dirs, name = path.split("/")
    return dirs, name


def _lstat(fd: int | None, name: str | None) -> os.stat_result | None:
    if fd is None or name is None:
        return None
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _read_exactly(fd: int, size: int) -> bytes:
    parts, got = [], 0
    while got < size:
        chunk = os.read(fd, min(size - got, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _exchange(fd: int, a: str, b: str) -> None:
    if fs._RENAMEAT2 is None:  # noqa: SLF001 - the same call the writes made
        raise OSError(errno.ENOSYS, "this system has no renameat2")
    fs._RENAMEAT2(fd, a, b, fs.RENAME_EXCHANGE)  # noqa: SLF001


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _rename_noreplace(fd: int, src: str, dst: str) -> None:
    """Rename `src` to `dst` in one directory, FileExistsError if `dst` is there."""
    if fs._RENAMEAT2 is not None:  # noqa: SLF001 - the same call the writes made
        try:
            fs._RENAMEAT2(fd, src, dst, fs.RENAME_NOREPLACE)  # noqa: SLF001
            return
        except OSError as e:
            if e.errno not in fs._NO_RENAME_FLAGS:  # noqa: SLF001
                raise
    if _lstat(fd, dst) is not None:  # without the flag: a look, then the rename
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST))
    os.rename(src, dst, src_dir_fd=fd, dst_dir_fd=fd)


def _give_name(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    fs._link_or_rename(src_fd, src, dst_fd, dst)  # noqa: SLF001 - never over another name
