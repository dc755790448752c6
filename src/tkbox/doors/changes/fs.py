"""Reading and writing the checkout without ever following a symlink.

Every directory is opened with `O_DIRECTORY|O_NOFOLLOW` relative to its
parent's descriptor, starting from the checkout root, so a symlinked parent
(planted before or swapped in during the apply) fails the walk instead of
redirecting it. Files are read with `O_NOFOLLOW`; each new file is written to
a temporary file created with `O_CREAT|O_EXCL|O_NOFOLLOW|O_WRONLY` in its
target directory; once all are written and durable (a few: fsync'd together
from a thread pool; many: one syncfs per filesystem), each takes its name in
one step with renameat(2)'s flags: exchanged with the file it replaces
(`RENAME_EXCHANGE`), whose identity is then checked under the temporary name,
or put where nothing is (`RENAME_NOREPLACE`, which fails if something appeared).
A name the patch modifies holds the old file or the new one at every moment.
Where the filesystem lacks those flags, the original is moved aside and the new
file linked into place (`link` fails if something appeared), as before them.

`place_all` is a transaction: every step is journalled, and a failure at any
step undoes the journal in reverse, leaving the checkout as it was. Replaced
files stay beside their new versions under the temporary names, deleted ones
(and replaced ones where the flags are missing) in a private staging directory
at the checkout root; once all are placed, and the renames durable (the
directories fsync'd), `Placed.remove_originals` removes both. For a process
that dies mid-way, every name is chosen before the first step and written to
a journal outside the checkout (`journal`), from which the next apply undoes
or finishes it (`recover`).

One idea: the descriptor-relative walk, the durable
writes and the journalled transaction are one guarantee (nothing followed,
nothing half-written, everything undone on failure); every undo step the
journal records is a function of this module's own walk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Container, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tkbox._fs import write_all
from tkbox.doors.changes import journal as jn
from tkbox.doors.changes.errors import ApplyFailed, PatchRefused
from tkbox.doors.changes.paths import fold_ntfs, folded_parts
from tkbox.doors.changes.plan import ABSENT, State
from tkbox.doors.changes.trie import Trie
from tkbox.errors import HostError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY | os.O_CLOEXEC
_MAX_BELOW = 100_000  # entries listed below a directory the patch replaces


def _ident(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns)


class Checkout:
    """The checkout root, held open; every path is walked from it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            self.fd = os.open(root, _DIR)
        except OSError as e:
            raise PatchRefused(f"cannot open the checkout {str(root)!r}: {e.strerror}") from None

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Checkout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open_parent(self, path: str) -> tuple[int | None, str | None]:
        """(fd of the parent of `path`, or None, and then the first ancestor that is not
        a directory, or None if one is missing)."""
        return _descend(os.dup(self.fd), "", path.split("/")[:-1])

    def states(self, paths: Iterable[str], max_bytes: int,
               list_below: Container[str] = frozenset()) -> Generator[tuple[str, State]]:
        """`(path, what is at path now)` for each of `paths` in turn, read without
        following symlinks. The parent directory's walk (`open_parent`'s) is kept from
        one path to the next while the parent is the same: paths in order walk each
        directory once. A directory swapped while the states are read is not seen
        here; the writes walk again and compare each file's identity, and refuse then.

        `list_below`: the paths whose directory, if they are one, is listed below
        (needed for a path the patch names, never for its ancestors).
        """
        parent: str | None = None
        fd: int | None = None
        blocked: str | None = None
        try:
            for path in paths:
                here, _, name = path.rpartition("/")
                if here != parent:
                    if fd is not None and parent is not None and (
                            parent == "" or here.startswith(parent + "/")):
                        # below the last parent (an ancestor, then its children): walked
                        # on from it, so a deep path's ancestors cost an open each
                        rest = here[len(parent) + 1:] if parent else here
                        fd, blocked = _descend(fd, parent, rest.split("/"))
                    else:
                        if fd is not None:
                            os.close(fd)
                            fd = None
                        fd, blocked = self.open_parent(path)
                    parent = here
                if fd is None:
                    yield path, State("absent", blocked_by=blocked)
                else:
                    yield path, _state_at(fd, name, path, max_bytes, path in list_below)
        finally:
            if fd is not None:
                os.close(fd)


