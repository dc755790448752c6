"""Attack: a bound origin splits its answer where the redactor decides too early.

A reflected value whose characters sit in escapes with separators between them
(`%67%68...`, `\\u0067-\\u0068...`, `&#103; &#104;...`, base64 wrapped in a form
body) was redacted when the answer came in one read, but a read that ended inside
an unfinished escape let the bytes before it go out: through a view derived from
another (separators dropped, decoded once or twice) they could no longer begin a
match, and the rest never matched alone. Now each view's text is final only up to
where an unfinished escape begins, nothing a later byte could make part of a
match is sent, and the guest receives exactly what redacting the whole answer at
once gives (`redact_reference.reference_redact`, written apart from `leaks.py`), for
every cut, and nothing a fresh `LeakScanner` finds in it.
"""

from __future__ import annotations

import base64
import random
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redact_reference import (
    CONTAINERS,
    ESCAPE_FORMS,
    SEPARATORS,
    VALUES,
    Shape,
    bodies,
    decode_level,
    encodings,
    reference_redact,
    shaped,
    values,
)

from tkbox.doors.secrets import leaks
from tkbox.doors.secrets.leaks import UNSTABLE, LeakScanner, Redactor, patterns

VALUE = VALUES[0]


def _redact(value: bytes, chunks: list[bytes]) -> bytes:
    r = Redactor(patterns([("GH", "value", value)], for_redaction=True))
    out = []
    for c in chunks:
        out.append(r.feed(c))
        assert len(r._buf) <= r.hold
    return b"".join(out) + r.feed(b"", final=True)


def _clean(value: bytes, out: bytes) -> None:
    assert LeakScanner(patterns([("GH", "value", value)])).feed(out) == []


def _every_cut(value: bytes, body: bytes) -> None:
    """Redacted alike at every single cut, as the whole body at once, and clean."""
    want = reference_redact(body, [value])
    _clean(value, want)
    assert _redact(value, [body]) == want
    bad = [i for i in range(1, len(body)) if _redact(value, [body[:i], body[i:]]) != want]
    assert bad == [], f"cuts that change what the guest receives: {bad[:10]}"


def _spread(value: bytes, escape: str, sep: bytes) -> bytes:
    return sep.join(ESCAPE_FORMS[escape](c) for c in value)


# --- the attacks, each as found ----------------------------------------------------------


def test_redaction_split_inside_percent_escape_between_separated_characters() -> None:
    body = b"q=" + _spread(VALUE, "percent", b"%20") + b"&page=2"
    assert b"*" in reference_redact(body, [VALUE])
    _every_cut(VALUE, body)


def test_redaction_split_inside_unicode_escape_of_separated_characters() -> None:
    body = b'{"echo": "' + _spread(VALUE, "json-u", b"-") + b'"}'
    _every_cut(VALUE, body)


def test_redaction_split_inside_html_reference_of_separated_characters() -> None:
    for form in ("html-dec", "html-hex"):
        body = b"<p>" + _spread(VALUE, form, b" ") + b"</p>"
        _every_cut(VALUE, body)


def test_redaction_split_inside_line_wrapped_base64_in_a_form_body() -> None:
    """base64 wrapped at 64 columns (PEM), then form-encoded: `%0A` between lines, the
    value's form over three of them."""
    value = b"ab/cd/ef/gh_0123456789-XYZ/" + b"k" * 100  # its base64 spans three lines
    raw = base64.b64encode(b"x" + value)
    wrapped = b"\n".join(raw[i:i + 64] for i in range(0, len(raw), 64))
    body = b"file=" + urllib.parse.quote_plus(wrapped).encode() + b"&name=a.txt"
    _every_cut(value, body)


def test_redaction_split_inside_a_doubly_escaped_character() -> None:
    """`%2567` is `%67` is `g`: a cut after `%25` leaves a `%` in the first decoding."""
    body = b"x=" + _spread(VALUE, "percent-twice", b"%2520") + b"&y"
    _every_cut(VALUE, body)


