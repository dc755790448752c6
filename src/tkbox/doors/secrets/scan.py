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

ESCAPES = re.compile(
    rb"%([0-9a-f]{2})|\\u00([0-9a-f]{2})|\\x([0-9a-f]{2})|&#x0*([0-9a-f]{1,2});"
    rb"|&#0*([0-9]{1,3});|\\(/)|&([a-z]{2,6});"
)
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


def decoded_views(low: bytes) -> list[bytes]:
    """Up to two levels of escape decoding of a case-folded window."""
    views: list[bytes] = []
    cur = low
    for _ in range(DECODE_LEVELS):
        if b"%" not in cur and b"\\" not in cur and b"&" not in cur:
            break
        nxt = ESCAPES.sub(_decode_one, cur).lower()
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
ESCAPE_START = re.compile(rb"[%%\\&][^%%\\&]{0,%d}\Z" % (MAX_ESCAPE - 1))
Span = tuple[int, int]


def _decode_mapped(text: bytes) -> tuple[bytes, list[tuple[int, int, int, int]]]:
    """One level of `decoded_views`' decoding, with its segments (decoded start, source
    start, decoded length, source length), so a decoded range maps back to the source."""
    out: list[bytes] = []
    segs: list[tuple[int, int, int, int]] = []
    d = s = 0
    for m in ESCAPES.finditer(text):
        a, b = m.span()
        if a > s:
            out.append(text[s:a])
            segs.append((d, s, a - s, a - s))
            d += a - s
        rep = _decode_one(m)
        out.append(rep)
        segs.append((d, a, len(rep), b - a) if len(rep) == 1 else (d, a, b - a, b - a))
        d += len(rep)
        s = b
    if s < len(text):
        out.append(text[s:])
        segs.append((d, s, len(text) - s, len(text) - s))
    return b"".join(out).lower(), segs


def _map_through(segs: list[tuple[int, int, int, int]], span: Span) -> Span:
    starts = [g[0] for g in segs]

    def src(i: int, end: bool) -> int:
        g = segs[max(bisect.bisect_right(starts, i) - 1, 0)]
        if g[2] == g[3]:  # literal bytes
            return g[1] + (i - g[0]) + (1 if end else 0)
        return g[1] + (g[3] if end else 0)  # one escape: all of it

    return src(span[0], False), src(span[1] - 1, True)


class _View:
    """A view of the window (as sent, or decoded) that maps its ranges to the window's."""

    def __init__(self, text: bytes, outer: _View | None = None,
                 segs: list[tuple[int, int, int, int]] | None = None) -> None:
        self.text, self.outer, self.segs = text, outer, segs

    def source(self, span: Span) -> Span:
        if self.segs is not None:
            span = _map_through(self.segs, span)
        return self.outer.source(span) if self.outer is not None else span


class _Squeezed:
    """A view with every byte but letters and digits dropped (separators hide nothing)."""

    def __init__(self, inner: _View) -> None:
        self.inner = inner
        self.text = inner.text.translate(None, NOT_ALNUM)
        self._pos: list[int] | None = None

    def source(self, span: Span) -> Span:
        if self._pos is None:
            self._pos = [m.start() for m in ALNUM_RUN.finditer(self.inner.text)]
        return self.inner.source((self._pos[span[0]], self._pos[span[1] - 1] + 1))


def _views(low: bytes) -> list[_View | _Squeezed]:
    plain = _View(low)
    views: list[_View] = [plain]
    cur = plain
    for _ in range(DECODE_LEVELS):
        if b"%" not in cur.text and b"\\" not in cur.text and b"&" not in cur.text:
            break
        text, segs = _decode_mapped(cur.text)
        if text == cur.text:
            break
        cur = _View(text, cur, segs)
        views.append(cur)
    return [*views, *(_Squeezed(v) for v in views)]


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
    """

    def __init__(self, pats: Sequence[Pattern]) -> None:
        self.needles = sorted({p.needle for p in pats}, key=len, reverse=True)
        self.squeezed = sorted({sq for nd in self.needles
                                if len(sq := nd.translate(None, NOT_ALNUM)) >= MIN_SQUEEZED},
                               key=len, reverse=True)
        longest = len(self.needles[0]) if self.needles else 0
        # an escape spends at most MAX_ESCAPE bytes on one, per level
        self.hold = longest * MAX_ESCAPE ** DECODE_LEVELS
        self.longest = self.hold  # memory bound of what is held
        self._buf = b""
        self.count = 0
        self.feeds = 0  # calls that looked at bytes: each looks at the held bytes again

    def _partial(self, view: _View | _Squeezed, needles: list[bytes]) -> int | None:
        """The window position where a match still incomplete at its end could begin."""
        text = view.text
        best: int | None = None
        if isinstance(view, _View) and (m := ESCAPE_START.search(text)):
            text = text[:m.start()]  # an unfinished escape: held, and looked before
            best = view.source((m.start(), m.start() + 1))[0]
        for nd in needles:
            lo = max(len(text) - len(nd) + 1, 0)
            j = text.find(nd[:1], lo)
            while j != -1:
                if nd.startswith(text[j:]):
                    at = view.source((j, j + 1))[0]
                    best = at if best is None else min(best, at)
                    break
                j = text.find(nd[:1], j + 1)
        return best

    def feed(self, data: bytes, final: bool = False) -> bytes:
        """Redacted bytes that are decided; the rest is held until more comes or `final`."""
        if not self.needles:
            return data
        self.feeds += 1
        buf = self._buf + data
        n = len(buf)
        views = _views(buf.lower())
        spans: list[Span] = []
        decided = n
        for view in views:
            needles = self.needles if isinstance(view, _View) else self.squeezed
            for nd in needles:
                j = view.text.find(nd)
                while j != -1:
                    spans.append(view.source((j, j + len(nd))))
                    j = view.text.find(nd, j + 1)
            if not final:
                at = self._partial(view, needles)
                if at is not None:
                    decided = min(decided, at)
        decided = max(decided, n - self.hold, 0)
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
