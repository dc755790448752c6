"""ClientHello inspection at the start of a tunnel."""

from __future__ import annotations

import ssl

import pytest

from tkbox.doors.network.names import parse_host
from tkbox.doors.network.testing import (
    CCS,
    client_hello,
    ech_ext,
    ext,
    records,
    server_hello,
)
from tkbox.doors.network.tls import (
    MAX_HANDSHAKE,
    Phase,
    TLSRefused,
    TunnelInspector,
    parse_client_hello,
    read_client_hello,
)


def real_client_hello(server_name: str) -> bytes:
    """The bytes Python's own TLS client (OpenSSL) sends first."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def inspector(host: str = "example.org", require_tls: bool = True) -> TunnelInspector:
    return TunnelInspector(parse_host(host), require_tls)


def test_a_real_client_hello_for_the_host_passes_whole() -> None:
    raw = real_client_hello("example.org")
    insp = inspector()
    assert insp.client_data(raw) == raw
    assert insp.phase is Phase.WAIT_SERVER and insp.server_names == ["example.org"]
    assert insp.server_data(records(server_hello())) != b""
    assert insp.done and insp.client_data(b"\x17\x03\x03anything") == b"\x17\x03\x03anything"


def test_client_hello_split_at_every_byte_and_across_records_is_reassembled() -> None:
    hello = client_hello("example.org", padding=300)
    raw = records(hello, size=97)  # several records
    for n in (1, 2, 5, 96, 97, 98, 1000):
        insp = inspector()
        out = b"".join(insp.client_data(raw[i : i + n]) for i in range(0, len(raw), n))
        assert out == raw and insp.phase is Phase.WAIT_SERVER


def test_client_hello_bytes_are_held_until_checked() -> None:
    """Stops a colluding origin from reading a name smuggled into a refused hello."""
    raw = records(client_hello("evil.example"))
    insp = inspector()
    assert insp.client_data(raw[:-1]) == b""
    with pytest.raises(TLSRefused):
        insp.client_data(raw[-1:])


def test_sni_that_differs_from_the_connect_host_is_refused() -> None:
    """Stops domain fronting: CONNECT allowed.example, then TLS to another name."""
    with pytest.raises(TLSRefused, match="names 'evil.example'"):
        inspector("allowed.example").client_data(records(client_hello("evil.example")))
    with pytest.raises(TLSRefused):
        inspector("allowed.example").client_data(real_client_hello("evil.example"))
    with pytest.raises(TLSRefused):
        inspector("example.org").client_data(records(client_hello("sub.example.org")))


def test_sni_case_is_not_a_difference() -> None:
    insp = inspector("example.org")
    insp.client_data(records(client_hello("EXAMPLE.org")))
    assert insp.phase is Phase.WAIT_SERVER


def test_missing_or_doubled_server_name_is_refused() -> None:
    with pytest.raises(TLSRefused, match="names no server"):
        inspector().client_data(records(client_hello(None)))
    with pytest.raises(TLSRefused, match="2 server names"):
        inspector().client_data(records(client_hello(names=[b"example.org", b"evil.example"])))
    with pytest.raises(TLSRefused, match="trailing dot"):
        inspector().client_data(records(client_hello("example.org.")))


def test_repeated_extension_is_refused() -> None:
    """Stops two parsers picking different copies of the server_name extension."""
    from tkbox.doors.network.testing import sni_ext

    with pytest.raises(TLSRefused, match="repeats"):
        inspector().client_data(records(client_hello("example.org", [sni_ext(b"evil.example")])))


def test_ip_tunnel_takes_no_server_name() -> None:
    insp = inspector("93.184.215.14")
    insp.client_data(records(client_hello(None)))
    assert insp.phase is Phase.WAIT_SERVER
    with pytest.raises(TLSRefused):
        inspector("93.184.215.14").client_data(records(client_hello("evil.example")))


def test_ech_is_refused() -> None:
    """Stops Encrypted ClientHello hiding the real server name behind a public one."""
    with pytest.raises(TLSRefused, match="Encrypted ClientHello"):
        inspector().client_data(records(client_hello("example.org", [ech_ext()])))
    with pytest.raises(TLSRefused, match="Encrypted ClientHello"):
        inspector().client_data(records(client_hello("example.org", [ext(0xFFCE, b"\x00")])))


def test_sni_changed_after_hello_retry_request_is_refused() -> None:
    """Stops passing the first ClientHello's check, then naming another host in the second."""
    insp = inspector()
    insp.client_data(records(client_hello("example.org")))
    insp.server_data(records(server_hello(retry=True)) + CCS)
    assert insp.phase is Phase.RETRY
    assert insp.client_data(CCS) == CCS
    with pytest.raises(TLSRefused, match="second ClientHello"):
        insp.client_data(records(client_hello("evil.example")))


