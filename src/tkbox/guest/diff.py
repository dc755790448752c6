"""The workspace patch, computed in the guest from the overlayfs upper layer alone.

`/workspace` is `overlay(lowerdir=LOWER, upperdir=UPPER)`. Every change the box
made lives in UPPER, so the patch is computed by walking UPPER only; LOWER is
read just for the old contents and modes of the paths UPPER names (and, below
a whiteout or an opaque directory, for the list of what was deleted).

How the upper layer encodes changes (Documentation/filesystems/overlayfs.rst):

- a file or symlink in UPPER: added, or (if LOWER has one) modified;
- a whiteout, a character device 0/0 (or a zero-size file carrying the
  `trusted.overlay.whiteout` xattr): the LOWER entry of that name is deleted
  (a whole subtree when it was a directory);
- a directory with `trusted.overlay.opaque` = `y`: nothing of the LOWER
  directory below it shows through; every LOWER entry it does not re-add is
  deleted;
- `trusted.overlay.redirect` and `trusted.overlay.metacopy` (renamed
  directories, metadata-only copies) are not interpreted: the guest mounts
  without `redirect_dir` and `metacopy`, and meeting them stops the diff.

The output is a git-format patch that plain `git apply` applies and that
`tkbox.doors.changes` parses: full `index` lines (git blob SHA-1, computed here:
`SHA-1("blob " + decimal length + NUL + content)`), `GIT binary patch`
`literal` hunks (zlib, then git's base85 in lines of at most 52 bytes) for any
file holding a NUL byte, C-style quoted names as git quotes them
(`quote_c_style` with `core.quotePath` on), a TAB after a name holding a space
on `---`/`+++` lines (as git writes them), sections sorted by path bytes, a
type change (file <-> symlink) written as a deletion then a creation, as git
does. Files whose final content and mode equal LOWER's are omitted. Entries
named `.git` (git's own state, not code) and special files (fifos, sockets,
devices) are skipped and listed in `PatchStats.skipped`.

Never follows a symlink: every directory is opened with `O_NOFOLLOW` relative
to its parent's descriptor, every entry is `lstat`ed, every file opened with
`O_NOFOLLOW`. Output is streamed; past `max_bytes` it stops with
`PatchTooLarge` (the caller discards what was written).

Standard library only: this module runs inside the VM as part of PID 1. The
git patch writer (hunks from `difflib`, git's quoting and base85 line format)
is written here because no standard-library module writes git patches.

Why one module (about 520 lines): the upper-layer walk and the patch writer
share one private record of each change (path, old and new mode and content)
and must agree byte for byte with `tkbox.doors.changes.patch`, which reads
what this writes.
"""

from __future__ import annotations

import base64
import difflib
import errno
import hashlib
import os
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "DiffError",
    "PatchStats",
    "PatchTooLarge",
    "UnsupportedOverlay",
    "git_blob_sha1",
    "quote_path",
    "write_patch",
]

ZERO_OID = "0" * 40
MODE_FILE = 0o100644
MODE_EXEC = 0o100755
MODE_LINK = 0o120000

# Git treats a file as binary when it holds a NUL byte; we look at the whole
# file, not git's first 8000 bytes, so a text hunk never carries a NUL.
_CONTEXT = 3
# Past these sizes difflib's matching gets slow under emulation: the hunk is
# then the whole file (still exact; just not minimal).
_DIFFLIB_MAX_LINES = 20_000
_READ_CHUNK = 1 << 16
_BINARY_LINE = 52  # bytes per base85 line, as git writes them

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class DiffError(Exception):
    """The workspace could not be turned into a patch (the RPC layer maps it)."""


class PatchTooLarge(DiffError):
    """The patch would exceed `max_bytes`."""


class UnsupportedOverlay(DiffError):
    """The upper layer uses an overlayfs feature this module does not read."""


@dataclass
class PatchStats:
    """What `write_patch` wrote."""

    added: int = 0
    modified: int = 0
    deleted: int = 0
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def files(self) -> int:
        return self.added + self.modified + self.deleted


def git_blob_sha1(content: bytes) -> str:
    """Git's object name of a blob: SHA-1("blob <len>\\0" + content)."""
    h = hashlib.sha1(b"blob %d\x00" % len(content), usedforsecurity=False)
    h.update(content)
    return h.hexdigest()


_ESCAPES = {7: b"\\a", 8: b"\\b", 9: b"\\t", 10: b"\\n", 11: b"\\v", 12: b"\\f", 13: b"\\r",
            0x22: b'\\"', 0x5C: b"\\\\"}


def _must_quote(name: bytes) -> bool:
    # git quote.c sq_must_quote with core.quotePath=true
    return any(c < 0x20 or c == 0x22 or c == 0x5C or c >= 0x7F for c in name)