def test_redaction_split_before_a_form_joined_across_a_redacted_range() -> None:
    """The start of a form, a whole one, and the rest of the first: with the whole one
    redacted and its `*` dropped, the two parts make a form of their own."""
    body = b"a " + VALUE[:9] + b" " + VALUE + b" " + VALUE[9:] + b" z"
    assert reference_redact(body, [VALUE]).count(b"*") == 2 * len(VALUE) + 2
    _every_cut(VALUE, body)


# --- every escape form, separator, encoding and container: every cut ---------------------


@pytest.mark.parametrize("escape", sorted(ESCAPE_FORMS))
def test_every_escape_form_is_redacted_alike_at_every_cut(escape: str) -> None:
    _every_cut(VALUE, b"<" + shaped(VALUE, Shape("raw-0", escape, 1, b"\n", "bare")) + b">")


@pytest.mark.parametrize("sep", SEPARATORS, ids=repr)
def test_every_separator_is_redacted_alike_at_every_cut(sep: bytes) -> None:
    _every_cut(VALUE, b"<" + shaped(VALUE, Shape("raw-0", "json-u", 2, sep, "bare")) + b">")


@pytest.mark.parametrize("encoding", sorted(encodings(VALUE)))
def test_every_encoding_is_redacted_alike_at_every_cut(encoding: str) -> None:
    _every_cut(VALUE, b"<" + shaped(VALUE, Shape(encoding, "percent", 3, b"", "bare")) + b">")


@pytest.mark.parametrize("container", sorted(CONTAINERS))
def test_every_container_is_redacted_alike_at_every_cut(container: str) -> None:
    _every_cut(VALUE, shaped(VALUE, Shape("hex-1", "html-dec", 2, b"\\n", container)))


SOME = settings(max_examples=30, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SOME
@given(st.data())
def test_any_corpus_body_is_redacted_as_a_whole_at_every_cut(data: st.DataObject) -> None:
    """Bodies of the corpus with one shape (more, and longer runs, in tests/fuzz/secrets),
    every single cut."""
    value = data.draw(values)
    _every_cut(value, data.draw(bodies(value, most=1)))


@SOME
@given(st.data())
def test_any_corpus_body_is_redacted_as_a_whole_at_random_cuts(data: st.DataObject) -> None:
    value = data.draw(values)
    body = data.draw(bodies(value))
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(body)), max_size=24))))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    want = reference_redact(body, [value])
    assert _redact(value, chunks) == want
    _clean(value, want)


# --- the reference is no oracle that agrees with anything ------------------------------------


def test_the_reference_redacts_each_shape_and_nothing_else() -> None:
    for escape in ESCAPE_FORMS:
        for sep in (b"", b"\\n", b"&#10;"):
            body = shaped(VALUE, Shape("raw-0", escape, 1, sep, "bare"))
            assert set(reference_redact(body, [VALUE])) == {ord("*")}, (escape, sep)
    plain = b'{"a": "hello %41 &amp; \\n \\u00e9 &#x41;", "b": "' + VALUE[:12] + b'"}'
    assert reference_redact(plain, [VALUE]) == plain


# --- what is held back is bounded ----------------------------------------------------


@pytest.mark.parametrize("stream", [
    b"&" + b"a" * 40,  # a name too long to be one: no escape, however long
    b"&#x" + b"0" * 7,  # unfinished numeric references, again and again
    b"\\u00",
    b"%2",
    b" ",  # the first character of the value, then endless separators
], ids=["long-name", "numeric", "unicode", "percent", "separators"])
def test_an_endless_unfinished_form_holds_at_most_hold_bytes(stream: bytes) -> None:
    """A hostile origin that never finishes: at most `hold` bytes wait, the rest goes
    on, and the guest gets every byte (redacted or not) by the end."""
    r = Redactor(patterns([("GH", "value", VALUE)], for_redaction=True))
    assert r.hold == r.width + 2 * UNSTABLE
    sent = len(r.feed(VALUE[:1]))
    for _ in range(400):
        sent += len(r.feed(stream * 8))
        assert len(r._buf) <= r.hold
    assert sent >= 1 + 400 * len(stream) * 8 - r.hold
    sent += len(r.feed(b"", final=True))
    assert sent == 1 + 400 * len(stream) * 8


