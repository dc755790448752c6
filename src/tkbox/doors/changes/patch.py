"""A strict parser of the git-format patches the guest writes (pure, no I/O).

Hand-written: no maintained Python library parses git's patch format
(binary literals, C-quoted names, mode lines) strictly enough to be the gate
in front of a user's checkout. It accepts only the canonical form that
`git diff --binary --full-index` and `tkbox.guest.diff` write:

```
patch    := section*                       (nothing before the first section)
section  := "diff --git " A " " B LF       A = quote("a/" P), B = quote("b/" P)
            ( "old mode " M LF "new mode " M LF [index LF]
            | "new file mode " M LF [index LF]
            | "deleted file mode " M LF [index LF]
            | index-with-mode LF )
            [ text | binary ]
index    := "index " H ".." H [" " M]      H: 7..40 lowercase hex, both the same length
text     := "--- " (A [TAB] | "/dev/null") LF "+++ " (B [TAB] | "/dev/null") LF hunk+
hunk     := "@@ -" range " +" range " @@" [" " heading] LF line+
line     := (" " | "-" | "+") bytes LF ["\\ No newline at end of file" LF]
binary   := "GIT binary patch" LF literal [literal]      (forward, optional reverse)
literal  := "literal " N LF base85-line+ LF              (zlib data of exactly N bytes)
M        := "100644" | "100755" | "120000"
```

A TAB ends a `---`/`+++` name exactly when the name holds a space (git writes
it so). Quoting is git's `quote_c_style`; a name is quoted exactly when git
would quote it. Refused with `PatchRefused` naming the line: anything else,
including CR in any line but hunk content, renames and copies, `delta` binary
hunks, `Binary files ... differ` (no data), setuid and other modes,
submodules, a `diff --git` header that disagrees with its `---`/`+++` lines,
hunks that overlap, miscount or name a position inconsistent with the hunks
before them, and every size over `Limits`.

`apply_section` applies one section to the file's old state exactly (no
offsets, no fuzz), checking the blob names on the `index` line; the door then
compares its result with what git builds from the same patch. It holds the old
file as one bytes object and joins the result from ranges of it and the hunks'
lines: the old file, the result and the patch, never an object per line.

One idea: the grammar above, its reader and the exact
applier share one private representation of a section and its hunks; the
applier is only correct for what this reader accepts, so they are read together.
"""

from __future__ import annotations

import hashlib
import operator
import re
import struct
import zlib
from dataclasses import dataclass, field
from itertools import repeat

from tkbox.doors.changes.errors import PatchRefused
from tkbox.doors.changes.paths import check_path, fold_ntfs

MODE_FILE = 0o100644
MODE_EXEC = 0o100755
MODE_LINK = 0o120000
_MODES = {b"100644": MODE_FILE, b"100755": MODE_EXEC, b"120000": MODE_LINK}
_NO_EOL = b"\\ No newline at end of file\n"
_HUNK = re.compile(
    rb"@@ -(0|[1-9][0-9]{0,9})(?:,(0|[02-9]|[1-9][0-9]{1,9}))? "
    rb"\+(0|[1-9][0-9]{0,9})(?:,(0|[02-9]|[1-9][0-9]{1,9}))? @@(?: [^\r\n]*)?\n"
)
_INDEX = re.compile(rb"index ([0-9a-f]{7,40})\.\.([0-9a-f]{7,40})(?: ([0-9]{6}))?\n")
_LITERAL = re.compile(rb"(literal|delta) (0|[1-9][0-9]{0,11})\n")
_RENAME_COPY = (b"rename from ", b"rename to ", b"copy from ", b"copy to ", b"similarity index ",
                b"dissimilarity index ", b"rename old ", b"rename new ")
_BINARY_LINE = 52
# full binary lines decoded together: what they take while decoded (~50 bytes of
# objects for each 4 bytes) stays small however long a literal is
_DECODE_AT_ONCE = 4096