def test_ech_added_after_hello_retry_request_is_refused() -> None:
    insp = inspector()
    insp.client_data(records(client_hello("example.org")))
    insp.server_data(records(server_hello(retry=True)))
    with pytest.raises(TLSRefused, match="Encrypted"):
        insp.client_data(records(client_hello("example.org", [ech_ext()])))


def test_a_good_retry_passes_and_then_everything_is_spliced() -> None:
    insp = inspector()
    insp.client_data(records(client_hello("example.org")))
    insp.server_data(records(server_hello(retry=True)))
    second = records(client_hello("example.org"))
    assert insp.client_data(second) == second
    insp.server_data(records(server_hello()))
    assert insp.done and insp.retried


def test_origin_may_not_commit_before_the_retried_hello_is_checked() -> None:
    """Stops a colluding origin skipping the second check with HRR then ServerHello at once."""
    insp = inspector()
    insp.client_data(records(client_hello("example.org")))
    with pytest.raises(TLSRefused, match="before the retried"):
        insp.server_data(records(server_hello(retry=True) + server_hello()))


def test_second_hello_retry_request_is_refused() -> None:
    insp = inspector()
    insp.client_data(records(client_hello("example.org")))
    insp.server_data(records(server_hello(retry=True)))
    insp.client_data(records(client_hello("example.org")))
    with pytest.raises(TLSRefused, match="second HelloRetryRequest"):
        insp.server_data(records(server_hello(retry=True)))


def test_client_handshake_before_the_server_answers_is_refused() -> None:
    insp = inspector()
    insp.client_data(records(client_hello("example.org")))
    with pytest.raises(TLSRefused):
        insp.client_data(records(client_hello("evil.example")))


def test_non_tls_on_an_implicit_port_is_refused() -> None:
    """Stops a plain-TCP tunnel through a `host` entry (which means HTTPS on 443)."""
    with pytest.raises(TLSRefused, match="not TLS"):
        inspector().client_data(b"SSH-2.0-OpenSSH_9.2\r\n")
    with pytest.raises(TLSRefused, match="not TLS"):
        inspector().client_data(b"GET / HTTP/1.1\r\n\r\n")


def test_non_tls_on_an_explicit_port_passes() -> None:
    insp = inspector(require_tls=False)
    assert insp.client_data(b"SSH-2.0-x\r\n") == b"SSH-2.0-x\r\n"
    assert insp.done and insp.tls is False
    first = inspector(require_tls=False)
    assert first.server_may_speak and first.server_data(b"220 smtp\r\n") == b"220 smtp\r\n"


def test_origin_may_not_speak_before_the_hello_on_an_implicit_port() -> None:
    with pytest.raises(TLSRefused):
        inspector().server_data(b"hello")


def test_oversized_hello_is_refused_without_buffering_it() -> None:
    insp = inspector()
    header = bytes([22, 3, 1, 0x40, 0x00, 1]) + (MAX_HANDSHAKE + 1).to_bytes(3, "big")
    with pytest.raises(TLSRefused, match="at most"):
        insp.client_data(header + b"\x00" * (0x4000 - 4))


def test_record_length_beyond_the_limit_is_refused() -> None:
    with pytest.raises(TLSRefused):
        inspector().client_data(bytes([22, 3, 1, 0x48, 0x01]))


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x03",
        b"\x03\x03" + b"\x00" * 31,
        b"\x03\x00" + b"\x00" * 40,
        b"\x03\x03" + b"\x00" * 32 + b"\x21" + b"\x00" * 33,
    ],
)
def test_truncated_or_odd_hello_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(TLSRefused):
        parse_client_hello(body)


def real_client_hello_alpn(protocols: list[str]) -> bytes:
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(protocols)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="example.org")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def test_read_client_hello_gives_the_offered_protocols_at_any_split() -> None:
    """The secrets door offers h2 to an origin only if the box's hello offers it."""
    data = real_client_hello_alpn(["h2", "http/1.1"])
    for cut in range(1, len(data)):
        assert read_client_hello(data[:cut]) is None
    hello = read_client_hello(data)
    assert hello is not None and hello.alpn == (b"h2", b"http/1.1")
    assert read_client_hello(real_client_hello("example.org")).alpn == ()  # type: ignore[union-attr]


@pytest.mark.parametrize("alpn", [b"", b"\x00\x00", b"\x00\x04\x02h2", b"\x00\x01\x00",
                                  b"\x00\x03\x02h2x"])
def test_a_malformed_alpn_offers_nothing(alpn: bytes) -> None:
    """Read only to choose what to offer: a malformed list is no offer (the TLS
    handshake, or the origin, refuses it), never an exception here."""
    assert parse_client_hello(client_hello(extra=[ext(0x0010, alpn)])[4:]).alpn == ()


def test_read_client_hello_refuses_what_is_not_a_hello() -> None:
    with pytest.raises(TLSRefused):
        read_client_hello(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(TLSRefused):
        read_client_hello(records(server_hello()))
