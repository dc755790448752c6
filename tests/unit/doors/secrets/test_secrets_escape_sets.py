"""Attack: the value, or what separates its characters, escaped in a way a format
allows but the scanner did not decode.

The docs name URL percent-encoding, JSON strings, the `\\xXX` byte escape and HTML
character references. JSON's two-character escapes were not decoded, so base64
wrapped with `\\n` inside a JSON string (how a code host's contents API returns a
file) split the match: neither the leak scan of a request nor the redaction of a
response caught it. Now every escape of each of those formats is decoded, and each
format's whole escape set is tried here, in a request (leak scan) and a response
(redaction), not a sample: every `%XX`, every `\\xXX`, JSON's eight two-character
escapes and every `\\uXXXX`, HTML's every named reference and numeric references of
every code point of the BMP (and each plane's edges; the fuzz target draws from
all). What each escape stands for is what the standard library's parsers say
(`json.loads`, `html.unescape`, `urllib.parse.unquote_to_bytes`), not `scan.py`.

An escape that stands for one printable character is tried inside a value; one
that stands for no letter or digit is tried between the value's characters (so
it must be dropped by the squeezed views, or the value's letters would be split
by the escape's own).
"""

from __future__ import annotations

import base64
import html
import json
import urllib.parse
from collections.abc import Iterator
from html.entities import html5
from pathlib import Path

import pytest

from tkbox.doors.secrets.leaks import LeakScanner, Redactor, patterns, scan_once

VALUE = b"ghp_S3cr3tV4lue0123456789abcdefXYZ"
ALNUM = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789")
DOCS = Path(__file__).resolve().parents[4] / "docs" / "secrets.md"


def _planes() -> list[int]:
    """Code points past the BMP: each plane's edges, and the first beyond Unicode."""
    out = [p << 16 | low for p in range(1, 17) for low in (0, 1, 0xFFFE, 0xFFFF)]
    return [*out, 0x1F600, 0x110000, 0xFFFFFFFF]


def escapes() -> Iterator[tuple[str, bytes, bytes]]:
    """(format, escape, what it stands for per the standard library) for every escape
    of every format the docs name."""
    for c in range(256):
        for esc in {b"%%%02x" % c, b"%%%02X" % c}:
            yield "percent", esc, urllib.parse.unquote_to_bytes(esc)
        for esc in {b"\\x%02x" % c, b"\\x%02X" % c}:
            yield "byte", esc, bytes([c])
    for k in b'"\\/bfnrt':
        esc = b"\\" + bytes([k])
        yield "json", esc, json.loads(b'"' + esc + b'"').encode()
    for c in range(0x10000):
        for esc in {b"\\u%04x" % c, b"\\u%04X" % c}:
            yield "json", esc, json.loads(b'"' + esc + b'"').encode("utf-8", "surrogatepass")
    for c in [*range(0x10000), *_planes()]:
        for esc in {b"&#%d;" % c, b"&#x%x;" % c, b"&#X%X;" % c, b"&#x%06x;" % c}:
            if len(esc) <= 13:
                yield "html", esc, html.unescape(esc.decode()).encode()
    for name in html5:
        if name.endswith(";"):
            esc = b"&" + name.encode()
            yield "html", esc, html.unescape(esc.decode()).encode()


def _fold(b: bytes) -> bytes:
    return b.lower()  # ASCII only: what the views do


def _sorted() -> tuple[list[tuple[str, bytes, bytes]], list[tuple[str, bytes]]]:
    """The escapes that stand for one printable character or hold letters or digits
    (tried inside a value), and those that stand for no letter or digit (tried between
    the characters)."""
    inside, between = [], []
    for fmt, esc, means in escapes():
        if ALNUM.isdisjoint(_fold(means)) and not (len(means) == 1 and 0x21 <= means[0] < 0x7F):
            between.append((fmt, esc))
        else:
            inside.append((fmt, esc, means))
    return inside, between


INSIDE, BETWEEN = _sorted()


def test_the_sets_are_whole() -> None:
    """So that a format's set cannot shrink unnoticed: the counts of each."""
    n = {fmt: 0 for fmt in ("percent", "byte", "json", "html")}
    for fmt, _, _ in escapes():
        n[fmt] += 1
    assert n["percent"] == n["byte"] == 256 + (256 - 10 * 10)  # A-F: a second spelling
    assert n["json"] == 8 + 0x10000 + (0x10000 - 10 ** 4)
    assert n["html"] == 264531
    assert sum(1 for k in html5 if k.endswith(";")) == 2125
    assert len(INSIDE) + len(BETWEEN) == sum(n.values())


def _value_with(means: bytes) -> bytes:
    return b"Tok" + means + b"en_0123456789xyzQ"


def _redacted(value: bytes, body: bytes, step: int) -> bytes:
    r = Redactor(patterns([("GH", "value", value)], for_redaction=True))
    out = b"".join(r.feed(body[i:i + step]) for i in range(0, len(body), step))
    return out + r.feed(b"", final=True)