@dataclass(frozen=True)
class Limits:
    """Every size the parser accepts, checked before reading past it."""

    max_patch_bytes: int = 256 << 20
    # lines are what the parse holds in memory (about 100 bytes of objects
    # each, whatever their length), so they are bounded apart from bytes
    max_lines: int = 2_000_000
    max_sections: int = 100_000
    max_hunks: int = 1_000_000  # over the whole patch
    max_file_bytes: int = 64 << 20  # one file's new content (binary literal, text result)
    max_binary_bytes: int = 512 << 20  # all binary literals of the patch, decoded
    # the checkout's old contents and the patch's new ones, held at once
    max_total_bytes: int = 1 << 30


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[tuple[bytes, bytes], ...]  # (b" " | b"-" | b"+", content incl. LF if any)


@dataclass(frozen=True)
class Section:
    """One `diff --git` section: one change to one path."""

    path: str
    raw_path: bytes
    line: int  # line number of its `diff --git` header, from 1
    start: int  # byte offsets of the section in the patch
    end: int
    old_mode: int | None  # None: the section creates the path
    new_mode: int | None  # None: the section deletes the path
    old_oid: str | None = None
    new_oid: str | None = None
    binary: bytes | None = None  # the forward literal's content, for a binary section
    hunks: tuple[Hunk, ...] = ()
    added: int = 0  # lines, as git --numstat counts them
    deleted: int = 0

    @property
    def is_new(self) -> bool:
        return self.old_mode is None

    @property
    def is_delete(self) -> bool:
        return self.new_mode is None

    @property
    def is_binary(self) -> bool:
        return self.binary is not None

    @property
    def where(self) -> str:
        return f"patch line {self.line} ({self.path})"


@dataclass(frozen=True)
class Patch:
    data: bytes
    sha256: str
    sections: tuple[Section, ...] = field(default_factory=tuple)

    def subset(self, keep: list[Section]) -> bytes:
        """The patch made of only these sections, byte for byte as they were."""
        return b"".join(self.data[s.start : s.end] for s in keep)


_NEEDS_QUOTE = re.compile(rb'[\x00-\x1f"\\\x7f-\xff]')  # < 0x20, '"', '\\', >= 0x7f


def quote_path(name: bytes) -> bytes:
    """Git's quote_c_style (core.quotePath on): the only quoting we accept."""
    if _NEEDS_QUOTE.search(name) is None:
        return name
    esc = {7: b"\\a", 8: b"\\b", 9: b"\\t", 10: b"\\n", 11: b"\\v", 12: b"\\f", 13: b"\\r",
           0x22: b'\\"', 0x5C: b"\\\\"}
    out = bytearray(b'"')
    for c in name:
        if c in esc:
            out += esc[c]
        elif c < 0x20 or c >= 0x7F:
            out += b"\\%03o" % c
        else:
            out.append(c)
    return bytes(out + b'"')


_UNESCAPE = {ord("a"): 7, ord("b"): 8, ord("t"): 9, ord("n"): 10, ord("v"): 11, ord("f"): 12,
             ord("r"): 13, ord('"'): 0x22, ord("\\"): 0x5C}


def unquote_path(text: bytes, where: str) -> tuple[bytes, int]:
    """Git's unquote_c_style of a name starting at text[0] == '"'.

    Returns the name and the index just past the closing quote.
    """
    out = bytearray()
    i = 1
    while i < len(text):
        c = text[i]
        if c == 0x22:
            return bytes(out), i + 1
        if c == 0x5C:
            if i + 1 >= len(text):
                break
            e = text[i + 1]
            if e in _UNESCAPE:
                out.append(_UNESCAPE[e])
                i += 2
                continue
            oct3 = text[i + 1 : i + 4]
            if len(oct3) == 3 and oct3[0] in b"0123" and all(d in b"01234567" for d in oct3):
                out.append(int(oct3, 8))
                i += 4
                continue
            raise PatchRefused(f"{where}: bad escape in a quoted name")
        out.append(c)
        i += 1
    raise PatchRefused(f"{where}: unterminated quoted name")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.lineno = 0  # of the last line returned by next()
        self._peeked: tuple[int, bytes | None] = (-1, None)  # (pos, the line there)

    def peek(self) -> bytes | None:
        if self._peeked[0] == self.pos:
            return self._peeked[1]
        if self.pos >= len(self.data):
            line = None
        else:
            end = self.data.find(b"\n", self.pos)
            line = self.data[self.pos : end + 1]
        self._peeked = (self.pos, line)
        return line

    def next(self) -> bytes | None:
        line = self.peek()
        if line is not None:
            self.pos += len(line)
            self.lineno += 1
        return line

    def where(self, ahead: int = 1) -> str:
        return f"patch line {self.lineno + ahead}"


