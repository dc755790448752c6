"""IP addresses: literal spellings, unwrapping, and the always-refused ranges.

Pure: no sockets, no DNS. Three jobs:

1. `parse_literal(text)` tells whether a host string is an IP address in any
   spelling the host's resolver accepts as one, and which address. glibc's
   `getaddrinfo` (with or without `AI_NUMERICHOST`) takes IPv4 in the
   `inet_aton` forms: one to four parts separated by dots, each decimal, octal
   (leading `0`) or hex (leading `0x`), the last part filling the remaining
   bytes (`a` = 32 bits, `a.b` = 8.24, `a.b.c` = 8.8.16). So `2130706433`,
   `0x7f.1`, `0177.0.0.1` and `127.1` are all 127.0.0.1. IPv6 may carry a
   zone (`fe80::1%eth0`). The standard library's `ipaddress` only takes the
   dotted-quad form, which is why the IPv4 part is hand-written here; a
   property test checks it against the host's own `inet_aton`/`getaddrinfo`.
2. `views(address)` unwraps the IPv4 addresses an IPv6 address carries:
   IPv4-mapped (`::ffff:0:0/96`), IPv4-compatible (`::/96`), NAT64
   (`64:ff9b::/96`, RFC 6052), 6to4 (`2002::/16`, RFC 3056) and Teredo
   (`2001::/32`, RFC 4380: server and client, whose bits are inverted).
3. `AddressPolicy.check(address)` applies the always-refused table (built
   from the IANA special-purpose address registries, with the clouds'
   metadata addresses named first), the host's own addresses, and the
   operator's `--egress-block` / `--egress-permit` ranges on top. Block wins
   over permit; a permit is the only way to reach a refused range.

The table is our own rather than `ipaddress.is_global`, whose answers have
changed between Python releases; each entry says what it is, so a refusal can
tell a person why.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tkbox.errors import GuestError, UserError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: the longest host string we consider as a possible literal
MAX_LITERAL = 64


class AddressError(GuestError):
    """A host string that looks like an IP address but is not a valid one."""


@dataclass(frozen=True)
class Literal:
    """An IP literal as the guest wrote it, and the address it means."""

    address: IPAddress
    zone: str | None = None  # IPv6 zone id (`%eth0`), never dialed


_DIGITS = {8: "01234567", 10: "0123456789", 16: "0123456789abcdef"}


def _inet_aton_part(part: str) -> int | None:
    """One `inet_aton` part: decimal, octal (leading 0) or hex (leading 0x)."""
    if not part:
        return None
    if part[:2] in ("0x", "0X"):
        base, digits = 16, part[2:].lower()
        if not digits:
            return None
    elif part[0] == "0":
        base, digits = 8, part
    else:
        base, digits = 10, part
    if not all(c in _DIGITS[base] for c in digits):
        return None
    # Bound before converting: a part is at most 32 bits in any base, so a
    # string longer than any 32-bit spelling (with leading zeros stripped) is
    # out of range. Leading zeros are allowed by inet_aton in every base.
    stripped = digits.lstrip("0") or "0"
    if len(stripped) > 11:
        return None
    return int(stripped, base)


def _parse_ipv4_aton(text: str) -> ipaddress.IPv4Address | None:
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = [_inet_aton_part(p) for p in parts]
    if any(v is None for v in values):
        return None
    nums = [v for v in values if v is not None]
    # the last part fills the bytes the others leave: 32, 24, 16 or 8 bits
    last_bits = 32 - 8 * (len(nums) - 1)
    if any(v > 0xFF for v in nums[:-1]) or nums[-1] >= 1 << last_bits:
        return None
    value = 0
    for v in nums[:-1]:
        value = (value << 8) | v
    value = (value << last_bits) | nums[-1]
    return ipaddress.IPv4Address(value)


def looks_numeric(text: str) -> bool:
    """Whether a host string is made only of what IP literals are made of.

    Such a string is never looked up as a name: either it is a literal or it
    is refused. (No top-level domain is all digits, and a hex-only last label
    like `0x7f` exists only to trick a parser.)
    """
    if ":" in text:
        return True
    last = text.rsplit(".", 1)[-1]
    return bool(last) and (last.isdigit() or last[:2].lower() == "0x")


def parse_literal(text: str) -> Literal | None:
    """The IP address a host string spells, or None if it is not a literal.

    Accepts every spelling the host's resolver takes as an address. Raises
    `AddressError` for a string that can only be meant as an address but is
    not a valid one (`1.2.3.256`, `::g`, `0x100000000`): such a string is
    refused, never looked up as a name.
    """
    if len(text) > MAX_LITERAL:
        if looks_numeric(text):
            raise AddressError("refused: a numeric host longer than any address we accept")
        return None
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        if ":" not in text:
            raise AddressError(f"refused: {text!r} in brackets is not an IPv6 address")
    if ":" in text:
        addr, sep, zone = text.partition("%")
        if sep and (not zone or not all(c.isalnum() or c in "-_." for c in zone)):
            raise AddressError("refused: an IPv6 zone id must be a plain interface name")
        try:
            ip6 = ipaddress.IPv6Address(addr)
        except ValueError:
            raise AddressError(f"refused: {text[:64]!r} is not a valid IPv6 address") from None
        return Literal(ip6, zone if sep else None)
    ip4 = _parse_ipv4_aton(text)
    if ip4 is not None:
        return Literal(ip4)
    if looks_numeric(text):
        raise AddressError(f"refused: {text[:64]!r} is neither a valid IP address nor a host name")
    return None


# --- unwrapping -------------------------------------------------------------

_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_COMPAT = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIXTOFOUR = ipaddress.IPv6Network("2002::/16")
_TEREDO = ipaddress.IPv6Network("2001::/32")
_WRAPPERS = (_MAPPED, _COMPAT, _NAT64, _SIXTOFOUR, _TEREDO)


def embedded(address: IPAddress) -> list[tuple[str, ipaddress.IPv4Address]]:
    """The IPv4 addresses an IPv6 address carries, with the form's name."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _MAPPED:
        return [("IPv4-mapped", low32)]
    if address in _COMPAT and int(address) > 1:
        return [("IPv4-compatible", low32)]
    if address in _NAT64:
        return [("NAT64", low32)]  # RFC 6052 §2.2, /96: the last 32 bits
    if address in _SIXTOFOUR:
        # RFC 3056 §2: 2002:V4ADDR::/48
        return [("6to4", ipaddress.IPv4Address((int(address) >> 80) & 0xFFFFFFFF))]
    if address in _TEREDO:
        # RFC 4380 §4: 2001:0:SERVER:flags:port:~CLIENT
        server = ipaddress.IPv4Address((int(address) >> 64) & 0xFFFFFFFF)
        client = ipaddress.IPv4Address(~int(address) & 0xFFFFFFFF)
        return [("Teredo server", server), ("Teredo client", client)]
    return []


