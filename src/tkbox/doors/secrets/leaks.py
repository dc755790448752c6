"""Finding and hiding secret values in byte streams. Pure, streaming, split-invariant.

**Forms.** A value `v` is looked for, case-folded (ASCII), as:

- `raw`: `v` itself;
- `hex`: `v.hex()`;
- `base64`, `base64url`: for each alignment k in 0, 1, 2 (the value starting
  k bytes into a 3-byte group), the characters of `b64(b"\\0"*k + v)` that
  depend only on `v`'s bits: indices `ceil(8k/6)` to `floor(8(k+n)/6)`
  (RFC 4648 §4, §5), so `v` is found inside any longer base64 text;
- `base32`: likewise at each of five alignments (RFC 4648 §6);
- `reversed`: `v` backwards;
- `percent`, `json`: `v` as `quote(v, safe="")` and as a JSON string body
  (only used to redact; the views decode escapes in general, below).

**Views.** Bytes are searched as sent (case-folded), and *decoded*: every escape
of the formats below replaced by what it stands for, and that text decoded
again (two levels: `%2541` is `A`, `\\\\u0041` is `\\u0041` and then `A`). The
text is case-folded before it is decoded, so an escape is recognised in any case
(`%4A`, `\\U0041`, `&#X41;`, `&AMP;`). The escapes, all of each format
(`ESCAPES`; nothing else is decoded):

- URL percent-encoding (RFC 3986 §2.1): `%XX` -> the byte;
- JSON strings (RFC 8259 §7): `\\"` `\\\\` `\\/` `\\b` `\\f` `\\n` `\\r` `\\t`, and
  `\\uXXXX` -> the code point in UTF-8 (a surrogate on its own: its three bytes,
  as Python's `surrogatepass` writes them);
- the C, JavaScript and Python byte escape `\\xXX` -> the byte;
- HTML character references (WHATWG HTML, "Character references"): `&#DDD;`
  (1 to 10 digits) and `&#xHHH;` (1 to 8 hex digits) -> the code point in UTF-8,
  as the spec reads it (`html.unescape`: 0, surrogates and past U+10FFFF are
  U+FFFD, 0x80 to 0x9F windows-1252, other controls and noncharacters nothing);
  and every named reference the spec lists with its `;` (2125 names,
  `html.entities.html5`; folded to lower case, a name that differs from another
  only in case decodes as its lower-case spelling does, so `&colon;` and
  `&Colon;` are both `:`).

Not decoded: an HTML reference without its `;` (`&amp` then text: a parse error
in HTML), an unknown name, numeric references with more digits than above;
`+` for a space in form bodies (it is a separator to the squeezed views either
way, and a base64 `+` must stay); JavaScript's `\\u{...}`, octal and `\\v`.
Each view is then *squeezed*: every byte but ASCII letters and digits dropped,
and searched for the forms squeezed the same way (when 8 or more characters
remain), so separators, spaces or line breaks put between the characters (a
base64 file wrapped at 76 columns, in a JSON string with `\\n`) hide nothing.

**Scanning** (requests: is any value or placeholder leaving?). The scanner keeps
the last `span` bytes it saw (64 times the longest form), cut where no escape of
the first two views is (`_sync`), so any occurrence (no wider than that) ending in
a chunk is inside that chunk's window and decoded as the whole stream decodes it: the set of hits
does not depend on how the bytes were split, and memory is bounded by `span`
plus one chunk and `UNSTABLE`. Each feed looks at the tail again, so a streaming
caller feeds at least `span` new bytes at a time (or what is left at the
message's end): the work stays linear in the bytes however they were split.

**Redaction** (responses: the guest must never read a value). See `Redactor`:
every match of a form in a view covers a range of the response's bytes (each
escape it touches whole, at both levels, and the separators between its
characters); a match whose range is wider than `width` (64 times the longest
form) is not one. Each range is replaced by as many `*`; then the views of the
result are searched again (a form whose parts a redacted range kept apart is
joined once the `*` are dropped) until nothing is found (`MAX_ROUNDS` searches at
most). The guest receives
exactly what redacting the whole body at once gives, however the origin's bytes
were split.

One idea: finding a secret's value in bytes, in any of its forms and however
the bytes are split; `Redactor` is that finding's ranges starred, over the same
decoded views (`_View`), so the two cannot disagree on what is a secret.
"""

from __future__ import annotations

import base64
import bisect
import functools
import html
import json
import re
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html.entities import html5
from itertools import accumulate, compress, islice, repeat
from operator import length_hint, sub

# --- escapes -----------------------------------------------------------------------

# Each escape begins with `%`, `\\` or `&`; only `\\\\` holds one of those past its
# first byte. Matched on case-folded text.
_PERCENT = rb"%[0-9a-f]{2}"
_BACKSLASH = rb"\\(?:u[0-9a-f]{4}|x[0-9a-f]{2}|[\"\\/bfnrt])"
_AMPERSAND = rb"&(?:#x[0-9a-f]{1,8}|#[0-9]{1,10}|[a-z][a-z0-9]{1,30});"
ESCAPES = re.compile(b"|".join((_PERCENT, _BACKSLASH, _AMPERSAND)))
# The longest escape: `&CounterClockwiseContourIntegral;`, a 31-letter name.
MAX_ESCAPE = 33
# The end of a text that an escape could still begin at: a proper prefix of one.
_UNFINISHED = re.compile(rb"(?:%[0-9a-f]?|\\(?:u[0-9a-f]{0,3}|x[0-9a-f]?)?"
                         rb"|&(?:#(?:x[0-9a-f]{0,8}|[0-9]{0,10})|[a-z][a-z0-9]{0,30})?)\Z")
