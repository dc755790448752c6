"""What the redactor must send, computed the slow, obvious way; and bodies to try it on.

`reference_redact(body, values)` redacts a whole body at once, written from the
rules in docs/secrets.md without any of `scan.py`'s machinery (no pieces, no
markers, no lazy mapping, no stable ends, no carries): every view is a list of
characters, each carrying the range of the body's bytes it came from.

- Escapes (matched on the case-folded text, left to right, as a tokenizer
  would): `%XX`; `\\uXXXX`, `\\xXX`, `\\"` `\\\\` `\\/` `\\b` `\\f` `\\n` `\\r` `\\t`;
  `&#` 1-10 digits `;`, `&#x` 1-8 hex digits `;`, `&name;` for HTML's named
  references (2 to 31 letters and digits, starting with a letter; an unknown
  name stays as it is and is no escape).
- Views: the body case-folded; that decoded; that decoded again. Each also
  squeezed (letters and digits only).
- A match of a form (or of a squeezed form with 8 or more characters, in a
  squeezed view) covers the bytes of its characters, widened to every escape
  it touches in the body and in the first decoding; a range wider than 64
  times the longest form is no match.
- The ranges are replaced by `*`, the result searched again, and so on until a
  round finds nothing new, four rounds at most.

Only `patterns` (which forms exist) is shared with the code under test.
"""

from __future__ import annotations

import base64
import html
import json
import string
import urllib.parse
from dataclasses import dataclass
from html.entities import html5

from hypothesis import strategies as st

from tkbox.doors.secrets.leaks import patterns