def quote_path(name: bytes) -> bytes:
    """`name` as git writes it in a patch header (quote.c `quote_c_style`)."""
    if not _must_quote(name):
        return name
    out = bytearray(b'"')
    for c in name:
        if c in _ESCAPES:
            out += _ESCAPES[c]
        elif c < 0x20 or c >= 0x7F:
            out += b"\\%03o" % c
        else:
            out.append(c)
    out += b'"'
    return bytes(out)


# --- reading the trees -----------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    """A file or symlink in one of the layers, by its path from the layer root."""

    root: int  # directory fd of the layer root
    path: bytes
    mode: int  # MODE_FILE, MODE_EXEC or MODE_LINK
    size: int


def _open_parent(root: int, path: bytes) -> tuple[int, bytes]:
    """An fd of `path`'s parent, walked from `root` without following symlinks."""
    *dirs, name = path.split(b"/")
    fd = os.dup(root)
    try:
        for d in dirs:
            nfd = os.open(d, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def _read(entry: _Entry, limit: int) -> bytes:
    if entry.size > limit:
        raise PatchTooLarge(
            f"{entry.path.decode(errors='replace')} is {entry.size} bytes, "
            f"more than the patch limit of {limit} bytes"
        )
    pfd, name = _open_parent(entry.root, entry.path)
    try:
        if entry.mode == MODE_LINK:
            return os.readlink(name, dir_fd=pfd)
        fd = os.open(name, _FILE_FLAGS, dir_fd=pfd)
    finally:
        os.close(pfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DiffError(f"{entry.path.decode(errors='replace')} changed type while diffing")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, _READ_CHUNK)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise PatchTooLarge(
                    f"{entry.path.decode(errors='replace')} grew past the patch limit "
                    f"of {limit} bytes"
                )
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _xattr(fd: int, name: str) -> bytes | None:
    try:
        return os.getxattr(fd, name)
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return None
        raise


def _mode_of(st: os.stat_result) -> int | None:
    if stat.S_ISLNK(st.st_mode):
        return MODE_LINK
    if stat.S_ISREG(st.st_mode):
        # git: executable iff the owner may execute (read-cache.c ce_mode_from_stat)
        return MODE_EXEC if st.st_mode & stat.S_IXUSR else MODE_FILE
    return None


def _listdir(dirfd: int) -> list[bytes]:
    # listdir(fd) gives str (surrogateescape); names are bytes here, sorted as bytes
    return sorted(os.fsencode(n) for n in os.listdir(dirfd))


def _lstat(dirfd: int, name: bytes) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


Change = tuple[bytes, "_Entry | None", "_Entry | None"]


class _Walker:
    def __init__(self, lower_root: int, upper_root: int, prefix: str, stats: PatchStats) -> None:
        self.lower_root = lower_root
        self.upper_root = upper_root
        self.prefix = prefix
        self.stats = stats
        self.changes: list[Change] = []

    def skip(self, path: bytes, why: str) -> None:
        self.stats.skipped.append((path.decode(errors="backslashreplace"), why))

    def is_whiteout(self, dirfd: int, name: bytes, st: os.stat_result) -> bool:
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
            return True
        if stat.S_ISREG(st.st_mode) and st.st_size == 0:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dirfd)
            try:
                return _xattr(fd, self.prefix + "whiteout") is not None
            finally:
                os.close(fd)
        return False

    def check_metacopy(self, dirfd: int, name: bytes, path: bytes) -> None:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dirfd)
        try:
            if _xattr(fd, self.prefix + "metacopy") is not None:
                raise UnsupportedOverlay(
                    f"{path.decode(errors='replace')} is a metadata-only copy (metacopy); "
                    "mount the workspace overlay with metacopy=off"
                )
        finally:
            os.close(fd)

    def delete_lower(self, dirfd: int, name: bytes, path: bytes, st: os.stat_result) -> None:
        """Record the deletion of LOWER's entry `name` (a whole subtree if a dir)."""
        if name == b".git":
            self.skip(path, "git's own state is not part of the patch")
            return
        mode = _mode_of(st)
        if mode is not None:
            self.changes.append((path, _Entry(self.lower_root, path, mode, st.st_size), None))
            return
        if not stat.S_ISDIR(st.st_mode):
            return  # a special file in the lower copy: nothing git can delete
        fd = os.open(name, _DIR_FLAGS, dir_fd=dirfd)
        try:
            for child in _listdir(fd):
                cst = _lstat(fd, child)
                if cst is not None:
                    self.delete_lower(fd, child, path + b"/" + child, cst)
        finally:
            os.close(fd)

    def walk(self, rel: bytes, ufd: int, lfd: int | None, opaque: bool) -> None:
        unames = _listdir(ufd)
        if opaque and lfd is not None:
            present = set(unames)
            for name in _listdir(lfd):
                if name not in present:
                    lst = _lstat(lfd, name)
                    if lst is not None:
                        self.delete_lower(lfd, name, rel + name, lst)
        for name in unames:
            path = rel + name
            ust = os.stat(name, dir_fd=ufd, follow_symlinks=False)
            if name == b".git":
                self.skip(path, "git's own state is not part of the patch")
                continue
            lst = _lstat(lfd, name) if lfd is not None else None
            if self.is_whiteout(ufd, name, ust):
                if lst is not None:
                    self.delete_lower(lfd, name, path, lst)  # type: ignore[arg-type]
                continue
            if stat.S_ISDIR(ust.st_mode):
                self.walk_dir(path, ufd, name, lfd, lst, opaque)
                continue
            mode = _mode_of(ust)
            if mode is None:
                self.skip(path, "special files (fifo, socket, device) cannot be in a patch")
                continue
            if mode != MODE_LINK:
                self.check_metacopy(ufd, name, path)
            new = _Entry(self.upper_root, path, mode, ust.st_size)
            old: _Entry | None = None
            if lst is not None:
                assert lfd is not None
                lmode = _mode_of(lst)
                if lmode is not None:
                    old = _Entry(self.lower_root, path, lmode, lst.st_size)
                elif stat.S_ISDIR(lst.st_mode):
                    self.delete_lower(lfd, name, path, lst)
            self.changes.append((path, old, new))

    def walk_dir(self, path: bytes, ufd: int, name: bytes, lfd: int | None,
                 lst: os.stat_result | None, opaque: bool) -> None:
        sub_ufd = os.open(name, _DIR_FLAGS, dir_fd=ufd)
        sub_lfd: int | None = None
        try:
            if _xattr(sub_ufd, self.prefix + "redirect") is not None:
                raise UnsupportedOverlay(
                    f"{path.decode(errors='replace')} is a redirected (renamed) directory; "
                    "mount the workspace overlay with redirect_dir=off"
                )
            sub_opaque = opaque or _xattr(sub_ufd, self.prefix + "opaque") == b"y"
            if lst is not None and lfd is not None:
                if stat.S_ISDIR(lst.st_mode):
                    sub_lfd = os.open(name, _DIR_FLAGS, dir_fd=lfd)
                else:
                    self.delete_lower(lfd, name, path, lst)
            self.walk(path + b"/", sub_ufd, sub_lfd, sub_opaque)
        finally:
            os.close(sub_ufd)
            if sub_lfd is not None:
                os.close(sub_lfd)


