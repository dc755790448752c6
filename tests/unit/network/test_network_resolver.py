"""Host addresses, hosts files, operator config."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from tkbox.doors.network.clock import FakeClock
from tkbox.doors.network.config import OperatorConfig
from tkbox.doors.network.resolver import HostAddresses, parse_hosts, read_own_addresses
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
