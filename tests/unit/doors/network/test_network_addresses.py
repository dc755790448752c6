"""Addresses: literal spellings, unwrapping, the always-refused table."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tkbox.doors.network.addresses import (
    METADATA,
    AddressError,
    AddressPolicy,
    embedded,
    parse_literal,
    parse_networks,
)
from tkbox.errors import UserError

ip = ipaddress.ip_address


def _resolver_literal(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """What the host's own resolver takes `text` to be, without DNS."""
    try:
        infos = socket.getaddrinfo(text, None, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError):
        return None
    return ip(str(infos[0][4][0]).partition("%")[0])


LOOPBACK_SPELLINGS = [
    "127.0.0.1",
    "2130706433",
    "0x7f000001",
    "0X7F000001",
    "017700000001",
    "0177.0.0.1",
    "0x7f.0.0.1",
    "0x7f.1",
    "127.1",
    "127.0.1",
    "0177.1",
    "127.000.000.001",
    "0x7F.0x0.0.01",
    "0000000177.0.0.1",
]


@pytest.mark.parametrize("spelling", LOOPBACK_SPELLINGS)
def test_every_ipv4_spelling_is_read_as_the_address_the_resolver_means(spelling: str) -> None:
    """Stops the classic filter bypass: `0x7f.1` or `2130706433` posing as a name."""
    lit = parse_literal(spelling)
    assert lit is not None and lit.address == ip("127.0.0.1")
    assert _resolver_literal(spelling) == lit.address


def test_ipv6_forms_and_zones_are_addresses_not_names() -> None:
    assert parse_literal("::1") is not None
    lit = parse_literal("[fe80::1%eth0]")
    assert lit is not None and lit.address == ip("fe80::1") and lit.zone == "eth0"
    lit = parse_literal("::ffff:127.0.0.1")
    assert lit is not None and lit.address == ip("::ffff:7f00:1")


@pytest.mark.parametrize(
    "text",
    [
        "1.2.3.256",
        "0x100000000",
        "4294967296",
        "08.1.1.1",
        "1.2.3.4.5",
        "::g",
        "1::2::3",
        "0x",
        "0x.1",
        "1.16777216",
        "fe80::1%",
        "fe80::1%a b",
        "example.123",
    ],
)
def test_numeric_hosts_that_are_no_valid_address_are_refused_not_resolved(text: str) -> None:
    """A numeric-looking host that is not an address must never reach DNS as a name."""
    with pytest.raises(AddressError):
        parse_literal(text)


def test_names_are_not_literals() -> None:
    for name in ["example.org", "a.b.c", "0x7f.example", "localhost", "1.2.3.4.example.org"]:
        assert parse_literal(name) is None


@settings(max_examples=400)
@given(
    st.lists(
        st.one_of(
            st.integers(0, 2**32).map(str),
            st.integers(0, 2**32).map(lambda n: f"0x{n:x}"),
            st.integers(0, 2**32).map(lambda n: f"0{n:o}"),
            st.sampled_from(["0", "00", "0x0", "255", "256", "0xff", "0377", "0400"]),
        ),
        min_size=1,
        max_size=5,
    ).map(".".join)
)
def test_ipv4_parser_agrees_with_the_hosts_resolver(text: str) -> None:
    """Property: our parser and glibc's numeric parser read every inet_aton form alike."""
    try:
        ours = parse_literal(text)
    except AddressError:
        ours = None
    theirs = _resolver_literal(text)
    assert (ours.address if ours else None) == theirs


def test_unwrapping_finds_every_embedded_ipv4() -> None:
    assert embedded(ip("::ffff:169.254.169.254")) == [("IPv4-mapped", ip("169.254.169.254"))]
    assert embedded(ip("::10.0.0.1")) == [("IPv4-compatible", ip("10.0.0.1"))]
    assert embedded(ip("64:ff9b::a00:1")) == [("NAT64", ip("10.0.0.1"))]
    assert embedded(ip("2002:7f00:1::")) == [("6to4", ip("127.0.0.1"))]
    # Teredo: server 65.54.227.120, client 192.0.2.45 obfuscated (RFC 4380 §4 example form)
    teredo = ip("2001:0:4136:e378:8000:63bf:3fff:fdd2")
    assert embedded(teredo) == [
        ("Teredo server", ip("65.54.227.120")),
        ("Teredo client", ip("192.0.2.45")),
    ]
    assert embedded(ip("2606:4700::1")) == []


