"""Attack: fields a trailer may not carry, in a request's trailers on an intercepted tunnel.

The door sends the origin the tunnel's canonical `Host` and refuses an encoded request
body; a chunked request's trailers must not carry a second `Host`, framing or a
`Content-Encoding` past it. The origin here is a real TLS server on loopback that
notes the trailers it gets (h11, which keeps them).
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import pytest
from secretsdoor_rig import exchange, make_ca, world

from tkbox.doors.secrets import Secret, SecretSpec

pytestmark = pytest.mark.integration

VALUE = b"ghp_RealTokenValue0123456789"
PH = b"tkbox_GH_5f1d3c2b1a0998877665544332211000"


class TrailerOrigin:
    """A TLS origin that records each request's head and trailers and answers `ok`."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen: list[dict[str, Any]] = []
        self.done = threading.Condition()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        with c, self.ctx.wrap_socket(c, server_side=True) as s:
            conn = h11.Connection(h11.SERVER)
            entry: dict[str, Any] = {}
            while True:
                ev = conn.next_event()
                if ev is h11.NEED_DATA:
                    data = s.recv(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(ev, h11.Request):
                    entry = {"headers": [(bytes(n), bytes(v)) for n, v in ev.headers]}
                elif isinstance(ev, h11.EndOfMessage):
                    entry["trailers"] = [(bytes(n), bytes(v)) for n, v in ev.headers]
                    s.sendall(conn.send(h11.Response(status_code=200, headers=[
                        ("content-length", "2"), ("connection", "close")]))
                        + conn.send(h11.Data(data=b"ok")) + conn.send(h11.EndOfMessage()))
                    with self.done:
                        self.seen.append(entry)
                        self.done.notify_all()
                    return
                elif not isinstance(ev, h11.Data):
                    return

    def wait(self, n: int) -> list[dict[str, Any]]:
        with self.done:
            assert self.done.wait_for(lambda: len(self.seen) >= n, 30)
            return list(self.seen)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("trailers")
    ca, cert, key = make_ca(d)
    origin = TrailerOrigin(cert, key)
    sec = Secret(SecretSpec("GH", "env", "GH", ("api.bound.test",),
                            ports=(("api.bound.test", origin.port),)), VALUE, PH)
    w = world(d, ca, origin, sec, [f"api.bound.test:{origin.port}"])
    yield w
    w["rig"].close()
    origin.close()




def test_routing_framing_and_encoding_trailers_never_reach_the_origin(
        w: dict[str, Any]) -> None:
    n = len(w["origin"].seen)
    got = exchange(w, b"POST /up HTTP/1.1\r\nHost: api.bound.test:%d\r\n" % w["port"]
                    + b"Authorization: Bearer " + PH + b"\r\nTransfer-Encoding: chunked\r\n"
                    b"Connection: close\r\n\r\n3\r\nabc\r\n0\r\n"
                    b"Host: evil.example\r\nContent-Length: 5\r\nContent-Encoding: gzip\r\n"
                    b"Transfer-Encoding: chunked\r\nProxy-Authorization: x\r\n"
                    b"X-Checksum-Crc32: AAAAAA==\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 200 "), got[:200]
    entry = w["origin"].wait(n + 1)[n]
    assert [v for k, v in entry["headers"] if k == b"host"] == [
        b"api.bound.test:%d" % w["port"]]
    assert (b"authorization", b"Bearer " + VALUE) in entry["headers"]
    # an ordinary trailer still goes on; none of the others does
    assert entry["trailers"] == [(b"x-checksum-crc32", b"AAAAAA==")]
    assert VALUE.decode() not in json.dumps(w["rig"].records())
