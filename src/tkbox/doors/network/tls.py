"""TLS at the start of a tunnel: the ClientHello's server name, sans-IO.

A `CONNECT host:443` tunnel must carry TLS to `host`, not to some other name
served at the same address (domain fronting) and not a hidden one. The
`TunnelInspector` watches both directions of a tunnel until the handshake has
committed to its server, then steps aside:

- client → origin: the first bytes must be TLS handshake records carrying one
  ClientHello (reassembled across records and TCP segments, at most
  `MAX_HANDSHAKE` bytes), **held back until checked**: its `server_name` must
  be exactly the tunnel's host (no SNI at all for an IP host), and it must not
  carry any extension of Encrypted ClientHello or of its drafts (`ech_refusal`:
  every code point draft-ietf-tls-esni ever assigned, and the blocks they were
  drawn from). Nothing of a refused ClientHello reaches the origin, so a
  colluding origin cannot read a name smuggled into it.
- origin → client: the first handshake message must be a ServerHello. If it is
  a HelloRetryRequest (RFC 8446 §4.1.3: a ServerHello whose random is
  SHA-256("HelloRetryRequest")), the client's second ClientHello is held and
  checked the same way, and the origin may not send its real ServerHello
  before that second ClientHello has passed. A second HelloRetryRequest is
  refused (RFC 8446 §4.1.4 forbids it).
- once a real ServerHello has passed, both directions are spliced untouched.

A tunnel whose first byte is not a TLS handshake record is "not TLS": it is
refused unless the allowlist entry names its port (`require_tls=False`),
in which case the inspector passes everything from the first byte.

Hand-written: no maintained Python library parses a ClientHello from bytes
without terminating TLS. Every length is checked before it is used; every
error is a `TLSRefused` (a `GuestError`) with a reason for a person.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tkbox.doors.network.names import Host, HostNameError, normalize_name
from tkbox.errors import GuestError

MAX_HANDSHAKE = 32 * 1024  # a ClientHello or ServerHello, reassembled
MAX_PLAINTEXT = 1 << 14  # RFC 8446 §5.1
MAX_CIPHERTEXT = (1 << 14) + 2048  # RFC 5246 §6.2.3 (TLS 1.2's bound, the larger)
# The held-back ClientHello records, headers included: the message (with its 4-byte
# header) plus a 5-byte record header per 256 bytes of it. A hello cut into smaller
# records than that on average is refused before it holds more (1-byte records
# would hold ~6 times `MAX_HANDSHAKE`).
MIN_HELD_RECORD = 256
MAX_HELD = MAX_HANDSHAKE + 4 + 5 * (MAX_HANDSHAKE // MIN_HELD_RECORD + 1)

CT_CCS, CT_ALERT, CT_HANDSHAKE, CT_APPDATA = 20, 21, 22, 23
HS_CLIENT_HELLO, HS_SERVER_HELLO = 1, 2
EXT_SERVER_NAME = 0x0000
EXT_ALPN = 0x0010  # application_layer_protocol_negotiation, RFC 7301
EXT_ECH = 0xFE0D  # encrypted_client_hello, RFC 9849 (draft-ietf-tls-esni-13 to -25)
EXT_ESNI_DRAFT = 0xFFCE  # encrypted_server_name, draft-ietf-tls-esni-00 to -05
EXT_RENEGOTIATION_INFO = 0xFF01  # RFC 5746: the one assigned code point in 0xff00-0xffff

# Every extension code point draft-ietf-tls-esni assigned in its history (read
# from the draft's own repository, tlswg/draft-ietf-tls-esni, every revision):
#   0xffce  encrypted_server_name (ESNI, -00 to -05); also echo_nonce/ech_nonce
#           and an early encrypted_client_hello in the editors' copies of -06
#   0xff02  encrypted_client_hello (-06 editors' copies; NSS, BoringSSL drafts)
#   0xff03  ech_nonce; 0xff04, 0xffcd outer_extension(s); 0xff08 an early ECH
#   0xfe08, 0xfe09, 0xfe0a, 0xfe0b, 0xfe0c  encrypted_client_hello, -07 to -12
#   0xfe0d  encrypted_client_hello, -13 to -25 and RFC 9849
#   0xfe00, 0xfd00  (ech_)outer_extensions; 0xda09  ech_is_inner (-09, -10)
ECH_CODE_POINTS = frozenset([0xFFCE, 0xFF02, 0xFF03, 0xFF04, 0xFF08, 0xFFCD, 0xFE00, 0xFD00,
                             0xFE08, 0xFE09, 0xFE0A, 0xFE0B, 0xFE0C, 0xFE0D, 0xDA09])


def is_ech_code_point(etype: int) -> bool:
    """Whether an extension type is, or may be, a form of Encrypted ClientHello.

    The general rule, not only the list: every code point the drafts used, and
    the whole blocks they were drawn from, so the next draft's is refused too:
    0xfd00-0xfeff (unassigned by IANA except ECH's own) and 0xff00-0xffff
    (private use; only renegotiation_info, 0xff01, is a public extension).
    GREASE values (0x?a?a, RFC 8701) lie outside both blocks.
    """
    if etype in ECH_CODE_POINTS:
        return True
    if 0xFD00 <= etype <= 0xFEFF:
        return True
    return 0xFF00 <= etype <= 0xFFFF and etype != EXT_RENEGOTIATION_INFO
# RFC 8446 §4.1.3: SHA-256("HelloRetryRequest")
HRR_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")


class TLSRefused(GuestError):
    """The tunnel's TLS is malformed, hides its name, or names another host."""


class _Reader:
    """Bounds-checked big-endian reads over one message."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise TLSRefused(f"refused: truncated {self.what}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def vec(self, len_bytes: int) -> bytes:
        return self.take(int.from_bytes(self.take(len_bytes), "big"))

    @property
    def left(self) -> int:
        return len(self.data) - self.pos


@dataclass(frozen=True)
class ClientHello:
    legacy_version: int
    server_name: str | None  # normalised; None when absent
    extensions: tuple[int, ...]
    ech_form: str | None = None  # the first ECH-like extension, described; None: none
    alpn: tuple[bytes, ...] = ()  # the protocols offered (RFC 7301), in the client's order

    @property
    def offers_ech(self) -> bool:
        return self.ech_form is not None


def _ech_form(etype: int, data: bytes) -> str:
    """A description of an ECH-like extension for the refusal (no guest bytes).

    RFC 9849 §5: `ECHClientHello` starts with its type, outer(0) or inner(1).
    """
    name = f"extension 0x{etype:04x}"
    if etype in (EXT_ECH, 0xFE08, 0xFE09, 0xFE0A, 0xFE0B, 0xFE0C, 0xFF02, 0xFF08):
        form = {0: "outer", 1: "inner"}.get(data[0]) if data else None
        return f"{name} (encrypted_client_hello, {form or 'malformed'} form)"
    if etype == EXT_ESNI_DRAFT:
        return f"{name} (encrypted_server_name, draft ESNI)"
    if etype in ECH_CODE_POINTS:
        return f"{name} (a draft Encrypted ClientHello extension)"
    return f"{name} (a code point of the blocks Encrypted ClientHello drafts used)"


def parse_client_hello(body: bytes) -> ClientHello:
    """A ClientHello handshake body (RFC 8446 §4.1.2, RFC 5246 §7.4.1.2)."""
    r = _Reader(body, "ClientHello")
    version = r.u16()
    if not 0x0301 <= version <= 0x0303:
        raise TLSRefused(f"refused: ClientHello version 0x{version:04x} (TLS 1.0 to 1.3 only)")
    r.take(32)  # random
    if len(r.vec(1)) > 32:
        raise TLSRefused("refused: ClientHello session id longer than 32 bytes")
    suites = r.vec(2)
    if not suites or len(suites) % 2:
        raise TLSRefused("refused: malformed ClientHello cipher suites")
    if not r.vec(1):
        raise TLSRefused("refused: ClientHello offers no compression method")
    if r.left == 0:
        return ClientHello(version, None, ())
    ext = _Reader(r.vec(2), "ClientHello extensions")
    if r.left:
        raise TLSRefused("refused: bytes after the ClientHello extensions")
    types: list[int] = []
    seen: set[int] = set()  # a set: a list's `in` is quadratic in ~8,000 empty extensions
    name: str | None = None
    ech: str | None = None
    alpn: tuple[bytes, ...] = ()
    while ext.left:
        etype = ext.u16()
        data = ext.vec(2)
        if etype in seen:
            raise TLSRefused(f"refused: ClientHello repeats extension {etype}")
        seen.add(etype)
        types.append(etype)
        if etype == EXT_SERVER_NAME:
            name = _parse_server_name(data)
        elif etype == EXT_ALPN:
            alpn = _parse_alpn(data)
        elif ech is None and is_ech_code_point(etype):
            ech = _ech_form(etype, data)
    return ClientHello(version, name, tuple(types), ech, alpn)


def _parse_alpn(data: bytes) -> tuple[bytes, ...]:
    """RFC 7301 §3.1: a non-empty ProtocolNameList of non-empty names; `()` for
    anything else (read only to choose what to offer; the TLS peer refuses it)."""
    try:
        r = _Reader(data, "ALPN extension")
        lst = _Reader(r.vec(2), "ALPN protocol list")
        names: list[bytes] = []
        while lst.left:
            names.append(lst.vec(1))
    except TLSRefused:
        return ()
    if r.left or not names or not all(names):
        return ()
    return tuple(names)


def read_client_hello(data: bytes) -> ClientHello | None:
    """The ClientHello that `data` (a tunnel's first bytes from the client) begins
    with, or None while it is incomplete. Raises `TLSRefused` for anything else (not
    TLS, not a ClientHello first, more than `MAX_HELD` bytes without one)."""
    records, handshake = _Records("the client"), _Handshake("the client's")
    for ctype, payload, _ in records.feed(data):
        if ctype != CT_HANDSHAKE:
            raise TLSRefused(f"refused: expected a TLS ClientHello, got record type {ctype}")
        msgs = handshake.feed(payload)
        if msgs:
            mtype, body = msgs[0]
            if mtype != HS_CLIENT_HELLO:
                raise TLSRefused("refused: the tunnel did not begin with a TLS ClientHello")
            return parse_client_hello(body)
    if len(data) > MAX_HELD:
        raise TLSRefused(f"refused: no ClientHello in the client's first {MAX_HELD} bytes")
    return None


def _parse_server_name(data: bytes) -> str:
    """RFC 6066 §3: exactly one host_name, ASCII, no trailing dot."""
    r = _Reader(data, "server_name extension")
    lst = _Reader(r.vec(2), "server_name list")
    if r.left:
        raise TLSRefused("refused: bytes after the server_name list")
    names: list[bytes] = []
    while lst.left:
        if lst.u8() != 0:
            raise TLSRefused("refused: server_name of an unknown type")
        names.append(lst.vec(2))
    if len(names) != 1:
        raise TLSRefused(f"refused: ClientHello carries {len(names)} server names (exactly one)")
    raw = names[0]
    if not raw or not raw.isascii() or raw.endswith(b"."):
        raise TLSRefused("refused: server_name is not an ASCII host name without trailing dot")
    try:
        return normalize_name(raw.decode("ascii"))
    except HostNameError:
        raise TLSRefused("refused: server_name is not a valid host name") from None


def server_hello_is_retry(body: bytes) -> bool:
    """Whether a ServerHello body is a HelloRetryRequest (RFC 8446 §4.1.3)."""
    r = _Reader(body, "ServerHello")
    r.u16()
    return r.take(32) == HRR_RANDOM


class _Records:
    """TLS record framing (RFC 8446 §5.1) with a bounded partial record."""

    def __init__(self, who: str) -> None:
        self.buf = bytearray()
        self.who = who

    def feed(self, data: bytes) -> list[tuple[int, bytes, bytes]]:
        """Complete records as (content type, payload, raw bytes)."""
        self.buf += data
        out: list[tuple[int, bytes, bytes]] = []
        while len(self.buf) >= 5:
            ctype = self.buf[0]
            major = self.buf[1]
            length = int.from_bytes(self.buf[3:5], "big")
            if ctype not in (CT_CCS, CT_ALERT, CT_HANDSHAKE, CT_APPDATA) or major != 3:
                raise TLSRefused(f"refused: {self.who} sent bytes that are not TLS records")
            limit = MAX_PLAINTEXT if ctype == CT_HANDSHAKE else MAX_CIPHERTEXT
            if length > limit or (length == 0 and ctype != CT_APPDATA):
                raise TLSRefused(f"refused: {self.who} sent a TLS record of {length} bytes")
            if len(self.buf) < 5 + length:
                break
            raw = bytes(self.buf[: 5 + length])
            del self.buf[: 5 + length]
            out.append((ctype, raw[5:], raw))
        return out


class _Handshake:
    """Handshake messages reassembled from handshake-record payloads."""

    def __init__(self, who: str) -> None:
        self.buf = bytearray()
        self.who = who

    def feed(self, payload: bytes) -> list[tuple[int, bytes]]:
        self.buf += payload
        out: list[tuple[int, bytes]] = []
        while len(self.buf) >= 4:
            length = int.from_bytes(self.buf[1:4], "big")
            if length > MAX_HANDSHAKE:
                raise TLSRefused(
                    f"refused: {self.who} handshake message of {length} bytes "
                    f"(at most {MAX_HANDSHAKE})"
                )
            if len(self.buf) < 4 + length:
                break
            out.append((self.buf[0], bytes(self.buf[4 : 4 + length])))
            del self.buf[: 4 + length]
        if len(self.buf) > MAX_HANDSHAKE + 4:
            raise TLSRefused(f"refused: {self.who} handshake data beyond {MAX_HANDSHAKE} bytes")
        return out

    @property
    def partial(self) -> bool:
        return bool(self.buf)


class Phase(enum.Enum):
    START = "start"  # nothing from the client yet
    HELLO = "hello"  # reading (and holding) a ClientHello
    WAIT_SERVER = "wait-server"  # ClientHello passed; waiting for the ServerHello
    RETRY = "retry"  # the origin sent a HelloRetryRequest: the next ClientHello is held
    DONE = "done"  # handshake committed, or not TLS on an explicit port: splice


class TunnelInspector:
    """Sans-IO watch over a tunnel's first bytes in both directions.

    `client_data(b)` returns the bytes now cleared to go to the origin (held
    ClientHello bytes are released once checked); `server_data(b)` returns the
    bytes to pass to the client. Either raises `TLSRefused`: cut the tunnel.
    """

    def __init__(self, host: Host, require_tls: bool) -> None:
        self.host = host
        self.require_tls = require_tls
        self.phase = Phase.START
        self.tls: bool | None = None
        self.server_names: list[str | None] = []
        self.retried = False
        self._crec = _Records("the client")
        self._chs = _Handshake("the client's")
        self._srec = _Records("the origin")
        self._shs = _Handshake("the origin's")
        self._held = bytearray()
        self._hellos = 0

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def server_may_speak(self) -> bool:
        """Whether origin bytes may flow yet (not before a TLS tunnel's ClientHello)."""
        if not self.require_tls:
            return True
        return self.phase not in (Phase.START, Phase.HELLO)

    def client_data(self, data: bytes) -> bytes:
        if self.phase is Phase.DONE:
            if self._crec.buf:  # a record that was partial when the handshake committed
                data = bytes(self._crec.buf) + data
                self._crec.buf.clear()
            return data
        if not data:
            return data
        if self.phase is Phase.START:
            if data[0] != CT_HANDSHAKE:
                if self.require_tls:
                    raise TLSRefused(
                        f"refused: the tunnel to {self.host} is not TLS; a tunnel that is not TLS "
                        "goes only to an entry that names its port (--allow host:port)"
                    )
                self.tls = False
                self.phase = Phase.DONE
                return data
            self.tls = True
            self.phase = Phase.HELLO
        out = bytearray()
        for ctype, payload, raw in self._crec.feed(data):
            if self.phase is Phase.DONE:
                out += raw
                continue
            if self.phase in (Phase.HELLO, Phase.RETRY):
                if ctype == CT_CCS and self.phase is Phase.RETRY and not self._chs.partial:
                    out += raw  # middlebox-compatibility change_cipher_spec (RFC 8446 §D.4)
                    continue
                if ctype != CT_HANDSHAKE:
                    raise TLSRefused(
                        f"refused: expected a TLS ClientHello, got record type {ctype}"
                    )
                if len(self._held) + len(raw) > MAX_HELD:
                    raise TLSRefused(
                        f"refused: the client's ClientHello records hold more than {MAX_HELD} "
                        f"bytes (records of {MIN_HELD_RECORD} bytes or more on average)"
                    )
                self._held += raw
                msgs = self._chs.feed(payload)
                if not msgs:
                    continue
                if len(msgs) > 1 or self._chs.partial:
                    raise TLSRefused("refused: handshake data after the ClientHello")
                mtype, body = msgs[0]
                if mtype != HS_CLIENT_HELLO:
                    raise TLSRefused("refused: the tunnel did not begin with a TLS ClientHello")
                self._check_hello(parse_client_hello(body))
                out += self._held
                self._held.clear()
                self.phase = Phase.WAIT_SERVER
                continue
            # WAIT_SERVER: early data, change_cipher_spec and alerts may pass
            if ctype == CT_HANDSHAKE:
                raise TLSRefused("refused: client handshake data before the origin's ServerHello")
            out += raw
        if self.phase is Phase.DONE:
            out += self._crec.buf
            self._crec.buf.clear()
        return bytes(out)

    def _check_hello(self, hello: ClientHello) -> None:
        self._hellos += 1
        self.server_names.append(hello.server_name)
        which = (
            "second ClientHello (after HelloRetryRequest)" if self._hellos > 1 else "ClientHello"
        )
        if hello.offers_ech:
            raise TLSRefused(
                f"refused: the {which} offers Encrypted ClientHello ({hello.ech_form}), which "
                "hides the server name; turn ECH (and ECH GREASE) off in the client"
            )
        if self.host.literal is not None:
            if hello.server_name is not None:
                raise TLSRefused(
                    f"refused: the {which} names {hello.server_name!r} but the tunnel goes to the "
                    f"address {self.host}"
                )
            return
        if hello.server_name is None:
            raise TLSRefused(
                f"refused: the {which} names no server (SNI); it must name {self.host}"
            )
        if hello.server_name != self.host.name:
            raise TLSRefused(
                f"refused: the {which} names {hello.server_name!r} but the tunnel is to "
                f"{self.host.name!r}; the server name must be the CONNECT host"
            )

    def server_data(self, data: bytes) -> bytes:
        if self.phase is Phase.DONE or not data:
            return data
        if self.phase is Phase.START and not self.require_tls:
            self.tls = False  # the origin speaks first: not TLS, on an explicit port
            self.phase = Phase.DONE
            return data
        if self.phase in (Phase.START, Phase.HELLO):
            raise TLSRefused("refused: the origin spoke before the client's ClientHello")
        for ctype, payload, _ in self._srec.feed(data):
            if self.phase is Phase.DONE:
                break
            if ctype in (CT_CCS, CT_ALERT):
                continue
            if ctype != CT_HANDSHAKE:
                raise TLSRefused("refused: the origin did not answer with a TLS ServerHello")
            for mtype, body in self._shs.feed(payload):
                if mtype != HS_SERVER_HELLO:
                    raise TLSRefused("refused: the origin did not answer with a TLS ServerHello")
                if server_hello_is_retry(body):
                    if self.retried:
                        raise TLSRefused("refused: a second HelloRetryRequest (RFC 8446 §4.1.4)")
                    if self.phase is not Phase.WAIT_SERVER:
                        raise TLSRefused("refused: HelloRetryRequest out of order")
                    self.retried = True
                    self.phase = Phase.RETRY
                    continue
                if self.phase is not Phase.WAIT_SERVER:
                    raise TLSRefused(
                        "refused: the origin sent its ServerHello before the retried ClientHello"
                    )
                self.phase = Phase.DONE
                break
        if self.phase is Phase.DONE:
            self._srec.buf.clear()
        return data