REFUSED = {
    "127.0.0.1": "loopback",
    "::1": "loopback",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "192.168.1.1": "private",
    "100.64.0.1": "carrier-grade NAT",
    "169.254.1.1": "link-local",
    "fe80::1": "link-local",
    "224.0.0.1": "multicast",
    "ff02::1": "multicast",
    "192.0.2.1": "documentation",
    "198.51.100.1": "documentation",
    "203.0.113.9": "documentation",
    "2001:db8::1": "documentation",
    "198.18.0.1": "benchmarking",
    "2001:2::1": "benchmarking",
    "240.0.0.1": "reserved",
    "255.255.255.255": "broadcast",
    "0.0.0.0": "this network",
    "::": "unspecified",
    "fc00::1": "unique-local",
    "fd12::1": "unique-local",
    "169.254.169.254": "metadata",
    "100.100.100.200": "Alibaba",
    "fd00:ec2::254": "AWS metadata",
    "168.63.129.16": "Azure",
    "64:ff9b:1::1": "local-use NAT64",
    "100::1": "discard",
    "4000::1": "reserved IPv6",
}


@pytest.mark.parametrize("address,why", sorted(REFUSED.items()))
def test_always_refused_ranges_say_what_they_are(address: str, why: str) -> None:
    v = AddressPolicy().check(ip(address))
    assert not v.allowed
    assert why in v.reason and "--egress-permit" in v.reason


@pytest.mark.parametrize(
    "wrapped",
    [
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "::127.0.0.1",
        "64:ff9b::7f00:1",
        "64:ff9b::a9fe:a9fe",
        "2002:a00:1::1",
        "2002:a9fe:a9fe::",
        "2001:0:4136:e378:8000:63bf:80ff:fffe",
    ],
)
def test_ipv6_wrappers_of_refused_ipv4_are_refused(wrapped: str) -> None:
    """Stops reaching loopback or metadata through IPv4-mapped/compatible, NAT64, 6to4, Teredo."""
    v = AddressPolicy().check(ip(wrapped))
    assert not v.allowed and "carrying" in v.reason


def test_public_addresses_and_wrappers_of_public_ones_pass() -> None:
    p = AddressPolicy()
    for a in ["93.184.215.14", "2606:4700::1111", "::ffff:93.184.215.14", "64:ff9b::5db8:d70e"]:
        assert p.check(ip(a)).allowed, a


def test_metadata_table_is_all_refused() -> None:
    for a in METADATA:
        assert not AddressPolicy().check(a).allowed


def test_hosts_own_addresses_are_refused() -> None:
    p = AddressPolicy(own_addresses=lambda: frozenset({ip("93.184.215.14")}))
    v = p.check(ip("93.184.215.14"))
    assert not v.allowed and "this host" in v.reason
    assert not p.check(ip("::ffff:93.184.215.14")).allowed


def test_permit_is_the_only_way_into_a_refused_range_and_block_wins() -> None:
    permit = parse_networks(["127.0.0.1/32"], "--egress-permit")
    block = parse_networks(["93.184.215.0/24", "127.0.0.1/32"], "--egress-block")
    assert AddressPolicy(permit=permit).check(ip("127.0.0.1")).allowed
    assert AddressPolicy(permit=permit).check(ip("::ffff:127.0.0.1")).allowed
    assert not AddressPolicy(permit=permit).check(ip("127.0.0.2")).allowed
    both = AddressPolicy(block=block, permit=permit)
    assert not both.check(ip("127.0.0.1")).allowed
    v = both.check(ip("93.184.215.14"))
    assert not v.allowed and "--egress-block 93.184.215.0/24" in v.reason


def test_operator_cidrs_are_checked() -> None:
    with pytest.raises(UserError, match="--egress-permit"):
        parse_networks(["10.0.0.1/8"], "--egress-permit")
    with pytest.raises(UserError):
        parse_networks(["nonsense"], "--egress-block")
