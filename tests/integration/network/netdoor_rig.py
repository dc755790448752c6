"""A rig for integration tests of the network door on loopback.

- `TestCA`: a CA and one leaf certificate for the test names, made with
  `cryptography`, written as PEM files.
- `HTTPSOrigin`: a threaded HTTPS static-file server on 127.0.0.1 with that
  leaf (serves a directory; `git` dumb HTTP and a pip "simple" index work).
- `RecordingHTTPOrigin`: a plain HTTP server on 127.0.0.1 that notes each
  request's target and `Host` headers exactly as they arrived.
- `DoorThread`: an `EgressDoor` behind a loopback TCP listener, on its own
  event loop in a thread, so blocking clients (curl, git, pip) can use it as
  their proxy while the test answers approvals.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import http.server
import ipaddress
import ssl
import threading
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tkbox.doors.network import (
    ApprovalBoard,
    EgressDoor,
    OperatorConfig,
    SystemClock,
    SystemResolver,
    serve_tcp,
)
from tkbox.doors.network.door import Dialer, open_tcp
from tkbox.record.testing import FakeSigner

T = TypeVar("T")
NAMES = ["origin.test", "other.test", "git.test", "mirror.test"]


class TestCA:
    __test__ = False

    def __init__(self, directory: Path, names: Iterable[str] = NAMES) -> None:
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tkbox test CA")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
        sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "origin.test")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        self.ca_pem = directory / "ca.pem"
        self.cert_pem = directory / "leaf.pem"
        self.key_pem = directory / "leaf.key"
        self.ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.cert_pem.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
        self.key_pem.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert_pem, self.key_pem)
        return ctx


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class HTTPSOrigin:
    """A static HTTPS server for `root` on 127.0.0.1 (a thread)."""

    def __init__(self, root: Path, ca: TestCA) -> None:
        handler = functools.partial(_Quiet, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        ctx = ca.server_context()
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RecordingHTTPOrigin:
    """A plain HTTP server on 127.0.0.1 (a thread). `seen` holds, per request, its
    target and every `Host` header value, as the server read them."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[str]]] = []
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                seen.append((self.path, self.headers.get_all("Host") or []))
                body = b"recorded\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class DoorThread:
    """A door on its own loop in a thread, behind a loopback listener."""

    def __init__(
        self,
        allow: Iterable[str],
        operator: OperatorConfig,
        *,
        wait_seconds: float = 30.0,
        box: str = "demo",
        dial: Dialer = open_tcp,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.signer = FakeSigner()
        self.run_id = f"run-{box}"
        self.box = box

        async def setup() -> tuple[EgressDoor, asyncio.Server]:
            await self.signer.open_run(self.run_id, operator.facts())
            clock = SystemClock()
            self.board = ApprovalBoard(self.signer, clock, wait_seconds=wait_seconds)
            door = EgressDoor(
                self.run_id,
                self.signer,
                allow,
                operator,
                SystemResolver(),
                self.board,
                clock,
                box=box,
                dial=dial,
            )
            server = await serve_tcp(door)
            return door, server

        self.door, self.server = self.call(setup())
        self.port = self.server.sockets[0].getsockname()[1]
        self.proxy = f"http://127.0.0.1:{self.port}"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def pending(self) -> list[Any]:
        async def get() -> list[Any]:
            return self.board.list()

        return self.call(get())

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        async def get() -> list[dict[str, Any]]:
            return self.signer.of_run(self.run_id, kind)

        return self.call(get())

    def wait_records(self, kind: str, n: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The records of `kind` once there are `n`: a connection's completion is
        written after the client has seen its answer, so it may land a moment later."""
        import time as _time

        deadline = _time.monotonic() + timeout
        while len(found := self.records(kind)) < n and _time.monotonic() < deadline:
            _time.sleep(0.02)
        return found

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            await self.door.close()
            await self.server.wait_closed()

        try:
            self.call(stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
