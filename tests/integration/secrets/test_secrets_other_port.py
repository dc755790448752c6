"""Attack: the guest sends the placeholder to another port of the bound host.

The secret is bound to `api.bound.test` (443, the default); the network door
also allows `api.bound.test` on the origin's loopback port. A request there
must not get the value: it is refused as a placeholder leak (403, recorded),
and the origin never sees the value or the placeholder.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from secretsdoor_rig import Origin, exchange, make_ca, world

from tkbox.doors.secrets import Secret, SecretSpec

pytestmark = pytest.mark.integration

VALUE = b"ghp_RealTokenValue0123456789"
PH = b"tkbox_GH_5f1d3c2b1a0998877665544332211000"


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("other-port")
    ca, cert, key = make_ca(d)
    origin = Origin(cert, key)
    sec = Secret(SecretSpec("GH", "env", "GH", ("api.bound.test",)), VALUE, PH)  # 443 only
    w = world(d, ca, origin, sec, [f"api.bound.test:{origin.port}"])
    yield w
    w["rig"].close()
    origin.close()




def test_placeholder_to_an_unbound_port_of_the_bound_host_is_refused_not_swapped(
        w: dict[str, Any]) -> None:
    leaks = len(w["rig"].records("tkbox.secret.leak"))
    got = exchange(w, f"GET /echo HTTP/1.1\r\nHost: api.bound.test:{w['port']}\r\n".encode()
                    + b"Authorization: Bearer " + PH + b"\r\nConnection: close\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 403 ")
    assert b"placeholder of secret GH was found in the header Authorization" in got
    assert f"not on port {w['port']}".encode() in got
    (leak,) = w["rig"].records("tkbox.secret.leak")[leaks:]
    assert leak["body"]["host"] == "api.bound.test"
    assert w["rig"].records("tkbox.secret.use") == []
    time.sleep(0.2)
    assert all(VALUE not in json.dumps(e).encode() and PH not in json.dumps(e).encode()
               for e in w["origin"].log)
    assert VALUE.lower() not in got.lower()
    assert VALUE.decode() not in json.dumps(w["rig"].records())


def test_the_same_port_without_the_placeholder_still_works(w: dict[str, Any]) -> None:
    got = exchange(w, f"GET /x HTTP/1.1\r\nHost: api.bound.test:{w['port']}\r\n"
                    "Connection: close\r\n\r\n".encode())
    assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"ok\n")


def _plain(w: dict[str, Any], port: int, data: bytes) -> bytes:
    raw = socket.create_connection(("127.0.0.1", w["rig"].port), timeout=30)
    raw.sendall(f"GET http://api.bound.test:{port}/echo HTTP/1.1\r\n"
                f"Host: api.bound.test:{port}\r\n".encode() + data + b"\r\n")
    out = b""
    while True:
        c = raw.recv(65536)
        if not c:
            break
        out += c
    raw.close()
    return out


@pytest.mark.parametrize("port", ["origin", 8080])
def test_placeholder_in_plain_http_to_the_bound_host_names_no_port_to_bind(
        w: dict[str, Any], port: int | str) -> None:
    """The refusal of a placeholder sent in plain http (on any port, not only 80) must not
    tell the operator to bind port 80: no binding swaps into plain http, and following
    that advice would only allow another port of the bound host for nothing."""
    p = w["port"] if port == "origin" else int(port)
    leaks = len(w["rig"].records("tkbox.secret.leak"))
    got = _plain(w, p, b"Authorization: Bearer " + PH + b"\r\n")
    assert got.startswith(b"HTTP/1.1 403 ")
    assert b"placeholder of secret GH was found in the header authorization" in got
    assert b"nothing is ever swapped into a plain http:// request" in got
    assert b"bind it as" not in got and b"port 80" not in got
    (leak,) = w["rig"].records("tkbox.secret.leak")[leaks:]
    assert leak["body"]["host"] == "api.bound.test"
    assert VALUE.decode() not in json.dumps(w["rig"].records())