def _show(line: bytes | None) -> str:
    if line is None:
        return "the end of the patch"
    return repr(line[:60].decode("utf-8", errors="backslashreplace"))


def _mode(text: bytes, where: str) -> int:
    mode = _MODES.get(text)
    if mode is None:
        shown = repr(text[:20].decode("utf-8", errors="backslashreplace"))
        raise PatchRefused(
            f"{where}: mode {shown} refused: only 100644, 100755 and 120000 are applied "
            "(no setuid or other bits, no submodules)"
        )
    return mode


def _header_path(rest: bytes, where: str) -> bytes:
    """P from `A B` of `diff --git A B`, checking both name the same path canonically."""
    if rest.startswith(b'"'):
        a, end = unquote_path(rest, where)
    else:
        n = (len(rest) - 5) // 2
        if n < 1 or len(rest) != 2 * n + 5:
            raise PatchRefused(f"{where}: cannot read the two names of the 'diff --git' header")
        a = rest[: n + 2]
    if not a.startswith(b"a/"):
        raise PatchRefused(f"{where}: the old name must start with 'a/'")
    path = a[2:]
    if rest != quote_path(b"a/" + path) + b" " + quote_path(b"b/" + path):
        raise PatchRefused(
            f"{where}: the 'diff --git' header names two different paths (a rename or copy?) "
            "or is not quoted as git quotes it"
        )
    return path


def _file_name(prefix: bytes, raw: bytes) -> bytes:
    return quote_path(prefix + raw) + (b"\t" if b" " in raw else b"")


def _refuse_unexpected(line: bytes | None, where: str) -> PatchRefused:
    if line is not None and line.startswith(_RENAME_COPY):
        return PatchRefused(f"{where}: rename and copy sections are refused; "
                            "a patch must name each file it changes")
    if line is not None and line.startswith(b"Binary files "):
        return PatchRefused(f"{where}: a binary change without its data; "
                            "the patch must be written with --binary")
    if line is not None and b"\r" in line:
        return PatchRefused(f"{where}: CR in a patch header line (CRLF line endings?)")
    return PatchRefused(f"{where}: unexpected {_show(line)}")


def parse_patch(data: bytes, limits: Limits | None = None) -> Patch:
    """Parse `data` completely, or raise PatchRefused naming the first fault."""
    limits = limits or Limits()
    if len(data) > limits.max_patch_bytes:
        raise PatchRefused(
            f"the patch is {len(data)} bytes, more than the limit of {limits.max_patch_bytes}; "
            "apply it in parts or raise the limit"
        )
    if data and not data.endswith(b"\n"):
        raise PatchRefused("the patch does not end with a newline (truncated?)")
    lines = data.count(b"\n")
    if lines > limits.max_lines:
        raise PatchRefused(
            f"the patch has {lines} lines, more than the limit of {limits.max_lines}; "
            "apply it in parts or raise the limit"
        )
    r = _Reader(data)
    sections: list[Section] = []
    budget = _Budget(limits)
    while r.peek() is not None:
        if not r.peek().startswith(b"diff --git "):  # type: ignore[union-attr]
            raise PatchRefused(f"{r.where()}: expected 'diff --git', found {_show(r.peek())}")
        if len(sections) >= limits.max_sections:
            raise PatchRefused(f"the patch has more than {limits.max_sections} sections")
        sections.append(_section(r, budget))
    _check_duplicates(sections)
    return Patch(data, hashlib.sha256(data).hexdigest(), tuple(sections))


@dataclass
class _Budget:
    limits: Limits
    hunks: int = 0
    binary: int = 0