def views(address: IPAddress) -> list[tuple[str, IPAddress]]:
    """The address itself, then every IPv4 address it carries."""
    out: list[tuple[str, IPAddress]] = [("", address)]
    out.extend(embedded(address))
    return out


# --- the always-refused table -------------------------------------------------

#: Cloud metadata and platform service addresses, named first so a refusal
#: says what they are. Some are in ranges refused anyway; 168.63.129.16 is not.
METADATA: dict[IPAddress, str] = {
    ipaddress.ip_address(a): name
    for a, name in [
        ("169.254.169.254", "the cloud metadata service (AWS, GCP, Azure, OCI, DigitalOcean, ...)"),
        ("169.254.170.2", "the AWS ECS task metadata service"),
        ("169.254.169.253", "the AWS VPC DNS"),
        ("169.254.169.123", "the AWS time service"),
        ("169.254.0.23", "the Tencent Cloud metadata service"),
        ("100.100.100.200", "the Alibaba Cloud metadata service"),
        ("192.0.0.192", "the Oracle Cloud metadata service"),
        ("168.63.129.16", "the Azure WireServer"),
        ("fd00:ec2::254", "the AWS metadata service (IPv6)"),
        ("fd00:ec2::253", "the AWS VPC DNS (IPv6)"),
        ("fd00:ec2::123", "the AWS time service (IPv6)"),
        ("fd20:ce::254", "the GCP metadata service (IPv6)"),
    ]
}

