"""Host names and authorities, normalised one way for every comparison.

Pure. The same function normalises an allowlist entry, a `CONNECT` target,
an absolute URL's host, a `Host` header, a hosts-file name and a TLS server
name, so two spellings of one host compare equal and nothing else does:

- lower case; one trailing dot removed (`Example.ORG.` = `example.org`);
- a name with non-ASCII letters is converted to its IDNA A-label form with
  UTS #46 mapping (the `idna` package, IDNA 2008); an `xn--` label must
  decode, so a malformed A-label cannot pose as another name;
- labels of 1 to 63 letters, digits, `-` and `_`, at most 253 characters;
- a host that is an IP address in any spelling the resolver accepts is an IP
  (see `addresses.parse_literal`), written back in its canonical form;
- userinfo (`user@host`) is refused, never stripped: it has no business in a
  proxy target and is a classic way to make two parsers disagree.

Names compare without their trailing dot, but a name is *asked* of the
host's resolver with it (`fully_qualified`): `intranet` goes out as
`intranet.`, which no `search` domain of the host's resolver configuration
ever completes into `intranet.corp.example`.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import idna

from tkbox.doors.network.addresses import AddressError, IPAddress, Literal, parse_literal
from tkbox.errors import GuestError

MAX_NAME = 253
MAX_LABEL = 63
MAX_AUTHORITY = 300
_LABEL_CHARS = frozenset(string.ascii_lowercase + string.digits + "-_")


class HostNameError(GuestError):
    """A host or authority that is not a valid name, address or port."""


@dataclass(frozen=True)
class Host:
    """A normalised host: a name, or an IP address (then `name` is its text)."""

    name: str
    literal: Literal | None = None

    @property
    def address(self) -> IPAddress | None:
        return self.literal.address if self.literal else None

    def __str__(self) -> str:
        if self.literal and self.literal.address.version == 6:
            return f"[{self.name}]"
        return self.name


def normalize_name(text: str) -> str:
    """The canonical form of a DNS name (not an address). Raises HostNameError."""
    if not text or len(text) > MAX_NAME + 1:
        raise HostNameError(f"refused: host name of {len(text)} characters (1 to {MAX_NAME})")
    name = text[:-1] if text.endswith(".") else text
    if not name.isascii():
        try:
            name = idna.encode(name, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError, ValueError):
            raise HostNameError(
                "refused: host name is not a valid internationalised name"
            ) from None
    name = name.lower()
    if not name or len(name) > MAX_NAME:
        raise HostNameError(f"refused: host name of {len(name)} characters (1 to {MAX_NAME})")
    for label in name.split("."):
        if not 1 <= len(label) <= MAX_LABEL or not set(label) <= _LABEL_CHARS:
            raise HostNameError(
                f"refused: {name[:80]!r} is not a valid host name "
                "(labels of 1 to 63 letters, digits, '-' or '_')"
            )
        if label.startswith("xn--"):
            try:
                idna.decode(label)
            except (idna.IDNAError, UnicodeError, ValueError):
                raise HostNameError(f"refused: {label!r} is not a valid IDNA label") from None
    return name


def parse_host(text: str) -> Host:
    """A host as written (name, IPv4 in any spelling, [IPv6] or IPv6)."""
    if "@" in text:
        raise HostNameError("refused: userinfo (user@host) is not allowed in a proxy target")
    stripped = text[:-1] if text.endswith(".") and not text.endswith("..") else text
    try:
        lit = parse_literal(stripped)
    except AddressError as exc:
        raise HostNameError(exc.message) from None
    if lit is not None:
        return Host(str(lit.address), lit)
    name = normalize_name(text)
    # IDNA mapping can turn a name into a numeric one ('0\u30020' -> '0.0'): look again,
    # so a normalised name is never something the resolver would read as an address.
    try:
        lit = parse_literal(name)
    except AddressError as exc:
        raise HostNameError(exc.message) from None
    if lit is not None:
        return Host(str(lit.address), lit)
    return Host(name)


def fully_qualified(text: str) -> str:
    """The absolute form of a host name for a DNS lookup: normalised, one trailing dot.

    A resolver appends its `search` domains only to a name without a trailing dot
    (resolv.conf(5): when the name has fewer dots than `ndots`, or does not exist as
    written), so `intranet` could come back as `intranet.corp.example` and pass the
    address checks with that name's address. The absolute form is only ever looked
    up as written. However the name is spelled (case, a trailing dot or not, Unicode),
    the same bytes come out. An IP address in any spelling is no name to look up:
    `HostNameError`, like any invalid name.
    """
    host = parse_host(text)
    if host.literal is not None:
        raise HostNameError(f"refused: {host} is an IP address, not a name to look up")
    return host.name + "."


def parse_port(text: str) -> int:
    """A port in canonical decimal form, 1 to 65535."""
    if (
        not text.isdigit()
        or not text.isascii()
        or len(text) > 5
        or (len(text) > 1 and text[0] == "0")
    ):
        raise HostNameError(f"refused: port {text[:8]!r} is not a decimal number from 1 to 65535")
    port = int(text)
    if not 1 <= port <= 65535:
        raise HostNameError(f"refused: port {port} is out of range (1 to 65535)")
    return port


def split_authority(text: str) -> tuple[str, str | None]:
    """`host`, `host:port`, `[v6]`, `[v6]:port` → (host, port text or None)."""
    if len(text) > MAX_AUTHORITY:
        raise HostNameError(
            f"refused: authority of {len(text)} characters (at most {MAX_AUTHORITY})"
        )
    if "@" in text:
        raise HostNameError("refused: userinfo (user@host) is not allowed in a proxy target")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise HostNameError("refused: unclosed '[' in an IPv6 authority")
        host, rest = text[: end + 1], text[end + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise HostNameError("refused: junk after ']' in an IPv6 authority")
        return host, rest[1:]
    if text.count(":") > 1:
        raise HostNameError("refused: an IPv6 address in an authority must be in brackets")
    host, sep, port = text.partition(":")
    return host, (port if sep else None)


def format_authority(host: Host, port: int, default_port: int) -> str:
    """The canonical `host[:port]` (a `Host` header's value): the host as normalised
    (`[v6]` bracketed), the port only when it is not the scheme's default."""
    return str(host) if port == default_port else f"{host}:{port}"


def parse_authority(text: str, default_port: int | None) -> tuple[Host, int]:
    """Parse `host[:port]`; without a port, `default_port` (None: required)."""
    host_text, port_text = split_authority(text)
    if port_text is None:
        if default_port is None:
            raise HostNameError(f"refused: {text[:80]!r} names no port (write host:port)")
        port = default_port
    else:
        port = parse_port(port_text)
    if not host_text:
        raise HostNameError("refused: empty host")
    return parse_host(host_text), port