def _section(r: _Reader, budget: _Budget) -> Section:
    start = r.pos
    header = r.next()
    assert header is not None
    line = r.lineno
    where = f"patch line {line}"
    rest = header[len(b"diff --git ") : -1]
    if b"\r" in rest:
        raise PatchRefused(f"{where}: CR in a patch header line (CRLF line endings?)")
    raw = _header_path(rest, where)
    path = check_path(raw, where)
    where = f"{where} ({path})"

    old_mode: int | None = None
    new_mode: int | None = None
    mode_lines = False
    nxt = r.peek()
    if nxt is not None and nxt.startswith(b"old mode "):
        r.next()
        old_mode = _mode(nxt[9:-1], r.where(0))
        nxt2 = r.next()
        if nxt2 is None or not nxt2.startswith(b"new mode "):
            raise _refuse_unexpected(nxt2, r.where(0))
        new_mode = _mode(nxt2[9:-1], r.where(0))
        if old_mode == new_mode:
            raise PatchRefused(f"{where}: 'old mode' and 'new mode' are the same")
        if (old_mode == MODE_LINK) != (new_mode == MODE_LINK):
            raise PatchRefused(f"{where}: a type change must be a deletion and a creation")
        mode_lines = True
    elif nxt is not None and nxt.startswith(b"new file mode "):
        r.next()
        new_mode = _mode(nxt[14:-1], r.where(0))
    elif nxt is not None and nxt.startswith(b"deleted file mode "):
        r.next()
        old_mode = _mode(nxt[18:-1], r.where(0))

    old_oid: str | None = None
    new_oid: str | None = None
    nxt = r.peek()
    if nxt is not None and nxt.startswith(b"index "):
        r.next()
        m = _INDEX.fullmatch(nxt)
        if m is None or len(m[1]) != len(m[2]):
            raise PatchRefused(f"{r.where(0)}: malformed 'index' line")
        old_oid, new_oid = m[1].decode(), m[2].decode()
        plain = not mode_lines and old_mode is None and new_mode is None
        if m[3] is not None:
            if not plain:
                raise PatchRefused(f"{r.where(0)}: a mode on the 'index' line of this section")
            old_mode = new_mode = _mode(m[3], r.where(0))
        elif plain:
            raise PatchRefused(f"{r.where(0)}: the 'index' line lacks the file's mode")
        if old_mode is None and set(old_oid) != {"0"}:
            raise PatchRefused(f"{r.where(0)}: a new file must have an all-zero old blob")
        if new_mode is None and set(new_oid) != {"0"}:
            raise PatchRefused(f"{r.where(0)}: a deletion must have an all-zero new blob")
    if old_mode is None and new_mode is None:
        raise _refuse_unexpected(r.peek(), r.where())

    nxt = r.peek()
    binary: bytes | None = None
    hunks: tuple[Hunk, ...] = ()
    added = deleted = 0
    if nxt == b"GIT binary patch\n":
        r.next()
        if old_oid is None or len(old_oid) != 40:
            raise PatchRefused(f"{where}: a binary section needs a full 'index' line")
        binary = _binary(r, budget, where, old_oid)
    elif nxt is not None and nxt.startswith(b"--- "):
        hunks, added, deleted = _text(r, budget, raw, old_mode, new_mode, where)
    elif nxt is not None and not nxt.startswith(b"diff --git "):
        raise _refuse_unexpected(nxt, r.where())
    elif old_oid is not None and old_mode is not None and new_mode is not None:
        raise PatchRefused(f"{where}: an 'index' line with no change below it")
    if old_mode is not None and new_mode is not None and not mode_lines and not hunks \
            and binary is None:
        raise PatchRefused(f"{where}: the section changes nothing")
    return Section(path=path, raw_path=raw, line=line, start=start, end=r.pos,
                   old_mode=old_mode, new_mode=new_mode, old_oid=old_oid, new_oid=new_oid,
                   binary=binary, hunks=hunks, added=added, deleted=deleted)


