"""The redactor and the scanner's decoding give what they gave before they were made fast.

`ReferenceRedactor` below is `scan.Redactor` as it was when it first searched every
view the scanner decodes (commit 123c041): simple, and slow (a Python call per escape,
a position map of every view at every feed). The fast one must send the guest the
same bytes at every feed, hold the same bytes and count the same redactions, on any
input split anywhere, in particular inputs seeded with the value in every form the
views decode (partly or doubly escaped, with separators, cut short at a read's end),
and long enough that matches far from a window's end are mapped too.

Attack stopped: an optimisation that lets a reflected value reach the guest in a
form, or at a read boundary, that the slow redactor caught.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.doors.secrets import scan
from tkbox.doors.secrets.scan import (
    DECODE_LEVELS,
    MIN_SQUEEZED,
    NAMED,
    NOT_ALNUM,
    REDACT_BYTE,
    Pattern,
    Redactor,
    _decode,
    decoded_views,
    forms,
    patterns,
)

MAX_ESCAPE = 8
REFERENCE_ESCAPES = re.compile(
    rb"%([0-9a-f]{2})|\\u00([0-9a-f]{2})|\\x([0-9a-f]{2})|&#x0*([0-9a-f]{1,2});"
    rb"|&#0*([0-9]{1,3});|\\(/)|&([a-z]{2,6});"
)
ALNUM_RUN = re.compile(rb"[a-z0-9]")
ESCAPE_START = re.compile(rb"[%%\\&][^%%\\&]{0,%d}\Z" % (MAX_ESCAPE - 1))


# --- the reference (scan.py at 123c041) ----------------------------------------------


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


def reference_decoded_views(low: bytes) -> list[bytes]:
    """Up to two levels of escape decoding of a case-folded window."""
    views: list[bytes] = []
    cur = low
    for _ in range(DECODE_LEVELS):
        if b"%" not in cur and b"\\" not in cur and b"&" not in cur:
            break
        nxt = REFERENCE_ESCAPES.sub(_decode_one, cur).lower()
        if nxt == cur:
            break
        views.append(nxt)
        cur = nxt
    return views


Span = tuple[int, int]


def _decode_mapped(text: bytes) -> tuple[bytes, list[tuple[int, int, int, int]]]:
    """One level of `decoded_views`' decoding, with its segments (decoded start, source
    start, decoded length, source length), so a decoded range maps back to the source."""
    out: list[bytes] = []
    segs: list[tuple[int, int, int, int]] = []
    d = s = 0
    for m in REFERENCE_ESCAPES.finditer(text):
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


class ReferenceRedactor:
    """`scan.Redactor` as of 123c041 (one position map per view, built every feed)."""

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


# --- inputs ---------------------------------------------------------------------------


def _esc(c: int, how: int) -> bytes:
    """Byte `c` as one escape the views decode (any case the text may use)."""
    return [b"%%%02x" % c, b"%%%02X" % c, b"\\u%04x" % c, b"\\x%02x" % c, b"&#x%x;" % c,
            b"&#%d;" % c, b"&#00%d;" % c, b"&#X%02X;" % c][how % 8]


_NAMES = {v[0]: b"&" + k + b";" for k, v in NAMED.items()}


@st.composite
def _value_in_a_form(draw: st.DrawFn, value: bytes) -> bytes:
    """The value in one of the forms a view decodes, or the start of one."""
    whole = [f for _, f in forms(value, for_redaction=True)]
    form = draw(st.sampled_from(whole))
    if draw(st.booleans()):
        form = draw(st.sampled_from([value.upper(), form.upper(), form.swapcase()]))
    out = bytearray()
    how = draw(st.integers(0, 6))
    for i, c in enumerate(form):
        if how == 1 and draw(st.booleans()):  # some characters escaped
            out += _esc(c, draw(st.integers(0, 7)))
        elif how == 2 and i % 2:  # escaped twice: %25XX, &amp;#..;, \u0025..
            out += draw(st.sampled_from([b"%25", b"&amp;", b"&percnt;", b"\\u0025",
                                         b"%26"])) + _esc(c, draw(st.integers(0, 7)))[1:]
        elif how == 3:  # separators between the characters
            out += bytes([c]) + draw(st.sampled_from([b"-", b" ", b"\r\n", b"", b"&amp;",
                                                      b"\\n", b"%20"]))
        elif how == 4 and c in _NAMES:
            out += _NAMES[c]
        elif how == 5 and draw(st.booleans()):  # one byte of an escape escaped in turn
            e = _esc(c, draw(st.integers(0, 7)))
            k = draw(st.integers(0, len(e) - 1))
            out += e[:k] + _esc(e[k], draw(st.integers(0, 7))) + e[k + 1:]
        else:
            out.append(c)
    if draw(st.integers(0, 3)) == 0:  # cut short (the end of a read, or of the body)
        out = out[:draw(st.integers(0, len(out)))]
    return bytes(out)


_NOISE = st.sampled_from([b"%", b"%2", b"%25", b"\\", b"\\u00", b"\\x4", b"&", b"&#", b"&#x",
                          b"&#0", b";", b"&amp", b"&amp;", b"&lt;", b"&nbsp;", b"&#999;",
                          b"\\/", b"\\\"", b"\\n", b"\x00", b"\x00%", b"-", b" ", b"=",
                          b"a", b"G", b"0", b"9", b"\xff", b"\xc3\xa9", b"&sol;", b"&#x00041;",
                          # pieces of escapes, and escaped pieces: escapes made by decoding
                          b"%34", b"%31", b"%3b", b"%23", b"%5c", b"%75", b"&#52;", b"&#x31;",
                          b"4", b"1", b"1;", b"b;", b"amp", b"#x", b"u00", b"x4", b"%00",
                          b"&#0;", b"\\u0000", b"%2", b"%5", b"&#x2", b"&#3"])


@st.composite
def _bodies(draw: st.DrawFn, value: bytes) -> bytes:
    pieces = draw(st.lists(st.one_of(
        _value_in_a_form(value),
        st.lists(_NOISE, max_size=12).map(b"".join),
        st.binary(max_size=40),
        # long stretches, so a match lies far (more than TAIL_WALK) from a view's end
        st.tuples(st.sampled_from([b"x", b"ab-", b"\x00", b"&amp;", b"%41", b" "]),
                  st.integers(0, 700)).map(lambda t: t[0] * t[1]),
    ), max_size=10))
    return b"".join(pieces)


_VALUES = st.one_of(
    st.sampled_from([b"ghp_S3cr3tV4lue+/=xyZ09", b"ab/cd/ef/gh_0123456789-XYZ/kkkk",
                     b"Sk-%41&amp;\\u0041", b"short1", b"\x00\xff&#;%"]),
    st.binary(min_size=4, max_size=24),
    st.text("abcXYZ019+/_-%&\\;#", min_size=4, max_size=30).map(str.encode),
)
FAST = settings(max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def _feeds(r: Redactor | ReferenceRedactor, chunks: list[bytes]) -> list[bytes]:
    return [r.feed(c) for c in chunks] + [r.feed(b"", final=True)]


# --- the properties -------------------------------------------------------------------


@FAST
@given(data=st.data())
def test_fast_redactor_sends_what_the_reference_sends(data: st.DataObject) -> None:
    """Every feed's output, the held bytes and the count are the reference's."""
    value = data.draw(_VALUES)
    body = data.draw(_bodies(value))
    chunks = _split(body, data.draw(st.lists(st.integers(0, 1 << 16), max_size=8)))
    pats = patterns([("GH", "value", value)], for_redaction=True)
    fast, ref = Redactor(pats), ReferenceRedactor(pats)
    for c in [*chunks, None]:
        got = fast.feed(b"", final=True) if c is None else fast.feed(c)
        want = ref.feed(b"", final=True) if c is None else ref.feed(c)
        assert got == want
        assert fast._buf == ref._buf
    assert fast.count == ref.count


@FAST
@given(data=st.data())
def test_fast_redactor_agrees_with_two_values(data: st.DataObject) -> None:
    """Two secrets' forms together (different lengths, overlapping matches)."""
    a, b = data.draw(_VALUES), data.draw(_VALUES)
    body = data.draw(_bodies(a)) + data.draw(_bodies(b)) + data.draw(_bodies(a))
    chunks = _split(body, data.draw(st.lists(st.integers(0, 1 << 16), max_size=6)))
    pats = patterns([("A", "value", a), ("B", "value", b)], for_redaction=True)
    assert _feeds(Redactor(pats), chunks) == _feeds(ReferenceRedactor(pats), chunks)


