"""A bound origin against the real door: reflections split inside escapes, and the
escapes a code host's contents API uses (issue 30, 1 and 2).

The origin reflects the swapped-in value with its characters escaped and separated,
writing its answer a few bytes at a time (each write flushed, with a pause), cut
inside the escapes: the door reads it in those pieces, and the guest must get what
redacting the whole answer gives (the slow reference), with no form of the value
left. A contents-API answer (base64 wrapped with JSON's `\\n`) reaches the guest
as `*`; the guest sending the same shape is refused before the origin hears it.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secretsdoor_rig import NAMES, Origin, _Handler, exchange, make_ca, world

from tkbox.doors.secrets import Secret, SecretSpec
from tkbox.doors.secrets.leaks import LeakScanner, patterns

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "doors" / "secrets"))
from redact_reference import reference_redact  # noqa: E402

pytestmark = pytest.mark.integration

VALUE = b"ghp_RealTokenValue0123456789"
PH = b"tkbox_GH_5f1d3c2b1a0998877665544332211000"


def _shapes(v: bytes) -> dict[str, bytes]:
    return {
        "percent": b"q=" + b"%20".join(b"%%%02x" % c for c in v) + b"&p=1",
        "unicode": b'{"e": "' + b"-".join(b"\\u%04x" % c for c in v) + b'"}',
        "html": b"<p>" + b" ".join(b"&#%d;" % c for c in v) + b"</p>",
        "form-base64": b"f=" + b"%0A".join(_lines(base64.b64encode(b"x" + v))) + b"&n",
        "contents": _contents(v),
    }


def _lines(b64: bytes) -> list[bytes]:
    """Lines of 10 columns: every form of the value spans several line breaks."""
    return [b64[i:i + 10] for i in range(0, len(b64), 10)]


def _contents(v: bytes) -> bytes:
    """A file in a code host's contents API answer: base64 wrapped, the line breaks
    JSON's `\\n`."""
    lines = b"\\n".join(_lines(base64.b64encode(b"#!/bin/sh\nexport TOKEN=" + v + b"\n")))
    return b'{"name": "deploy.sh", "encoding": "base64", "content": "' + lines + b'"}'


class _Splitting(_Handler):
    def _serve(self) -> None:
        if not self.path.startswith("/split/"):
            super()._serve()
            return
        self._body()
        v = self.headers.get("authorization", "").split()[-1].encode()
        out = _shapes(v)[self.path.removeprefix("/split/")]
        self.send_response(200)
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.flush()
        # pieces of 5 bytes: each escape (3 to 6 bytes) is cut somewhere
        for i in range(0, len(out), 5):
            self.wfile.write(out[i:i + 5])
            self.wfile.flush()
            time.sleep(0.002)

    do_GET = _serve
    do_POST = _serve


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("split-escapes")
    ca, cert, key = make_ca(d)
    origin = Origin(cert, key, _Splitting)
    sec = Secret(SecretSpec("GH", "env", "GH", ("api.bound.test",),
                            ports=(("api.bound.test", origin.port),)), VALUE, PH)
    w = world(d, ca, origin, sec, [f"{n}:{origin.port}" for n in NAMES])
    yield w
    w["rig"].close()
    origin.close()


def _get(w: dict[str, Any], path: str) -> bytes:
    return exchange(w, f"GET {path} HTTP/1.1\r\nHost: api.bound.test:{w['port']}\r\n".encode()
                    + b"Authorization: Bearer " + PH + b"\r\nConnection: close\r\n\r\n")


@pytest.mark.parametrize("shape", sorted(_shapes(VALUE)))
def test_reflection_split_inside_escapes_reaches_the_guest_as_a_whole_redaction(
        w: dict[str, Any], shape: str) -> None:
    got = _get(w, f"/split/{shape}")
    assert got.startswith(b"HTTP/1.1 200 ")
    body = got.split(b"\r\n\r\n", 1)[1]
    want = reference_redact(_shapes(VALUE)[shape], [VALUE])
    assert b"*" in want
    assert body == want
    assert LeakScanner(patterns([("GH", "value", VALUE)])).feed(got) == []
    assert VALUE.decode() not in json.dumps(w["rig"].records())


def test_leak_in_a_contents_api_shaped_request_is_refused(w: dict[str, Any]) -> None:
    """The guest PUTs a file the way a contents API takes one: base64 wrapped with
    JSON's `\\n`, the value inside. Refused: the origin gets the head and not a byte of
    the body, which was held back until it was scanned."""
    before = len(w["origin"].log)
    body = _contents(VALUE)
    got = exchange(w, f"PUT /repos/o/r/contents/deploy.sh HTTP/1.1\r\nHost: api.bound.test:"
                   f"{w['port']}\r\nContent-Length: {len(body)}\r\n".encode()
                   + b"Authorization: Bearer " + PH + b"\r\nConnection: close\r\n\r\n" + body)
    assert got.startswith(b"HTTP/1.1 403 ")
    assert b"value of secret GH" in got
    time.sleep(0.2)
    assert all(not e["body"] for e in w["origin"].log[before:])
    (leak,) = [r for r in w["rig"].records("tkbox.secret.leak")
               if r["body"].get("where") == "body"][-1:]
    assert leak["body"]["name"] == "GH"