_RANGES: list[tuple[str, str]] = [
    # IPv4 (IANA IPv4 Special-Purpose Address Registry, RFC 6890 and updates)
    ("0.0.0.0/8", "a 'this network' address (RFC 791)"),
    ("10.0.0.0/8", "a private address (RFC 1918)"),
    ("100.64.0.0/10", "a carrier-grade NAT address (RFC 6598)"),
    ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local address"),
    ("172.16.0.0/12", "a private address (RFC 1918)"),
    ("192.0.0.0/24", "an IETF protocol assignment (RFC 6890)"),
    ("192.0.2.0/24", "a documentation address (TEST-NET-1)"),
    ("192.88.99.0/24", "a deprecated 6to4 relay anycast (RFC 7526)"),
    ("192.168.0.0/16", "a private address (RFC 1918)"),
    ("198.18.0.0/15", "a benchmarking address (RFC 2544)"),
    ("198.51.100.0/24", "a documentation address (TEST-NET-2)"),
    ("203.0.113.0/24", "a documentation address (TEST-NET-3)"),
    ("224.0.0.0/4", "a multicast address"),
    ("255.255.255.255/32", "a broadcast address"),
    ("240.0.0.0/4", "a reserved address (RFC 1112)"),
    # IPv6 (IANA IPv6 Special-Purpose Address Registry)
    ("::/128", "an unspecified address"),
    ("::1/128", "a loopback address"),
    ("64:ff9b:1::/48", "a local-use NAT64 address (RFC 8215)"),
    ("100::/64", "a discard-only address (RFC 6666)"),
    ("2001:2::/48", "a benchmarking address (RFC 5180)"),
    ("2001:db8::/32", "a documentation address (RFC 3849)"),
    ("2001:10::/28", "a deprecated ORCHID address (RFC 4843)"),
    ("3fff::/20", "a documentation address (RFC 9637)"),
    ("5f00::/16", "an SRv6 SID address (RFC 9602)"),
    ("fc00::/7", "a unique-local (private) address (RFC 4193)"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a deprecated site-local address (RFC 3879)"),
    ("ff00::/8", "a multicast address"),
]
RANGES: list[tuple[IPNetwork, str]] = [(ipaddress.ip_network(n), why) for n, why in _RANGES]
_GLOBAL_UNICAST6 = ipaddress.IPv6Network("2000::/3")


def refused_range(address: IPAddress) -> str | None:
    """Why this one address (not its embedded ones) is always refused, or None."""
    if address in METADATA:
        return METADATA[address]
    for net, why in RANGES:
        if address.version == net.version and address in net:
            return why
    if isinstance(address, ipaddress.IPv6Address):
        if any(address in w for w in _WRAPPERS):
            return None  # judged by the IPv4 address it carries
        if address not in _GLOBAL_UNICAST6:
            return "a reserved IPv6 address (outside 2000::/3)"
    return None


def parse_networks(values: Iterable[str], flag: str) -> tuple[IPNetwork, ...]:
    """Operator CIDRs from a flag; a bad one is the operator's mistake."""
    out: list[IPNetwork] = []
    for v in values:
        try:
            out.append(ipaddress.ip_network(v.strip(), strict=True))
        except ValueError as exc:
            raise UserError(
                f"{flag} {v!r}: not a CIDR range ({exc}); write e.g. 10.1.2.0/24"
            ) from None
    return tuple(out)


@dataclass(frozen=True)
class AddressVerdict:
    address: IPAddress
    allowed: bool
    reason: str  # one line for a person
    rule: str  # "public", "permit CIDR", "block CIDR", the refused range's name


def _in_any(address: IPAddress, nets: Sequence[IPNetwork]) -> IPNetwork | None:
    for n in nets:
        if address.version == n.version and address in n:
            return n
    return None


class AddressPolicy:
    """The pure address check: refused table, host's own, operator ranges."""

    def __init__(
        self,
        block: Sequence[IPNetwork] = (),
        permit: Sequence[IPNetwork] = (),
        own_addresses: Callable[[], frozenset[IPAddress]] = frozenset,
    ) -> None:
        self.block = tuple(block)
        self.permit = tuple(permit)
        self._own = own_addresses

    def check(self, address: IPAddress) -> AddressVerdict:
        own = self._own()
        seen = views(address)
        for form, v in seen:
            hit = _in_any(v, self.block)
            if hit is not None:
                return AddressVerdict(
                    address,
                    False,
                    f"refused: {_say(address, form, v)} is blocked by the host's operator "
                    f"(--egress-block {hit})",
                    f"block {hit}",
                )
        permits: list[str] = []
        for form, v in seen:
            why = refused_range(v)
            if why is None and v in own:
                why = "an address of this host"
            if why is None:
                continue
            hit = _in_any(v, self.permit) or _in_any(address, self.permit)
            if hit is not None:
                permits.append(f"permit {hit}")
                continue
            return AddressVerdict(
                address,
                False,
                f"refused: {_say(address, form, v)} is {why}, always refused; "
                "only the host's operator can open a range (tkbox daemon --egress-permit CIDR)",
                why,
            )
        if permits:
            rule = permits[0]
            return AddressVerdict(address, True, f"allowed by the host's operator ({rule})", rule)
        return AddressVerdict(address, True, "public address", "public")


def _say(address: IPAddress, form: str, v: IPAddress) -> str:
    return str(address) if not form else f"{address} ({form}, carrying {v})"
