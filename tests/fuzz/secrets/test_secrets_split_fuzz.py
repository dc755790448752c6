"""Fuzzing the redactor's split-invariance and the views' escape sets (issue 30, 1 and 2).

Promise of each target:

- redaction: for any body the corpus makes (the value in every encoding x escape
  form x separator x container, some cut short, among escape-like noise), cut at
  every single place and at random places, the guest receives exactly what
  redacting the whole body at once gives (`reference_redact`, written apart from
  `scan.py`), a fresh `LeakScanner` finds no value in it, and the redactor never
  holds more than `hold` bytes;
- escapes: the value with each character, or each gap between characters, written
  as a random escape of a random format the docs name (any code point), is found
  by the leak scan however the request is split, and reaches the guest only as `*`
  however the response is split.

A body that holds no value goes through unchanged (`test_a_body_without_the_value_is_
sent_as_it_is`), so a target cannot pass by redacting everything.
"""

from __future__ import annotations

import json
from html.entities import html5

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.doors.secrets.redact_reference import (
    NOISE,
    VALUES,
    bodies,
    reference_redact,
    shaped,
    shapes,
    values,
)

from tkbox.doors.secrets.leaks import LeakScanner, Redactor, patterns

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                       HealthCheck.data_too_large])
# short ones too: every cut of a body costs its length squared
_VALUES = st.one_of(values, st.binary(min_size=4, max_size=12),
                    st.binary(min_size=8, max_size=14).map(lambda b: bytes(33 + x % 94 for x in b)))


def _redact(value: bytes, chunks: list[bytes]) -> bytes:
    r = Redactor(patterns([("GH", "value", value)], for_redaction=True))
    out = []
    for c in chunks:
        out.append(r.feed(c))
        assert len(r._buf) <= r.hold
    return b"".join(out) + r.feed(b"", final=True)


def _cut(data: st.DataObject, body: bytes, most: int) -> list[bytes]:
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(body)), max_size=most))))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


def _clean(value: bytes, out: bytes) -> None:
    assert LeakScanner(patterns([("GH", "value", value)])).feed(out) == []


@FUZZ
@given(st.data())
def test_redaction_is_the_whole_body_redaction_at_every_cut(data: st.DataObject) -> None:
    value = data.draw(_VALUES)
    body = data.draw(bodies(value, most=1))
    want = reference_redact(body, [value])
    _clean(value, want)
    for i in range(len(body) + 1):
        assert _redact(value, [body[:i], body[i:]]) == want, i
    assert _redact(value, _cut(data, body, 16)) == want