def _descend(fd: int, base: str, dirs: list[str]) -> tuple[int | None, str | None]:
    """Walk `dirs` down from `fd` (taken: closed, or returned walked), `base` its path
    in the checkout: (fd of the last, or None, and then the first that is not a
    directory, or None if one is missing). Never through a symlink."""
    for i, d in enumerate(dirs):
        try:
            nfd = os.open(d, _DIR, dir_fd=fd)
        except FileNotFoundError:
            os.close(fd)
            return None, None
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                return None, "/".join([base, *dirs[: i + 1]] if base else dirs[: i + 1])
            raise
        os.close(fd)
        fd = nfd
    return fd, None


def _state_at(dirfd: int, name: str, path: str, max_bytes: int, list_below: bool) -> State:
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return ABSENT
    if stat.S_ISLNK(st.st_mode):
        return State("link", os.fsencode(os.readlink(name, dir_fd=dirfd)), ident=_ident(st))
    if stat.S_ISDIR(st.st_mode):
        below = frozenset(_below(dirfd, name, path)) if list_below else frozenset()
        return State("dir", ident=_ident(st), below=below)
    if not stat.S_ISREG(st.st_mode):
        return State("other", ident=_ident(st))
    if st.st_size > max_bytes:
        raise PatchRefused(f"{path}: the checkout's file is larger than {max_bytes} bytes")
    fd = os.open(name, _READ, dir_fd=dirfd)
    try:
        fst = os.fstat(fd)
        if _ident(fst) != _ident(st):
            raise PatchRefused(f"{path}: changed while being read; try again")
        content = read_fd(fd, fst.st_size)
    finally:
        os.close(fd)
    return State("file", content, exec=bool(st.st_mode & stat.S_IXUSR),
                 perm=stat.S_IMODE(st.st_mode), ident=_ident(st))


def read_fd(fd: int, size: int) -> bytes:
    """All that is left to read from `fd`, `size` its size when last stat'd (one read
    when it has not grown)."""
    chunks = []
    while chunk := os.read(fd, max(size + 1, 1 << 16)):
        chunks.append(chunk)
    return b"".join(chunks)


def _below(dirfd: int, name: str, path: str) -> list[str]:
    out: list[str] = []
    fd = os.open(name, _DIR, dir_fd=dirfd)
    try:
        for child in sorted(os.listdir(fd)):
            cpath = f"{path}/{child}"
            st = os.stat(child, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                out.extend(_below(fd, child, cpath))
            else:
                out.append(cpath)
            if len(out) > _MAX_BELOW:
                raise PatchRefused(f"{path}: the directory the patch replaces is too large")
    finally:
        os.close(fd)
    return out


# --- the transaction ----------------------------------------------------------


FSYNC_THREADS = 32  # temporary files being fsync'd at once
SYNCFS_FROM = 64  # new files from which one syncfs per filesystem replaces an fsync each


def _syncfs() -> Callable[[int], None] | None:
    """syncfs(2) from the C library (Python has no binding), or None where it is missing."""
    try:
        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int]
    call.restype = ctypes.c_int

    def run(fd: int) -> None:
        if call(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    return run


_SYNCFS = _syncfs()

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2  # renameat2(2)'s flags
_NO_RENAME_FLAGS = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)  # this filesystem lacks them


def _renameat2() -> Callable[[int, str, str, int], None] | None:
    """`run(dirfd, old, new, flags)`: renameat2(2) within one directory, from the C
    library (Python has no binding), or None where it is missing."""
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                     ctypes.c_uint]
    call.restype = ctypes.c_int

    def run(dirfd: int, old: str, new: str, flags: int) -> None:
        if call(dirfd, os.fsencode(old), dirfd, os.fsencode(new), flags) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    return run


_RENAMEAT2 = _renameat2()