@pytest.mark.parametrize("fmt", ["percent", "byte", "json", "html"])
def test_every_escape_of_a_character_is_found_in_requests_and_redacted_in_responses(
        fmt: str) -> None:
    """The value with one character written as the escape: the leak scan of a request
    finds it, and a response reflecting it reaches the guest as `*`."""
    missed, leaked = [], []
    for f, esc, means in INSIDE:
        if f != fmt:
            continue
        value = _value_with(means)
        body = b'{"q": "Tok' + esc + b'en_0123456789xyzQ"}'
        if not scan_once(patterns([("GH", "value", value)]), body):
            missed.append(esc)
        out = _redacted(value, body, 5)
        if LeakScanner(patterns([("GH", "value", value)])).feed(out) or esc in out:
            leaked.append(esc)
    assert missed == [] and leaked == [], (missed[:10], leaked[:10])


def _spread(seps: list[bytes]) -> Iterator[bytes]:
    """VALUE with the escapes between its characters: as many bodies as keep each
    within the width a match may have (64 times the longest form)."""
    room = 48 * 6 * len(VALUE)
    share = room // (len(VALUE) - 1)
    at = 0
    while at < len(seps):
        body = bytearray(VALUE[:1])
        for c in VALUE[1:]:
            run = 0
            while at < len(seps) and run + len(seps[at]) <= share:
                body += seps[at]
                run += len(seps[at])
                at += 1
            body.append(c)
        yield bytes(body)


@pytest.mark.parametrize("fmt", ["percent", "byte", "json", "html"])
def test_every_escape_of_a_separator_is_dropped_in_requests_and_responses(fmt: str) -> None:
    """The value's characters with runs of the escapes between them: the leak scan of
    a request finds the value, and a response reflecting it reaches the guest as `*`
    from its first character to its last."""
    seps = [esc for f, esc in BETWEEN if f == fmt]
    assert seps
    pats = patterns([("GH", "value", VALUE)])
    for body in _spread(seps):
        assert scan_once(pats, body), body[:200]
        out = _redacted(VALUE, body, 4096)
        assert set(out) == {ord("*")}, out[:200]


# --- the contents API: base64 wrapped with `\n`, inside a JSON string ------------------------


def _contents(value: bytes, lines: bytes) -> bytes:
    encoded = base64.encodebytes(b"#!/bin/sh\nexport TOKEN=" + value + b"\n").decode()
    encoded = encoded.replace("\n", lines.decode())
    return b'{"name": "deploy.sh", "encoding": "base64", "content": "' + encoded.encode() + b'"}'


LONG = b"ghp_" + b"S3cr3tV4lueXYZ0123456789" * 3  # its base64 is longer than a line


@pytest.mark.parametrize("lines", [b"\\n", b"\\r\\n", b"\\t", b"\\b", b"\\f", b"\\/", b'\\"',
                                   b"\\\\"], ids=repr)
def test_leak_of_base64_wrapped_with_json_escapes_is_found(lines: bytes) -> None:
    """A request body shaped like a contents API's file, the value in the file: each of
    JSON's two-character escapes as the line break."""
    body = _contents(LONG, lines)
    assert scan_once(patterns([("GH", "value", LONG)]), body)


@pytest.mark.parametrize("lines", [b"\\n", b"\\r\\n", b"\\t", b"\\b", b"\\f", b"\\/", b'\\"',
                                   b"\\\\"], ids=repr)
@pytest.mark.parametrize("step", [1, 7, 76, 100000])
def test_redaction_of_base64_wrapped_with_json_escapes(lines: bytes, step: int) -> None:
    """A contents API reflecting a file that holds the value: the guest gets `*`."""
    body = _contents(LONG, lines)
    out = _redacted(LONG, body, step)
    assert len(out) == len(body) and b"*" in out
    assert LeakScanner(patterns([("GH", "value", LONG)])).feed(out) == []


# --- what the docs say is not decoded is not --------------------------------------------------


@pytest.mark.parametrize("written", [
    b"Tok&ampen_0123456789xyzQ",  # an HTML reference without its `;`
    b"Tok\\u{26}en_0123456789xyzQ",  # JavaScript's \u{...}
    b"Tok\\46en_0123456789xyzQ",  # octal
    b"Tok&#x000000026;en_0123456789xyzQ",  # more than 8 hex digits
    b"Tok&#00000000038;en_0123456789xyzQ",  # more than 10 digits
    b"Tok&unknownname;en_0123456789xyzQ",
])
def test_what_the_docs_say_is_not_decoded_is_not(written: bytes) -> None:
    assert scan_once(patterns([("GH", "value", b"Tok&en_0123456789xyzQ")]), written) == []


def test_the_docs_list_the_escapes_decoded() -> None:
    text = DOCS.read_text()
    for spelled in ["`%XX`", '`\\"`', "`\\\\`", "`\\/`", "`\\b`", "`\\f`", "`\\n`", "`\\r`",
                    "`\\t`", "`\\uXXXX`", "`\\xXX`", "`&#DDD;`", "`&#xHHH;`", "2125"]:
        assert spelled in text, spelled