DECODE_LEVELS = 2
# Bytes an escape of the first decoded view can cover (MAX_ESCAPE characters of
# MAX_ESCAPE bytes each), with one escape of the window: how far back an unfinished
# escape can begin, or a cut can move to leave no escape cut.
UNSTABLE = MAX_ESCAPE * (MAX_ESCAPE + 1)
# A form's characters may spread over this many bytes each, on average, escaped
# twice and with separators between them: matches wider are not looked for.
WIDTH_PER_CHARACTER = 64
# How many times a text is searched (redacted, searched again, ...): a form split in
# more parts around redacted ranges than this is not joined.
MAX_ROUNDS = 4

_JSON_SHORT = {b'"': b'"', b"\\": b"\\", b"/": b"/", b"b": b"\b", b"f": b"\f",
               b"n": b"\n", b"r": b"\r", b"t": b"\t"}


def _named() -> dict[bytes, bytes]:
    """HTML's named character references with their `;`, case-folded: name -> bytes."""
    spellings: dict[bytes, list[tuple[str, str]]] = {}
    for name, chars in html5.items():
        if name.endswith(";"):
            spellings.setdefault(name[:-1].lower().encode(), []).append((name[:-1], chars))
    out: dict[bytes, bytes] = {}
    for key, names in spellings.items():
        lower = [chars for name, chars in names if name.encode() == key]
        out[key] = (lower[0] if lower else sorted(names)[0][1]).encode().lower()
    return out


NAMED = _named()
# The numeric references HTML does not read as their code point (WHATWG HTML, "Numeric
# character reference end state": 0 and 128-159 are replaced, controls and
# noncharacters dropped), as `html.unescape` reads them; the rest are the code point,
# or U+FFFD for a surrogate or past U+10FFFF.
_NUMERIC = {n: html.unescape(f"&#{n};").encode()
            for n in (*range(0x100), *range(0xFDD0, 0xFDF0),
                      *(p << 16 | q for p in range(17) for q in (0xFFFE, 0xFFFF)))
            if html.unescape(f"&#{n};") != chr(n)}
# Bytes the squeezed views drop: everything but ASCII letters and digits.
NOT_ALNUM = bytes(b for b in range(256) if not (48 <= b <= 57 or 97 <= b <= 122 or 65 <= b <= 90))
MIN_SQUEEZED = 8


def decode_escape(esc: bytes) -> bytes:
    """What one case-folded escape (`ESCAPES` matched all of it) stands for, case-folded;
    an unknown name stands for itself."""
    head, kind = esc[:1], esc[1:2]
    if head == b"%":
        out = bytes([int(esc[1:], 16)])
    elif head == b"\\":
        if kind == b"u":
            out = chr(int(esc[2:], 16)).encode("utf-8", "surrogatepass")
        elif kind == b"x":
            out = bytes([int(esc[2:], 16)])
        else:
            out = _JSON_SHORT[kind]
    elif kind == b"#":
        n = int(esc[3:-1], 16) if esc[2:3] == b"x" else int(esc[2:-1])
        out = _NUMERIC[n] if n in _NUMERIC else (
            b"\xef\xbf\xbd" if n > 0x10FFFF or 0xD800 <= n <= 0xDFFF else chr(n).encode())
    else:
        out = NAMED.get(esc[1:-1], esc)
    return out.lower()


@dataclass(frozen=True)
class Pattern:
    """One form of one secret's value or placeholder, case-folded."""

    name: str  # the secret's name
    kind: str  # "value" or "placeholder"
    form: str  # raw, hex, base64, base64url, percent, json
    needle: bytes


@dataclass(frozen=True)
class Hit:
    name: str
    kind: str
    form: str
    decoded: bool  # found only after decoding escapes

    def describe(self) -> str:
        how = self.form + (" (escaped)" if self.decoded else "")
        return f"{self.kind} of {self.name} ({how})"


