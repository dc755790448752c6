"""The proxy's request head: strict, bounded, sans-IO.

`RequestHeadParser.feed(bytes)` buffers at most `MAX_HEAD` bytes until the
blank line that ends a request head, checks the raw bytes itself, then lets
`h11` parse them. Only two shapes pass:

- `CONNECT host:port HTTP/1.x` (a tunnel; no body), and
- an absolute-form `http://host[:port]/path` request whose `Host` header
  names the same host and port as the URL.

A plain request is relayed in origin form (`/path`) with one `Host` header,
written by the door from the host and port it decided on
(`names.format_authority`: lower case, no trailing dot, IDNA A-labels, the
port only if not 80), never the guest's bytes: an origin that matches names
exactly sees the name that was allowed, not `EXAMPLE.org.:80`.

The raw pre-check exists because `h11` is lenient where a proxy must not be
(verified against h11 0.16): it merges duplicate identical `Content-Length`
headers, accepts `Content-Length` together with `Transfer-Encoding`, bare LF
line endings and obsolete line folding. A proxy whose view of a request's
framing differs from the origin's is the root of request smuggling, so each of
those is refused here, as are over-long lines and too many headers. What we
forward is re-serialised by `h11` from parsed events, never the guest's bytes.

Errors: `BadRequest` (a `GuestError`) with the HTTP status to answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import h11

from tkbox.doors.network.names import Host, HostNameError, format_authority, parse_authority
from tkbox.doors.network.records import excerpt
from tkbox.errors import GuestError

MAX_HEAD = 16 * 1024  # the whole request head
MAX_LINE = 8 * 1024  # one request line or header line
MAX_HEADERS = 64  # header fields in one head
MAX_TARGET = 4 * 1024
MAX_METHOD = 32  # the method goes whole into every Connect decision record

_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_BAD_LINE_BYTES = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    405: "Method Not Allowed",
    408: "Request Timeout",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class BadRequest(GuestError):
    """The guest's request is malformed or of a kind the proxy refuses."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ProxyRequest:
    method: str
    kind: Literal["connect", "http"]
    host: Host
    port: int
    path: str  # origin-form target for "http"; "" for "connect"
    headers: tuple[tuple[bytes, bytes], ...] = field(default=())  # end-to-end, for "http"
    http_version: str = "1.1"

    @property
    def chunked(self) -> bool:
        return any(n == b"transfer-encoding" for n, _ in self.headers)


