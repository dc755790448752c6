"""A relayed plain-http request names the host the door decided on, in its canonical form.

A real HTTP server on 127.0.0.1 notes the `Host` headers and target it gets;
a guest's raw request reaches it through the door over loopback. The names are
mapped with an egress-hosts file and 127.0.0.1 is reached through a permit.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from netdoor_rig import DoorThread, RecordingHTTPOrigin

from tkbox.doors.network import OperatorConfig
from tkbox.doors.network.door import open_tcp
from tkbox.protocol.streams import ByteStream

pytestmark = pytest.mark.integration

NAMES = ["origin.test", "xn--bcher-kva.test"]


@pytest.fixture(scope="module")
def origin() -> Iterator[RecordingHTTPOrigin]:
    server = RecordingHTTPOrigin()
    yield server
    server.close()


@pytest.fixture(scope="module")
def operator(tmp_path_factory: pytest.TempPathFactory) -> OperatorConfig:
    hosts = tmp_path_factory.mktemp("hostrewrite") / "egress-hosts"
    hosts.write_text("127.0.0.1 " + " ".join(NAMES) + "\n")
    return OperatorConfig.from_flags(permit=["127.0.0.1/32"], hosts_file=hosts)


def ask(door: DoorThread, head: bytes) -> bytes:
    """Send one raw request head to the door as the guest would; its whole answer."""
    with socket.create_connection(("127.0.0.1", door.port), timeout=20) as s:
        s.sendall(head)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


# (request target, Host header line as the guest wrote it)
ON_PORT_80 = [
    ("http://origin.test/", b"Host: origin.test"),
    ("http://ORIGIN.Test/", b"Host: ORIGIN.Test"),
    ("http://origin.test./", b"Host: origin.test."),
    ("http://origin.test:80/", b"Host: origin.test:80"),
    ("http://origin.test/", b"Host: ORIGIN.TEST.:80"),
    ("http://Origin.Test.:80/", b"Host:origin.test"),
    ("http://origin.test/", b"Host: \t Origin.TEST.:80 \t "),
    ("http://origin.test/", b"hOsT:   origin.test.   "),
]


@pytest.mark.parametrize(("target", "host_line"), ON_PORT_80)
def test_origin_gets_the_canonical_host_however_the_guest_wrote_it(
    origin: RecordingHTTPOrigin, operator: OperatorConfig, target: str, host_line: bytes
) -> None:
    """Stops a guest's `ORIGIN.Test.:80` (checked as `origin.test`) reaching a server
    that matches names exactly, and may serve another site for a name it does not
    know: the origin gets one `Host: origin.test` and the origin-form target.

    No unprivileged test can listen on port 80, so the door's dialer (its `Dialer`
    boundary) connects to the origin's port whatever port the door dials; it notes
    what the door asked for, and the door still dials exactly the checked address."""
    dialed: list[tuple[str, int]] = []

    async def dial(address: str, port: int) -> ByteStream:
        dialed.append((address, port))
        return await open_tcp(address, origin.port)

    door = DoorThread(["origin.test"], operator, dial=dial)
    try:
        before = len(origin.seen)
        out = ask(door, f"GET {target} HTTP/1.1\r\n".encode() + host_line
                  + b"\r\nAccept: */*\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 200 "), out[:200]
        assert origin.seen[before:] == [("/", ["origin.test"])]
        assert dialed == [("127.0.0.1", 80)]
    finally:
        door.close()


@pytest.mark.parametrize(("target", "host_line", "canonical"), [
    ("http://Origin.Test.:{port}/a?b=1", b"Host: ORIGIN.test.:{port}", "origin.test:{port}"),
    ("http://XN--BCHER-KVA.TEST.:{port}/a?b=1", b"Host:  Xn--Bcher-Kva.Test:{port}",
     "xn--bcher-kva.test:{port}"),
])
def test_origin_on_another_port_gets_the_canonical_host_and_port(
    origin: RecordingHTTPOrigin, operator: OperatorConfig, target: str, host_line: bytes,
    canonical: str,
) -> None:
    """The same through the real dialer, on the origin's own port: the port is kept
    (it is not the default), the name is lower case, without its dot, in A-labels."""
    port = origin.port
    door = DoorThread([f"origin.test:{port}", f"xn--bcher-kva.test:{port}"], operator)
    try:
        before = len(origin.seen)
        head = (f"GET {target.format(port=port)} HTTP/1.1\r\n".encode()
                + host_line.replace(b"{port}", str(port).encode()) + b"\r\n\r\n")
        out = ask(door, head)
        assert out.startswith(b"HTTP/1.1 200 "), out[:200]
        assert origin.seen[before:] == [("/a?b=1", [canonical.format(port=port)])]
    finally:
        door.close()


def test_rig_origin_records_what_it_was_sent(origin: RecordingHTTPOrigin) -> None:
    """The recording server reports the guest's bytes as sent when nothing rewrites
    them, so the tests above would see a Host that was not rewritten."""
    before = len(origin.seen)
    with socket.create_connection(("127.0.0.1", origin.port), timeout=20) as s:
        s.sendall(b"GET /x HTTP/1.1\r\nHost: ORIGIN.Test.:80\r\nConnection: close\r\n\r\n")
        while s.recv(65536):
            pass
    assert origin.seen[before:] == [("/x", ["ORIGIN.Test.:80"])]


def test_only_the_canonical_host_is_relayed(
    origin: RecordingHTTPOrigin, operator: OperatorConfig
) -> None:
    """Exactly one Host reaches the origin; a second one is refused at the door."""
    door = DoorThread([f"origin.test:{origin.port}"], operator)
    try:
        before = len(origin.seen)
        out = ask(door, f"GET http://origin.test:{origin.port}/ HTTP/1.1\r\n"
                  f"Host: origin.test:{origin.port}\r\nHost: other.test\r\n\r\n".encode())
        assert out.startswith(b"HTTP/1.1 400 ")
        assert origin.seen[before:] == []
    finally:
        door.close()