def _text(r: _Reader, budget: _Budget, raw: bytes, old_mode: int | None,
          new_mode: int | None, where: str) -> tuple[tuple[Hunk, ...], int, int]:
    minus = r.next()
    want = b"--- " + (_file_name(b"a/", raw) if old_mode is not None else b"/dev/null") + b"\n"
    if minus != want:
        raise PatchRefused(
            f"{r.where(0)}: the '---' line does not match the 'diff --git' header "
            f"(expected {_show(want)}, found {_show(minus)})"
        )
    plus = r.next()
    want = b"+++ " + (_file_name(b"b/", raw) if new_mode is not None else b"/dev/null") + b"\n"
    if plus != want:
        raise PatchRefused(
            f"{r.where(0)}: the '+++' line does not match the 'diff --git' header "
            f"(expected {_show(want)}, found {_show(plus)})"
        )
    hunks: list[Hunk] = []
    added = deleted = 0
    old_end = 0  # lines of the old file consumed by earlier hunks
    delta = 0  # new - old lines so far
    old_eof = new_eof = False
    while (nxt := r.peek()) is not None and nxt.startswith(b"@@"):
        budget.hunks += 1
        if budget.hunks > budget.limits.max_hunks:
            raise PatchRefused(f"the patch has more than {budget.limits.max_hunks} hunks")
        if old_eof or new_eof:
            raise PatchRefused(f"{r.where()}: a hunk after the end of the file")
        r.next()
        m = _HUNK.fullmatch(nxt)
        if m is None:
            raise PatchRefused(f"{r.where(0)}: malformed hunk header {_show(nxt)}")
        os_, oc = int(m[1]), 1 if m[2] is None else int(m[2])
        ns, nc = int(m[3]), 1 if m[4] is None else int(m[4])
        # unified diff: a range of 0 lines names the line before it
        pos = os_ - 1 if oc else os_
        if pos < old_end or (oc and os_ == 0) or (old_mode is None and (os_, oc) != (0, 0)) \
                or (new_mode is None and (ns, nc) != (0, 0)):
            raise PatchRefused(f"{r.where(0)}: hunk position out of order or impossible")
        if ns != (pos + delta + 1 if nc else pos + delta):
            raise PatchRefused(f"{r.where(0)}: hunk's new position disagrees with the hunks "
                               "before it")
        lines: list[tuple[bytes, bytes]] = []
        o = n = 0
        # The hunk's body, read as `r.next()` would, on local variables (the hot loop
        # of a big patch); `r` is brought up to date whatever happens.
        data, at, lineno, size = r.data, r.pos, r.lineno, len(r.data)
        try:
            while o < oc or n < nc:
                body: bytes | None = None
                if at < size:  # parse_patch: the data ends with a newline
                    end = data.find(b"\n", at) + 1
                    body, at, lineno = data[at:end], end, lineno + 1
                if body is None or body[:1] not in (b" ", b"-", b"+"):
                    raise PatchRefused(f"patch line {lineno}: hunk ends early, "
                                       f"found {_show(body)}")
                tag, content = body[:1], body[1:]
                if old_eof and tag != b"+" or new_eof and tag != b"-":
                    raise PatchRefused(f"patch line {lineno}: a line after "
                                       "'No newline at end of file'")
                if tag == b"+":
                    n += 1
                    added += 1
                elif tag == b"-":
                    o += 1
                    deleted += 1
                else:
                    o += 1
                    n += 1
                if o > oc or n > nc:
                    raise PatchRefused(f"patch line {lineno}: more lines than the hunk header "
                                       "counts")
                if data.startswith(_NO_EOL, at):  # the next line is exactly _NO_EOL
                    at, lineno = at + len(_NO_EOL), lineno + 1
                    content = content[:-1]
                    old_eof = old_eof or tag != b"+"
                    new_eof = new_eof or tag != b"-"
                lines.append((tag, content))
        finally:
            r.pos, r.lineno = at, lineno
        hunks.append(Hunk(os_, oc, ns, nc, tuple(lines)))
        old_end = pos + oc
        delta += nc - oc
    if not hunks:
        raise PatchRefused(f"{r.where()}: '---'/'+++' lines with no hunk")
    nxt = r.peek()
    if nxt is not None and not nxt.startswith(b"diff --git "):
        raise _refuse_unexpected(nxt, r.where())
    return tuple(hunks), added, deleted


