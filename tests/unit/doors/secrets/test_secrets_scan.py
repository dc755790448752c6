"""The leak scanner and the redactor: every encoding x place x case, split-invariance.

Attack stopped: a guest that knows a secret's value (or holds its placeholder)
sends it out encoded, in any place of a request, split across chunks, so that
a scanner looking at one form or one chunk at a time misses it.
"""

from __future__ import annotations

import base64
import json
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tkbox.doors.secrets.leaks import LeakScanner, Redactor, forms, patterns

VALUE = b"ghp_S3cr3tV4lue+/=xyZ09"
PH = b"tkbox_GH_0123456789abcdef0123456789abcdef"
PATS = patterns([("GH", "value", VALUE), ("GH", "placeholder", PH)])
RED = patterns([("GH", "value", VALUE)], for_redaction=True)


def _b64_in_context(v: bytes, prefix: bytes, urlsafe: bool) -> bytes:
    enc = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    return enc(prefix + v + b"tail")


def encodings(v: bytes) -> dict[str, bytes]:
    """The value in every form a leaking guest might use."""
    out = {
        "raw": v,
        "percent-reserved": urllib.parse.quote(v, safe="").encode(),
        "percent-all": "".join(f"%{b:02X}" for b in v).encode(),
        "percent-some": b"".join(b"%%%02x" % b if i % 3 == 0 else bytes([b])
                                 for i, b in enumerate(v)),
        "percent-double": "".join(f"%25{b:02X}" for b in v).encode(),
        "json-escaped": json.dumps(v.decode()).encode(),
        "json-unicode": "".join(f"\\u{b:04x}" for b in v).encode(),
        "html-entities": "".join(f"&#{b};" for b in v).encode(),
        "hex": v.hex().encode(),
        "hex-escaped-percent": urllib.parse.quote(v.hex()).encode(),
        "base64-percent": urllib.parse.quote(base64.b64encode(v)).encode(),
        "reversed": v[::-1],
        "dashes-between": b"-".join(v[i:i + 1] for i in range(len(v))),
        "spaces-in-hex": b" ".join(b"%02x" % b for b in v),
        "mime-base64": b"\r\n".join(base64.b64encode(b"pad" + v + b"pad")[i:i + 7]
                                      for i in range(0, 60, 7)),
        "base32": base64.b32encode(b"ab" + v),
        "json-of-base64": json.dumps(base64.b64encode(v).decode()).encode().replace(b"/", b"\\/"),
    }
    for k in range(3):
        out[f"base64-align{k}"] = _b64_in_context(v, b"u" * k, False)
        out[f"base64url-align{k}"] = _b64_in_context(v, b"u" * k, True)
        out[f"base64-noPad-align{k}"] = _b64_in_context(v, b"::" [:k], False).rstrip(b"=")
    return out


ENC = encodings(VALUE)
PH_ENC = encodings(PH)
CASES = {"as-is": lambda b: b, "upper": bytes.upper, "lower": bytes.lower}


def _scan_chunks(chunks: list[bytes]) -> set[tuple[str, str]]:
    s = LeakScanner(PATS)
    for c in chunks:
        s.feed(c)
    return {(h.name, h.kind) for h in s.hits}


@pytest.mark.parametrize("place", ["url", "header", "body", "chunked", "trailer"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("enc", sorted(ENC))
def test_value_leak_found_in_every_encoding_place_and_case(enc: str, case: str,
                                                           place: str) -> None:
    """The value, in any encoding and case, in any place of a request, is found."""
    leak = CASES[case](ENC[enc])
    stream = {
        "url": b"GET /x?q=" + leak + b" HTTP/1.1\r\n",
        "header": b"X-Note: a " + leak + b" b\r\n",
        "body": b'{"data": "' + leak + b'"}',
        "chunked": b"5\r\nhello\r\n" + hex(len(leak))[2:].encode() + b"\r\n" + leak + b"\r\n0\r\n",
        "trailer": b"0\r\nX-Trailer: " + leak + b"\r\n\r\n",
    }[place]
    assert ("GH", "value") in _scan_chunks([stream])
    # and split into 1-byte chunks, the same
    assert ("GH", "value") in _scan_chunks([stream[i:i + 1] for i in range(len(stream))])


@pytest.mark.parametrize("enc", sorted(PH_ENC))
def test_placeholder_found_in_every_encoding(enc: str) -> None:
    """The placeholder, encoded, is found just like the value."""
    assert ("GH", "placeholder") in _scan_chunks([b"x=" + PH_ENC[enc].upper() + b"&"])


def test_clean_traffic_has_no_hits() -> None:
    """Ordinary bytes, including near misses, are not leaks."""
    clean = b"GET /" + VALUE[:-1] + b" " + VALUE[1:] + b"%41%42 \\u0041 " + bytes(range(256))
    assert _scan_chunks([clean]) == set()


def test_forms_are_distinct_and_bounded() -> None:
    f = forms(VALUE)
    assert len(f) == len({n for _, n in f})
    assert all(n == n.lower() for _, n in f)


streams = st.lists(st.sampled_from([b"abc", b"%", b"\\u00", b"&#", VALUE[:5], VALUE[5:],
                                    ENC["percent-all"][:9], ENC["base64-align1"],
                                    ENC["hex"], PH, b"\r\n", b"zz"]),
                   max_size=20).map(b"".join)


@settings(max_examples=200, deadline=None)
@given(data=streams, cuts=st.lists(st.integers(0, 4000), max_size=12))
def test_scan_does_not_depend_on_splitting(data: bytes, cuts: list[int]) -> None:
    """However the bytes are split, the scanner finds exactly the same leaks."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert _scan_chunks(chunks) == _scan_chunks([data])


def _redact(chunks: list[bytes]) -> bytes:
    r = Redactor(RED)
    out = b"".join(r.feed(c) for c in chunks)
    return out + r.feed(b"", final=True)


@settings(max_examples=300, deadline=None)
@given(data=streams, cuts=st.lists(st.integers(0, 4000), max_size=12))
def test_redaction_does_not_depend_on_splitting(data: bytes, cuts: list[int]) -> None:
    """However a response is split, the guest receives byte-for-byte the same thing."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    whole = _redact([data])
    assert _redact(chunks) == whole
    assert len(whole) == len(data)
    assert VALUE.lower() not in whole.lower()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("enc", ["raw", "hex", "base64-align0", "base64-align1",
                                 "base64-align2", "base64url-align1", "percent-reserved",
                                 "percent-all", "json-unicode"])
def test_redaction_hides_every_form_in_responses(enc: str, case: str) -> None:
    """A host that reflects the value cannot hand it to the guest, in these forms."""
    body = b"before " + CASES[case](ENC[enc]) + b" after"
    out = _redact([body[i:i + 3] for i in range(0, len(body), 3)])
    assert len(out) == len(body)
    assert ("GH", "value") not in _scan_chunks([out])


def test_scanner_memory_is_bounded() -> None:
    """Feeding megabytes keeps only the span, not the stream."""
    s = LeakScanner(PATS)
    for _ in range(64):
        s.feed(b"x" * 65536)
    assert len(s._tail) <= s.keeps
    r = Redactor(RED)
    for _ in range(64):
        r.feed(b"y" * 65536)
    assert len(r._buf) <= r.hold