# --- positions mapped back alike, however they are looked up ---------------------------------


def test_a_piece_is_found_alike_walking_back_summing_back_and_bisecting() -> None:
    """`_Decoded._piece` finds the piece holding a position three ways (by how far from
    the end it is, and whether all ends are listed): each gives what listing all does."""
    rnd = random.Random(5)
    toks = [b"%41", b"\\u00e9", b"\\\\", b"\\n", b"&amp;", b"&#x1f600;", b"abc", b"\x00", b"%",
            b"&", b"xxxxx", b"\\u2028", b"&foo;"]
    for _ in range(40):
        text = b"".join(rnd.choice(toks) for _ in range(rnd.randrange(1, 3000))).lower()
        for v in leaks._views(text)[1:]:
            assert isinstance(v, leaks._Decoded)
            listed = leaks._Decoded(v.text, v.outer, v.parts, v.dec, v.marked)
            listed._piece_ends()
            for in_source, total in ((True, len(v.outer.text)), (False, len(v.text))):
                for pos in rnd.sample(range(total), min(total, 40)):
                    fresh = leaks._Decoded(v.text, v.outer, v.parts, v.dec, v.marked)
                    assert fresh._piece(pos, in_source) == listed._piece(pos, in_source)


# --- the fast paths are the reference's ------------------------------------------------------


def _reference_levels(low: bytes) -> list[bytes]:
    level0 = [(x, i, i + 1) for i, x in enumerate(low)]
    level1 = decode_level(level0)[0]
    level2 = decode_level(level1)[0]
    return [bytes(c[0] for c in lv) for lv in (level1, level2)]


@SOME
@given(st.lists(st.one_of(st.sampled_from([b"%41", b"%2541", b"\\u00e9", b"\\\\", b"\\\\u0041",
                                           b"\\n", b"\\x41", b"&amp;", b"&#x1f600;", b"&#65;",
                                           b"&colon;", b"&Colon;", b"&foo;", b"\x00", b"%",
                                           b"&", b"\\", b";", b"#", b"x", b"\\u", b"&#x"]),
                          st.binary(max_size=4)), max_size=300).map(b"".join))
def test_decoding_is_the_reference_decoding(text: bytes) -> None:
    """Both levels, on the sparse and the dense (marked) paths: what the reference's
    escape-by-escape tokenizer gives."""
    low = text.lower()
    want = _reference_levels(low)
    assert leaks._decode(low)[0] == want[0]
    views = leaks._views(low)  # a level that would change nothing is left out
    assert [v.text for v in views] + [views[-1].text] * (3 - len(views)) == [low, *want]


@pytest.mark.parametrize("body", [
    (VALUE + b" ") * 300 + b"z" * 3000,
    b"-".join(VALUE[i:i + 1] for i in range(len(VALUE))) * 120 + b"x1" * 2000,
    b"".join(b"%%%02x" % c for c in VALUE) * 80 + b"&amp;" * 600,
    b"".join(b"\\u%04x" % c if i % 2 else bytes([c]) for i, c in enumerate(VALUE)) * 90
    + b"q" * 900,
], ids=["raw", "separators", "percent", "some-unicode"])
@pytest.mark.parametrize("step", [65536, 4096, 333])
def test_many_matches_in_one_read_are_redacted_as_the_reference(body: bytes, step: int) -> None:
    """Hundreds of matches in a read, far from its end (positions listed, not walked)."""
    want = reference_redact(body, [VALUE])
    assert _redact(VALUE, [body[i:i + step] for i in range(0, len(body), step)]) == want