def _b64_forms(v: bytes, alphabet: str) -> list[bytes]:
    out: list[bytes] = []
    n = len(v)
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + v)
        if alphabet == "base64url":
            enc = enc.translate(bytes.maketrans(b"+/", b"-_"))
        start = -(-8 * k // 6)
        end = 8 * (k + n) // 6
        out.append(enc[start:end])
    return out


def _b32_forms(v: bytes) -> list[bytes]:
    out: list[bytes] = []
    n = len(v)
    for k in range(5):  # RFC 4648 §6: 5-byte groups, 5 bits a character
        enc = base64.b32encode(b"\0" * k + v)
        out.append(enc[-(-8 * k // 5): 8 * (k + n) // 5])
    return out


def forms(v: bytes, *, for_redaction: bool = False) -> list[tuple[str, bytes]]:
    """Every encoded form of `v`, case-folded, without duplicates."""
    out: list[tuple[str, bytes]] = [("raw", v), ("hex", v.hex().encode()),
                                    ("reversed", v[::-1])]
    out += [("base64", f) for f in _b64_forms(v, "base64")]
    out += [("base64url", f) for f in _b64_forms(v, "base64url")]
    out += [("base32", f) for f in _b32_forms(v)]
    if for_redaction:
        out.append(("percent", urllib.parse.quote(v, safe="").encode()))
        out.append(("percent", "".join(f"%{b:02x}" for b in v).encode()))
        out.append(("json", json.dumps(v.decode("latin-1"))[1:-1].encode()))
        out.append(("json", "".join(f"\\u{b:04x}" for b in v).encode()))
    seen: set[bytes] = set()
    result: list[tuple[str, bytes]] = []
    for form, needle in out:
        low = needle.lower()
        if low and low not in seen:
            seen.add(low)
            result.append((form, low))
    return result


def patterns(items: Iterable[tuple[str, str, bytes]], *, for_redaction: bool = False
             ) -> list[Pattern]:
    """(name, kind, bytes) triples to every case-folded form of each."""
    return [Pattern(name, kind, form, needle)
            for name, kind, v in items for form, needle in forms(v, for_redaction=for_redaction)]


# --- decoding at C speed ---------------------------------------------------------------

# `_decode` finds escapes by searching for one literal byte (C speed), never for any of
# three (a byte at a time in `re`). With few escapes, one search per first byte
# (`_ESCAPES_AT`: matches of different ones never overlap, since no escape holds the
# first byte of another kind, so together they are `ESCAPES`' matches). With many, a
# NUL is put before each `%`, `&` and `\` as a marker and the text is split at the
# markers that begin an escape (`\\\\` holds a marker inside it, `_MARKED_BACKSLASH`):
# where the text holds no NUL of its own, the other markers stay in the literal pieces
# and are dropped from the result at once (`_ESCAPE_SPLIT`); otherwise each is split
# off on its own (`_MARK_SPLIT`, its escape None).
_STARTS = (b"%", b"&", b"\\")
_ESCAPES_AT = [(b"%", re.compile(_PERCENT)), (b"&", re.compile(_AMPERSAND)),
               (b"\\", re.compile(_BACKSLASH))]
SPARSE_ESCAPES = 64  # at most this many escapes of one kind are split off one by one
_MARKED_BACKSLASH = b"\\\0\\"
_MARKED_ALTS = _PERCENT + rb"|\\(?:u[0-9a-f]{4}|x[0-9a-f]{2}|[\"/bfnrt]|\0\\)|" + _AMPERSAND
_ESCAPE_SPLIT = re.compile(rb"\0(" + _MARKED_ALTS + rb")")
_MARK_SPLIT = re.compile(rb"\0(?:(" + _MARKED_ALTS + rb")|(?=[%&\\]))")
_HOLDS_MARK = frozenset({_MARKED_BACKSLASH})


class _EscapeTable(dict[bytes | None, bytes]):
    """Escape (as `ESCAPES` matched it, case-folded; `\\\\` also as marked) -> what it
    stands for, case-folded. The common ones are filled in at import; others (any
    `\\uXXXX`, leading zeros, unknown names) are computed, and kept while few."""

    LIMIT = 1 << 15

    def __missing__(self, key: bytes | None) -> bytes:
        assert key is not None  # an escape `ESCAPES` matched (None, a marker, is in)
        rep = decode_escape(key)
        if len(self) < self.LIMIT:
            self[key] = rep
        return rep


_TABLE = _EscapeTable()
_TABLE[None] = b""
_TABLE[_MARKED_BACKSLASH] = b"\\"
for _key in [*(b"\\" + c for c in _JSON_SHORT), *(b"&%s;" % nm for nm in NAMED),
             *(b"%s%02x" % (pre, c) for pre in (b"%", b"\\u00", b"\\x") for c in range(256)),
             *(b"&#x%x;" % c for c in range(256)), *(b"&#x%02x;" % c for c in range(16)),
             *(b"&#%d;" % c for c in range(1000)), *(b"&#%03d;" % c for c in range(100))]:
    _TABLE.__missing__(_key)  # fills the entry


def _decode(text: bytes) -> tuple[bytes, list[bytes | None], list[bytes], bool]:
    """`ESCAPES.sub(decode_escape, text)` for a case-folded `text`, without a Python call
    per escape where there are many; with the pieces: `text` split as [literal, escape,
    literal, ..., literal] (an escape None where a marker began none), the same list
    decoded, and whether the literal pieces still hold markers (NULs that are not
    `text`'s)."""
    found: list[re.Match[bytes]] = []
    for c, rx in _ESCAPES_AT:
        if c in text:
            found += islice(rx.finditer(text), SPARSE_ESCAPES + 1)
            if len(found) > SPARSE_ESCAPES:
                break
    else:  # few escapes: the pieces one by one
        found.sort(key=lambda m: m.start())
        parts: list[bytes | None] = []
        at = 0
        for m in found:
            parts += (text[at:m.start()], m.group())
            at = m.end()
        parts.append(text[at:])
        dec: list[bytes] = parts[:]  # type: ignore[assignment]  # escapes replaced next
        dec[1::2] = map(_TABLE.__getitem__, parts[1::2])
        return b"".join(dec), parts, dec, False
    marked, marks = text, 0
    for c in _STARTS:
        if n := text.count(c):
            marks += n
            marked = marked.replace(c, b"\0" + c)
    if marks and b"\0" not in text:
        parts = _ESCAPE_SPLIT.split(marked)
        dec = parts[:]  # type: ignore[assignment]
        dec[1::2] = map(_TABLE.__getitem__, parts[1::2])
        out = b"".join(dec)
        # each escape took its marker (`\\\\` two), so the rest are in literal pieces
        left = marks - len(parts) // 2 - (
            parts[1::2].count(_MARKED_BACKSLASH) if b"\\\\" in text else 0)
        if out.count(b"\0") == left:  # no escape stood for a NUL
            return out.replace(b"\0", b""), parts, dec, True
    parts = _MARK_SPLIT.split(marked)
    dec = parts[:]  # type: ignore[assignment]
    dec[1::2] = map(_TABLE.__getitem__, parts[1::2])
    return b"".join(dec), parts, dec, False


# --- views -------------------------------------------------------------------------------

Span = tuple[int, int]
TAIL_WALK = 256  # a position this near a view's end is mapped walking back from it,
TAIL_PIECES = 16  # over at most this many pieces (else all pieces' ends are listed once)
RECHECK_ESCAPES = 64  # at most this many escapes are looked at one by one (`decodes_again`)


def _unfinished(text: bytes, end: int) -> int:
    """Where an escape that more bytes could finish begins in `text[:end]` (the earliest
    such place), or `end`."""
    m = _UNFINISHED.search(text, max(end - MAX_ESCAPE + 1, 0), end)
    return end if m is None else m.start()


class _View:
    """The window as sent, case-folded: its positions are the window's."""

    def __init__(self, text: bytes) -> None:
        self.text = text

    def start(self, i: int) -> int:
        """The window position where the range of view position `i` begins (the
        window's end for the view's end)."""
        return i

    def source(self, span: Span) -> Span:
        return span


class _Decoded(_View):
    """One level of escape decoding of `outer` (`_decode`): a decoded range maps back
    to all of each escape it touches, and to literal bytes one for one.

    Nothing is mapped until it is needed: near the end (a match not yet complete, a
    view's stable end) by walking back over the last pieces, elsewhere by bisecting
    the pieces' ends.
    """

    def __init__(self, text: bytes, outer: _View, parts: list[bytes | None],
                 dec: list[bytes], marked: bool) -> None:
        super().__init__(text)
        self.outer, self.parts, self.dec, self.marked = outer, parts, dec, marked
        self._ends: tuple[list[int], list[int]] | None = None

    def _escape(self, k: int) -> bool:
        """Whether piece `k` is an escape that decoded to something else."""
        return bool(k & 1) and self.parts[k] is not None and self.dec[k] != self.parts[k]

    def _lengths(self, k: int) -> tuple[int, int]:
        """(decoded length, source length) of piece `k`."""
        if k & 1:  # an escape (None: a marker)
            p = self.parts[k]
            return len(self.dec[k]), length_hint(p) - (p in _HOLDS_MARK)
        p = self.dec[k]  # literal bytes (with markers, if `marked`)
        n = len(p) - p.count(b"\0") if self.marked else len(p)
        return n, n

    def _lens(self, k0: int) -> tuple[list[int], list[int]]:
        """(decoded lengths, source lengths) of the pieces from `k0` (even) on, at C
        speed."""
        dec, parts = self.dec[k0:], self.parts[k0:]
        dls = list(map(len, dec))
        if self.marked:  # literal pieces: less their markers
            dls[0::2] = map(sub, dls[0::2], map(bytes.count, dec[0::2], repeat(b"\0")))
        sls = dls[:]  # literal pieces are the same in both
        sls[1::2] = map(sub, map(length_hint, parts[1::2]),
                        map(_HOLDS_MARK.__contains__, parts[1::2]))
        return dls, sls

    def _piece_ends(self) -> tuple[list[int], list[int]]:
        """Where each piece ends, decoded and in the source (computed once)."""
        if self._ends is None:
            dls, sls = self._lens(0)
            self._ends = list(accumulate(dls)), list(accumulate(sls))
        return self._ends

    def _piece(self, pos: int, in_source: bool) -> tuple[int, int, int, int, int]:
        """(piece, decoded start, source start, decoded length, source length) of the
        piece holding position `pos`, decoded or (`in_source`) in the outer view.

        Near the end, found walking back over the last pieces; in the last quarter, by
        summing the lengths of the last pieces (more each time) until they reach it;
        elsewhere, by listing all pieces' ends once and bisecting them."""
        total, other = ((len(self.outer.text), len(self.text)) if in_source
                        else (len(self.text), len(self.outer.text)))
        if self._ends is None and total - pos <= TAIL_WALK:
            d, s = len(self.text), len(self.outer.text)
            for k in range(len(self.parts) - 1, max(len(self.parts) - TAIL_PIECES, -1), -1):
                dl, sl = self._lengths(k)
                d, s = d - dl, s - sl
                if (s <= pos and sl) if in_source else (d <= pos and dl):
                    return k, d, s, dl, sl
        many = 256  # (only for the last quarter: further back, listing all costs less)
        while self._ends is None and 4 * (total - pos) <= total and 4 * many < len(self.parts):
            k0 = (len(self.parts) - many) & ~1
            dls, sls = self._lens(k0)
            mine, theirs = (sls, dls) if in_source else (dls, sls)
            back = list(accumulate(reversed(mine)))  # bytes from each piece to the end
            if back[-1] >= total - pos:
                i = bisect.bisect_left(back, total - pos)
                k = len(self.parts) - 1 - i
                start = total - back[i]
                other_start = other - sum(theirs[k - k0:])
                ml, tl = mine[k - k0], theirs[k - k0]
                return ((k, other_start, start, tl, ml) if in_source
                        else (k, start, other_start, ml, tl))
            many *= 8
        dends, sends = self._piece_ends()
        k = bisect.bisect_right(sends if in_source else dends, pos)
        dl, sl = self._lengths(k)
        return k, dends[k] - dl, sends[k] - sl, dl, sl

    def _src(self, i: int, end: bool) -> int:
        k, d, s, _, sl = self._piece(i, False)
        if not self._escape(k):  # literal bytes (or an escape left as it is)
            return s + (i - d) + (1 if end else 0)
        return s + (sl if end else 0)  # one escape: all of it

    def start(self, i: int) -> int:
        if i >= len(self.text):
            return self.outer.start(len(self.outer.text))
        return self.outer.start(self._src(i, False))

    def source(self, span: Span) -> Span:
        return self.outer.source((self._src(span[0], False), self._src(span[1] - 1, True)))

    def inner(self, s: int) -> int:
        """The position in this view of outer position `s` (of the escape holding it)."""
        if s >= len(self.outer.text):
            return len(self.text)
        k, d, s0, _, _ = self._piece(s, True)
        return d if self._escape(k) else d + (s - s0)

    def floor(self, s: int) -> int:
        """Outer position `s`, or where the escape it is inside begins."""
        if 0 < s < len(self.outer.text):
            k, _, s0, _, _ = self._piece(s, True)
            if s0 < s and self._escape(k):
                return s0
        return s

    def ceil(self, s: int) -> int:
        """Outer position `s`, or where the escape it is inside ends."""
        if 0 < s < len(self.outer.text):
            k, _, s0, _, sl = self._piece(s, True)
            if s0 < s and self._escape(k):
                return s0 + sl
        return s

    def decodes_again(self) -> bool:
        """False only if decoding this view again changes nothing (so `_decode` need not
        run). An escape made of literal bytes alone was decoded already, so a new one
        holds a byte an escape decoded to: each such byte is looked at, with every
        escape that could begin up to MAX_ESCAPE bytes before it. With many, True."""
        if len(self.parts) // 2 - (0 if self.marked else self.parts.count(None)) > RECHECK_ESCAPES:
            return True
        escapes = [k for k in range(1, len(self.parts), 2) if self._escape(k)]
        text, dends = self.text, self._piece_ends()[0]
        for k in escapes:
            de = dends[k]
            ds = de - len(self.dec[k])
            at = max(ds - MAX_ESCAPE + 1, 0)
            while True:
                at = min((j for c in _STARTS if (j := text.find(c, at, de)) != -1), default=-1)
                if at == -1:
                    break
                m = ESCAPES.match(text, at)
                if m is not None and m.end() > ds:
                    return True
                at += 1
        return False


class _Squeezed:
    """A view with every byte but letters and digits dropped (separators hide nothing)."""

    def __init__(self, inner: _View) -> None:
        self.inner = inner
        self.text = inner.text.translate(None, NOT_ALNUM)
        self._blocks: list[int] | None = None  # letters and digits up to each block's end
        self._lookups = 0
        self._all: list[int] | None = None  # the position of each letter and digit

    def before(self, u: int) -> int:
        """How many letters and digits the inner view holds before position `u`."""
        if u >= len(self.inner.text):
            return len(self.text)
        return len(self.text) - len(self.inner.text[u:].translate(None, NOT_ALNUM))

    def _pos(self, k: int) -> int:
        """The position in the inner view of its `k`th letter or digit."""
        text = self.inner.text
        left = len(self.text) - k  # letters and digits from the k-th to the end
        if left <= TAIL_WALK:  # count back from the end
            size = 4 * left + 64
            while True:
                at = max(len(text) - size, 0)
                have = len(text[at:].translate(None, NOT_ALNUM))
                if have >= left or at == 0:
                    break
                size *= 4
            skip = have - left
        elif self._all is not None:
            return self._all[k]
        elif self._lookups >= SQUEEZE_LOOKUPS:  # many matches: every position, once
            self._all = list(compress(range(len(text)), text.translate(ALNUM_MASK)))
            return self._all[k]
        else:  # count blocks from the start, then within the block
            self._lookups += 1
            if self._blocks is None:
                self._blocks = list(accumulate(
                    len(text[i:i + SQUEEZE_BLOCK].translate(None, NOT_ALNUM))
                    for i in range(0, len(text), SQUEEZE_BLOCK)))
            b = bisect.bisect_right(self._blocks, k)
            at, skip = b * SQUEEZE_BLOCK, k - (self._blocks[b - 1] if b else 0)
            for step, skipper in ALNUM_SKIPS:
                for _ in range(skip // step):
                    m = skipper.match(text, at)
                    assert m is not None  # the k-th is there
                    at = m.end()
                skip %= step
        m = next(islice(ALNUM_RUN.finditer(text, at), skip, None))
        return m.start()

    def start(self, j: int) -> int:
        if j >= len(self.text):
            return self.inner.start(len(self.inner.text))
        return self.inner.start(self._pos(j))

    def source(self, span: Span) -> Span:
        return self.inner.source((self._pos(span[0]), self._pos(span[1] - 1) + 1))


ALNUM_RUN = re.compile(rb"[a-z0-9]")
# n letters or digits (and what is between them): skips n of them at C speed
ALNUM_SKIPS = [(n, re.compile(rb"(?:[^a-z0-9]*[a-z0-9]){%d}" % n)) for n in (256, 16)]
SQUEEZE_BLOCK = 4096
ALNUM_MASK = bytes(int(b not in NOT_ALNUM) for b in range(256))  # letters, digits -> 1
SQUEEZE_LOOKUPS = 16  # after this many positions looked up in blocks, all are listed


def _views(low: bytes) -> list[_View]:
    """The window as sent, and up to two levels of it decoded (fewer where a level
    would change nothing)."""
    cur = _View(low)
    views: list[_View] = [cur]
    for _ in range(DECODE_LEVELS):
        if b"%" not in cur.text and b"\\" not in cur.text and b"&" not in cur.text:
            break
        if isinstance(cur, _Decoded) and not cur.decodes_again():
            break  # what `_decode` would give is `cur.text`
        text, parts, dec, marked = _decode(cur.text)
        if text == cur.text:
            break
        cur = _Decoded(text, cur, parts, dec, marked)
        views.append(cur)
    return views


def decoded_views(low: bytes) -> list[bytes]:
    """Up to two levels of escape decoding of a case-folded window (the texts)."""
    return [v.text for v in _views(low)[1:]]


def _sync(views: list[_View], s: int) -> int:
    """The last window position at or before `s` that is inside no escape of the
    window nor of its first decoding: a window cut there decodes as the whole does."""
    if len(views) > 1:
        first = views[1]
        assert isinstance(first, _Decoded)
        s = first.floor(s)
        if len(views) > 2:
            second = views[2]
            assert isinstance(second, _Decoded)
            i = first.inner(s)
            j = second.floor(i)
            if j != i:
                s = first.start(j)
    return s


def _expand(views: list[_View], span: Span) -> Span:
    """`span` (window positions) widened to every escape it touches, in the window and
    in its first decoding: what a match covers."""
    a, b = span
    if len(views) > 1:
        first = views[1]
        assert isinstance(first, _Decoded)
        a, b = first.floor(a), first.ceil(b)
        if len(views) > 2:
            second = views[2]
            assert isinstance(second, _Decoded)
            i, j = first.inner(a), first.inner(b)
            i2, j2 = second.floor(i), second.ceil(j)
            if (i2, j2) != (i, j):
                a, b = first.source((i2, j2))
    return a, b


def _starts_near(text: bytes, s: int) -> bool:
    """Whether an escape of the first two views could hold window position `s`."""
    lo = max(s - UNSTABLE, 0)
    return any(text.find(c, lo, s) != -1 for c in _STARTS)


# --- scanning ------------------------------------------------------------------------


class LeakScanner:
    """Streaming search for any pattern, as sent or decoded. See the module docstring."""

    def __init__(self, pats: Sequence[Pattern]) -> None:
        self.patterns = list(pats)
        self.squeezed = [(p, sq) for p in self.patterns
                         if len(sq := p.needle.translate(None, NOT_ALNUM)) >= MIN_SQUEEZED]
        longest = max((len(p.needle) for p in self.patterns), default=0)
        self.span: int = longest * WIDTH_PER_CHARACTER
        # the tail kept: `span` bytes, and up to `UNSTABLE` more to leave no escape cut
        self.keeps = self.span + UNSTABLE if self.patterns else 0
        self._tail = b""
        self.hits: list[Hit] = []
        self._seen: set[tuple[str, str, str]] = set()
        self.feeds = 0  # calls that looked at bytes
        self.scanned = 0  # bytes looked at (held tail included): the work done

    @property
    def hold(self) -> int:
        """Bytes a caller must hold back so a leak found later has not left yet."""
        return self.span

    # Each feed looks at the held tail (`span` bytes) again, so feeding many small
    # pieces costs span bytes of work each: a streaming caller gathers at least
    # `span` new bytes (or the message's end) before feeding, which keeps the work
    # within twice the bytes.

    def feed(self, data: bytes) -> list[Hit]:
        """New hits in `data` (given what came before). Never raises on any bytes."""
        if not self.patterns or not data:
            return []
        joined = self._tail + data
        window = joined.lower()
        views = _views(window)
        cut = len(joined) - self.span
        if cut > 0 and _starts_near(window, cut):
            cut = _sync(views, cut)
        self._tail = joined[max(cut, 0):]
        self.feeds += 1
        self.scanned += len(window)
        new: list[Hit] = []
        for level, view in enumerate(views):
            text = view.text
            squeezed = text.translate(None, NOT_ALNUM)
            for p in self.patterns:
                key = (p.name, p.kind, p.form)
                if key in self._seen or p.needle not in text:
                    continue
                self._seen.add(key)
                new.append(Hit(p.name, p.kind, p.form, level > 0))
            for p, sq in self.squeezed:
                key = (p.name, p.kind, p.form)
                if key in self._seen or sq not in squeezed:
                    continue
                self._seen.add(key)
                new.append(Hit(p.name, p.kind, p.form + " (with separators)", level > 0))
        self.hits.extend(new)
        return new

    def reset(self) -> None:
        """A new message: nothing carries over from the last one."""
        self._tail = b""


def scan_once(pats: Sequence[Pattern], data: bytes) -> list[Hit]:
    """All hits in one complete piece of bytes (a header value, a URL)."""
    return LeakScanner(pats).feed(data)


# --- redaction -----------------------------------------------------------------------

REDACT_BYTE = b"*"
# (start, end, round, carried): a range to redact, the round of the search that found
# it, and whether it is the rest of one that began in bytes already sent.
_Range = tuple[int, int, int, bool]


def _merged(spans: Iterable[Span]) -> list[Span]:
    out: list[Span] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _looks(text: bytes) -> list[tuple[_View, _Squeezed]]:
    """The views of `text` (case-folded here), each with itself squeezed."""
    return [(v, _Squeezed(v)) for v in _views(text.lower())]


def _starred(data: bytes, spans: Iterable[Span]) -> bytes:
    out = bytearray(data)
    for a, b in spans:
        out[a:b] = REDACT_BYTE * (b - a)
    return bytes(out)


class Redactor:
    """Streaming replacement of every form, as sent or decoded. See the module docstring.

    **What is redacted** (of a whole body; the reference the tests hold it to): the
    body is searched in the views the scanner searches (as sent, one and two levels
    decoded, each squeezed). A match in a view covers a range of the body's bytes:
    all of each escape it touches, at both levels, and the separators between its
    characters. A range wider than `width` (64 times the longest form) is not a
    match. Every range is replaced by as many `*` (lengths, and so `Content-Length`,
    do not change). The views of the result are then searched again, since a form
    whose parts a redacted range kept apart is whole once the `*` are dropped, and
    so on (a round each) until a round finds nothing new, `MAX_ROUNDS` at most.

    **Streaming.** The output is exactly that, however the body was split. A view's
    text is final only up to its *stable end*: the window's end, moved back to where
    an unfinished escape begins (`%4`, `\\u00`, `&#x4` could still become one), and
    in a decoded view also to where the stable end of the view it decodes lands (a
    round's too, to where the last round could still redact). A match is taken only
    in a view's stable text; a suffix of it that begins a form could become a match,
    so the bytes from its start on are held back, as are the bytes from any stable
    end on. The cut is then moved back to where no escape of the window or of its
    first decoding is cut (`_sync`: so the next window decodes as the whole body
    does), and what is sent is redacted; of a range that goes on past the cut, the
    rest is remembered for the next bytes (`_carry`, by round).

    **Bound.** A match ends within `width` of where it begins, and an unfinished
    escape begins within `UNSTABLE` bytes of the end, so a suffix that begins
    before `width + UNSTABLE` bytes from the end could only become a match wider
    than `width`: it is not held. So at most `hold` bytes are held (`width` plus
    twice `UNSTABLE`), whatever the origin sends (an endless unfinished escape is
    not one: an escape has at most `MAX_ESCAPE` bytes); past that, bytes are sent.

    Cost: each view's text is made at C speed (`bytes.lower`, `_decode`,
    `bytes.translate`) and searched with `bytes.find`; a form is looked for in a view
    only if its squeezed form is in the view squeezed (or it has too few letters and
    digits to have one); the second level is decoded only where an escape could hold
    a byte the first decoded to (`_Decoded.decodes_again`); positions are mapped back
    to the window's bytes only for a match found, one not yet complete, or a view's
    stable end; a later round runs only when the last redacted something or held
    more back, and then searches only around what was redacted (`_around`) unless
    that is near the end; where a form could begin at a text's end is looked up by
    its last byte (`_Starts`).
    """

    def __init__(self, pats: Sequence[Pattern]) -> None:
        self.needles = sorted({p.needle for p in pats}, key=len, reverse=True)
        self.squeezed = sorted({sq for nd in self.needles
                                if len(sq := nd.translate(None, NOT_ALNUM)) >= MIN_SQUEEZED},
                               key=len, reverse=True)
        # each needle with its squeezed form, where it has one: not in a view squeezed,
        # so not in the view
        self._pairs = [(nd, sq if len(sq := nd.translate(None, NOT_ALNUM)) >= MIN_SQUEEZED
                        else None) for nd in self.needles]
        longest = len(self.needles[0]) if self.needles else 0
        self.width = longest * WIDTH_PER_CHARACTER
        # a form holding a `*` can match across a redacted range as it is; the others,
        # only squeezed, with at most `_reach` letters and digits on each side of it
        self._starry = any(REDACT_BYTE in nd for nd in self.needles)
        self._starts = _Starts.of(tuple(self.needles))
        self._squeezed_starts = _Starts.of(tuple(self.squeezed))
        self._reach = max(map(len, self.squeezed), default=0)
        self.hold = self.width + 2 * UNSTABLE if self.needles else 0  # bytes held, at most
        self._buf = b""
        self._carry: list[int] = []  # by round: the first bytes of `_buf` it redacts
        self.count = 0  # ranges redacted
        self.feeds = 0  # calls that looked at bytes: each looks at the held bytes again

    def feed(self, data: bytes, final: bool = False) -> bytes:
        """Redacted bytes that are decided; the rest is held until more comes or `final`."""
        if not self.needles:
            return data
        self.feeds += 1
        buf = self._buf + data if self._buf else bytes(data)
        n = len(buf)
        # a suffix beginning before this could only become a match wider than `width`
        floor = 0 if final else n - self.width - UNSTABLE
        ranges: list[_Range] = [(0, c, r, True) for r, c in enumerate(self._carry) if c]
        limit = n  # bytes from here on may still change what a round's views hold
        looks = start = _looks(buf)
        first = [v for v, _ in looks]
        stars: list[Span] = []  # what this round's text has redacted
        fresh: list[Span] = []  # of those, what the last round's had not
        rnd = 0
        while True:
            if not fresh:  # the text of the last round: looked at again only before `held`
                found, held = self._round(looks, limit, n, floor, final, rnd == 0)
            elif final or any(b > limit - self.width - 2 * UNSTABLE for _, b in fresh):
                looks = _looks(_starred(buf, stars))  # near the end: all of it again
                found, held = self._round(looks, limit, n, floor, final, True)
            else:  # only around the new ranges can a match be new; the end is as it was
                found = self._around(buf, stars, fresh, start)
                held = self._round(looks, limit, n, floor, final, False)[1]
            ranges += [(a, b, rnd, False) for a, b in found]
            more = _merged((a, b) for a, b, r, _ in ranges if r <= rnd)
            # Bytes from `held` on may still be redacted in this round: what is before
            # them, joined with what is after, could make a form in the next.
            fresh = [iv for iv in more if iv not in stars]
            moved, limit = held < limit, (held if held >= n else _sync(first, held))
            if rnd + 1 == MAX_ROUNDS or not (fresh or moved or len(self._carry) > rnd + 1):
                break
            rnd, stars = rnd + 1, more
        decided = limit
        carry = [0] * (rnd + 1)
        for a, b, r, carried in ranges:
            if b > decided and (a < decided or (carried and decided == 0)):
                carry[r] = max(carry[r], b - decided)
        while carry and not carry[-1]:
            carry.pop()
        sent = _merged((a, min(b, decided)) for a, b, _, _ in ranges if a < decided)
        self.count += len(sent) - (1 if sent and sent[0][0] == 0 and any(self._carry) else 0)
        self._carry = carry
        self._buf = buf[decided:]
        return _starred(buf[:decided], sent) if sent else buf[:decided]

    def _round(self, looks: list[tuple[_View, _Squeezed]], limit: int, n: int, floor: int,
               final: bool, search: bool) -> tuple[list[Span], int]:
        """A round's matches in the stable text of its views (`looks`, each with itself
        squeezed; if `search`), and where the bytes not decided begin (at or before
        `limit`, a window position inside no escape, or its end `n`)."""
        views = [v for v, _ in looks]
        found: list[Span] = []
        held = limit
        u = limit  # the stable end, in the view being looked at
        # A level not decoded (nothing in it was an escape) is, up to its stable end, the
        # level before it: looked at as that, for where an escape could yet begin.
        for level in range(max(len(looks), 1 if final or limit < n else DECODE_LEVELS)):
            view, squeezed = looks[min(level, len(looks) - 1)]
            text = view.text
            if final:
                u = len(text)
            else:
                if level < len(looks):
                    u = view.inner(u) if isinstance(view, _Decoded) else min(u, len(text))
                if limit >= n and level < DECODE_LEVELS:
                    # only bytes still to come could finish an escape: a range redacted
                    # from `limit` on finishes none
                    u = _unfinished(text, u)
                if u < len(text):
                    held = min(held, view.start(u))
            usq = squeezed.before(u)
            if search and level < len(looks):
                seen: set[bytes] = set()
                for snd in self.squeezed:
                    j = squeezed.text.find(snd, 0, usq)
                    if j != -1:
                        seen.add(snd)
                    while j != -1:
                        self._take(found, views, squeezed.source((j, j + len(snd))))
                        j = squeezed.text.find(snd, j + 1, usq)
                for nd, sq in self._pairs:
                    if sq is not None and sq not in seen:
                        continue
                    j = text.find(nd, 0, u)
                    while j != -1:
                        self._take(found, views, view.source((j, j + len(nd))))
                        j = text.find(nd, j + 1, u)
            if not final:
                for at in (self._starts.partial(view, u, floor),
                           self._squeezed_starts.partial(squeezed, usq, floor)):
                    if at is not None:
                        held = min(held, at)
        return found, held

    def _around(self, buf: bytes, stars: list[Span], fresh: list[Span],
                first: list[tuple[_View, _Squeezed]]) -> list[Span]:
        """The matches of a round's text (`buf` with `stars` redacted) near the ranges
        redacted since the last round (`fresh`): elsewhere its text is the last round's.
        A new match holds a new `*` (a form that holds one) or, squeezed, joins the
        letters and digits on both sides of a new range: the stretch searched reaches
        as many of them as the longest squeezed form has on each side, in each view of
        the first round (`width`, for a form with a `*` or a range with another
        redacted range that near, whose letters and digits are gone). Each stretch
        begins and ends where no escape is cut (`_sync`), so it decodes as the whole
        does there."""
        views = [v for v, _ in first]
        stretches: list[Span] = []
        for a, b in fresh:
            lo, hi = max(a - self.width, 0), b + self.width
            alone = not any(c < hi and d > lo for c, d in stars if (c, d) != (a, b))
            if alone and not self._starry:
                lo, hi = a, b
                i, j = a, b
                for view, squeezed in first:
                    if isinstance(view, _Decoded):
                        i, j = view.inner(i), view.inner(j)
                    k, m = squeezed.before(i), squeezed.before(j)
                    if k:
                        lo = min(lo, squeezed.start(max(k - self._reach, 0)))
                    if m < len(squeezed.text):
                        last = min(m + self._reach, len(squeezed.text))
                        hi = max(hi, squeezed.source((m, last))[1])
            stretches.append((max(lo - UNSTABLE, 0), hi + UNSTABLE))
        found: list[Span] = []
        for lo, hi in _merged(stretches):
            s0, s1 = _sync(views, lo), _sync(views, hi)
            part = _starred(buf[s0:s1], [(max(a, s0) - s0, min(b, s1) - s0)
                                         for a, b in stars if b > s0 and a < s1])
            got, _ = self._round(_looks(part), len(part), len(part), 0, True, True)
            found += [(a + s0, b + s0) for a, b in got]
        return found

    def _take(self, found: list[Span], views: list[_View], span: Span) -> None:
        a, b = _expand(views, span)
        if b - a <= self.width:
            found.append((a, b))


class _Starts:
    """Where a form could begin at a text's end: for each byte, the forms' proper
    prefixes that end with it, as (length, form), longest first."""

    def __init__(self, needles: tuple[bytes, ...]) -> None:
        ends: dict[int, list[tuple[int, bytes]]] = {}
        for nd in set(needles):
            for k in range(1, len(nd)):
                ends.setdefault(nd[k - 1], []).append((k, nd))
        self.ends = {c: sorted(v, key=lambda t: -t[0]) for c, v in ends.items()}

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def of(needles: tuple[bytes, ...]) -> _Starts:
        return _Starts(needles)

    def partial(self, view: _View | _Squeezed, end: int, floor: int) -> int | None:
        """The window position where a match not yet complete at `end` of `view` could
        begin (the earliest, at or after `floor`): where the longest suffix of
        `view.text[:end]` that begins a form begins."""
        if not end:
            return None
        text = view.text
        for k, nd in self.ends.get(text[end - 1], ()):
            if k <= end and nd.startswith(text[end - k:end]):
                at = view.start(end - k)
                if at >= floor:
                    return at
        return None