@st.composite
def _long_bodies(draw: st.DrawFn, value: bytes) -> bytes:
    """Bodies longer than a match may be wide, with forms far from a read's end, forms
    joined around a redacted one, and long runs of separators after a form's start."""
    parts = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            parts.append(draw(bodies(value, most=2)))
        elif kind == 1:  # the start of a form, a whole one, the rest of the first
            f, g = shaped(value, draw(shapes(value))), shaped(value, draw(shapes(value)))
            k = draw(st.integers(0, len(f)))
            parts.append(f[:k] + draw(st.sampled_from([b"", b" ", b"%20"])) + g + f[k:])
        else:
            run = draw(st.sampled_from([b" ", b"\x00", b"-", b"x", b"&amp;", b"\\n", b"%2",
                                        b"q1 ", b"\\\\"]))
            parts.append(run * draw(st.integers(0, 9000 // len(run))))
    return b"".join(parts)


@FUZZ
@given(st.data())
def test_redaction_of_long_bodies_is_the_whole_body_redaction(data: st.DataObject) -> None:
    value = data.draw(values)
    body = data.draw(_long_bodies(value))
    want = reference_redact(body, [value])
    assert _redact(value, _cut(data, body, 30)) == want
    assert _redact(value, [body]) == want


@st.composite
def _escape(draw: st.DrawFn, c: int) -> bytes:
    """Code point `c` as one escape of a format the docs name (or of two, nested)."""
    up = draw(st.booleans())
    forms = [lambda: (b"\\u%04X" if up else b"\\u%04x") % c if c < 0x10000 else
             json.dumps(chr(c)).encode()[1:-1],
             lambda: b"&#%0*d;" % (draw(st.integers(1, 10)), c),
             lambda: (b"&#X%0*X;" if up else b"&#x%0*x;") % (draw(st.integers(1, 8)), c)]
    if c < 0x100:
        forms += [lambda: (b"%%%02X" if up else b"%%%02x") % c,
                  lambda: (b"\\x%02X" if up else b"\\x%02x") % c]
    short = {0x22: b'\\"', 0x5C: b"\\\\", 0x2F: b"\\/", 8: b"\\b", 0xC: b"\\f", 0xA: b"\\n",
             0xD: b"\\r", 9: b"\\t"}
    if c in short:
        forms.append(lambda: short[c])
    if c in NAMES:
        forms.append(lambda: draw(st.sampled_from(NAMES[c])))
    out: bytes = draw(st.sampled_from(forms))()
    if out != b"\\\\" and draw(st.integers(0, 5)) == 0:  # its first byte escaped again
        out = b"%%%02x" % out[0] + out[1:]
    return out


NAMES: dict[int, list[bytes]] = {}
for _name, _chars in html5.items():
    if _name.endswith(";") and len(_chars) == 1:
        NAMES.setdefault(ord(_chars), []).append(b"&" + _name.encode())
# Separators: no letter or digit, and none of `%&\#;` (which, decoded next to the
# value's characters, would make escapes of them: a different text, not a hiding place)
SEPARATING = st.one_of(
    st.sampled_from([0x0A, 0x0D, 0x09, 0x20, 0x2D, 0x2F, 0x2B, 0xA0, 0x2028, 0x200B, 0x1F600,
                     0xFEFF, 0x22, 0x3A]),
    st.integers(0, 0x10FFFF).filter(
        lambda x: not (chr(x).isascii() and (chr(x).isalnum() or chr(x) in "%&\\#;"))))


@st.composite
def _escaped_value(draw: st.DrawFn, value: bytes) -> bytes:
    out = bytearray()
    for i, c in enumerate(value):
        out += draw(_escape(c)) if draw(st.booleans()) else bytes([c])
        if i + 1 < len(value) and draw(st.integers(0, 2)) == 0:
            for _ in range(draw(st.integers(1, 3))):
                out += draw(_escape(draw(SEPARATING)))
    return bytes(out)


# values with no escape syntax of their own (one that has some is decoded with the
# escapes around it: another text), and 8 letters and digits (fewer are not looked
# for with separators between them)
PLAIN = st.binary(min_size=8, max_size=24).map(
    lambda b: bytes(x for x in (33 + y % 94 for y in b) if x not in b"%&\\#;") + b"tok3n0AB")


@FUZZ
@given(st.data())
def test_every_escape_of_every_format_is_found_and_redacted(data: st.DataObject) -> None:
    value = data.draw(st.one_of(st.sampled_from(VALUES[:3]), PLAIN))
    # (a space apart from the noise, whose `%2` would make an escape of what follows)
    body = (b"".join(data.draw(st.lists(NOISE, max_size=4))) + b" "
            + data.draw(_escaped_value(value)) + b" "
            + b"".join(data.draw(st.lists(NOISE, max_size=4))))
    scanner = LeakScanner(patterns([("GH", "value", value)]))
    for c in _cut(data, body, 8):
        scanner.feed(c)
    assert scanner.hits, body
    out = _redact(value, _cut(data, body, 8))
    assert out == reference_redact(body, [value])
    _clean(value, out)


@FUZZ
@given(st.data())
def test_a_body_without_the_value_is_sent_as_it_is(data: st.DataObject) -> None:
    value = data.draw(st.sampled_from(VALUES))
    body = b"".join(data.draw(st.lists(st.one_of(NOISE, st.binary(max_size=30)), max_size=30)))
    if LeakScanner(patterns([("GH", "value", value)], for_redaction=True)).feed(body):
        return
    assert _redact(value, _cut(data, body, 10)) == body