class _Flusher:
    """Make every temporary file durable before any of them takes its real name.

    A few files: each is fsync'd, many at once from a thread pool (one fsync after
    another costs a journal commit each: 1,100 took 2.5 s on this host; together
    about 0.15-0.5 s), closed once durable; at most `2 * FSYNC_THREADS` are open.
    From `SYNCFS_FROM` files: one syncfs(2) per filesystem the files are on (about
    70 ms for 1,100 here), the same guarantee for each file paid once; it also
    flushes whatever else is waiting to be written on those filesystems.
    """

    def __init__(self, files: int) -> None:
        self.syncfs = _SYNCFS if files >= SYNCFS_FROM else None
        self.filesystems: dict[int, int] = {}  # st_dev -> a descriptor on it, for syncfs
        self.pool = (ThreadPoolExecutor(FSYNC_THREADS, thread_name_prefix="tkbox-fsync")
                     if self.syncfs is None else None)
        self.slots = threading.BoundedSemaphore(2 * FSYNC_THREADS)
        self.pending: list[Future[None]] = []

    def add(self, fd: int) -> None:
        """Take `fd` (closed here, whatever happens)."""
        if self.pool is None:
            try:
                dev = os.fstat(fd).st_dev
                if dev not in self.filesystems:
                    self.filesystems[dev] = os.dup(fd)
            finally:
                os.close(fd)
            return
        self.slots.acquire()
        try:
            self.pending.append(self.pool.submit(self._one, fd))
        except BaseException:
            self.slots.release()
            os.close(fd)
            raise

    def _one(self, fd: int) -> None:
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
            self.slots.release()

    def wait(self) -> None:
        """Every file durable, or the first error."""
        if self.syncfs is not None:
            for fd in self.filesystems.values():
                self.syncfs(fd)
        for fut in self.pending:
            fut.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        for fd in self.filesystems.values():
            os.close(fd)
        self.filesystems.clear()


@dataclass(frozen=True)
class Write:
    """One path's final state: what was decided."""

    path: str
    new: State  # absent (delete), file or link
    old: State  # as it was when decided
    verify: Callable[[bytes], bool]  # the content still hashes to what was decided