WIDTH_PER_CHARACTER = 64
ROUNDS = 4
HEX = frozenset(b"0123456789abcdef")
DIGITS = frozenset(b"0123456789")
NAME = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789")
JSON_SHORT = {ord('"'): b'"', ord("\\"): b"\\", ord("/"): b"/", ord("b"): b"\b",
              ord("f"): b"\f", ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t"}


def _names() -> dict[bytes, bytes]:
    by_folded: dict[bytes, dict[str, str]] = {}
    for name, chars in html5.items():
        if name.endswith(";"):
            by_folded.setdefault(name[:-1].lower().encode(), {})[name[:-1]] = chars
    out = {}
    for folded, spellings in by_folded.items():
        chars = spellings.get(folded.decode(), spellings[min(spellings)])
        out[folded] = chars.encode("utf-8").lower()
    return out


NAMES = _names()


def escape_at(t: bytes, i: int) -> tuple[int, bytes] | None:
    """(length, what it stands for, case-folded) of the escape at `t[i]`, or None."""
    c = t[i:i + 1]
    if c == b"%":
        if len(t) >= i + 3 and t[i + 1] in HEX and t[i + 2] in HEX:
            return 3, bytes([int(t[i + 1:i + 3], 16)]).lower()
    elif c == b"\\" and i + 1 < len(t):
        k = t[i + 1]
        if k == ord("u") and len(t) >= i + 6 and all(x in HEX for x in t[i + 2:i + 6]):
            return 6, chr(int(t[i + 2:i + 6], 16)).encode("utf-8", "surrogatepass").lower()
        if k == ord("x") and len(t) >= i + 4 and all(x in HEX for x in t[i + 2:i + 4]):
            return 4, bytes([int(t[i + 2:i + 4], 16)]).lower()
        if k in JSON_SHORT:
            return 2, JSON_SHORT[k]
    elif c == b"&":
        semi = t.find(b";", i)
        if semi == -1:
            return None
        body = t[i + 1:semi]
        if body[:2] == b"#x" and 1 <= len(body) - 2 <= 8 and all(x in HEX for x in body[2:]):
            return semi + 1 - i, html.unescape(t[i:semi + 1].decode()).encode().lower()
        if body[:1] == b"#" and 1 <= len(body) - 1 <= 10 and all(x in DIGITS for x in body[1:]):
            return semi + 1 - i, html.unescape(t[i:semi + 1].decode()).encode().lower()
        if (2 <= len(body) <= 31 and body[0] in NAME and body[0] not in DIGITS
                and all(x in NAME for x in body) and body in NAMES):
            return semi + 1 - i, NAMES[body]
    return None


Char = tuple[int, int, int]  # (byte, first body byte, end)


def decode_level(chars: list[Char]) -> tuple[list[Char], list[tuple[int, int]]]:
    """One level of decoding, and the body ranges of the escapes it decoded."""
    t = bytes(c[0] for c in chars)
    out: list[Char] = []
    escapes: list[tuple[int, int]] = []
    i = 0
    while i < len(chars):
        e = escape_at(t, i)
        if e is None:
            out.append(chars[i])
            i += 1
            continue
        n, rep = e
        a, b = chars[i][1], chars[i + n - 1][2]
        out += [(x, a, b) for x in rep]
        escapes.append((a, b))
        i += n
    return out, escapes


def _occurrences(hay: bytes, needle: bytes) -> list[int]:
    out, j = [], hay.find(needle)
    while j != -1:
        out.append(j)
        j = hay.find(needle, j + 1)
    return out


def _widen(span: tuple[int, int], escapes: list[tuple[int, int]]) -> tuple[int, int]:
    a, b = span
    while True:
        wider = (a, b)
        for s, e in escapes:
            if s < b and a < e:
                a, b = min(a, s), max(b, e)
        if (a, b) == wider:
            return a, b


def _round(body: bytes, needles: list[bytes], squeezed: list[bytes], width: int
           ) -> set[tuple[int, int]]:
    level0: list[Char] = [(x, i, i + 1) for i, x in enumerate(body.lower())]
    level1, esc0 = decode_level(level0)
    level2, esc1 = decode_level(level1)
    escapes = esc0 + esc1
    found: set[tuple[int, int]] = set()
    for view in (level0, level1, level2):
        alnum = [c for c in view if chr(c[0]) in string.ascii_lowercase + string.digits]
        for chars, forms in ((view, needles), (alnum, squeezed)):
            hay = bytes(c[0] for c in chars)
            for nd in forms:
                for j in _occurrences(hay, nd):
                    hit = chars[j:j + len(nd)]
                    span = _widen((min(c[1] for c in hit), max(c[2] for c in hit)), escapes)
                    if span[1] - span[0] <= width:
                        found.add(span)
    return found


def _covered(spans: set[tuple[int, int]]) -> set[int]:
    return {i for a, b in spans for i in range(a, b)}


def reference_redact(body: bytes, values: list[bytes]) -> bytes:
    """`body` with every form of every value, in every view, replaced by `*`."""
    needles = sorted({p.needle for p in patterns([("S", "value", v) for v in values],
                                                 for_redaction=True)})
    squeezed = sorted({sq for nd in needles
                       if len(sq := bytes(x for x in nd if chr(x).isascii() and chr(x).isalnum()))
                       >= 8})
    width = WIDTH_PER_CHARACTER * max(map(len, needles))
    stars: set[int] = set()
    for _ in range(ROUNDS):
        text = bytes(b"*"[0] if i in stars else x for i, x in enumerate(body))
        more = _covered(_round(text, needles, squeezed, width)) - stars
        if not more:
            break
        stars |= more
    return bytes(b"*"[0] if i in stars else x for i, x in enumerate(body))


# --- the corpus: every escape form x separators x encodings x containers -------------


ESCAPE_FORMS = {
    "percent": lambda c: b"%%%02x" % c,
    "percent-upper": lambda c: b"%%%02X" % c,
    "json-u": lambda c: b"\\u%04x" % c,
    "json-u-upper": lambda c: b"\\u%04X" % c,
    "c-x": lambda c: b"\\x%02x" % c,
    "html-dec": lambda c: b"&#%d;" % c,
    "html-dec-zeros": lambda c: b"&#%05d;" % c,
    "html-hex": lambda c: b"&#x%x;" % c,
    "html-hex-upper": lambda c: b"&#X%02X;" % c,
    "json-short": lambda c: {34: b'\\"', 92: b"\\\\", 47: b"\\/"}.get(c, bytes([c])),
    "html-named": lambda c: NAMED_FOR.get(c, b"&#%d;" % c),
    "percent-twice": lambda c: b"%%25%02x" % c,
    "json-u-in-json": lambda c: b"\\\\u%04x" % c,
    "html-in-html": lambda c: b"&amp;#%d;" % c,
    "percent-in-json": lambda c: b"\\u0025%02x" % c,
}
NAMED_FOR = {v[0]: b"&" + k + b";" for k, v in sorted(NAMES.items(), key=lambda t: -len(t[0]))
             if len(v) == 1 and v[0] < 128}

SEPARATORS = [b"", b"\n", b"\r\n", b" ", b"-", b"\t", b"%0a", b"%0D%0A", b"%20", b"+",
              b"\\n", b"\\r\\n", b"\\t", b"\\u000a", b"\\u2028", b"&#10;", b"&#x0A;",
              b"&NewLine;", b"&nbsp;", b"&ZeroWidthSpace;", b"%25%30%41", b"\\\\n",
              b"&amp;#10;", b"\\x0a", b"&#8203;"]


def encodings(value: bytes) -> dict[str, bytes]:
    """The value as an origin might reflect it: its forms, and longer texts holding it."""
    out = {f"{form}-{i}": nd for i, (form, nd) in enumerate(_forms(value))}
    for k in range(3):
        whole = base64.b64encode(b"x" * k + value + b"tail")
        out[f"base64-text-{k}"] = whole
        out[f"base64-wrapped-{k}"] = b"\n".join(whole[i:i + 12] for i in range(0, len(whole), 12))
    out["hex-text"] = (b"\x01" + value).hex().encode()
    return out


def _forms(value: bytes) -> list[tuple[str, bytes]]:
    return [(p.form, p.needle) for p in patterns([("S", "value", value)], for_redaction=True)]


CONTAINERS = {
    "bare": lambda t: t,
    "json": lambda t: json.dumps(t.decode("latin-1")).encode("latin-1"),
    "json-ascii": lambda t: json.dumps(t.decode("latin-1"), ensure_ascii=True).encode(),
    "form": lambda t: urllib.parse.quote_plus(t, safe="").encode(),
    "html": lambda t: html.escape(t.decode("latin-1")).encode("latin-1"),
}


@dataclass(frozen=True)
class Shape:
    encoding: str
    escape: str
    every: int  # escape every n-th character (1: all)
    separator: bytes
    container: str


def shaped(value: bytes, shape: Shape) -> bytes:
    """The value in `shape`: encoded, some characters escaped, separators between
    them, put in a container."""
    text = encodings(value)[shape.encoding]
    esc = ESCAPE_FORMS[shape.escape]
    pieces = [esc(c) if i % shape.every == 0 else bytes([c]) for i, c in enumerate(text)]
    return CONTAINERS[shape.container](shape.separator.join(pieces))


VALUES = [b"ghp_S3cr3tV4lue+/=xyZ09", b"sk-ant-api03-AbC_dEf-0123456789", b"AKIA0123456789ABCDEF",
          b"tok/en%41&amp;\\u0041x"]

_PRINTABLE = st.binary(min_size=8, max_size=28).map(
    lambda b: bytes(33 + x % 94 for x in b))
values = st.one_of(st.sampled_from(VALUES), _PRINTABLE)


@st.composite
def shapes(draw: st.DrawFn, value: bytes) -> Shape:
    return Shape(draw(st.sampled_from(sorted(encodings(value)))),
                 draw(st.sampled_from(sorted(ESCAPE_FORMS))),
                 draw(st.sampled_from([1, 1, 2, 3, 1000])),
                 draw(st.sampled_from(SEPARATORS)),
                 draw(st.sampled_from(sorted(CONTAINERS))))


NOISE = st.sampled_from([b"%", b"%2", b"%25", b"\\", b"\\\\", b"\\u00", b"\\u", b"\\x4", b"&",
                         b"&#", b"&#x", b"&#0", b"&amp", b"&amp;", b"&lt;", b"&nbsp;",
                         b"&#99999;", b"\\/", b'\\"', b"\\n", b"\x00", b"-", b" ", b"=",
                         b"a", b"G", b"0", b"9", b"\xff", b"\xc3\xa9", b"&sol;", b"%3",
                         b"&#x00041;", b"%34", b"%31", b"%5c", b"%75", b"&#52;", b"4", b"1;",
                         b"amp", b"#x", b"u00", b"x4", b"\\u0025", b"\r\n", b"&CounterClo"])


@st.composite
def bodies(draw: st.DrawFn, value: bytes, most: int = 4) -> bytes:
    """A response: the value in up to `most` shapes (some cut short), among noise."""
    parts = []
    for _ in range(draw(st.integers(1, most))):
        parts.append(b"".join(draw(st.lists(NOISE, max_size=6))))
        one = shaped(value, draw(shapes(value)))
        if draw(st.integers(0, 4)) == 0:  # cut short: the start, or the end, of a form
            k = draw(st.integers(0, len(one)))
            one = one[:k] if draw(st.booleans()) else one[k:]
        parts.append(one)
    parts.append(b"".join(draw(st.lists(NOISE, max_size=6))))
    return b"".join(parts)