# --- writing the patch ------------------------------------------------------


class _Out:
    def __init__(self, out: BinaryIO, max_bytes: int, stats: PatchStats) -> None:
        self.out = out
        self.max_bytes = max_bytes
        self.stats = stats

    def write(self, data: bytes) -> None:
        if self.stats.bytes + len(data) > self.max_bytes:
            raise PatchTooLarge(f"the patch is larger than the limit of {self.max_bytes} bytes")
        self.out.write(data)
        self.stats.bytes += len(data)


def _is_binary(content: bytes) -> bool:
    return b"\x00" in content


def _base85_lines(data: bytes) -> Iterator[bytes]:
    """Git's binary-patch lines: a length letter, then base85 of <= 52 bytes.

    Length letter: 'A'..'Z' for 1..26 bytes, 'a'..'z' for 27..52 (apply.c).
    base64.b85encode uses the same alphabet as git's base85.c (RFC 1924).
    """
    for i in range(0, len(data), _BINARY_LINE):
        chunk = data[i : i + _BINARY_LINE]
        n = len(chunk)
        letter = chr(ord("A") + n - 1) if n <= 26 else chr(ord("a") + n - 27)
        yield letter.encode() + base64.b85encode(chunk, pad=True) + b"\n"


def _literal(content: bytes) -> Iterator[bytes]:
    yield b"literal %d\n" % len(content)
    yield from _base85_lines(zlib.compress(content))
    yield b"\n"


def _hunks(a: list[bytes], b: list[bytes]) -> Iterator[bytes]:
    if len(a) > _DIFFLIB_MAX_LINES or len(b) > _DIFFLIB_MAX_LINES or not a or not b:
        groups = [[("replace", 0, len(a), 0, len(b))]]
    else:
        groups = [list(g) for g in
                  difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(_CONTEXT)]
    for group in groups:
        i1, i2 = group[0][1], group[-1][2]
        j1, j2 = group[0][3], group[-1][4]
        yield b"@@ -" + _range(i1, i2 - i1) + b" +" + _range(j1, j2 - j1) + b" @@\n"
        for tag, ai1, ai2, bj1, bj2 in group:
            if tag == "equal":
                for line in a[ai1:ai2]:
                    yield from _line(b" ", line)
                continue
            for line in a[ai1:ai2]:
                yield from _line(b"-", line)
            for line in b[bj1:bj2]:
                yield from _line(b"+", line)


