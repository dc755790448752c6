"""Attack: keep a request out of the record by relaying between mismatched HTTP versions.

A guest speaking HTTP/1.0 inside a tunnel the door reads, to an origin that
answers chunked with trailers, once made the relay raise inside h11 (a 1.0
client cannot be sent trailers): the exchange ended as an internal error, the
tunnel's `Connect` decision was never completed and the request's
`tkbox.model.call` never recorded. The rule tested here, over every combination
of guest version (1.0, 1.1), origin framing (length, chunked, chunked with
trailers, close-delimited), keep-alive or not, and an early close on either
side: the decision is completed, every request the origin got is recorded as a
model call, no exchange ends as an internal error, and a guest that stays gets
the body framed for its version (a 1.0 guest: no trailers, never chunked).

The origin is a real TLS server on loopback writing its framing by hand; the
guest is a real TLS client in a tunnel through the network and secrets doors.
"""

from __future__ import annotations

import itertools
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import pytest
from secretsdoor_rig import make_ca, tunnel, world

from tkbox.doors.secrets import Secret, SecretSpec

pytestmark = pytest.mark.integration

VALUE = b"ghp_RealTokenValue0123456789"
PH = b"tkbox_GH_5f1d3c2b1a0998877665544332211000"
MODEL = "api.anthropic.com"
BODY = json.dumps({"type": "message", "model": "stand-in-1", "content": "x" * 300,
                   "usage": {"input_tokens": 3, "output_tokens": 4}}).encode()
FRAMINGS = ("length", "chunked", "trailers", "close")
EARLY = ("none", "guest-mid-request", "guest-mid-response", "origin-mid-body")


