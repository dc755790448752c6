"""A rig for the secrets door on loopback: a test CA, a recording HTTPS origin, and the
network door with a secrets door behind a loopback listener, on a loop in a thread.

The origin records every request (method, path, headers, body) so a test can
say where the real value arrived, and answers:

- `/echo`: reflects the request's headers and body (a host that reflects the
  value: the guest must get it back redacted);
- `/v1/messages`: a stand-in of the Anthropic Messages API, JSON or SSE;
- anything else: `ok`.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import ssl
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tkbox.doors.network import (
    ApprovalBoard,
    EgressDoor,
    OperatorConfig,
    SystemClock,
    SystemResolver,
    serve_tcp,
)
from tkbox.doors.network.allowlist import Allowlist
from tkbox.doors.secrets import Secret, SecretsDoor
from tkbox.image.testing import ScratchCA
from tkbox.record.testing import FakeSigner

T = TypeVar("T")
NAMES = ["api.bound.test", "other.test", "api.anthropic.com"]


def make_ca(d: Path, names: Sequence[str] = NAMES) -> tuple[Path, Path, Path]:
    ca = ScratchCA.create(d, names)
    return ca.ca_pem, ca.cert_pem, ca.key_pem


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log: list[dict[str, Any]]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _body(self) -> bytes:
        n = int(self.headers.get("content-length") or 0)
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(n) if n else b""

    def _serve(self) -> None:
        body = self._body()
        self.log.append({"method": self.command, "path": self.path,
                         "headers": [(k.lower(), v) for k, v in self.headers.items()],
                         "body": body})
        if self.path.startswith("/echo"):
            out = json.dumps({"headers": dict(self.headers.items()),
                              "body": body.decode("latin-1")}).encode()
            ctype = "application/json"
        elif self.path.startswith("/v1/messages"):
            req = json.loads(body or b"{}")
            if req.get("stream"):
                self._sse(req)
                return
            out = json.dumps({
                "id": "msg_1", "type": "message", "role": "assistant",
                "model": req.get("model", "m"), "stop_reason": "end_turn",
                "stop_sequence": None,
                "content": [{"type": "text", "text": "hello from the stand-in"}],
                "usage": {"input_tokens": 11, "output_tokens": 7}}).encode()
            ctype = "application/json"
        else:
            out, ctype = b"ok\n", "text/plain"
        self.send_response(200)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def _sse(self, req: dict[str, Any]) -> None:
        model = req.get("model", "m")
        events = [
            ("message_start", {"type": "message_start", "message": {
                "id": "msg_1", "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 23, "output_tokens": 1}}}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": "streamed hi"}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {
                "stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 42}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for name, data in events:
            chunk = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    do_GET = _serve
    do_POST = _serve
    do_PUT = _serve


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a request the door cut short (a blocked leak) is expected here


class Origin:
    """A recording HTTPS origin on 127.0.0.1 (a thread)."""

    def __init__(self, cert: Path, key: Path, handler_base: type = _Handler) -> None:
        self.log: list[dict[str, Any]] = []
        handler = type("H", (handler_base,), {"log": self.log})
        self.server = _Server(("127.0.0.1", 0), handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Rig:
    """The network door with a secrets door, behind a loopback proxy port."""

    def __init__(self, allow: Sequence[str], operator: OperatorConfig, secrets: Sequence[Secret],
                 ca_pems: Sequence[str], *, inspect: Sequence[str] = (),
                 model_hosts: Sequence[str] = (), signer: FakeSigner | None = None,
                 approval_wait: float = 5) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.signer = signer if signer is not None else FakeSigner()
        self.run_id = "run-secrets"

        async def setup() -> tuple[EgressDoor, asyncio.Server]:
            await self.signer.open_run(self.run_id, {})

            async def record(kind: str, body: dict[str, Any]) -> None:
                await self.signer.event(self.run_id, kind, body)

            self.mitm = SecretsDoor("box", secrets, inspect_hosts=inspect,
                                    model_hosts=model_hosts, ca_pems=ca_pems, record=record,
                                    ruled_hosts=Allowlist(allow).ruled_names())
            clock = SystemClock()
            self.board = ApprovalBoard(self.signer, clock, wait_seconds=approval_wait)
            door = EgressDoor(self.run_id, self.signer, allow, operator, SystemResolver(),
                              self.board, clock, box="box", mitm=self.mitm)
            return door, await serve_tcp(door)

        self.door, self.server = self.call(setup())
        self.port = self.server.sockets[0].getsockname()[1]
        self.proxy = f"http://127.0.0.1:{self.port}"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        async def get() -> list[dict[str, Any]]:
            return self.signer.of_run(self.run_id, kind)

        return self.call(get())

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


def world(d: Path, ca: Path, origin: Any, secret: Secret, allow: Sequence[str],
          model_hosts: Sequence[str] = ()) -> dict[str, Any]:
    """A `Rig` for one secret, `NAMES` all mapped to loopback (an operator hosts
    file) and permitted, and the box CA written where a client can trust it:
    {"rig", "origin", "port" (the origin's), "box_ca"}. Close rig and origin after."""
    hosts = d / "hosts"
    hosts.write_text("127.0.0.1 " + " ".join(NAMES) + "\n")
    op = OperatorConfig.from_flags(permit=["127.0.0.1/32"], hosts_file=hosts)
    rig = Rig(allow, op, [secret], [ca.read_text()], model_hosts=model_hosts)
    assert rig.mitm.ca_pem is not None
    box_ca = d / "box-ca.pem"
    box_ca.write_text(rig.mitm.ca_pem)
    return {"rig": rig, "origin": origin, "port": origin.port, "box_ca": box_ca}


def tunnel(w: dict[str, Any], host: str = "api.bound.test") -> ssl.SSLSocket:
    """A CONNECT through `w`'s door to `host` on the origin's port, and TLS in it
    (trusting the box CA)."""
    raw = socket.create_connection(("127.0.0.1", w["rig"].port), timeout=30)
    raw.sendall(f"CONNECT {host}:{w['port']} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += raw.recv(4096)
    assert b" 200 " in head
    return ssl.create_default_context(cafile=str(w["box_ca"])).wrap_socket(
        raw, server_hostname=host)


def exchange(w: dict[str, Any], data: bytes) -> bytes:
    """`data` sent in a `tunnel`, and everything the guest gets back until it ends."""
    s = tunnel(w)
    s.sendall(data)
    out = read_all(s)
    s.close()
    return out


def read_all(s: ssl.SSLSocket) -> bytes:
    """Everything `s` receives until it ends (or 30 s without a byte)."""
    s.settimeout(30)
    out = b""
    while True:
        try:
            c = s.recv(65536)
        except (ssl.SSLError, OSError):
            break
        if not c:
            break
        out += c
    return out