def _lines(data: bytes) -> list[bytes]:
    """Lines as git counts them: ended by LF only (a CR is content)."""
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def _range(start: int, count: int) -> bytes:
    # unified diff: an empty range names the line before it; ",1" is implied
    first = start if count == 0 else start + 1
    return b"%d" % first if count == 1 else b"%d,%d" % (first, count)


def _line(prefix: bytes, line: bytes) -> Iterator[bytes]:
    yield prefix + line
    if not line.endswith(b"\n"):
        yield b"\n\\ No newline at end of file\n"


def _names(path: bytes) -> tuple[bytes, bytes]:
    return quote_path(b"a/" + path), quote_path(b"b/" + path)


def _section(out: _Out, path: bytes, old: tuple[int, bytes] | None,
             new: tuple[int, bytes] | None) -> None:
    """One `diff --git` section; `old`/`new` are (mode, content) or None."""
    qa, qb = _names(path)
    out.write(b"diff --git " + qa + b" " + qb + b"\n")
    old_oid = git_blob_sha1(old[1]) if old else ZERO_OID
    new_oid = git_blob_sha1(new[1]) if new else ZERO_OID
    if old is None:
        assert new is not None
        out.write(b"new file mode %o\n" % new[0])
        out.write(f"index {old_oid}..{new_oid}\n".encode())
    elif new is None:
        out.write(b"deleted file mode %o\n" % old[0])
        out.write(f"index {old_oid}..{new_oid}\n".encode())
    else:
        if old[0] != new[0]:
            out.write(b"old mode %o\nnew mode %o\n" % (old[0], new[0]))
            if old[1] != new[1]:
                out.write(f"index {old_oid}..{new_oid}\n".encode())
        elif old[1] != new[1]:
            out.write(f"index {old_oid}..{new_oid} {new[0]:o}\n".encode())
    a = old[1] if old else b""
    b = new[1] if new else b""
    if a == b:
        return
    if _is_binary(a) or _is_binary(b):
        out.write(b"GIT binary patch\n")
        for chunk in _literal(b):
            out.write(chunk)
        return
    tab_a = b"\t" if b" " in path else b""
    out.write(b"--- " + (qa + tab_a if old else b"/dev/null") + b"\n")
    out.write(b"+++ " + (qb + tab_a if new else b"/dev/null") + b"\n")
    for chunk in _hunks(_lines(a), _lines(b)):
        out.write(chunk)


def write_patch(lower: Path, upper: Path, out: BinaryIO, *, max_bytes: int,
                xattr_prefix: str = "trusted.overlay.") -> PatchStats:
    """Write the git-format patch that turns `lower` into `overlay(lower, upper)`.

    `xattr_prefix` is `user.overlay.` for an overlay mounted with `userxattr`.
    Raises `PatchTooLarge` past `max_bytes`, `UnsupportedOverlay` for layers
    using redirects or metacopy, `DiffError` when a file changes under it.
    """
    stats = PatchStats()
    lroot = os.open(lower, _DIR_FLAGS)
    try:
        uroot = os.open(upper, _DIR_FLAGS)
        try:
            walker = _Walker(lroot, uroot, xattr_prefix, stats)
            opaque = _xattr(uroot, xattr_prefix + "opaque") == b"y"
            walker.walk(b"", uroot, lroot, opaque)
            sink = _Out(out, max_bytes, stats)
            for path, old, new in sorted(walker.changes, key=lambda c: c[0]):
                _emit(sink, stats, path, old, new, max_bytes)
        finally:
            os.close(uroot)
    finally:
        os.close(lroot)
    return stats


def _emit(out: _Out, stats: PatchStats, path: bytes, old: _Entry | None,
          new: _Entry | None, limit: int) -> None:
    o = (old.mode, _read(old, limit)) if old else None
    n = (new.mode, _read(new, limit)) if new else None
    if o == n:
        return  # copied up but unchanged (e.g. touched, or changed back)
    if o is not None and n is not None and (o[0] == MODE_LINK) != (n[0] == MODE_LINK):
        # a type change is a deletion and a creation, as git writes it
        _section(out, path, o, None)
        _section(out, path, None, n)
        stats.deleted += 1
        stats.added += 1
        return
    _section(out, path, o, n)
    if o is None:
        stats.added += 1
    elif n is None:
        stats.deleted += 1
    else:
        stats.modified += 1
