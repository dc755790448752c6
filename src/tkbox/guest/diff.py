"""The workspace patch, computed in the guest from the overlayfs upper layer alone.

`/workspace` is `overlay(lowerdir=LOWER, upperdir=UPPER)`. Every change the box
made lives in UPPER, so the patch is computed by walking UPPER only; LOWER is
read just for the old contents and modes of the paths UPPER names (and, below
a whiteout or an opaque directory, for the list of what was deleted).

One idea: one pass over UPPER that decides, for each change, whether it goes in
the patch or is set apart, and streams it; the walk, the budget and the rendering
share that pass (splitting them would mean walking UPPER twice or passing its state).

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
does. Files whose final content, mode and link target equal LOWER's are
omitted, compared a chunk at a time (a file copied up unchanged, by `chown -R`
say, costs neither memory nor a place in the patch). Entries named `.git`
(git's own state, not code) and special files (fifos, sockets, devices) are
skipped and listed in `PatchStats.skipped`.

Nothing one file does costs the rest of the patch. A change is *set apart*
(left out, and listed with its path, size, SHA-256 and why) when the host says
the checkout's git ignores its path (`WHY_IGNORED`: `tkbox apply` would not
write it either), when the file is larger than `max_file` (`WHY_FILE`: the
changes door's own per-file limit), or when the patch would pass `max_bytes`
with it: sections are sized smallest first and the first that does not fit is
set apart, so what is left out is the largest (`WHY_TOTAL`). The kept sections
are then written in path order, each whole, so a patch cut off between two of
them still applies. At most `MAX_LISTED` entries are listed (hashed up to
`MAX_HASHED_BYTES` in all); the rest are counted by reason.

Never follows a symlink: every directory is opened with `O_NOFOLLOW` relative
to its parent's descriptor, every entry is `lstat`ed, every file opened with
`O_NOFOLLOW`.

Standard library only: this module runs inside the VM as part of PID 1. The
git patch writer (hunks from `difflib`, git's quoting and base85 line format)
is written here because no standard-library module writes git patches.

Why one module (about 700 lines): the upper-layer walk, the decision of what
is set apart and the patch writer share one private record of each change
(path, old and new mode and content), and the writer must agree byte for byte
with `tkbox.doors.changes.patch`, which reads what this writes.
"""

from __future__ import annotations

import base64
import difflib
import errno
import hashlib
import os
import stat
import zlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

# the `apart` event's vocabulary (the RPC's, `tkbox.guest.rpc`), re-exported here
from tkbox.guest.rpc import CHANGES, WHY, WHY_FILE, WHY_IGNORED, WHY_TOTAL

