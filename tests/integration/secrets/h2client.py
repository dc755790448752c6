"""A raw HTTP/2 client for the door's tests: CONNECT through the proxy, TLS with
ALPN `h2` (trusting the box CA), then `h2` (with its outbound checks off, so a
test can send what a hostile box would) or frames written by hand."""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions

MAX_KEPT = 8 * 1024 * 1024


@dataclass(frozen=True)
class Goaway:
    error_code: int
    last_stream_id: int
    additional_data: bytes


def find_goaway(data: bytes) -> Goaway | None:
    """The first GOAWAY frame in a raw frame stream (RFC 9113 §6.8)."""
    i = 0
    while i + 9 <= len(data):
        length = int.from_bytes(data[i:i + 3], "big")
        if i + 9 + length > len(data):
            return None
        if data[i + 3] == 7 and length >= 8:
            body = data[i + 9:i + 9 + length]
            return Goaway(int.from_bytes(body[4:8], "big"),
                          int.from_bytes(body[:4], "big") & 0x7FFFFFFF, body[8:])
        i += 9 + length
    return None


class H2Client:
    def __init__(self, proxy_port: int, host: str, port: int, box_ca: Path,
                 validate: bool = False) -> None:
        raw = socket.create_connection(("127.0.0.1", proxy_port), timeout=30)
        raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += raw.recv(4096)
        assert b" 200 " in head, head
        ctx = ssl.create_default_context(cafile=str(box_ca))
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        self.sock = ctx.wrap_socket(raw, server_hostname=host)
        assert self.sock.selected_alpn_protocol() == "h2"
        self.authority = f"{host}:{port}".encode()
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=validate,
            normalize_outbound_headers=validate, validate_inbound_headers=False))
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(16 * 1024 * 1024)
        self.flush()
        self.responses: dict[int, dict[str, Any]] = {}
        self.goaway: Goaway | None = None
        self.closed = False
        self.received = bytearray()  # every byte the door sent, for frames read raw

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def send_raw(self, data: bytes) -> bool:
        """Raw bytes after the preface; False once the door has cut the connection."""
        try:
            self.sock.sendall(data)
            return True
        except (OSError, ssl.SSLError):
            self.closed = True
            return False

    def request(self, method: str, path: str, body: bytes | None = None,
                extra: list[tuple[bytes, bytes]] | None = None,
                authority: bytes | None = None,
                trailers: list[tuple[bytes, bytes]] | None = None) -> int:
        sid = self.conn.get_next_available_stream_id()
        head = [(b":method", method.encode()), (b":scheme", b"https"),
                (b":authority", authority if authority is not None else self.authority),
                (b":path", path.encode())] + (extra or [])
        self.conn.send_headers(sid, head, end_stream=body is None and trailers is None)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=trailers is None)
        if trailers is not None:
            self.conn.send_headers(sid, trailers, end_stream=True)
        self.responses[sid] = {"headers": None, "body": b"", "trailers": None, "ended": False,
                               "reset": None}
        self.flush()
        return sid

    def pump(self, timeout: float = 0.2) -> bool:
        """Read what has come; False once the connection ended."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return True
        except (OSError, ssl.SSLError):
            self.closed = True
            return False
        if not data:
            self.closed = True
            return False
        if len(self.received) < MAX_KEPT:
            self.received += data
            self.goaway = self.goaway or find_goaway(bytes(self.received))
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            # raw frames sent past `h2` put it out of step; the raw bytes still tell
            return True
        for ev in events:
            sid = getattr(ev, "stream_id", None)
            r = self.responses.get(sid) if sid else None
            if isinstance(ev, h2.events.ResponseReceived) and r is not None:
                r["headers"] = dict(ev.headers)
            elif isinstance(ev, h2.events.DataReceived):
                if r is not None:
                    r["body"] += ev.data
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.TrailersReceived) and r is not None:
                r["trailers"] = dict(ev.headers)
            elif isinstance(ev, h2.events.StreamEnded) and r is not None:
                r["ended"] = True
            elif isinstance(ev, h2.events.StreamReset) and r is not None:
                r["reset"] = ev.error_code
        try:
            self.flush()
        except (OSError, ssl.SSLError):
            self.closed = True
            return False
        return True

    def pump_raw(self, timeout: float = 0.001) -> bool:
        """Read what has come without `h2` (which would answer, between raw frames);
        False once the connection ended."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return True
        except (OSError, ssl.SSLError):
            self.closed = True
            return False
        if not data:
            self.closed = True
            return False
        if len(self.received) < MAX_KEPT:
            self.received += data
            self.goaway = self.goaway or find_goaway(bytes(self.received))
        return True

    def wait(self, sids: list[int], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.responses[s]["ended"] or self.responses[s]["reset"] is not None
                   for s in sids):
                return
            if not self.pump():
                return
        raise AssertionError(f"no answer on streams {sids} within {timeout} s")

    def wait_closed(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.closed:
            self.pump_raw(0.2)
        assert self.closed, "the door did not end the connection"

    def status(self, sid: int) -> int:
        h = self.responses[sid]["headers"]
        return int(h[b":status"]) if h else 0

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