def _binary(r: _Reader, budget: _Budget, where: str, old_oid: str) -> bytes:
    forward = _literal(r, budget, where)
    nxt = r.peek()
    if nxt is not None and (nxt.startswith(b"literal ") or nxt.startswith(b"delta ")):
        _literal(r, budget, where)  # the reverse hunk: checked, not used
    nxt = r.peek()
    if nxt is not None and not nxt.startswith(b"diff --git "):
        raise _refuse_unexpected(nxt, r.where())
    return forward


#: git's base85 alphabet (base85.c; RFC 1924's, as `base64.b85encode` uses)
_B85 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
_B85_VALUE = bytes(_B85.find(bytes([c])) % 256 for c in range(256))  # 255: not base85


def _b85decode(text: bytes) -> bytes:
    """`base64.b85decode` of whole groups of five, ValueError where it raises one.

    The standard library's is a loop in Python over each character: dropping it
    took parsing the benchmark's patch (55 binary files) from 65 to 45-51 ms.
    Here each step is one loop in C over all the groups: the characters' values
    by `bytes.translate`, then d0·85⁴ + d1·85³ + d2·85² + d3·85 + d4 for every
    group at once, refused if any is not below 2³². (A test compares the two on
    valid and broken text.)"""
    if len(text) % 5:
        raise ValueError("base85 text is not whole groups of five")
    v = text.translate(_B85_VALUE)
    if 255 in v:
        raise ValueError("a character that is not base85")
    mul, add = operator.mul, operator.add
    words = map(mul, v[0::5], repeat(85**4))
    for k, weight in ((1, 85**3), (2, 85**2), (3, 85)):
        words = map(add, words, map(mul, v[k::5], repeat(weight)))
    values = list(map(add, words, v[4::5]))
    if values and max(values) > 0xFFFFFFFF:
        raise ValueError("a base85 group beyond 32 bits")
    return struct.pack(f">{len(values)}I", *values)


def _literal(r: _Reader, budget: _Budget, where: str) -> bytes:
    head = r.next()
    m = _LITERAL.fullmatch(head or b"")
    if m is None:
        raise PatchRefused(f"{r.where(0)}: expected 'literal N', found {_show(head)}")
    if m[1] == b"delta":
        raise PatchRefused(f"{r.where(0)}: 'delta' binary hunks are refused; "
                           "only 'literal' ones are applied")
    size = int(m[2])
    limits = budget.limits
    if size > limits.max_file_bytes:
        raise PatchRefused(f"{where}: a binary file of {size} bytes, more than the limit of "
                           f"{limits.max_file_bytes}")
    budget.binary += size
    if budget.binary > limits.max_binary_bytes:
        raise PatchRefused(f"the patch's binary files exceed {limits.max_binary_bytes} bytes")
    compressed = bytearray()
    # Full lines are decoded together, up to _DECODE_AT_ONCE (base85 decodes each 5
    # characters on their own, and a full line has no padding); each batch is
    # decoded before any later refusal, so the first bad line is still the one named.
    full: list[tuple[int, bytes]] = []  # (line number, base85 text) not yet decoded

    def decode_full() -> None:
        if not full:
            return
        try:
            compressed.extend(_b85decode(b"".join(text for _, text in full)))
        except ValueError:
            for lineno, text in full:
                try:
                    _b85decode(text)
                except ValueError:
                    raise PatchRefused(f"patch line {lineno}: bad base85 data") from None
            raise PatchRefused(f"{r.where(0)}: bad base85 data") from None
        full.clear()

    def refuse(why: str) -> PatchRefused:
        decode_full()
        return PatchRefused(why)

    last = False
    while True:
        line = r.next()
        if line is None:
            raise refuse(f"{where}: binary data ends early")
        if line == b"\n":
            break
        if last:
            raise refuse(f"{r.where(0)}: a short binary line before the last")
        c = line[0]
        if 0x41 <= c <= 0x5A:
            k = c - 0x41 + 1
        elif 0x61 <= c <= 0x7A:
            k = c - 0x61 + 27
        else:
            raise refuse(f"{r.where(0)}: bad binary line length letter")
        groups = (k + 3) // 4
        if len(line) != 2 + 5 * groups:
            raise refuse(f"{r.where(0)}: binary line of the wrong length")
        if k == _BINARY_LINE:
            full.append((r.lineno, line[1:-1]))
            if len(full) == _DECODE_AT_ONCE:
                decode_full()
            continue
        decode_full()
        try:
            chunk = _b85decode(line[1:-1])
        except ValueError:
            raise PatchRefused(f"{r.where(0)}: bad base85 data") from None
        if any(chunk[k:]):
            raise PatchRefused(f"{r.where(0)}: non-zero padding in binary data")
        compressed += chunk[:k]
        last = True
    decode_full()
    d = zlib.decompressobj()
    try:
        out = d.decompress(compressed, size + 1)
    except zlib.error:
        raise PatchRefused(f"{where}: binary data does not inflate") from None
    if len(out) != size or not d.eof or d.unused_data or d.unconsumed_tail:
        raise PatchRefused(f"{where}: binary data does not inflate to {size} bytes")
    return out


