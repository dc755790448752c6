"""Hostile origins and guests against the secrets door: what the origin reflects in
places other than the body (reason phrase, header names, malformed heads, model
fields), request smuggling, and the scanner's work on many tiny chunks.

Each test checks that the real value is nowhere in what the guest received nor in
any record.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from secretsdoor_rig import NAMES, Origin, _Handler, exchange, make_ca, world

from tkbox.doors.secrets import Secret, SecretSpec
from tkbox.doors.secrets.leaks import LeakScanner, Redactor
from tkbox.doors.secrets.rules import TunnelRules

pytestmark = pytest.mark.integration

VALUE = b"ghp_RealTokenValue0123456789"
PH = b"tkbox_GH_5f1d3c2b1a0998877665544332211000"


class _Hostile(_Handler):
    """Answers that carry what the request's Authorization held, outside the body."""

    def _serve(self) -> None:
        auth = self.headers.get("authorization", "")
        if self.path == "/reason":
            self._body()
            self.send_response(401, "bad credentials " + auth)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        if self.path == "/header-name":
            self._body()
            self.send_response(200)
            self.send_header("x-" + auth.split()[-1], "1")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        if self.path == "/badhead":
            self._body()
            self.wfile.write(b"HTTP/1.1 401 No\r\nWWW-Authenticate-Debug " + auth.encode()
                             + b"\r\ncontent-length: 0\r\n\r\n")
            return
        if self.path == "/reflect-forms":  # forms the redactor once passed on
            self._body()
            v = auth.split()[-1].encode()
            out = b"\n".join([
                b"".join(b"\\u%04x" % c if i % 3 == 0 else bytes([c]) for i, c in enumerate(v)),
                b"".join(b"&#%d;" % c if i % 2 else bytes([c]) for i, c in enumerate(v)),
                v.replace(b"_", b"&lowbar;"),
                b"-".join(bytes([c]) for c in v),
                base64.encodebytes(v * 3)])
            self.send_response(200)
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        if self.path == "/tiny-chunks":  # the value among 64 KiB, every byte its own chunk
            self._body()
            body = b"a" * 32768 + auth.split()[-1].encode() + b"z" * 32768
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"".join(b"1\r\n%c\r\n" % c for c in body) + b"0\r\n\r\n")
            return
        if self.path.startswith("/v1/model"):  # an OpenAI-compatible host echoing a field
            self._body()
            echoed = auth.split()[-1]
            if self.path.endswith("-dashed"):  # separators between the characters
                echoed = "-".join(echoed)
            out = json.dumps({"object": "chat.completion", "model": echoed,
                              "usage": {"prompt_tokens": 1}}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        super()._serve()

    do_GET = _serve
    do_POST = _serve


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("reflections")
    ca, cert, key = make_ca(d)
    origin = Origin(cert, key, _Hostile)
    sec = Secret(SecretSpec("GH", "env", "GH", ("api.bound.test",),
                            ports=(("api.bound.test", origin.port),)), VALUE, PH)
    w = world(d, ca, origin, sec, [f"{n}:{origin.port}" for n in NAMES],
              model_hosts=["api.bound.test"])
    yield w
    w["rig"].close()
    origin.close()




def _get(w: dict[str, Any], path: str, extra: bytes = b"", body: bytes = b"",
         method: bytes = b"GET") -> bytes:
    return exchange(w, method + f" {path} HTTP/1.1\r\nHost: api.bound.test:{w['port']}\r\n"
                     .encode() + b"Authorization: Bearer " + PH + b"\r\n" + extra
                     + b"Connection: close\r\n\r\n" + body)


def _completions(w: dict[str, Any], after: int) -> list[dict[str, Any]]:
    """The tunnels' completion records past the first `after` (waits for one)."""
    for _ in range(200):
        done = w["rig"].records("tkbox.complete")
        if len(done) > after:
            return done[after:]
        time.sleep(0.05)
    raise AssertionError("no tkbox.complete record")


def _nowhere(w: dict[str, Any], got: bytes) -> None:
    """The value in no form the guest could read, and in no record."""
    low = got.lower()
    for needle in (VALUE, VALUE[:12], VALUE[-12:]):
        assert needle.lower() not in low
    recs = json.dumps(w["rig"].records())
    assert VALUE.decode() not in recs
    assert VALUE[:12].decode() not in recs


def test_origin_reason_phrase_never_reaches_the_guest(w: dict[str, Any]) -> None:
    got = _get(w, "/reason")
    assert got.startswith(b"HTTP/1.1 401 Unauthorized\r\n")
    _nowhere(w, got)


def test_origin_header_name_holding_the_value_is_redacted(w: dict[str, Any]) -> None:
    got = _get(w, "/header-name")
    assert got.startswith(b"HTTP/1.1 200 ")
    assert b"x-" + b"*" * len(VALUE) in got.lower()
    _nowhere(w, got)


def test_malformed_origin_head_is_not_quoted_to_the_guest_or_the_record(
        w: dict[str, Any]) -> None:
    before = len(w["rig"].records("tkbox.complete"))
    got = _get(w, "/badhead")
    assert got.startswith(b"HTTP/1.1 502 ")
    assert b"x-tkbox-reason: refused: the origin's answer is not valid HTTP/1.1\r\n" in got
    (done,) = _completions(w, before)
    assert done["outcome"]["ended"] == "origin error"
    assert done["outcome"]["reason"] == "refused: the origin's answer is not valid HTTP/1.1"
    _nowhere(w, got)


def test_content_length_with_transfer_encoding_is_refused_not_forwarded(
        w: dict[str, Any]) -> None:
    before, done = len(w["origin"].log), len(w["rig"].records("tkbox.complete"))
    smuggled = (b"GET /echo HTTP/1.1\r\nHost: api.bound.test\r\nX-Debug: " + PH + b"\r\n\r\n")
    body = b"5\r\nhello\r\n0\r\n\r\n" + smuggled
    got = _get(w, "/echo", b"Content-Length: 15\r\nTransfer-Encoding: chunked\r\n", body,
               method=b"POST")
    assert got.startswith(b"HTTP/1.1 403 ")
    assert b"both Content-Length and Transfer-Encoding" in got
    (rec,) = _completions(w, done)
    assert rec["outcome"]["ended"] == "refused request"
    time.sleep(0.2)
    assert len(w["origin"].log) == before
    _nowhere(w, got)


def _model_call(w: dict[str, Any], before: int) -> dict[str, Any]:
    """The one `tkbox.model.call` recorded after `before` (recorded as the answer ends)."""
    for _ in range(100):
        calls = w["rig"].records("tkbox.model.call")[before:]
        if calls:
            break
        time.sleep(0.05)
    (call,) = calls
    return dict(call)


def test_model_field_echoing_the_value_is_not_recorded(w: dict[str, Any]) -> None:
    before = len(w["rig"].records("tkbox.model.call"))
    got = _get(w, "/v1/model")
    assert got.startswith(b"HTTP/1.1 200 ")
    assert b'"model": "' + b"*" * len(VALUE) + b'"' in got
    call = _model_call(w, before)
    assert call["body"]["path"] == "/v1/model"
    assert call["body"]["model"] == "*" * len(VALUE)
    assert call["body"]["usage"] == {"input_tokens": 1}
    _nowhere(w, got)


def test_model_name_holding_the_value_with_separators_is_redacted(w: dict[str, Any]) -> None:
    before = len(w["rig"].records("tkbox.model.call"))
    got = _get(w, "/v1/model-dashed")
    assert got.startswith(b"HTTP/1.1 200 ")
    assert b'"model": "' + b"*" * (2 * len(VALUE) - 1) + b'"' in got
    call = _model_call(w, before)
    assert call["body"]["model"] == "*" * (2 * len(VALUE) - 1)
    assert "-".join(VALUE.decode()) not in json.dumps(w["rig"].records())
    _nowhere(w, got)


def _post_chunks(w: dict[str, Any], path: str, chunks: list[bytes]) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: api.bound.test:{w['port']}\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    return exchange(w, head + body)


@pytest.fixture
def scanners(monkeypatch: pytest.MonkeyPatch) -> list[LeakScanner]:
    """Every body scanner the door makes while the test runs."""
    made: list[LeakScanner] = []
    real = TunnelRules.body_scanner

    def spy(self: TunnelRules) -> LeakScanner:
        made.append(real(self))
        return made[-1]

    monkeypatch.setattr(TunnelRules, "body_scanner", spy)
    return made


def test_a_body_of_one_byte_chunks_is_scanned_in_linear_work(
        w: dict[str, Any], scanners: list[LeakScanner]) -> None:
    n = 64 * 1024
    before = len(w["origin"].log)
    got = _post_chunks(w, "/echo-tiny", [b"%"] * n)
    assert got.startswith(b"HTTP/1.1 200 ")
    assert w["origin"].log[before]["body"] == b"%" * n
    (sc,) = scanners
    # Each feed looks at the held tail again (`hold` bytes): fed per 1-byte chunk this
    # was n feeds and n * hold bytes (~190 MB here); now at most two looks at each byte.
    assert sc.hold > 1000
    assert sc.feeds <= n // sc.hold + 2
    assert sc.scanned <= 2 * n + 2 * sc.hold
    _nowhere(w, got)


def test_a_placeholder_split_over_one_byte_chunks_is_still_caught(
        w: dict[str, Any], scanners: list[LeakScanner]) -> None:
    before, leaks = len(w["origin"].log), len(w["rig"].records("tkbox.secret.leak"))
    chunks = [b"x"] * 5000 + [bytes([c]) for c in PH] + [b"y"] * 3
    got = _post_chunks(w, "/echo-split", chunks)
    assert got.startswith(b"HTTP/1.1 403 ")
    assert b"placeholder of secret GH was found in the body" in got
    (leak,) = w["rig"].records("tkbox.secret.leak")[leaks:]
    assert leak["body"]["where"] == "body"
    time.sleep(0.2)
    assert all(PH not in e["body"] for e in w["origin"].log[before:])
    (sc,) = scanners
    assert sc.feeds <= 5100 // sc.hold + 2
    _nowhere(w, got)


@pytest.fixture
def redactors(monkeypatch: pytest.MonkeyPatch) -> list[Redactor]:
    """Every response redactor the door makes while the test runs."""
    made: list[Redactor] = []
    real = TunnelRules.redactor

    def spy(self: TunnelRules) -> Redactor:
        made.append(real(self))
        return made[-1]

    monkeypatch.setattr(TunnelRules, "redactor", spy)
    return made


def _dechunk(got: bytes) -> bytes:
    head, _, rest = got.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    out = b""
    while True:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return out
        out, rest = out + rest[:n], rest[n + 2:]


def test_an_origins_one_byte_chunks_are_redacted_per_read_not_per_chunk(
        w: dict[str, Any], redactors: list[Redactor]) -> None:
    """Attack: answer in 1-byte chunks, so the door's loop (every box's) does a chunk's
    work (a redaction, a TLS write) per byte; and reflect the value across 28 of them."""
    got = _get(w, "/tiny-chunks")
    assert got.startswith(b"HTTP/1.1 200 ")
    body = _dechunk(got)
    assert body == b"a" * 32768 + b"*" * len(VALUE) + b"z" * 32768
    (r,) = redactors
    assert r.count == 1
    # One feed per read of the origin (16 KiB TLS records, ~2700 chunks each), not one
    # per chunk (65564 before).
    n = len(body)
    assert r.feeds < n // 100
    _nowhere(w, got)


def test_value_reflected_escaped_in_part_or_with_separators_is_redacted(
        w: dict[str, Any]) -> None:
    """Attack: a bound origin reflects the value with some characters JSON-escaped, as
    HTML entities, with separators, or wrapped base64, hoping the guest reads it there."""
    got = _get(w, "/reflect-forms")
    assert got.startswith(b"HTTP/1.1 200 ")
    body = got.partition(b"\r\n\r\n")[2]
    rules = TunnelRules("api.bound.test", w["port"], w["rig"].mitm.secrets)
    assert LeakScanner(rules.scan_patterns).feed(body) == []
    assert body.count(b"*") >= 4 * len(VALUE)
    _nowhere(w, got)