def answer(status: int, reason: str) -> bytes:
    """The proxy's own HTTP answer: status line, the reason in a header and the body."""
    text = "".join(c if " " <= c <= "~" else "?" for c in reason)[:1000]
    body = (text + "\n").encode("ascii")
    return (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Refused')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"X-Tkbox-Reason: {text}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii") + body


def _check_raw_head(head: bytes) -> None:
    """Line-level checks h11 does not make (see the module docstring)."""
    lines = head[:-4].split(b"\r\n")
    if len(lines[0]) > MAX_LINE:
        raise BadRequest(414, f"refused: request line longer than {MAX_LINE} bytes")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest(431, f"refused: more than {MAX_HEADERS} header fields")
    for i, line in enumerate(lines):
        if not line:
            raise BadRequest(400, "refused: empty line before the request line")
        if len(line) > MAX_LINE:
            raise BadRequest(431, f"refused: a header line longer than {MAX_LINE} bytes")
        if b"\r" in line or b"\n" in line:
            raise BadRequest(400, "refused: bare CR or LF in the request head (lines end in CRLF)")
        if _BAD_LINE_BYTES.search(line):
            raise BadRequest(400, "refused: control character in the request head")
        if i == 0:
            continue
        if line[:1] in (b" ", b"\t"):
            raise BadRequest(400, "refused: obsolete header line folding")
        name, sep, _ = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise BadRequest(400, "refused: malformed header field name")


def _check_framing(head: bytes) -> None:
    """Refuse ambiguous message framing before any parser interprets it."""
    raw_names = [line.partition(b":")[0].lower() for line in head[:-4].split(b"\r\n")[1:]]
    counts = {n: raw_names.count(n) for n in (b"content-length", b"transfer-encoding", b"host")}
    if counts[b"content-length"] > 1:
        raise BadRequest(400, "refused: duplicate Content-Length (request smuggling)")
    if counts[b"transfer-encoding"] > 1:
        raise BadRequest(400, "refused: duplicate Transfer-Encoding (request smuggling)")
    if counts[b"content-length"] and counts[b"transfer-encoding"]:
        raise BadRequest(
            400, "refused: both Content-Length and Transfer-Encoding (request smuggling)"
        )
    if counts[b"host"] > 1:
        raise BadRequest(400, "refused: duplicate Host header")


def _split_absolute(target: str) -> tuple[str, str]:
    """`http://authority/path?q` → (authority, origin-form path)."""
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        if target.startswith("/") or target == "*":
            raise BadRequest(
                400,
                "refused: this is a proxy; send an absolute-form request (http://host/path) "
                "or CONNECT host:port",
            )
        raise BadRequest(400, "refused: only http:// URLs or CONNECT host:port are accepted")
    if scheme.lower() == "https":
        raise BadRequest(400, "refused: for https:// use CONNECT host:443 (HTTPS_PROXY does this)")
    if "#" in rest:
        raise BadRequest(400, "refused: a fragment (#) in a request target")
    cut = len(rest)
    for c in "/?":
        i = rest.find(c)
        if 0 <= i < cut:
            cut = i
    authority, path = rest[:cut], rest[cut:]
    if not path.startswith("/"):
        path = "/" + path
    return authority, path


class RequestHeadParser:
    """Feed bytes from the guest; get one ProxyRequest, or a BadRequest.

    After a request, `leftover` holds the bytes that followed the head (the
    start of a tunnel or of a body), and for "http" requests `conn` is the
    h11 server connection that has seen the head, ready to parse the body.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self.leftover = b""
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.request: ProxyRequest | None = None

    def feed(self, data: bytes) -> ProxyRequest | None:
        if self.request is not None:
            raise BadRequest(400, "refused: one request per connection")
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            first = self._buf.find(b"\r\n")
            if (first < 0 and len(self._buf) > MAX_LINE) or first > MAX_LINE:
                raise BadRequest(414, f"refused: request line longer than {MAX_LINE} bytes")
            if len(self._buf) > MAX_HEAD:
                raise BadRequest(431, f"refused: request head larger than {MAX_HEAD} bytes")
            return None
        head = bytes(self._buf[: end + 4])
        if len(head) > MAX_HEAD:
            raise BadRequest(431, f"refused: request head larger than {MAX_HEAD} bytes")
        self.leftover = bytes(self._buf[end + 4 :])
        self._buf.clear()
        _check_raw_head(head)
        _check_framing(head)
        self.conn.receive_data(head)
        try:
            event = self.conn.next_event()
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint if exc.error_status_hint in _REASONS else 400
            # h11's message quotes the guest's bytes: keep a bounded, escaped excerpt only
            raise BadRequest(status, f"refused: malformed request ({excerpt(exc, 120)})") from None
        if not isinstance(event, h11.Request):
            raise BadRequest(400, "refused: malformed request head")
        self.request = self._interpret(event)
        return self.request

    def _interpret(self, event: h11.Request) -> ProxyRequest:
        if len(event.method) > MAX_METHOD:
            # RFC 9112 §3: a method longer than any the server implements is a 501
            raise BadRequest(501, f"refused: request method longer than {MAX_METHOD} characters")
        method = event.method.decode("ascii")
        version = event.http_version.decode("ascii")
        if version not in ("1.0", "1.1"):
            raise BadRequest(400, f"refused: HTTP/{version} (only HTTP/1.0 and 1.1)")
        target = event.target.decode("ascii")
        if len(target) > MAX_TARGET:
            raise BadRequest(414, f"refused: request target longer than {MAX_TARGET} bytes")
        headers = [(bytes(n).lower(), bytes(v)) for n, v in event.headers]
        values = dict(headers)
        te = values.get(b"transfer-encoding")
        if te is not None and te.strip().lower() != b"chunked":
            raise BadRequest(501, "refused: only Transfer-Encoding: chunked is supported")
        if b"upgrade" in values:
            raise BadRequest(
                400, "refused: Upgrade is not supported through the proxy; use CONNECT"
            )
        host_header = values.get(b"host")

        if method == "CONNECT":
            if te is not None or values.get(b"content-length", b"0") != b"0":
                raise BadRequest(400, "refused: a CONNECT request carries no body")
            try:
                host, port = parse_authority(target, None)
            except HostNameError as exc:
                raise BadRequest(400, exc.message) from None
            if host_header is not None:
                self._same_host(host_header, host, port, port)
            return ProxyRequest(method, "connect", host, port, "", (), version)

        authority, path = _split_absolute(target)
        try:
            host, port = parse_authority(authority, 80)
        except HostNameError as exc:
            raise BadRequest(400, exc.message) from None
        if host_header is None:
            raise BadRequest(400, "refused: no Host header")
        self._same_host(host_header, host, port, 80)
        forwarded = _end_to_end(headers, format_authority(host, port, 80))
        return ProxyRequest(method, "http", host, port, path, tuple(forwarded), version)

    @staticmethod
    def _same_host(value: bytes, host: Host, port: int, default: int) -> None:
        try:
            h, p = parse_authority(value.decode("ascii"), default)
        except (HostNameError, UnicodeDecodeError):
            raise BadRequest(400, "refused: malformed Host header") from None
        if h.name != host.name or p != port:
            raise BadRequest(
                400,
                f"refused: Host header {h}:{p} differs from the request target {host}:{port}",
            )


def _end_to_end(headers: list[tuple[bytes, bytes]], authority: str) -> list[tuple[bytes, bytes]]:
    """The headers to relay: `Host: authority` first (RFC 9110 §7.2: a user agent sends it
    first) in place of the guest's; hop-by-hop headers (RFC 9110 §7.6.1) and those
    named in Connection dropped."""
    named: set[bytes] = set()
    for n, v in headers:
        if n in (b"connection", b"proxy-connection"):
            named.update(t.strip().lower() for t in v.split(b","))
    named -= {b"content-length"}  # framing is never the guest's to drop
    out = [(b"host", authority.encode("ascii"))]
    out += [(n, v) for n, v in headers if n != b"host" and n not in HOP_BY_HOP and n not in named]
    if any(n == b"transfer-encoding" for n, _ in headers):
        out.append((b"transfer-encoding", b"chunked"))
    out.append((b"connection", b"close"))
    return out