class FramingOrigin:
    """A TLS origin answering each request (path `/v1/<framing>/<cut>`) with `BODY`
    framed as asked: Content-Length, chunked, chunked with a trailer, or
    close-delimited; with `cut` it closes half-way through the body. It keeps the
    connection open for another request unless the framing or the request says close.
    `seen` counts requests whose head arrived."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            with c, self.ctx.wrap_socket(c, server_side=True) as s:
                s.settimeout(30)
                buf = b""
                while True:
                    while b"\r\n\r\n" not in buf:
                        data = s.recv(65536)
                        if not data:
                            return
                        buf += data
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    with self.lock:
                        self.seen += 1
                    line = head.split(b"\r\n")[0].split(b" ")
                    _, framing, cut = line[1].decode().split("/")[1:4]
                    closing = b"connection: close" in head.lower()
                    if not self._answer(s, framing, cut == "cut", closing):
                        return
        except (OSError, ssl.SSLError, ValueError):
            return

    def _answer(self, s: ssl.SSLSocket, framing: str, cut: bool, closing: bool) -> bool:
        conn = b"connection: close\r\n" if closing else b""
        if framing == "length":
            out = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n" % (len(BODY), conn) + BODY
        elif framing in ("chunked", "trailers"):
            trailer = b"trailer: x-checksum\r\n" if framing == "trailers" else b""
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p)
                              for p in (BODY[:100], BODY[100:200], BODY[200:]))
            end = b"0\r\nx-checksum: abc123\r\n\r\n" if framing == "trailers" else b"0\r\n\r\n"
            out = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n%s%s\r\n" % (trailer, conn)
                   + chunks + end)
        else:
            out = b"HTTP/1.1 200 OK\r\n\r\n" + BODY
        if cut:
            s.sendall(out[:len(out) - len(BODY) // 2 - 40])
            return False
        s.sendall(out)
        return framing != "close" and not closing

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("versions")
    ca, cert, key = make_ca(d)
    origin = FramingOrigin(cert, key)
    sec = Secret(SecretSpec("GH", "env", "GH", ("api.bound.test",),
                            ports=(("api.bound.test", origin.port),)), VALUE, PH)
    w = world(d, ca, origin, sec, [f"{MODEL}:{origin.port}"], model_hosts=[MODEL])
    yield w
    w["rig"].close()
    origin.close()


def _wait_for(pred: Any, what: str, seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _request(version: str, keep: bool, framing: str, cut: bool, body: int | None = None
             ) -> bytes:
    head = f"{'POST' if body else 'GET'} /v1/{framing}/{'cut' if cut else 'whole'} " \
           f"HTTP/{version}\r\nHost: {MODEL}\r\n"
    if version == "1.0" and keep:
        head += "Connection: keep-alive\r\n"
    if version == "1.1" and not keep:
        head += "Connection: close\r\n"
    if body:
        head += f"Content-Length: {body}\r\n"
    return (head + "\r\n").encode()


def _read_response(s: ssl.SSLSocket, version: str) -> tuple[int, bytes, list[Any], bool]:
    """One response as the guest reads it, framing checked for the version it spoke:
    status, body, trailers, and whether the connection may carry another request.
    A 1.1 guest reads through h11; a 1.0 guest reads until the close (the door never
    keeps a 1.0 connection) a body that must not be chunked."""
    if version == "1.0":
        got = b""
        while True:
            try:
                c = s.recv(65536)
            except (ssl.SSLError, OSError):
                break
            if not c:
                break
            got += c
        head, _, body = got.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        fields = dict(line.lower().split(b": ", 1) for line in lines[1:])
        assert lines[0].startswith(b"HTTP/1.1 ") and b"transfer-encoding" not in fields, head
        if b"content-length" in fields:
            assert len(body) == int(fields[b"content-length"])
        return int(lines[0].split()[1]), body, [], False
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("host", MODEL)]))
    client.send(h11.EndOfMessage())
    status, data = 0, b""
    while True:
        ev = client.next_event()
        if ev is h11.NEED_DATA:
            try:
                client.receive_data(s.recv(65536))
            except (ssl.SSLError, OSError):
                client.receive_data(b"")
            continue
        if isinstance(ev, h11.Response):
            status = ev.status_code
        elif isinstance(ev, h11.Data):
            data += ev.data
        elif isinstance(ev, h11.EndOfMessage):
            again = client.our_state is h11.DONE and client.their_state is h11.DONE
            return status, data, list(ev.headers), again
        else:
            raise AssertionError(f"the guest got {ev!r} before its response ended")


CASES = list(itertools.product(("1.0", "1.1"), FRAMINGS, (True, False), EARLY))


@pytest.mark.parametrize("version,framing,keep,early", CASES,
                         ids=[f"http{v}-{f}-{'keep' if k else 'close'}-{e}"
                              for v, f, k, e in CASES])
def test_mismatched_versions_never_keep_an_exchange_out_of_the_record(
        w: dict[str, Any], version: str, framing: str, keep: bool, early: str) -> None:
    rig, origin = w["rig"], w["origin"]
    n_records = len(rig.records())
    seen_before = origin.seen
    s = tunnel(w, MODEL)
    s.settimeout(30)
    rounds = 2 if keep and early == "none" else 1
    for _ in range(rounds):
        if early == "guest-mid-request":
            s.sendall(_request(version, keep, framing, False, body=100) + b"x" * 10)
            time.sleep(0.2)
            break
        s.sendall(_request(version, keep, framing, early == "origin-mid-body"))
        if early == "guest-mid-response":
            s.recv(10)
            break
        if early == "origin-mid-body":
            got = b""
            while True:
                try:
                    c = s.recv(65536)
                except (ssl.SSLError, OSError):
                    break
                if not c:
                    break
                got += c
            # the guest never gets a whole body it was not sent
            assert BODY not in got
            break
        status, body, trailers, again = _read_response(s, version)
        assert status == 200 and body == BODY
        if framing == "trailers" and version == "1.1":
            assert [(bytes(k), bytes(v)) for k, v in trailers] == [(b"x-checksum", b"abc123")]
        if not again:
            break  # the door (or the origin) closes: no second request on this connection
    s.close()

    def completed() -> bool:
        recs = rig.records()[n_records:]
        decisions = [r["id"] for r in recs if r["kind"] == "tkbox.decision"]
        done = {r["decision"] for r in recs if r["kind"] == "tkbox.complete"}
        return len(decisions) == 1 and decisions[0] in done

    _wait_for(completed, "the tunnel's completion")
    recs = rig.records()[n_records:]
    complete = next(r for r in recs if r["kind"] == "tkbox.complete")["outcome"]
    assert complete.get("stage") != "internal", complete
    assert "internal" not in str(complete.get("reason", "")), complete
    assert complete["intercepted"] is True
    calls = [r["body"] for r in recs if r["kind"] == "tkbox.model.call"]
    # every request the origin got is in the record (the origin's thread may note the
    # last one a moment after the door recorded it)
    _wait_for(lambda: origin.seen - seen_before == len(calls),
              f"the origin to have seen the {len(calls)} recorded requests")
    time.sleep(0.1)
    assert origin.seen - seen_before == len(calls), calls
    assert len(calls) >= 1
    if early == "none":
        assert all(c["status"] == 200 and c["model"] == "stand-in-1" for c in calls)
    for c in calls:
        assert c["host"] == MODEL and c["path"].startswith("/v1/")
    assert not any(r["kind"] == "tkbox.egress.refused" and r["body"]["stage"] == "internal"
                   for r in recs)
    assert VALUE.decode() not in json.dumps(recs)