@dataclass
class _Txn:
    co: Checkout
    stage: str = ""
    stage_fd: int = -1
    undo: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    replaced: list[tuple[list[str], str]] = field(default_factory=list)  # originals, by tmp
    renameat2: Callable[[int, str, str, int], None] | None = field(
        default_factory=lambda: _RENAMEAT2)  # None once a filesystem lacks its flags
    # every name used, chosen before the first step (the journal holds them):
    tmps: dict[str, str] = field(default_factory=dict)  # path -> its new file's temporary name
    backups: dict[str, str] = field(default_factory=dict)  # path -> its original's, in stage
    current: str = ""  # the checkout path being written, for errors

    def dir_fd(self, path_dirs: list[str], create: bool) -> int:
        fd = os.dup(self.co.fd)
        try:
            for i, d in enumerate(path_dirs):
                try:
                    nfd = os.open(d, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(d, 0o755, dir_fd=fd)
                    self.undo.append((f"mkdir {'/'.join(path_dirs[: i + 1])}",
                                      _rmdir(self.co, path_dirs[:i], d)))
                    nfd = os.open(d, _DIR, dir_fd=fd)
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd


def _rmdir(co: Checkout, parent: list[str], name: str) -> Callable[[], None]:
    def run() -> None:
        fd = _walk(co, parent)
        try:
            os.rmdir(name, dir_fd=fd)
        finally:
            os.close(fd)
    return run


def _walk(co: Checkout, dirs: list[str]) -> int:
    fd = os.dup(co.fd)
    for d in dirs:
        nfd = os.open(d, _DIR, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd


def _split(path: str) -> tuple[list[str], str]:
    *dirs, name = path.split("/")
    return dirs, name


class Placed:
    """Every write in place, durable; the originals they replaced still kept for undo."""

    def __init__(self, txn: _Txn, journal: jn.Journal | None) -> None:
        self._txn = txn
        self._journal = journal

    def remove_originals(self) -> None:
        """Remove the originals and the staging directory (once; blocking). HostError
        if they cannot all be: the patch stays applied, the journal stays (the next
        apply into the checkout removes them), and the message says what is left."""
        try:
            _cleanup(self._txn)
        except OSError as e:
            if self._journal is not None:
                self._journal.keep()
            raise HostError(f"the patch was applied, but the originals it replaced could not "
                            f"all be removed ({e.strerror}): the next tkbox apply into this "
                            f"checkout removes them, or remove the .tkbox-*.tmp files and "
                            f"{self._txn.stage!r} in the checkout by hand") from None
        if self._journal is not None:
            self._journal.done()


def place_all(co: Checkout, writes: Iterable[Write], max_bytes: int,
              journals: Path | None = None) -> Placed:
    """Put every write in place and make it durable, or none (PatchRefused if the
    checkout moved, ApplyFailed if a write failed: each undone, the checkout as it
    was). The originals are kept until `Placed.remove_originals`: so the caller may
    record that the files are written while they are removed.

    `journals`: where the journal is kept (`journal`), written before the first
    step; None for none (a process that dies mid-way then leaves the checkout
    half-written)."""
    writes = list(writes)
    txn = _Txn(co)
    txn.stage = f".tkbox-apply-{secrets.token_hex(8)}"
    for w in writes:
        if w.new.kind != "absent":
            txn.tmps[w.path] = f".tkbox-{secrets.token_hex(8)}.tmp"
        if _present(w.old):
            txn.backups[w.path] = str(len(txn.backups) + 1)
    journal = jn.Journal.begin(journals, _journal_plan(txn, writes)) if journals else None
    try:
        try:
            os.mkdir(txn.stage, 0o700, dir_fd=co.fd)
        except OSError as e:
            raise HostError(f"cannot create the staging directory in the checkout: "
                            f"{e.strerror}") from None
        txn.stage_fd = os.open(txn.stage, _DIR, dir_fd=co.fd)
        if journal is not None:  # durable before anything else changes: `recover` reads
            try:                 # a checkout without it as one the apply never touched
                os.fsync(co.fd)
            except OSError as e:
                os.close(txn.stage_fd)
                with contextlib.suppress(OSError):
                    os.rmdir(txn.stage, dir_fd=co.fd)
                raise HostError(f"cannot make the staging directory durable in the "
                                f"checkout: {e.strerror}; nothing was applied") from None
    except BaseException:
        if journal is not None:
            journal.done()
        raise
    try:
        try:
            _run(txn, writes, max_bytes)
            _sync_dirs(co, writes)
            if journal is not None:
                journal.placed()
        except BaseException as exc:
            try:
                _rollback(txn, exc)
            except BaseException:
                if journal is not None:
                    journal.keep()  # the next apply tries again
                raise
            if journal is not None:
                journal.done()
            if isinstance(exc, OSError):
                where = f"writing {txn.current!r}" if txn.current else "writing the checkout"
                raise ApplyFailed(
                    f"nothing applied: {where} in {str(co.root)!r} failed "
                    f"({exc.strerror or exc}); the checkout is as it was; fix that "
                    "(free space, permissions) and run tkbox apply again") from None
            raise
    finally:
        os.close(txn.stage_fd)
    return Placed(txn, journal)


def _present(old: State) -> bool:
    """Whether the path holds a file or link that the write replaces or deletes."""
    return old.kind in ("file", "link") and old.blocked_by is None


def _journal_plan(txn: _Txn, writes: list[Write]) -> jn.Plan:
    """The journal's account of `writes` (`journal.Plan`): the names chosen, what each
    path holds and will hold, the directories the puts make and the deletions may
    empty (read from the checkout now: `_dirs`)."""
    entries = tuple(jn.Entry(
        w.path, txn.tmps.get(w.path), txn.backups.get(w.path), _present(w.old),
        w.old.ident[1:] if _present(w.old) else (), w.new.kind,
        len(w.new.content), hashlib.sha256(w.new.content).hexdigest()) for w in writes)
    made: list[str] = []
    kept: list[tuple[str, int]] = []
    stack: list[tuple[Trie[_Dir], str]] = [(_dirs(txn.co, writes), "")]
    while stack:  # parents before children (the order recovery makes them again in)
        node, path = stack.pop()
        for c, child in sorted(node.below.items(), reverse=True):
            here, d = f"{path}/{c}" if path else c, child.value
            assert d is not None
            if d.st is None and d.put:
                made.append(here)
            elif d.st is not None and d.gone:
                kept.append((here, stat.S_IMODE(d.st.st_mode)))
            stack.append((child, here))
    return jn.Plan(str(txn.co.root), txn.stage, time.time(), entries, tuple(made), tuple(kept))


@dataclass
class _Dir:
    """A directory above a write, as `_dirs` found it."""

    st: os.stat_result | None = None  # None: missing, not a directory, or a symlink
    put: bool = False  # above a new file or link
    gone: bool = False  # above a deletion


def _dirs(co: Checkout, writes: list[Write]) -> Trie[_Dir]:
    """Every directory above a write, in a tree of their components: each write's
    directories walked once from the checkout root down (an open a component, never
    following a symlink, stopped at the first missing), so the work is the writes'
    components, not a walk from the root for every directory (a patch of deep
    paths would make that the square of their depth)."""
    tree: Trie[_Dir] = Trie()
    for w in writes:
        put = w.new.kind != "absent"
        gone = not put and _present(w.old)
        node, fd = tree, os.dup(co.fd)
        try:
            for c in _split(w.path)[0]:
                child = node.below.get(c)
                if child is None:
                    child = node.below[c] = Trie()
                    child.value = _Dir()
                if fd >= 0:
                    try:
                        nfd = os.open(c, _DIR, dir_fd=fd)
                    except OSError:
                        nfd = -1
                    os.close(fd)
                    fd = nfd
                    if fd >= 0 and child.value is not None and child.value.st is None:
                        child.value.st = os.fstat(fd)
                assert child.value is not None
                child.value.put |= put
                child.value.gone |= gone
                node = child
        finally:
            if fd >= 0:
                os.close(fd)
    return tree


def _sync_dirs(co: Checkout, writes: list[Write]) -> None:
    """Make the renames durable: every directory above a write (the checkout root,
    where the staging directory is, among them) fsync'd; from `SYNCFS_FROM` writes or
    directories, as for their bytes, one syncfs per filesystem instead (the root's,
    and each write's directory's)."""
    tree: Trie[None] = Trie()
    for w in writes:
        tree.add(_split(w.path)[0])
    many = len(writes) >= SYNCFS_FROM or _count(tree, SYNCFS_FROM) >= SYNCFS_FROM
    if many and _SYNCFS is not None:
        devices: dict[int, int] = {}
        try:
            for dirs in [[], *(_split(w.path)[0] for w in writes)]:
                try:
                    fd = _walk(co, dirs)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # emptied and removed: on the root's filesystem
                if devices.setdefault(os.fstat(fd).st_dev, fd) != fd:
                    os.close(fd)
            for fd in devices.values():
                _SYNCFS(fd)
        finally:
            for fd in devices.values():
                os.close(fd)
        return
    stack: list[tuple[Trie[None], list[str]]] = [(tree, [])]
    while stack:  # fewer than SYNCFS_FROM directories: each walked to and fsync'd
        node, dirs = stack.pop()
        stack.extend((child, [*dirs, c]) for c, child in node.below.items())
        try:
            fd = _walk(co, dirs)
        except (FileNotFoundError, NotADirectoryError):
            continue  # emptied and removed: its parent, listed too, holds that
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _count(tree: Trie[None], most: int) -> int:
    """The nodes of `tree` below its root, counted up to `most`."""
    n, stack = 0, [tree]
    while stack and n < most:
        node = stack.pop()
        n += len(node.below)
        stack.extend(node.below.values())
    return n


def _run(txn: _Txn, writes: list[Write], max_bytes: int) -> None:
    co = txn.co
    paths = [w.path for w in writes]  # each named by the patch: listed below, as planned
    with contextlib.closing(co.states(paths, max_bytes, list_below=set(paths))) as now:
        for w, (_, state) in zip(writes, now, strict=True):  # as it was decided
            if state != w.old:
                raise PatchRefused(f"{w.path}: the checkout changed after the decision; "
                                   "nothing was written, run tkbox apply again")
            if w.new.kind != "absent" and not w.verify(w.new.content):
                raise PatchRefused(f"{w.path}: the content is no longer what was decided")
    deletions = sorted((w for w in writes if w.new.kind == "absent" and _present(w.old)),
                       key=lambda w: w.path.split("/"), reverse=True)
    emptied: set[tuple[str, ...]] = set()
    for w in deletions:
        txn.current = w.path
        dirs, name = _split(w.path)
        fd = txn.dir_fd(dirs, create=False)
        try:
            _move_aside(txn, fd, dirs, name, w.old)
        finally:
            os.close(fd)
        for i in range(len(dirs), 0, -1):
            emptied.add(tuple(dirs[:i]))
    # like git, remove the directories the deletions left empty, deepest first,
    # but not one a write below needs: removed, it would come back as a new 0755
    # directory, and a 0700 one would lose its permission bits
    puts = sorted((w for w in writes if w.new.kind != "absent"), key=lambda w: w.path.split("/"))
    needed: Trie[None] = Trie()  # every put's directories, folded as a filesystem may compare
    for w in puts:
        needed.add(folded_parts(w.path)[:-1])
    for dirs_t in sorted(emptied, key=lambda d: (len(d), d), reverse=True):
        if needed.find(fold_ntfs(d) for d in dirs_t) is not None:
            continue
        dirs = list(dirs_t)
        fd = txn.dir_fd(dirs[:-1], create=False)
        try:
            st = os.stat(dirs[-1], dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                continue
            try:
                os.rmdir(dirs[-1], dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    continue
                raise
            perm = stat.S_IMODE(st.st_mode)
            txn.undo.append((f"rmdir {'/'.join(dirs)}", _mkdir(co, dirs[:-1], dirs[-1], perm)))
        finally:
            os.close(fd)
    temps: list[str] = []
    flusher = _Flusher(sum(1 for w in puts if w.new.kind == "file"))
    try:
        for w in puts:  # every new file's bytes, beside its target, under a temporary name
            txn.current = w.path
            dirs, name = _split(w.path)
            fd = txn.dir_fd(dirs, create=True)
            try:
                temps.append(_put_temporary(txn, fd, dirs, w, flusher))
            finally:
                os.close(fd)
        txn.current = ""
        flusher.wait()  # all durable before any of them takes a real name
    finally:
        flusher.close()
    for w, tmp in zip(puts, temps, strict=True):
        txn.current = w.path
        dirs, name = _split(w.path)
        fd = txn.dir_fd(dirs, create=False)
        try:
            _put(txn, fd, dirs, name, tmp, w)
        finally:
            os.close(fd)


def _mkdir(co: Checkout, parent: list[str], name: str, perm: int) -> Callable[[], None]:
    def run() -> None:
        fd = _walk(co, parent)
        try:
            os.mkdir(name, perm, dir_fd=fd)
        finally:
            os.close(fd)
    return run


def _check_ident(fd: int, name: str, old: State, path: str) -> None:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    now = () if st is None else _ident(st)
    if now != old.ident:
        raise PatchRefused(f"{path}: the checkout changed while writing; nothing was kept, "
                           "run tkbox apply again")


def _move_aside(txn: _Txn, fd: int, dirs: list[str], name: str, old: State) -> None:
    path = "/".join([*dirs, name])
    _check_ident(fd, name, old, path)
    backup = txn.backups[path]
    os.rename(name, backup, src_dir_fd=fd, dst_dir_fd=txn.stage_fd)
    txn.undo.append((f"restore {path}", _restore(txn, dirs, name, backup)))


def _restore(txn: _Txn, dirs: list[str], name: str, backup: str) -> Callable[[], None]:
    def run() -> None:  # never over what took the name meanwhile: that is left, reported
        fd = _walk(txn.co, dirs)
        try:
            _link_or_rename(txn.stage_fd, backup, fd, name)
        finally:
            os.close(fd)
    return run


def _link_or_rename(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    """Give `src` the name `dst`, or raise FileExistsError if something has it: a link
    then an unlink; where the filesystem has no hard links, a look then a rename."""
    try:
        os.link(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        try:
            os.stat(dst, dir_fd=dst_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            return
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST)) from None
    os.unlink(src, dir_fd=src_fd)


def _unlink(txn: _Txn, dirs: list[str], name: str) -> Callable[[], None]:
    def run() -> None:
        fd = _walk(txn.co, dirs)
        try:
            os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)
    return run


def _put_temporary(txn: _Txn, fd: int, dirs: list[str], w: Write, flusher: _Flusher) -> str:
    """Write `w`'s new file (or symlink) under a temporary name in its directory; the
    file is handed to `flusher` to be made durable."""
    tmp = txn.tmps[w.path]
    if w.new.kind == "link":
        os.symlink(w.new.content, tmp, dir_fd=fd)
        txn.undo.append((f"remove temporary {tmp}", _unlink_quiet(txn, dirs, tmp)))
        return tmp
    if w.old.kind == "file" and w.old.blocked_by is None:
        perm = w.old.perm & 0o777
        perm = perm | ((perm & 0o444) >> 2) if w.new.exec else perm & ~0o111
    else:
        perm = 0o755 if w.new.exec else 0o644
    tfd = os.open(tmp, _CREATE, 0o600, dir_fd=fd)
    try:
        txn.undo.append((f"remove temporary {tmp}", _unlink_quiet(txn, dirs, tmp)))
        write_all(tfd, w.new.content)
        os.fchmod(tfd, perm)
    except BaseException:
        os.close(tfd)
        raise
    flusher.add(tfd)
    return tmp


def _put(txn: _Txn, fd: int, dirs: list[str], name: str, tmp: str, w: Write) -> None:
    """Give the temporary file its real name: in one step where the filesystem has
    renameat2's flags, else with the original moved aside first."""
    path = "/".join([*dirs, name])
    present = _present(w.old)
    if (rename := txn.renameat2) is not None:
        try:
            rename(fd, tmp, name, RENAME_EXCHANGE if present else RENAME_NOREPLACE)
        except OSError as e:
            if e.errno == errno.EEXIST and not present:
                raise PatchRefused(f"{path}: appeared in the checkout while writing; nothing "
                                   "was kept, run tkbox apply again") from None
            if e.errno == errno.ENOENT and present:
                raise PatchRefused(f"{path}: the checkout changed while writing; nothing was "
                                   "kept, run tkbox apply again") from None
            if e.errno not in _NO_RENAME_FLAGS:
                raise
            txn.renameat2 = None  # this filesystem: the steps below, from here on
        else:
            if present:  # the original is now at `tmp`: it must be what was decided on
                txn.undo.append((f"restore {path}", _exchange(txn.co, rename, dirs, tmp, name)))
                txn.replaced.append((dirs, tmp))
                _check_ident(fd, tmp, w.old, path)
            else:
                txn.undo.append((f"remove new {path}", _unlink(txn, dirs, name)))
            return
    if present:
        _move_aside(txn, fd, dirs, name, w.old)
    else:
        _check_ident(fd, name, ABSENT, path)
    try:  # not rename(): it would replace what appeared at `name` meanwhile
        _link_or_rename(fd, tmp, fd, name)
    except FileExistsError:
        raise PatchRefused(f"{path}: appeared in the checkout while writing; nothing was "
                           "kept, run tkbox apply again") from None
    txn.undo.append((f"remove new {path}", _unlink(txn, dirs, name)))


def _exchange(co: Checkout, rename: Callable[[int, str, str, int], None], dirs: list[str],
              a: str, b: str) -> Callable[[], None]:
    def run() -> None:
        fd = _walk(co, dirs)
        try:
            rename(fd, a, b, RENAME_EXCHANGE)
        finally:
            os.close(fd)
    return run


def _unlink_quiet(txn: _Txn, dirs: list[str], name: str) -> Callable[[], None]:
    def run() -> None:
        try:
            _unlink(txn, dirs, name)()
        except FileNotFoundError:
            pass
    return run


def _rollback(txn: _Txn, exc: BaseException) -> None:
    failed: list[str] = []
    for what, step in reversed(txn.undo):
        try:
            step()
        except OSError as e:
            failed.append(f"{what} ({e.strerror})")
    if failed:
        raise HostError(
            f"writing the patch failed ({exc}) and undoing it failed too: {'; '.join(failed)}; "
            f"the originals are in {txn.stage!r} in the checkout"
        ) from exc
    try:
        os.rmdir(txn.stage, dir_fd=txn.co.fd)
    except OSError as e:
        raise HostError(f"writing the patch failed ({exc}); the checkout is restored but "
                        f"{txn.stage!r} could not be removed: {e.strerror}") from exc


def _cleanup(txn: _Txn) -> None:
    """Drop the originals kept for undo: the replaced ones under their temporary
    names (each directory walked once), then what we put in the staging dir."""
    by_dir: dict[tuple[str, ...], list[str]] = {}
    for dirs, tmp in txn.replaced:
        by_dir.setdefault(tuple(dirs), []).append(tmp)
    for dirs_t, names in by_dir.items():
        fd = _walk(txn.co, list(dirs_t))
        try:
            for name in names:
                os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)
    fd = os.open(txn.stage, _DIR, dir_fd=txn.co.fd)
    try:
        for name in os.listdir(fd):
            os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(txn.stage, dir_fd=txn.co.fd)