def _check_duplicates(sections: list[Section]) -> None:
    seen: dict[tuple[str, ...], Section] = {}
    for i, s in enumerate(sections):
        key = tuple(fold_ntfs(p) for p in s.path.split("/"))
        prev = seen.get(key)
        if prev is not None:
            pair = (prev is sections[i - 1] and prev.path == s.path and prev.is_delete
                    and s.is_new)
            if not pair:
                raise PatchRefused(
                    f"{s.where}: the path appears twice in the patch, or two paths a "
                    f"case-insensitive filesystem would take for one ({prev.path!r})"
                )
        seen[key] = s


# --- applying one section to bytes ------------------------------------------


def git_blob_sha1(content: bytes) -> str:
    """Git's object name of a blob: SHA-1("blob <len>\\0" + content)."""
    h = hashlib.sha1(b"blob %d\x00" % len(content), usedforsecurity=False)
    h.update(content)
    return h.hexdigest()


def apply_section(s: Section, old: bytes | None, max_bytes: int) -> bytes | None:
    """The content after `s`, given the content before it (None: absent).

    Exact: every hunk at its stated position, every context and removed line
    equal to the old file's, the blob names on the `index` line equal to the
    old and new contents' (as far as they are given).
    """
    if (old is None) != s.is_new:
        raise PatchRefused(f"{s.where}: the patch {'creates' if s.is_new else 'changes'} "
                           f"it, but it {'exists' if old is not None else 'does not exist'}")
    if old is not None and s.old_oid is not None and not git_blob_sha1(old).startswith(s.old_oid):
        raise PatchRefused(f"{s.where}: the file is not the one the patch was made against")
    if s.binary is not None:
        new = s.binary
    elif s.hunks:
        new = _apply_hunks(s, old or b"", max_bytes)
    else:
        new = old or b""
    if s.is_delete:
        if new:
            raise PatchRefused(f"{s.where}: the deletion leaves content behind")
        return None
    if s.new_oid is not None and not git_blob_sha1(new).startswith(s.new_oid):
        raise PatchRefused(f"{s.where}: the result is not the blob the 'index' line names")
    return new


# The old file stays one bytes object: a line is the bytes up to and including
# an LF, or a non-empty tail without one. Splitting it into a list of lines
# cost ~70x its size (a 16 MiB file of short lines took 1.15 GiB); here the
# result is joined from views of the old bytes and the hunks' own lines, so
# applying holds the old file, the result and the patch, and no more.


