"""HTTP/2 on an intercepted tunnel: the pure parts. No I/O.

`h2relay` (the asyncio shell) speaks HTTP/2 with the `h2` library on both
legs; what it decides is here, so it can be tested by feeding it bytes:

- `H2Limits` and `H2Limits.for_hold`: the settings the door advertises and the
  memory they bound (see "Memory" below);
- `FrameGuard`: a watch over one peer's raw frames, in front of `h2`, that cuts
  off the known attack classes before `h2` spends memory or work on them;
- `read_request`: a guest's request header block as the HTTP/1.1-shaped head
  the door's rules read (`TunnelRules.request`, `HttpGate.check`), or a
  `BadTunnelRequest`;
- `origin_head` and `refusal`: header blocks the door sends.

**Attack classes** and what bounds each (`FrameGuard` unless said):

- *Rapid reset* (CVE-2023-44487): a stream opened and reset at once is free
  for the peer and costs the door a gate decision and an origin stream. Every
  RST_STREAM costs the peer a token from a bucket (`burst`, refilled at `rate`
  a second, and by a token per DATA frame either way that carried bytes); an
  empty bucket ends the connection (GOAWAY `ENHANCE_YOUR_CALM`). Independently,
  a stream counts against `max_streams` until the door's work on it has ended,
  not until the peer reset it (`h2relay`), so resets never buy concurrency.
- *CONTINUATION flood* (CVE-2024-27316 and its kin in 2024): a header block is
  at most `max_header_block` bytes in at most `max_block_frames` frames,
  counted here from the frame headers before `h2` buffers a byte of it.
- *HPACK bomb* (CVE-2016-6581): the decoded header list is bounded by
  `max_header_list` (set on `h2`'s HPACK decoder, which counts as it inflates),
  and the dynamic table by the `header_table` size the door advertises; the
  table the *door's* encoder keeps for a peer is clamped to `header_table` too,
  whatever size the peer allows.
- *Control-frame floods* (CVE-2019-9512 ping, -9515 settings, -9514 reset,
  -9513 priority, -9518 empty frames, -9511 window-update dribble): every
  SETTINGS (and every 10 of its entries), PING, PRIORITY, RST_STREAM,
  WINDOW_UPDATE, GOAWAY, unknown frame, empty DATA frame that does not end its
  stream and empty header fragment costs a token.
- *Internal buffering* (CVE-2019-9517): a peer that does not read what it is
  sent is not read from either (`h2relay` stops reading a side whose queued
  output passes `out_low`), so answers to its frames cannot pile up.
- *Flow-control windows*: the door acknowledges a stream's bytes only once
  they have left for the other side, so each stream holds at most its window,
  and all streams of a direction at most the connection window.

**Memory.** Per direction, what the door holds for a connection is at most the
connection window it advertised (every unacknowledged byte counts against it),
plus `h2`'s frame buffer (one read and one frame), plus the queued output
(`out_low`, one read's answers past it). The scanner and the redactor hold up to
`hold` bytes of a stream that must stay unacknowledged until more bytes come;
so that the holds of all open streams can never take the whole connection
window and stall it, `for_hold` sets the stream window to at least four holds
and lowers `max_streams` until every stream's two holds plus one window fit in
`buffer_budget`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tkbox.doors.secrets.rules import BadTunnelRequest

Headers = list[tuple[bytes, bytes]]

#: RFC 9113 §3.4: the client connection preface
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = 9
# RFC 9113 §6: frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
#: frame types that cost a token whatever they carry
_CONTROL = frozenset({PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE})
_NAMES = {DATA: "DATA", HEADERS: "HEADERS", PRIORITY: "PRIORITY", RST_STREAM: "RST_STREAM",
          SETTINGS: "SETTINGS", PUSH_PROMISE: "PUSH_PROMISE", PING: "PING", GOAWAY: "GOAWAY",
          WINDOW_UPDATE: "WINDOW_UPDATE", CONTINUATION: "CONTINUATION"}
#: the request pseudo-header fields (RFC 9113 §8.3.1); `:protocol` (RFC 8441) is refused
REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":authority", b":path"})


@dataclass(frozen=True)
class H2Limits:
    """What the door advertises on both legs, and its own budgets. `for_hold`
    fits the windows and the stream count to the scanner's hold."""

    max_streams: int = 100  # SETTINGS_MAX_CONCURRENT_STREAMS, and the door's own count
    stream_window: int = 256 * 1024  # SETTINGS_INITIAL_WINDOW_SIZE
    conn_window: int = 1024 * 1024  # the connection's receive window
    max_header_list: int = 64 * 1024  # SETTINGS_MAX_HEADER_LIST_SIZE, HPACK-decoded
    header_table: int = 4096  # SETTINGS_HEADER_TABLE_SIZE; the door's encoder's cap too
    max_frame: int = 16384  # SETTINGS_MAX_FRAME_SIZE (the RFC's minimum)
    max_header_block: int = 64 * 1024 + 16384  # encoded header block, all fragments
    max_block_frames: int = 16  # HEADERS + CONTINUATION frames of one block
    burst: float = 200.0  # control-frame tokens at the start and at most
    rate: float = 100.0  # tokens refilled a second
    out_low: int = 256 * 1024  # queued output above which a side is neither read nor fed
    buffer_budget: int = 16 * 1024 * 1024  # what one direction may hold, at most

    @property
    def settings(self) -> dict[int, int]:
        """The SETTINGS the door sends (RFC 9113 §6.5.2 codes)."""
        return {0x1: self.header_table, 0x2: 0, 0x3: self.max_streams,
                0x4: self.stream_window, 0x5: self.max_frame, 0x6: self.max_header_list}

    def for_hold(self, hold: int) -> H2Limits:
        """These limits for streams whose scanner or redactor holds `hold` bytes:
        stream window >= 4 holds; the connection window fits every stream's two holds
        and one more window (so held bytes never stall the connection), within
        `buffer_budget`, with `max_streams` lowered as far as that needs (to 1)."""
        window = max(self.stream_window, 4 * hold)
        streams = self.max_streams
        if hold:
            streams = max(1, min(streams, (self.buffer_budget - window) // (2 * hold)))
        conn = max(self.conn_window, streams * 2 * hold + window)
        return replace(self, stream_window=min(window, 2**31 - 1), max_streams=streams,
                       conn_window=min(conn, 2**31 - 1))


class H2Flood(Exception):  # noqa: N818 - a refusal reason, not a bug
    """A peer sent more than its budget: `reason` is one line for a person."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class FrameGuard:
    """Watch over one peer's frames (see the module docstring). `feed(data)` takes
    the decrypted bytes in the order received, before `h2` does, and raises
    `H2Flood` once the peer is over a budget; `earn(n)` credits n tokens (a DATA
    frame with bytes sent to this peer). Memory: at most one frame header."""

    def __init__(self, who: str, limits: H2Limits, clock: Callable[[], float], *,
                 preface: bool) -> None:
        self.who, self.limits, self.clock = who, limits, clock
        self._preface = len(PREFACE) if preface else 0
        self._head = bytearray()
        self._skip = 0  # payload bytes of the current frame still to pass
        self._block: int | None = None  # stream of an unfinished header block
        self._block_bytes = 0
        self._block_frames = 0
        self.tokens = limits.burst
        self._last = clock()
        self.frames = 0

    def earn(self, n: float = 1.0) -> None:
        self.tokens = min(self.limits.burst, self.tokens + n)

    def spend(self, n: float, what: str) -> None:
        now = self.clock()
        self.tokens = min(self.limits.burst,
                          self.tokens + max(0.0, now - self._last) * self.limits.rate)
        self._last = now
        self.tokens -= n
        if self.tokens < 0:
            raise H2Flood(
                f"refused: {self.who} sent control frames faster than "
                f"{self.limits.rate:g} a second after a burst of {self.limits.burst:g} "
                f"(the last: {what}); an HTTP/2 flood (rapid reset, ping, settings or "
                "empty-frame storms) ends the connection")

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        if self._preface:
            n = min(self._preface, len(view))
            view = view[n:]
            self._preface -= n
        while view:
            if self._skip:
                n = min(self._skip, len(view))
                view = view[n:]
                self._skip -= n
                continue
            need = FRAME_HEADER - len(self._head)
            self._head += view[:need]
            view = view[need:]
            if len(self._head) < FRAME_HEADER:
                return
            head = bytes(self._head)
            self._head.clear()
            self._frame(int.from_bytes(head[:3], "big"), head[3], head[4],
                        int.from_bytes(head[5:9], "big") & 0x7FFFFFFF)

    def _frame(self, length: int, ftype: int, flags: int, stream: int) -> None:
        self.frames += 1
        self._skip = length
        name = _NAMES.get(ftype, f"type 0x{ftype:02x}")
        if self._block is not None:
            if ftype != CONTINUATION or stream != self._block:
                return  # h2 refuses it (RFC 9113 §6.10): a connection error there
            self._header_fragment(length, flags)
            return
        if ftype in (HEADERS, PUSH_PROMISE):
            self._block, self._block_bytes, self._block_frames = stream, 0, 0
            self._header_fragment(length, flags)
        elif ftype == CONTINUATION:
            return  # a CONTINUATION outside a block: h2 refuses it
        elif ftype == DATA:
            if length == 0 and not flags & END_STREAM:
                self.spend(1, "an empty DATA frame")
            elif length:
                self.earn(1)
        elif ftype == SETTINGS:
            self.spend(1 + (length // 6) // 10, name)
        elif ftype in _CONTROL:
            self.spend(1, name)
        else:
            self.spend(1, f"a frame of unknown {name}")

    def _header_fragment(self, length: int, flags: int) -> None:
        self._block_bytes += length
        self._block_frames += 1
        if length == 0 and not flags & END_HEADERS:
            self.spend(1, "an empty header fragment")
        lim = self.limits
        if self._block_bytes > lim.max_header_block or self._block_frames > lim.max_block_frames:
            raise H2Flood(
                f"refused: {self.who} sent a header block of more than "
                f"{lim.max_header_block} bytes or {lim.max_block_frames} frames (a CONTINUATION "
                "flood ends the connection)")
        if flags & END_HEADERS:
            self._block = None


# --- requests -------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A guest's HTTP/2 request head, read: `head` is its fields with `host` standing
    for `:authority`, as the HTTP/1.1 rules read a request (RFC 9113 §8.3.1)."""

    method: bytes
    path: bytes
    head: Headers
    expects_continue: bool


def read_request(headers: Sequence[tuple[bytes, bytes]]) -> Request:
    """A request header block (already valid HTTP/2 for `h2`: pseudo-fields first,
    lower-case names, no connection-specific fields) read into a `Request`, or a
    `BadTunnelRequest` for one an intercepted tunnel does not carry:

    - CONNECT, and extended CONNECT (`:protocol`, RFC 8441): a tunnel in a tunnel
      would carry bytes the door cannot read;
    - a `:scheme` other than `https` (the tunnel is TLS; an origin may route on it);
    - no `:path`, or an empty one; a pseudo-field twice or one that is not a
      request's;
    - no `:authority` and no `host`, or a `host` that differs from `:authority` (RFC
      9113 §8.3.1 leaves which wins to the origin). Whether the authority is the
      tunnel's own host and port is `TunnelRules.request`'s check, as for HTTP/1.1.

    A refusal here quotes nothing the guest sent: the request is scanned for
    secrets (`TunnelRules.request`) only once it is well formed."""
    pseudo: dict[bytes, bytes] = {}
    rest: Headers = []
    for name, value in headers:
        if name.startswith(b":"):
            if name in pseudo:
                raise BadTunnelRequest("refused: an HTTP/2 request repeats a pseudo-header")
            pseudo[name] = value
        else:
            rest.append((name, value))
    method = pseudo.get(b":method")
    if method is None:
        raise BadTunnelRequest("refused: an HTTP/2 request without :method")
    if method == b"CONNECT" or b":protocol" in pseudo:
        raise BadTunnelRequest(
            "refused: CONNECT (and extended CONNECT, RFC 8441) inside an intercepted tunnel; "
            "a tunnel in a tunnel would carry bytes the door cannot read")
    unknown = sorted(set(pseudo) - REQUEST_PSEUDO)
    if unknown:
        raise BadTunnelRequest("refused: an HTTP/2 request with a pseudo-header that is not "
                               "a request's (:method, :scheme, :authority, :path)")
    scheme = pseudo.get(b":scheme")
    if scheme != b"https":
        raise BadTunnelRequest(
            "refused: an HTTP/2 request in a TLS tunnel whose :scheme is not https")
    path = pseudo.get(b":path")
    if not path:
        raise BadTunnelRequest("refused: an HTTP/2 request without :path")
    authority = pseudo.get(b":authority")
    hosts = [v for n, v in rest if n == b"host"]
    if authority is None and not hosts:
        raise BadTunnelRequest("refused: an HTTP/2 request names no host (no :authority, "
                               "no host)")
    if authority is not None and any(h != authority for h in hosts):
        raise BadTunnelRequest(
            "refused: an HTTP/2 request whose host differs from its :authority; origins "
            "differ on which one they route by")
    if authority is None and len(hosts) > 1:
        raise BadTunnelRequest("refused: an HTTP/2 request with two host fields")
    host = authority if authority is not None else hosts[0]
    head = [(b"host", host)] + [(n, v) for n, v in rest if n != b"host"]
    expects = any(n == b"expect" and v.strip().lower() == b"100-continue" for n, v in rest)
    return Request(method, path, head, expects)


def origin_head(method: bytes, path: bytes, authority: bytes, headers: Headers) -> Headers:
    """The request head sent to the origin: pseudo-fields from what the rules read
    (the tunnel's canonical authority), then the swapped fields without `host`."""
    return ([(b":method", method), (b":scheme", b"https"), (b":authority", authority),
             (b":path", path)] + [(n.lower(), v) for n, v in headers if n.lower() != b"host"])


def refusal(status: int, reason: str) -> tuple[Headers, bytes]:
    """A refusal's header block and body for one stream (the HTTP/1.1 door's
    answer, without `connection`, which HTTP/2 does not carry)."""
    text = "".join(c if " " <= c <= "~" else "?" for c in reason)[:1000]
    body = (text + "\n").encode("ascii")
    return ([(b":status", str(status).encode()),
             (b"content-type", b"text/plain; charset=utf-8"),
             (b"content-length", str(len(body)).encode()),
             (b"x-tkbox-reason", text.encode("ascii"))], body)