__all__ = [
    "CHANGES",
    "WHY",
    "DiffError",
    "PatchLimits",
    "PatchStats",
    "PatchTooLarge",
    "SetApart",
    "UnsupportedOverlay",
    "WorkspaceDiff",
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
_COMPARE_CHUNK = 1 << 20
#: sections kept in memory between sizing them and writing them (the rest are
#: rendered again: the guest has stopped every process, so they come out the same)
_CACHE_BYTES = 64 << 20
MAX_LISTED = 1000  # set-apart changes listed one by one; the rest are counted
MAX_HASHED_BYTES = 4 << 30  # content hashed for the listed entries, in all

_BINARY_LINE = 52  # bytes per base85 line, as git writes them

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class DiffError(Exception):
    """The workspace could not be turned into a patch (the RPC layer maps it)."""


class PatchTooLarge(DiffError):
    """A file is larger than the limit it is read with."""


class UnsupportedOverlay(DiffError):
    """The upper layer uses an overlayfs feature this module does not read."""


@dataclass(frozen=True)
class SetApart:
    """A change the patch does not carry, and why (one of `WHY`)."""

    path: bytes
    change: str  # added, modified, deleted
    size: int  # of the new content (of the old, for a deletion)
    sha256: str  # of that content; "" past MAX_HASHED_BYTES
    why: str


@dataclass
class PatchStats:
    """What `write_patch` wrote, and what it set apart."""

    added: int = 0
    modified: int = 0
    deleted: int = 0
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    set_apart: list[SetApart] = field(default_factory=list)  # the listed ones
    apart: dict[str, list[int]] = field(default_factory=dict)  # why -> [count, bytes]

    @property
    def files(self) -> int:
        return self.added + self.modified + self.deleted

    def count_apart(self, why: str, size: int) -> None:
        n = self.apart.setdefault(why, [0, 0])
        n[0] += 1
        n[1] += size

    def to_dict(self) -> dict[str, int]:
        """The counts, flat (the `end` frame of the `diff` RPC)."""
        out = {"added": self.added, "modified": self.modified, "deleted": self.deleted,
               "bytes": self.bytes, "skipped": len(self.skipped)}
        for why, (count, size) in self.apart.items():
            out[f"apart_{why}"] = count
            out[f"apart_{why}_bytes"] = size
        return out


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


def _section(out: _Buf, path: bytes, old: tuple[int, bytes] | None,
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


def section(path: bytes, old: tuple[int, bytes] | None,
            new: tuple[int, bytes] | None) -> bytes:
    """One path's `diff --git` section as `WorkspaceDiff` writes it; `old`/`new` are
    (mode, content) or None (for `tkbox.guest.testing`'s fake, which has no disks)."""
    out = _Buf()
    _section(out, path, old, new)
    return out.getvalue()


# --- deciding what the patch carries ---------------------------------------------


class _Buf:
    """A section rendered into memory (its size decides whether it fits the patch)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> None:
        self.parts.append(data)
        self.size += len(data)

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


@dataclass
class _Unit:
    """One path's change: one section, or two for a type change (file <-> symlink)."""

    path: bytes
    old: _Entry | None
    new: _Entry | None

    @property
    def change(self) -> str:
        return "added" if self.old is None else "deleted" if self.new is None else "modified"

    @property
    def size(self) -> int:
        """The larger side: what the per-file limit is checked against."""
        return max(self.old.size if self.old else 0, self.new.size if self.new else 0)

    @property
    def shown(self) -> _Entry:
        """The content named in a set-apart entry: the new one, or the deleted one."""
        e = self.new or self.old
        assert e is not None
        return e


@dataclass(frozen=True)
class PatchLimits:
    """What the changes door reads of one patch (`tkbox.doors.changes.patch.Limits`,
    checked equal by a test): a patch past any of them would be refused whole."""

    size: int = 256 << 20  # bytes of the patch
    sections: int = 100_000
    lines: int = 2_000_000
    binary_bytes: int = 512 << 20  # binary literals' content, decoded
    content_bytes: int = 1 << 30  # old and new contents together


@dataclass(frozen=True)
class _Cost:
    size: int = 0
    sections: int = 0
    lines: int = 0
    binary_bytes: int = 0
    content_bytes: int = 0

    @classmethod
    def of(cls, u: _Unit, section: bytes) -> _Cost:
        old = u.old.size if u.old else 0
        new = u.new.size if u.new else 0
        binary = b"\nGIT binary patch\n" in section
        # a section starts each line that begins "diff --git " (a hunk's lines begin
        # with " ", "+", "-" or "\\", a binary literal's with its length letter)
        sections = section.count(b"\ndiff --git ") + section.startswith(b"diff --git ")
        return cls(len(section), sections, section.count(b"\n"),
                   new if binary else 0, old + new)

    def __add__(self, other: _Cost) -> _Cost:
        return _Cost(self.size + other.size, self.sections + other.sections,
                     self.lines + other.lines, self.binary_bytes + other.binary_bytes,
                     self.content_bytes + other.content_bytes)

    def within(self, limits: PatchLimits) -> bool:
        return (self.size <= limits.size and self.sections <= limits.sections
                and self.lines <= limits.lines and self.binary_bytes <= limits.binary_bytes
                and self.content_bytes <= limits.content_bytes)


class _FileTooLarge(Exception):
    """A file is (or grew) past the per-file limit while it was read."""


def _read_bounded(entry: _Entry, limit: int) -> bytes:
    try:
        return _read(entry, limit)
    except PatchTooLarge:
        raise _FileTooLarge() from None


def _render(unit: _Unit, limit: int) -> bytes:
    """The unit's section(s); raises `_FileTooLarge` past `limit` bytes of a file."""
    o = (unit.old.mode, _read_bounded(unit.old, limit)) if unit.old else None
    n = (unit.new.mode, _read_bounded(unit.new, limit)) if unit.new else None
    buf = _Buf()
    if o is not None and n is not None and (o[0] == MODE_LINK) != (n[0] == MODE_LINK):
        # a type change is a deletion and a creation, as git writes it
        _section(buf, unit.path, o, None)
        _section(buf, unit.path, None, n)
    else:
        _section(buf, unit.path, o, n)
    return buf.getvalue()


def _same(old: _Entry, new: _Entry) -> bool:
    """Equal mode and content, compared a chunk at a time (a copied-up file of any size
    costs no memory: `chown`, `touch` or an open for writing copy a file up unchanged)."""
    if old.mode != new.mode or old.size != new.size:
        return False
    if old.mode == MODE_LINK:
        return _read(old, 1 << 16) == _read(new, 1 << 16)
    fds: list[int] = []
    try:
        for e in (old, new):
            pfd, name = _open_parent(e.root, e.path)
            try:
                fds.append(os.open(name, _FILE_FLAGS, dir_fd=pfd))
            finally:
                os.close(pfd)
        while True:
            a = os.read(fds[0], _COMPARE_CHUNK)
            b = os.read(fds[1], _COMPARE_CHUNK)
            if a != b:
                return False
            if not a:
                return True
    finally:
        for fd in fds:
            os.close(fd)


def _sha256(entry: _Entry) -> str:
    if entry.mode == MODE_LINK:
        return hashlib.sha256(_read(entry, 1 << 16)).hexdigest()
    pfd, name = _open_parent(entry.root, entry.path)
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=pfd)
    finally:
        os.close(pfd)
    try:
        h = hashlib.sha256()
        while chunk := os.read(fd, _COMPARE_CHUNK):
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


class WorkspaceDiff:
    """The patch of `overlay(lower, upper)`, in three steps the guest agent interleaves
    with questions to the host:

    1. `changes()`: walk the upper layer; the paths whose content, mode or link target
       differ from the lower layer's (a file merely copied up is not a change);
    2. `plan(ignored)`: set apart what the patch will not carry (the paths the host says
       the checkout's git ignores; files past `max_file`; then, while the sections left
       exceed `max_bytes`, the largest of them), and say which;
    3. `sections()`: the kept changes' sections, in path order, one unit at a time.

    A context manager: it holds the two layers' directory descriptors.
    """

    def __init__(self, lower: Path, upper: Path, *, max_bytes: int, max_file: int,
                 xattr_prefix: str = "trusted.overlay.", max_listed: int = MAX_LISTED,
                 max_hashed: int = MAX_HASHED_BYTES, limits: PatchLimits | None = None) -> None:
        self.lower, self.upper = lower, upper
        self.max_bytes, self.max_file = max_bytes, max_file
        self.limits = replace(limits or PatchLimits(), size=max_bytes)
        self.prefix = xattr_prefix
        self.max_listed, self.max_hashed = max_listed, max_hashed
        self.stats = PatchStats()
        self.units: list[_Unit] = []
        self._kept: list[_Unit] = []
        self._cache: dict[bytes, bytes] = {}
        self._roots: tuple[int, int] | None = None

    def __enter__(self) -> WorkspaceDiff:
        lroot = os.open(self.lower, _DIR_FLAGS)
        try:
            uroot = os.open(self.upper, _DIR_FLAGS)
        except BaseException:
            os.close(lroot)
            raise
        self._roots = (lroot, uroot)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._roots is not None:
            for fd in self._roots:
                os.close(fd)
            self._roots = None

    def changes(self) -> list[bytes]:
        """Step 1: the changed paths, sorted by bytes."""
        assert self._roots is not None, "use WorkspaceDiff as a context manager"
        lroot, uroot = self._roots
        walker = _Walker(lroot, uroot, self.prefix, self.stats)
        walker.walk(b"", uroot, lroot, _xattr(uroot, self.prefix + "opaque") == b"y")
        units: list[_Unit] = []
        for path, old, new in sorted(walker.changes, key=lambda c: c[0]):
            if old is not None and new is not None and _same(old, new):
                continue  # copied up but unchanged (chown, touch, or changed back)
            units.append(_Unit(path, old, new))
        self.units = units
        return [u.path for u in units]

    def plan(self, ignored: Collection[bytes] = ()) -> list[SetApart]:
        """Step 2: decide; the set-apart entries listed (the rest only counted)."""
        ignored = set(ignored)
        apart: list[tuple[_Unit, str]] = []
        candidates: list[_Unit] = []
        for u in self.units:
            if u.path in ignored:
                apart.append((u, WHY_IGNORED))
            elif u.size > self.max_file:
                apart.append((u, WHY_FILE))
            else:
                candidates.append(u)
        # Smallest first: when one of the patch's limits is reached, what is left out
        # is the largest (a one-line fix survives a dataset written beside it).
        used = _Cost()
        cached = 0
        kept: list[_Unit] = []
        for u in sorted(candidates, key=lambda u: (u.size, u.path)):
            try:
                section = _render(u, self.max_file)
            except _FileTooLarge:
                apart.append((u, WHY_FILE))
                continue
            total = used + _Cost.of(u, section)
            if not total.within(self.limits):
                apart.append((u, WHY_TOTAL))
                continue
            used = total
            kept.append(u)
            if cached + len(section) <= _CACHE_BYTES:
                self._cache[u.path] = section
                cached += len(section)
        self._kept = sorted(kept, key=lambda u: u.path)
        return self._list(apart)

    def _list(self, apart: list[tuple[_Unit, str]]) -> list[SetApart]:
        # What a person must hear of first: changes left out for their size (largest
        # first), then what the checkout ignores anyway.
        apart.sort(key=lambda a: (a[1] == WHY_IGNORED, -a[0].shown.size, a[0].path))
        listed: list[SetApart] = []
        hashed = 0
        for u, why in apart:
            e = u.shown
            self.stats.count_apart(why, e.size)
            if len(listed) >= self.max_listed:
                continue
            digest = ""
            if hashed + e.size <= self.max_hashed:
                hashed += e.size
                digest = _sha256(e)
            listed.append(SetApart(u.path, u.change, e.size, digest, why))
        self.stats.set_apart = listed
        return listed

    def sections(self) -> Iterator[bytes]:
        """Step 3: each kept change's section(s), in path order, as whole units."""
        used = 0
        for u in self._kept:
            section = self._cache.pop(u.path, None)
            if section is None:
                try:
                    section = _render(u, self.max_file)
                except _FileTooLarge:
                    raise DiffError(f"{u.path.decode(errors='replace')} changed while "
                                    "the patch was written") from None
            used += len(section)
            if used > self.max_bytes:
                raise DiffError("the workspace changed while the patch was written")
            self._count(u)
            self.stats.bytes += len(section)
            yield section

    def _count(self, u: _Unit) -> None:
        if u.old is not None and u.new is not None and \
                (u.old.mode == MODE_LINK) != (u.new.mode == MODE_LINK):
            self.stats.deleted += 1
            self.stats.added += 1
        elif u.old is None:
            self.stats.added += 1
        elif u.new is None:
            self.stats.deleted += 1
        else:
            self.stats.modified += 1


def write_patch(lower: Path, upper: Path, out: BinaryIO, *, max_bytes: int,
                max_file: int | None = None, ignored: Collection[bytes] = (),
                xattr_prefix: str = "trusted.overlay.") -> PatchStats:
    """Write the git-format patch that turns `lower` into `overlay(lower, upper)`, all
    three steps of `WorkspaceDiff` at once; `stats.set_apart` lists what it left out.

    `xattr_prefix` is `user.overlay.` for an overlay mounted with `userxattr`.
    Raises `UnsupportedOverlay` for layers using redirects or metacopy, `DiffError`
    when a file changes under it.
    """
    with WorkspaceDiff(lower, upper, max_bytes=max_bytes,
                       max_file=max_bytes if max_file is None else max_file,
                       xattr_prefix=xattr_prefix) as d:
        d.changes()
        d.plan(ignored)
        for section in d.sections():
            out.write(section)
        return d.stats