def _apply_hunks(s: Section, old: bytes, max_bytes: int) -> bytes:
    view = memoryview(old)
    out: list[bytes | memoryview] = []
    size = 0  # bytes the hunks write, checked after each hunk as a result's early bound
    line = at = 0  # the old file's next unread line and its byte offset
    for h in s.hunks:
        pos = h.old_start - 1 if h.old_count else h.old_start
        assert pos >= line, "parse_patch orders hunks"
        start = at
        at = _skip_lines(old, at, pos - line)
        if at < 0:
            raise PatchRefused(f"{s.where}: a hunk past the end of the file")
        out.append(_unchanged(old, view, start, at))
        line = pos
        for tag, content in h.lines:
            if tag == b"+":
                out.append(content)
                size += len(content)
                continue
            if not _line_is(old, at, content):
                raise PatchRefused(f"{s.where}: the hunk at old line {h.old_start} does not "
                                   "match the file")
            if tag == b" ":
                out.append(content)
                size += len(content)
            at += len(content)
            line += 1
        if size > max_bytes:
            raise PatchRefused(f"{s.where}: the result is larger than {max_bytes} bytes")
    out.append(_unchanged(old, view, at, len(old)))
    if sum(map(len, out)) > max_bytes:  # refused before the result is built
        raise PatchRefused(f"{s.where}: the result is larger than {max_bytes} bytes")
    return b"".join(out)


_VIEW_FROM = 160  # bytes: a memoryview costs ~180 of its own; a shorter range is copied


def _unchanged(old: bytes, view: memoryview, start: int, end: int) -> bytes | memoryview:
    """old[start:end] for the result, copied only when a copy is smaller than a view."""
    return view[start:end] if end - start >= _VIEW_FROM else old[start:end]


def _line_is(old: bytes, at: int, content: bytes) -> bool:
    """Whether the old file's line starting at byte `at` is exactly `content`.

    `content` holds at most one LF, at its end (a patch line); without one it
    can only be the file's last line, a non-empty tail with no LF.
    """
    if content.endswith(b"\n"):
        return old.startswith(content, at)
    return bool(content) and at + len(content) == len(old) and old.startswith(content, at)


_FEW_LINES = 4  # found one LF at a time; more are narrowed to by counting


def _skip_lines(old: bytes, at: int, k: int) -> int:
    """The offset just past `k` more lines from byte `at` (a line start), or -1.

    Work in proportion to the bytes skipped, in C (`bytes.count`, `bytes.index`),
    with O(log k) steps in Python: a window that doubles until it holds the k-th
    LF, then halved down to it. No list of lines, and no rescan from the start,
    however many hunks there are.
    """
    if k == 0:
        return at
    need, width = k, k  # k lines take at least k bytes
    while True:
        end = min(at + width, len(old))
        found = old.count(b"\n", at, end)
        if found >= need:
            break
        if end == len(old):  # a last line without LF counts as one
            return end if found == need - 1 and at < end and not old.endswith(b"\n") else -1
        at, need, width = end, need - found, width * 2
    # the need-th LF from `at` is in old[at:end]
    while need > _FEW_LINES:
        mid = (at + end) // 2
        found = old.count(b"\n", at, mid)
        if found >= need:
            end = mid
        else:
            at, need = mid, need - found
    for _ in range(need):
        at = old.index(b"\n", at) + 1
    return at


def git_reading(sections: list[Section] | tuple[Section, ...]) -> bytes:
    """What `git apply --numstat -z --summary` prints for these sections.

    apply.c `numstat_patch_list` (`-z`: raw names, NUL-terminated) then
    `summary_patch_list` (` create mode`, ` delete mode`, ` mode change`).
    """
    out = bytearray()
    for s in sections:
        if s.is_binary:
            out += b"-\t-\t"
        else:
            out += b"%d\t%d\t" % (s.added, s.deleted)
        out += s.raw_path + b"\x00"
    for s in sections:
        if s.new_mode is not None and s.old_mode is None:
            out += b" create mode %06o " % s.new_mode + s.raw_path + b"\n"
        elif s.old_mode is not None and s.new_mode is None:
            out += b" delete mode %06o " % s.old_mode + s.raw_path + b"\n"
        elif s.old_mode is not None and s.new_mode is not None and s.old_mode != s.new_mode:
            out += b" mode change %06o => %06o " % (s.old_mode, s.new_mode) + s.raw_path + b"\n"
    return bytes(out)
