"""C2SP tlog-proof: one leaf's inclusion proof, with the checkpoint it leads to.

    "c2sp.org/tlog-proof@v1" LF
    [ "extra " <base64 of opaque bytes> LF ]
    "index " <0-based leaf index, decimal> LF
    <base64 hash> LF                     (0..63: RFC 6962 audit path, leaf's sibling first)
    LF
    <checkpoint: a signed note, verbatim>

`Lines` is the strict line reader the bundle format shares.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from tkbox.formats import _strict
from tkbox.formats.errors import FormatError
from tkbox.formats.merkle import HASH_SIZE

HEADER = "c2sp.org/tlog-proof@v1"
MAX_PATH = 63
MAX_EXTRA = 1 << 20


class LongLine(str):
    """A line longer than its reader's `max_line`: only its first `max_line` bytes
    decoded (as text that is at least `max_line // 4` characters long), with where the
    whole line lies in the data (`start`, `end`). Whatever compares, measures or shows
    it finds it too long, as it would the whole line: set `max_line` to at least 4
    times the longest line that may be read."""

    start: int
    end: int


class Lines:
    """Reads LF-terminated UTF-8 lines from bytes, counting them for errors.

    With `max_line`, a longer line is never copied out or decoded whole: it is
    checked for UTF-8 a chunk at a time and read as a `LongLine`. With `cache`
    False, audit-path lines are decoded each time rather than kept."""

    def __init__(self, data: bytes, name: str, code: str, *, max_line: int | None = None,
                 cache: bool = True) -> None:
        self.data = data
        self.max_line = max_line
        self.cache = cache
        self.pos = 0
        self.line = 0  # number of the last line read
        self.name = name
        self.code = code
        self._peeked: tuple[int, int, str] | None = None  # (pos, end, text) of the next line
        # Audit-path lines already decoded: the proofs of one bundle share most nodes.
        self.hashes: dict[str, bytes] = {}

    def where(self, line: int | None = None) -> str:
        return f"{self.name} line {self.line if line is None else line}"

    def fail(self, what: str, line: int | None = None, code: str | None = None) -> FormatError:
        return FormatError(code or self.code, self.where(line), what)

    def _text(self, end: int) -> str:
        if self.max_line is not None and end - self.pos > self.max_line:
            return self._long(end)
        raw = self.data[self.pos : end]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:  # the error names the line; built only when needed
            return _strict.utf8(raw, self.code, self.where(self.line + 1))

    def _long(self, end: int) -> LongLine:
        assert self.max_line is not None
        _strict.utf8_span(self.data, self.pos, end, self.code, self.where(self.line + 1))
        with memoryview(self.data) as view:
            head = codecs.utf_8_decode(view[self.pos : self.pos + self.max_line], "strict",
                                       False)[0]
        line = LongLine(head)
        line.start, line.end = self.pos, end
        return line

    def peek(self) -> str | None:
        """The next line without consuming it; None at the end of the data."""
        if self._peeked is not None and self._peeked[0] == self.pos:
            return self._peeked[2]
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            return None
        text = self._text(end)
        self._peeked = (self.pos, end, text)
        return text

    def next(self, what: str) -> str:
        if self._peeked is not None and self._peeked[0] == self.pos:
            _, end, text = self._peeked
        else:
            end = self.data.find(b"\n", self.pos)
            if end < 0:
                raise FormatError(
                    f"{self.code.split('.')[0]}.truncated", self.where(self.line + 1),
                    f"the data ends where {what} should be",
                )
            text = self._text(end)
        self.line += 1
        self.pos = end + 1
        return text

    def rest(self) -> bytes:
        return self.data[self.pos :]

    def keyword(self, word: str, what: str) -> str:
        """The value of a '<word> <value>' line."""
        line = self.next(what)
        if not line.startswith(word + " "):
            raise self.fail(f"expected {what} ('{word} …'), found {_strict.show(line)}")
        return line[len(word) + 1 :]


@dataclass(frozen=True)
class Entry:
    """The part of a tlog-proof before the checkpoint."""

    index: int
    path: tuple[bytes, ...]
    extra: bytes | None = None

    def text(self) -> str:
        out = [HEADER]
        if self.extra is not None:
            out.append(f"extra {_strict.b64e(self.extra)}")
        out.append(f"index {self.index}")
        out.extend(_strict.b64e(h) for h in self.path)
        return "".join(line + "\n" for line in out)


def read_entry(lines: Lines, *, max_extra: int = MAX_EXTRA) -> Entry:
    """Read header, optional extra, index and audit path; stop before the next part."""
    header = lines.next("the tlog-proof header")
    if header != HEADER:
        raise lines.fail(f"expected {HEADER!r}, found {_strict.show(header)}")
    extra: bytes | None = None
    nxt = lines.peek()
    if nxt is not None and nxt.startswith("extra "):
        value = lines.keyword("extra", "the extra line")
        if len(value) > (max_extra + 2) // 3 * 4:
            raise lines.fail(f"the extra data is larger than {max_extra} bytes")
        extra = _strict.b64(value, lines.code, lines.where())
    index = _strict.decimal(lines.keyword("index", "the index line"), lines.code, lines.where())
    path: list[bytes] = []
    while True:
        nxt = lines.peek()
        if nxt is None or nxt == "" or nxt == HEADER:
            break
        if len(path) == MAX_PATH:
            raise lines.fail(f"an audit path has at most {MAX_PATH} hashes", lines.line + 1)
        line = lines.next("a hash")
        if isinstance(line, LongLine):
            raise _strict.b64_span(lines.data, line.start, line.end, line, lines.code,
                                   lines.where(), length=HASH_SIZE)
        h = lines.hashes.get(line)
        if h is None:
            h = _strict.b64(line, lines.code, lines.where(), length=HASH_SIZE)
            if lines.cache:
                lines.hashes[line] = h
        path.append(h)
    return Entry(index, tuple(path), extra)


@dataclass(frozen=True)
class TlogProof:
    entry: Entry
    checkpoint: bytes  # the signed note, verbatim

    def encode(self) -> bytes:
        return self.entry.text().encode() + b"\n" + self.checkpoint


def parse(data: bytes) -> TlogProof:
    lines = Lines(data, "tlog-proof", "proof.malformed")
    entry = read_entry(lines)
    if lines.next("the blank line before the checkpoint") != "":
        raise lines.fail("expected the blank line before the checkpoint")
    return TlogProof(entry, lines.rest())
