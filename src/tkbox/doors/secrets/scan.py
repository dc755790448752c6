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
  (only used to redact; the scanner decodes escapes in general, below).

**Scanning** (requests: is any value or placeholder leaving?). Each window is
searched twice: as sent (case-folded), and *decoded*: every `%XX`, `\\xXX`,
`\\u00XX`, `&#xXX;`, `&#DDD;`, named HTML entity (`&sol;`) and `\\/` replaced by
its byte, and that again (two levels: `%2541` is `A`); and each of those views
again *squeezed*, every byte but ASCII letters and digits dropped, searched for
the forms squeezed the same way (when 8 or more characters remain), so
separators, spaces or line breaks put between the characters (MIME-wrapped
base64 too) hide nothing.
So a value that is percent-encoded, JSON-escaped, HTML-escaped,
doubly encoded, or partly encoded (any subset of its bytes) and *then* hex or
base64 is found by one rule, not a list of cases. The scanner keeps the last
`span` bytes it saw (64 times the longest form: an escape spends at most
eight bytes on one, per level), so any occurrence ending in a chunk is inside that chunk's
window: the set of hits does not depend on how the bytes were split, and
memory is bounded by `span` plus one chunk. Each feed looks at the tail again,
so a streaming caller feeds at least `span` new bytes at a time (or what is
left at the message's end): the work stays linear in the bytes however they
were split (a body sent as one-byte chunks costs what one chunk does).

**Redaction** (responses: the guest must never read a value). Every match of
any form in any view the scanner searches (as sent, decoded, squeezed) covers
a range of the response's bytes; each range is replaced by as many `*` (so
lengths, and so `Content-Length`, do not change). Bytes are held back only
while they could begin a match not yet complete, at most `hold` (64 times
the longest form), so the output is the same however the input was split.
See `Redactor`.
"""

from __future__ import annotations

import base64
import bisect
import json
import re
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, islice, repeat
from operator import length_hint, sub

# Each escape begins with `%`, `\\` or `&`, and none of those occurs inside one, so
# escapes never overlap and each is decoded on its own (see `_decode`).
_ESCAPE_FORMS = (rb"%([0-9a-f]{2})", rb"\\u00([0-9a-f]{2})", rb"\\x([0-9a-f]{2})",
                 rb"&#x0*([0-9a-f]{1,2});", rb"&#0*([0-9]{1,3});", rb"\\(/)",
                 rb"&([a-z]{2,6});")
ESCAPES = re.compile(b"|".join(_ESCAPE_FORMS))
# HTML named character references (WHATWG HTML, "Named character references") of
# the visible ASCII characters a value may hold, names of at most six letters
# (case-folded: the views are); an unknown name is left as it is.
NAMED = {b"excl": b"!", b"quot": b'"', b"num": b"#", b"dollar": b"$", b"percnt": b"%",
         b"amp": b"&", b"apos": b"'", b"lpar": b"(", b"rpar": b")", b"ast": b"*",
         b"midast": b"*", b"plus": b"+", b"comma": b",", b"period": b".", b"sol": b"/",
         b"colon": b":", b"semi": b";", b"lt": b"<", b"equals": b"=", b"gt": b">",
         b"quest": b"?", b"commat": b"@", b"lsqb": b"[", b"lbrack": b"[", b"bsol": b"\\",
         b"rsqb": b"]", b"rbrack": b"]", b"hat": b"^", b"lowbar": b"_", b"grave": b"`",
         b"lcub": b"{", b"lbrace": b"{", b"verbar": b"|", b"vert": b"|", b"rcub": b"}",
         b"rbrace": b"}"}
MAX_ESCAPE = 8  # "&percnt;" carries one byte in eight
DECODE_LEVELS = 2
# Bytes the squeezed views drop: everything but ASCII letters and digits.
NOT_ALNUM = bytes(b for b in range(256) if not (48 <= b <= 57 or 97 <= b <= 122 or 65 <= b <= 90))
MIN_SQUEEZED = 8


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


def _decode_one(m: re.Match[bytes]) -> bytes:
    for g in (1, 2, 3, 4):
        if m.group(g) is not None:
            return bytes([int(m.group(g), 16)])
    if m.group(5) is not None:
        n = int(m.group(5))
        return bytes([n]) if n < 256 else m.group(0)
    if m.group(7) is not None:
        return NAMED.get(m.group(7), m.group(0))
    return b"/"


class _EscapeTable(dict[bytes | None, bytes]):
    """Escape (as `ESCAPES` matched it, case-folded) -> its byte, case-folded (or the
    escape itself where `_decode_one` leaves it). The common ones are filled in at import;
    others (leading zeros, unknown entity names) are computed, and kept while few and short."""

    LIMIT = 1 << 14

    def __missing__(self, key: bytes | None) -> bytes:
        m = ESCAPES.match(key or b"")
        assert key is not None and m is not None and m.end() == len(key)  # an escape
        rep = _decode_one(m).lower()
        if len(self) < self.LIMIT and len(key) <= 16:
            self[key] = rep
        return rep


_TABLE = _EscapeTable()
_TABLE[None] = b""
for _key in [b"\\/", *(b"&%s;" % nm for nm in NAMED),
             *(b"%s%02x" % (pre, c) for pre in (b"%", b"\\u00", b"\\x") for c in range(256)),
             *(b"&#x%x;" % c for c in range(16)), *(b"&#x%02x;" % c for c in range(256)),
             *(b"&#%d;" % c for c in range(1000)), *(b"&#%03d;" % c for c in range(100))]:
    if ESCAPES.fullmatch(_key):
        _TABLE.__missing__(_key)  # fills the entry
# `_decode` finds escapes by searching for one literal byte (C speed), never for any of
# three (a byte at a time in `re`). With few escapes, one search per first byte
# (`_ESCAPES_AT`: matches of different ones never overlap, so together they are
# `ESCAPES`' matches). With many, a NUL is put before each `%`, `&` and `\` as a marker
# and the text is split at the markers that begin an escape: where the text holds no
# NUL of its own, the other markers stay in the literal pieces and are dropped from the
# result at once (`_ESCAPE_SPLIT`); otherwise each is split off on its own (`_MARK_SPLIT`,
# its escape None).
_STARTS = (b"%", b"&", b"\\")
_ESCAPES_AT = [(c, re.compile(b"|".join(f for f in _ESCAPE_FORMS if f.startswith(c))))
               for c in _STARTS]
SPARSE_ESCAPES = 64  # at most this many escapes of one kind are split off one by one
_ESCAPE_ALTS = b"|".join(f.replace(b"(", b"(?:") for f in _ESCAPE_FORMS)
_ESCAPE_SPLIT = re.compile(rb"\0(" + _ESCAPE_ALTS + rb")")
_MARK_SPLIT = re.compile(rb"\0(?:(" + _ESCAPE_ALTS + rb")|(?=[%&\\]))")


def _decode(text: bytes) -> tuple[bytes, list[bytes | None], list[bytes], bool]:
    """`ESCAPES.sub(_decode_one, text).lower()` for a case-folded `text`, without a Python
    call per escape where there are many; with the pieces: `text` split as [literal,
    escape, literal, ..., literal] (an escape None where a marker began none), the same
    list decoded, and whether the literal pieces still hold markers (NULs that are not
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
        if out.count(b"\0") == marks - len(parts) // 2:  # no escape was a NUL
            return out.replace(b"\0", b""), parts, dec, True
    parts = _MARK_SPLIT.split(marked)
    dec = parts[:]  # type: ignore[assignment]
    dec[1::2] = map(_TABLE.__getitem__, parts[1::2])
    return b"".join(dec), parts, dec, False


def decoded_views(low: bytes) -> list[bytes]:
    """Up to two levels of escape decoding of a case-folded window."""
    views: list[bytes] = []
    cur = low
    for _ in range(DECODE_LEVELS):
        if b"%" not in cur and b"\\" not in cur and b"&" not in cur:
            break
        nxt = _decode(cur)[0]
        if nxt == cur:
            break
        views.append(nxt)
        cur = nxt
    return views


class LeakScanner:
    """Streaming search for any pattern, as sent or decoded. See the module docstring."""

    def __init__(self, pats: Sequence[Pattern]) -> None:
        self.patterns = list(pats)
        self.squeezed = [(p, sq) for p in self.patterns
                         if len(sq := p.needle.translate(None, NOT_ALNUM)) >= MIN_SQUEEZED]
        longest = max((len(p.needle) for p in self.patterns), default=0)
        # each level of escapes spends at most six bytes on one
        self.span: int = longest * MAX_ESCAPE ** DECODE_LEVELS
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
        self._tail = joined[-self.span:]
        self.feeds += 1
        self.scanned += len(window)
        new: list[Hit] = []
        views = [(window, False)] + [(v, True) for v in decoded_views(window)]
        for view, dec in views:
            squeezed = view.translate(None, NOT_ALNUM)
            for p in self.patterns:
                key = (p.name, p.kind, p.form)
                if key in self._seen or p.needle not in view:
                    continue
                self._seen.add(key)
                new.append(Hit(p.name, p.kind, p.form, dec))
            for p, sq in self.squeezed:
                key = (p.name, p.kind, p.form)
                if key in self._seen or sq not in squeezed:
                    continue
                self._seen.add(key)
                new.append(Hit(p.name, p.kind, p.form + " (with separators)", dec))
        self.hits.extend(new)
        return new

    def reset(self) -> None:
        """A new message: nothing carries over from the last one."""
        self._tail = b""


def scan_once(pats: Sequence[Pattern], data: bytes) -> list[Hit]:
    """All hits in one complete piece of bytes (a header value, a URL)."""
    return LeakScanner(pats).feed(data)


REDACT_BYTE = b"*"
ALNUM_RUN = re.compile(rb"[a-z0-9]")
# n letters or digits (and what is between them): skips n of them at C speed
ALNUM_SKIPS = [(n, re.compile(rb"(?:[^a-z0-9]*[a-z0-9]){%d}" % n)) for n in (256, 16)]
SQUEEZE_BLOCK = 4096
ALNUM_MASK = bytes(int(b not in NOT_ALNUM) for b in range(256))  # letters, digits -> 1
SQUEEZE_LOOKUPS = 16  # after this many positions looked up in blocks, all are listed
ESCAPE_START = re.compile(rb"[%%\\&][^%%\\&]{0,%d}\Z" % (MAX_ESCAPE - 1))
Span = tuple[int, int]
TAIL_WALK = 256  # a position this near a view's end is mapped walking back from it
RECHECK_ESCAPES = 64  # at most this many escapes are looked at one by one (`decodes_again`)


class _View:
    """The window as sent, case-folded: its ranges are the window's."""

    def __init__(self, text: bytes) -> None:
        self.text = text

    def start(self, i: int) -> int:
        """The window position where the range of view position `i` begins."""
        return i

    def source(self, span: Span) -> Span:
        return span


class _Decoded(_View):
    """One level of escape decoding of `outer` (`_decode`): a decoded range maps back
    to all of each escape it touches, and to literal bytes one for one.

    Nothing is mapped until a match needs it: near the end (a match not yet complete)
    by walking back over the last pieces, elsewhere by bisecting the pieces' ends.
    """

    def __init__(self, text: bytes, outer: _View, parts: list[bytes | None],
                 dec: list[bytes], marked: bool) -> None:
        super().__init__(text)
        self.outer, self.parts, self.dec, self.marked = outer, parts, dec, marked
        self._ends: tuple[list[int], list[int]] | None = None

    def _lengths(self, k: int) -> tuple[int, int]:
        """(decoded length, source length) of piece `k`."""
        if k % 2:  # an escape (None: a marker)
            return len(self.dec[k]), length_hint(self.parts[k])
        p = self.dec[k]  # literal bytes (with markers, if `marked`)
        n = len(p) - p.count(b"\0") if self.marked else len(p)
        return n, n

    def _piece(self, i: int) -> tuple[int, int, int, int]:
        """(decoded start, source start, decoded length, source length) of the piece
        holding decoded position `i`."""
        if len(self.text) - i <= TAIL_WALK:
            d, s = len(self.text), len(self.outer.text)
            k = len(self.parts) - 1
            while True:
                dl, sl = self._lengths(k)
                d, s = d - dl, s - sl
                if dl and d <= i:
                    return d, s, dl, sl
                k -= 1
        dends, sends = self._piece_ends()
        k = bisect.bisect_right(dends, i)
        dl, sl = self._lengths(k)
        return dends[k] - dl, sends[k] - sl, dl, sl

    def _piece_ends(self) -> tuple[list[int], list[int]]:
        """Where each piece ends, decoded and in the source (computed once, at C speed)."""
        if self._ends is None:
            dls = list(map(len, self.dec))
            if self.marked:  # literal pieces: less their markers
                dls[0::2] = map(sub, dls[0::2], map(bytes.count, self.dec[0::2], repeat(b"\0")))
            sls = dls[:]  # literal pieces are the same in both
            sls[1::2] = map(length_hint, self.parts[1::2])  # a marker (None): 0
            self._ends = list(accumulate(dls)), list(accumulate(sls))
        return self._ends

    def decodes_again(self) -> bool:
        """False only if decoding this view again changes nothing (so `_decode` need not
        run). An escape made of literal bytes alone was decoded already, and none holds
        a `%`, `&` or `\\` but its first, so a new one holds a byte an escape decoded
        to and begins at the last of those at or before it. With many escapes, True."""
        escapes = len(self.parts) // 2 - (0 if self.marked else self.parts.count(None))
        if escapes > RECHECK_ESCAPES:
            return True
        text, dends = self.text, self._piece_ends()[0]
        after = 0  # an escape beginning before this was looked at already
        for k in compress(range(1, len(self.parts), 2), map(length_hint, self.parts[1::2])):
            if len(self.dec[k]) != 1:
                continue  # an escape left as it is
            d = dends[k] - 1  # the byte it decoded to
            at = max(text.rfind(c, after, d + 1) for c in _STARTS)
            if at != -1 and (m := ESCAPES.match(text, at)) and m.end() > d:
                return True
            after = d + 1
        return False

    def _src(self, i: int, end: bool) -> int:
        d, s, dl, sl = self._piece(i)
        if dl == sl:  # literal bytes (or an escape left as it is)
            return s + (i - d) + (1 if end else 0)
        return s + (sl if end else 0)  # one escape: all of it

    def start(self, i: int) -> int:
        return self.outer.start(self._src(i, False))

    def source(self, span: Span) -> Span:
        return self.outer.source((self._src(span[0], False), self._src(span[1] - 1, True)))


class _Squeezed:
    """A view with every byte but letters and digits dropped (separators hide nothing)."""

    def __init__(self, inner: _View) -> None:
        self.inner = inner
        self.text = inner.text.translate(None, NOT_ALNUM)
        self._blocks: list[int] | None = None  # letters and digits up to each block's end
        self._lookups = 0
        self._all: list[int] | None = None  # the position of each letter and digit

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
        return self.inner.start(self._pos(j))

    def source(self, span: Span) -> Span:
        return self.inner.source((self._pos(span[0]), self._pos(span[1] - 1) + 1))


def _views(low: bytes) -> list[_View]:
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


class Redactor:
    """Streaming replacement of every form, as sent or decoded. See the module docstring.

    The window (held bytes and new ones) is searched in the views the scanner
    searches: as sent, after one and two levels of escape decoding (`ESCAPES`: so a
    value with any subset of its characters escaped, mixed with literal ones), and
    each of those squeezed (separators between the characters dropped). A match in
    a view covers a range of the window's bytes (all of each escape it uses, and
    the separators between its characters); every such range is replaced by as many
    `*`. Bytes are held back only while they could begin a match not yet complete
    (a suffix of some view is a prefix of a form, or an escape is unfinished), and
    never more than `hold` bytes: a form spread wider than that (separators longer
    than about 60 bytes between its characters) is passed on (docs/secrets.md).

    Cost: each view's text is made at C speed (`bytes.lower`, `_decode`,
    `bytes.translate`) and searched with `bytes.find`; a form is looked for in a view
    only if its squeezed form is in the view squeezed (or it has too few letters and
    digits to have one); the second level is decoded only where an escape could hold
    a byte the first decoded to (`_Decoded.decodes_again`); positions are mapped back
    to the window's bytes only for a match found, or one not yet complete at a view's
    end. The output is what the slower mapping of every view gave, byte for byte
    (tests/unit/secrets/test_secrets_redact_equivalence.py).
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
        # an escape spends at most MAX_ESCAPE bytes on one, per level
        self.hold = longest * MAX_ESCAPE ** DECODE_LEVELS
        self.longest = self.hold  # memory bound of what is held
        self._buf = b""
        self.count = 0
        self.feeds = 0  # calls that looked at bytes: each looks at the held bytes again

    @staticmethod
    def _partial(view: _View | _Squeezed, needles: list[bytes]) -> int | None:
        """The window position where a match still incomplete at its end could begin."""
        text = view.text
        end = len(text)
        best: int | None = None
        if isinstance(view, _View) and (
                m := ESCAPE_START.search(text, max(end - MAX_ESCAPE, 0))):
            end = m.start()  # an unfinished escape: held, and looked before
            best = view.start(end)
        for nd in needles:
            first = nd[:1]
            j = text.find(first, max(end - len(nd) + 1, 0), end)
            while j != -1:
                if nd.startswith(text[j:end]):
                    at = view.start(j)
                    best = at if best is None else min(best, at)
                    break
                j = text.find(first, j + 1, end)
        return best

    def feed(self, data: bytes, final: bool = False) -> bytes:
        """Redacted bytes that are decided; the rest is held until more comes or `final`."""
        if not self.needles:
            return data
        self.feeds += 1
        buf = self._buf + data if self._buf else bytes(data)
        n = len(buf)
        spans: list[Span] = []
        decided = n
        for view in _views(buf.lower()):
            squeezed = _Squeezed(view)
            found: set[bytes] = set()
            for snd in self.squeezed:
                j = squeezed.text.find(snd)
                if j != -1:
                    found.add(snd)
                while j != -1:
                    spans.append(squeezed.source((j, j + len(snd))))
                    j = squeezed.text.find(snd, j + 1)
            for nd, sq in self._pairs:
                if sq is not None and sq not in found:
                    continue
                j = view.text.find(nd)
                while j != -1:
                    spans.append(view.source((j, j + len(nd))))
                    j = view.text.find(nd, j + 1)
            if not final:
                for at in (self._partial(view, self.needles),
                           self._partial(squeezed, self.squeezed)):
                    if at is not None:
                        decided = min(decided, at)
        decided = max(decided, n - self.hold, 0)
        self._buf = buf[decided:]
        if not spans:
            return buf[:decided]
        spans.sort()
        out = bytearray(buf)
        merged: list[Span] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        for a, b in merged:
            if a >= decided:
                break
            decided = max(decided, b)  # a match begun is sent whole, redacted
            out[a:b] = REDACT_BYTE * (b - a)
            self.count += 1
        self._buf = buf[decided:]
        return bytes(out[:decided])
