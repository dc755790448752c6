"""Names, allowlist entries, presets."""

from __future__ import annotations

from pathlib import Path

import pytest

from tkbox.doors.network import presets
from tkbox.doors.network.allowlist import Allowlist, parse_entry
from tkbox.doors.network.names import HostNameError, parse_authority, parse_host
from tkbox.errors import UserError


def test_names_normalise_case_trailing_dot_and_idna() -> None:
    assert parse_host("Example.ORG.").name == "example.org"
    assert parse_host("bücher.example").name == "xn--bcher-kva.example"
    assert parse_host("BÜCHER.example").name == "xn--bcher-kva.example"
    assert parse_host("xn--bcher-kva.example").name == "xn--bcher-kva.example"


@pytest.mark.parametrize(
    "bad",
    [
        "exa mple.org",
        "a..b",
        "-" * 64 + ".org",
        "a" * 254,
        "xn--zz-.example",
        "e\x00x.org",
        "ex/ample.org",
        "",
    ],
)
def test_invalid_names_are_refused(bad: str) -> None:
    with pytest.raises(HostNameError):
        parse_host(bad)


def test_a_name_that_idna_maps_to_digits_is_an_address_not_a_name() -> None:
    """Stops '0\u30020' (ideographic full stop) becoming the name '0.0' (glibc: 0.0.0.0)."""
    h = parse_host("0\u30020")
    assert h.literal is not None and h.name == "0.0.0.0"
    with pytest.raises(HostNameError):
        parse_host("x\u30020")


def test_userinfo_in_a_target_is_refused_not_stripped() -> None:
    """Stops `allowed.org@evil.net` style confusion between two URL parsers."""
    with pytest.raises(HostNameError, match="userinfo"):
        parse_authority("allowed.org@evil.net:443", None)


def test_authorities_and_ports_are_canonical() -> None:
    h, p = parse_authority("[::1]:8443", None)
    assert h.address is not None and p == 8443
    assert parse_authority("Example.org", 80)[1] == 80
    for bad in [
        "example.org:0",
        "example.org:65536",
        "example.org:0443",
        "example.org:+1",
        "example.org:",
        "::1:443",
        "[::1]x",
        "example.org:４４３",
    ]:
        with pytest.raises(HostNameError):
            parse_authority(bad, None)
    with pytest.raises(HostNameError, match="names no port"):
        parse_authority("example.org", None)


def test_entry_host_allows_443_and_80_only() -> None:
    a = Allowlist(["example.org"], expand=lambda n: None)
    assert a.match(parse_host("example.org"), 443) is not None
    assert a.match(parse_host("EXAMPLE.org."), 80) is not None
    assert a.match(parse_host("example.org"), 8443) is None
    m = a.match(parse_host("example.org"), 443)
    assert m is not None and not m.entry.explicit_port


def test_entry_with_port_or_range_allows_only_those() -> None:
    a = Allowlist(["example.org:8443", "api.example.org:9000-9010"], expand=lambda n: None)
    m = a.match(parse_host("example.org"), 8443)
    assert m is not None and m.entry.explicit_port
    assert a.match(parse_host("example.org"), 443) is None
    assert a.match(parse_host("api.example.org"), 9005) is not None
    assert a.match(parse_host("api.example.org"), 9011) is None


def test_matching_is_exact_never_by_suffix() -> None:
    """Stops `evil.example.org` or `example.org.evil.net` riding on `example.org`."""
    a = Allowlist(["example.org"], expand=lambda n: None)
    for other in ["evil.example.org", "example.org.evil.net", "xexample.org"]:
        assert a.match(parse_host(other), 443) is None


def test_bad_entries_are_the_users_error() -> None:
    for bad in ["exa mple.org", "example.org:99999", "example.org:90-80", "a@b"]:
        with pytest.raises(UserError, match="--allow"):
            parse_entry(bad)


def test_fixed_presets_expand() -> None:
    a = Allowlist(["github"])
    m = a.match(parse_host("api.github.com"), 443)
    assert m is not None and "preset github" in m.rule
    for name in ("go-proxy", "anthropic", "openai", "gemini", "claude-code"):
        assert presets.preset_entries(name)


def test_pypi_preset_is_pips_own_default_index() -> None:
    from pip._internal.models.index import PyPI

    assert presets.pip_hosts() == [PyPI.netloc, PyPI.file_storage_domain]
    assert set(presets.describe_presets()) == set(presets.NAMES)


def test_npm_preset_reads_npms_configured_registry() -> None:
    assert presets.npm_hosts(lambda argv: "https://npm.mirror.example:8443/\n") == [
        "npm.mirror.example:8443"
    ]
    assert presets.npm_hosts(lambda argv: "https://npm.mirror.example/\n") == ["npm.mirror.example"]
    assert presets.npm_hosts(lambda argv: "not a url") == []


def test_apt_sources_in_both_formats(tmp_path: Path) -> None:
    (tmp_path / "etc/apt/sources.list.d").mkdir(parents=True)
    (tmp_path / "usr/share/distro-info").mkdir(parents=True)
    (tmp_path / "usr/share/distro-info/debian.csv").write_text(
        "version,codename,series\n12,Bookworm,bookworm\n"
    )
    (tmp_path / "usr/share/distro-info/ubuntu.csv").write_text(
        "version,codename,series\n24.04 LTS,Noble Numbat,noble\n"
    )
    (tmp_path / "etc/apt/sources.list").write_text(
        "# comment\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://deb.mirror.example/debian bookworm main\n"
        "deb-src https://src.mirror.example:8080/debian bookworm-updates main\n"
    )
    (tmp_path / "etc/apt/sources.list.d/ubuntu.sources").write_text(
        "Types: deb\nURIs: http://ubuntu.mirror.example/ubuntu\n http://ports.mirror.example/ubuntu\n"
        "Suites: noble noble-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://disabled.mirror.example/ubuntu\nSuites: noble\nEnabled: no\n"
    )
    (tmp_path / "etc/apt/sources.list.d/ignored.list.disabled").write_text(
        "deb http://ignored.mirror.example/debian bookworm main\n"
    )
    (tmp_path / "etc/os-release").write_text("ID=debian\nVERSION_CODENAME=bookworm\n")
    assert presets.apt_hosts("debian", tmp_path) == [
        "deb.mirror.example",
        "src.mirror.example:8080",
    ]
    assert presets.apt_hosts("ubuntu", tmp_path) == [
        "ubuntu.mirror.example",
        "ports.mirror.example",
    ]


def test_a_preset_empty_on_this_host_is_reported() -> None:
    a = Allowlist(["pypi", "example.org"], expand=lambda n: () if n == "pypi" else None)
    assert a.unknown_empty == ["pypi"]
