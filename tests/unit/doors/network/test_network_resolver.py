"""Host addresses, hosts files, operator config; the name the system resolver is asked."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from pathlib import Path

import pytest

from tkbox._clock import FakeClock
from tkbox.doors.network.config import OperatorConfig
from tkbox.doors.network.names import HostNameError, fully_qualified
from tkbox.doors.network.resolver import (
    AddrInfo,
    HostAddresses,
    ResolveError,
    SystemResolver,
    parse_hosts,
    read_own_addresses,
)
from tkbox.errors import UserError

FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     +-- 127.0.0.0/8 2 0 2
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 203.0.113.0/24 2 0 2
           |-- 203.0.113.0
              /24 link UNICAST
           |-- 203.0.113.7
              /32 host LOCAL
"""
IF_INET6 = (
    "00000000000000000000000000000001 01 80 10 80       lo\n"
    "2a0100000000000000000000000000aa 02 40 00 80     eth0\n"
)


def test_own_addresses_come_from_proc(tmp_path: Path) -> None:
    (tmp_path / "fib_trie").write_text(FIB_TRIE)
    (tmp_path / "if_inet6").write_text(IF_INET6)
    got = read_own_addresses(tmp_path)
    assert got == {ipaddress.ip_address(a) for a in ["127.0.0.1", "203.0.113.7", "::1", "2a01::aa"]}
    assert read_own_addresses(tmp_path / "missing") == frozenset()


def test_own_addresses_are_re_read_at_most_every_five_seconds() -> None:
    clock = FakeClock()
    reads: list[float] = []

    def read() -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        reads.append(clock.monotonic())
        return frozenset({ipaddress.ip_address(f"198.51.100.{len(reads)}")})

    own = HostAddresses(clock, read)
    first = own()
    clock.advance(4.9)
    assert own() == first and len(reads) == 1
    clock.advance(0.1)
    assert own() != first and len(reads) == 2


def test_hosts_file_maps_names_and_aliases() -> None:
    got = parse_hosts("# mirrors\n127.0.0.1 Mirror.Internal. pkg.internal\n::1 mirror.internal\n")
    assert got["mirror.internal"] == (
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    )
    assert got["pkg.internal"] == (ipaddress.ip_address("127.0.0.1"),)


@pytest.mark.parametrize("bad", ["127.0.0.1\n", "0x7f.1 a.internal\n", "1.2.3.4 bad name!\n"])
def test_bad_hosts_file_lines_name_the_line(bad: str) -> None:
    with pytest.raises(UserError, match="line 1"):
        parse_hosts(bad)


def test_operator_config_from_flags_and_its_record(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 mirror.internal\n")
    op = OperatorConfig.from_flags(
        ["203.0.113.7/32"], ["127.0.0.1/32"], hosts, [tmp_path / "ca.pem"]
    )
    assert op.facts() == {
        "egress_block": ["203.0.113.7/32"],
        "egress_permit": ["127.0.0.1/32"],
        "egress_hosts": {"mirror.internal": ["127.0.0.1"]},
        "ca_certs": [str(tmp_path / "ca.pem")],
    }
    with pytest.raises(UserError, match="--egress-hosts"):
        OperatorConfig.from_flags(hosts_file=tmp_path / "missing")


class RecordingLookup:
    """The system resolver's boundary (`Lookup`), answering from a table and noting
    exactly what it was asked."""

    def __init__(self, answers: dict[bytes, list[str]]) -> None:
        self.answers = answers
        self.asked: list[tuple[bytes, int]] = []

    async def __call__(self, query: bytes, port: int) -> Sequence[AddrInfo]:
        self.asked.append((query, port))
        if query not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in self.answers[query]]


@pytest.mark.parametrize(("written", "asked"), [
    ("intranet", b"intranet."),
    ("Intranet", b"intranet."),
    ("intranet.", b"intranet."),
    ("INTRANET.", b"intranet."),
    ("Db.Corp.Example", b"db.corp.example."),
    ("db.corp.example.", b"db.corp.example."),
    ("B\u00fccher.Example.", b"xn--bcher-kva.example."),
    ("xn--bcher-kva.example", b"xn--bcher-kva.example."),
])
def test_system_resolver_asks_only_the_absolute_name(written: str, asked: bytes) -> None:
    """Stops the host's `search` domains completing a box's name: `intranet` must
    never come back as `intranet.corp.example`, so exactly one lookup is made, of
    the normalised name with its trailing dot, however the name was written."""
    lookup = RecordingLookup({asked: ["8.8.4.4"]})
    got = asyncio.run(SystemResolver(lookup=lookup).resolve(written, 443))
    assert got == [ipaddress.ip_address("8.8.4.4")]
    assert lookup.asked == [(asked, 443)]
    assert fully_qualified(written) == asked.decode("ascii")


@pytest.mark.parametrize("bad", ["127.1", "0x7f000001", "[::1]", "::1", "1.2.3.4.", "a..b",
                                 "user@intranet", "", ".", "bad name", "a" * 64 + ".example"])
def test_what_is_no_name_is_never_looked_up(bad: str) -> None:
    """An address in any spelling, or no valid name, never reaches the system resolver
    (`1.2.3.4.` would go out to DNS as a name)."""
    lookup = RecordingLookup({})
    with pytest.raises(ResolveError):
        asyncio.run(SystemResolver(lookup=lookup).resolve(bad, 443))
    assert lookup.asked == []
    with pytest.raises(HostNameError):
        fully_qualified(bad)


def test_a_name_that_does_not_resolve_is_a_resolve_error() -> None:
    lookup = RecordingLookup({})
    with pytest.raises(ResolveError, match="does not resolve"):
        asyncio.run(SystemResolver(lookup=lookup).resolve("missing.example", 80))
    assert lookup.asked == [(b"missing.example.", 80)]