_V = b"ghp_S3cr3tV4lue+/=xyZ09"


@pytest.mark.parametrize("body", [
    (_V + b" ") * 300 + b"z" * 3000,
    b"-".join(_V[i:i + 1] for i in range(len(_V))) * 120 + b"x1" * 2000,
    b"".join(b"%%%02x" % c for c in _V) * 80 + b"&amp;" * 600,
    b"".join(b"\\u%04x" % c if i % 2 else bytes([c]) for i, c in enumerate(_V)) * 90 + b"q" * 900,
], ids=["raw", "separators", "percent", "some-unicode"])
@pytest.mark.parametrize("step", [65536, 4096, 333])
def test_many_matches_in_one_read_are_mapped_alike(body: bytes, step: int) -> None:
    """Hundreds of matches in a read, far from its end (positions listed, not counted)."""
    chunks = [body[i:i + step] for i in range(0, len(body), step)]
    pats = patterns([("GH", "value", _V)], for_redaction=True)
    assert _feeds(Redactor(pats), chunks) == _feeds(ReferenceRedactor(pats), chunks)


@FAST
@given(st.lists(st.one_of(_NOISE, st.binary(max_size=6)), max_size=60).map(b"".join))
def test_decoding_is_the_reference_decoding(text: bytes) -> None:
    """One level of decoding, and the scanner's two, are the `re.sub` ones."""
    low = text.lower()
    assert _decode(low)[0] == REFERENCE_ESCAPES.sub(_decode_one, low).lower()
    assert decoded_views(low) == reference_decoded_views(low)
    assert [v.text for v in scan._views(low)] == [low, *reference_decoded_views(low)]


def test_every_table_escape_decodes_as_the_reference() -> None:
    """The precomputed escapes (and the computed ones) are what `_decode_one` gives."""
    for key in [*list(scan._TABLE), b"&#x0000041;", b"&#0000;", b"&nbsp;", b"&#255;", b"&#256;"]:
        if key is None:
            continue
        m = REFERENCE_ESCAPES.fullmatch(key)
        assert m is not None
        assert scan._TABLE[key] == _decode_one(m).lower()
