"""Fuzzing the door's parsers: garbage is refused with our error type, memory stays bounded.

Promise of each target: for any input, the parser either returns a value or
raises its own `GuestError` subclass (never `ValueError`, `IndexError`, ...),
and its internal buffers never exceed the documented limit.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.doors.network.addresses import AddressError, parse_literal
from tkbox.doors.network.names import HostNameError, parse_authority, parse_host
from tkbox.doors.network.request import MAX_HEAD, BadRequest, RequestHeadParser
from tkbox.doors.network.testing import client_hello, ech_ext, records, server_hello
from tkbox.doors.network.tls import (
    MAX_CIPHERTEXT,
    MAX_HANDSHAKE,
    MAX_HELD,
    TLSRefused,
    TunnelInspector,
    parse_client_hello,
)
from tkbox.errors import GuestError

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- request heads ------------------------------------------------------------

_pieces = st.sampled_from(
    [
        b"CONNECT ",
        b"GET ",
        b"POST ",
        b"http://",
        b"https://",
        b"a.example",
        b":443",
        b":0x50",
        b"[::1]",
        b"@",
        b"/",
        b" HTTP/1.1",
        b" HTTP/1.0",
        b"\r\n",
        b"\n",
        b"\r",
        b"Host: ",
        b"Content-Length: 5",
        b"Transfer-Encoding: chunked",
        b" ",
        b"\t",
        b":",
        b"\x00",
        b"\xff",
        b"0x7f.1",
        b"%25eth0",
        b"\r\n\r\n",
        b"X" * 300,
    ]
)
_heads = st.lists(st.one_of(_pieces, st.binary(max_size=40)), max_size=40).map(b"".join)


def _feed_all(data: bytes, split: int) -> None:
    p = RequestHeadParser()
    try:
        for i in range(0, max(len(data), 1), split):
            if p.feed(data[i : i + split]) is not None:
                break
            assert len(p._buf) <= MAX_HEAD + split
    except BadRequest:
        pass


@FUZZ
@given(_heads, st.integers(1, 64))
def test_request_parser_structured_garbage_raises_only_bad_request(data: bytes, split: int) -> None:
    _feed_all(data, split)


@FUZZ
@given(st.binary(max_size=4096), st.integers(1, 4096))
def test_request_parser_random_bytes_raise_only_bad_request(data: bytes, split: int) -> None:
    _feed_all(data, split)


def test_request_parser_memory_is_bounded_for_an_endless_head() -> None:
    p = RequestHeadParser()
    p.feed(b"GET http://a.example/ HTTP/1.1\r\n")
    try:
        for _ in range(10_000):
            p.feed(b"X-A: " + b"b" * 59 + b"\r\n")
            assert len(p._buf) <= MAX_HEAD + 64
        raise AssertionError("an endless head was never refused")
    except BadRequest as exc:
        assert exc.status == 431


# --- ClientHello / tunnel inspector ----------------------------------------------


@FUZZ
@given(st.binary(max_size=2048))
def test_client_hello_parser_raises_only_tls_refused(body: bytes) -> None:
    try:
        parse_client_hello(body)
    except TLSRefused:
        pass


_hellos = st.builds(
    lambda name, ech, pad: client_hello(name, [ech_ext()] if ech else [], padding=pad),
    st.sampled_from(["example.org", "evil.example", None]),
    st.booleans(),
    st.integers(0, 600),
)


@FUZZ
@given(
    _hellos,
    st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=8),
    st.integers(1, 300),
    st.integers(20, 5000),
)
def test_mutated_client_hellos_raise_only_tls_refused(
    hello: bytes, flips: list[tuple[int, int]], split: int, record_size: int
) -> None:
    raw = bytearray(records(hello, size=record_size))
    for pos, val in flips:
        if raw:
            raw[pos % len(raw)] = val
    insp = TunnelInspector(parse_host("example.org"), require_tls=True)
    try:
        for i in range(0, len(raw), split):
            insp.client_data(bytes(raw[i : i + split]))
            assert len(insp._held) <= MAX_HELD
            assert len(insp._crec.buf) <= MAX_CIPHERTEXT + 5 + split
    except TLSRefused:
        pass


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.one_of(
                st.binary(max_size=600),
                st.sampled_from(
                    [
                        records(server_hello(True)),
                        records(server_hello()),
                        records(client_hello("example.org")),
                        records(client_hello("evil.example")),
                        bytes([20, 3, 3, 0, 1, 1]),
                        bytes([23, 3, 3, 0, 3]) + b"abc",
                    ]
                ),
            ),
        ),
        max_size=12,
    ),
    st.booleans(),
)
def test_tunnel_inspector_in_both_directions_raises_only_tls_refused(
    steps: list[tuple[bool, bytes]], require_tls: bool
) -> None:
    insp = TunnelInspector(parse_host("example.org"), require_tls)
    try:
        for from_client, data in steps:
            if from_client:
                insp.client_data(data)
            else:
                insp.server_data(data)
            assert len(insp._srec.buf) <= MAX_CIPHERTEXT + 5 + len(data)
            assert len(insp._shs.buf) <= MAX_HANDSHAKE + 4
    except TLSRefused:
        pass


def test_inspector_memory_is_bounded_for_an_endless_hello() -> None:
    insp = TunnelInspector(parse_host("example.org"), require_tls=True)
    # a handshake message claiming 16 MiB, fed record by record
    first = bytes([1]) + (MAX_HANDSHAKE).to_bytes(3, "big") + b"\x00" * 1000
    try:
        insp.client_data(records(first))
        for _ in range(1000):
            insp.client_data(records(b"\x00" * 16000))
            assert len(insp._held) <= MAX_HELD
        raise AssertionError("an endless hello was never refused")
    except TLSRefused:
        pass


# --- addresses and names ---------------------------------------------------------

_hostish = st.text(
    alphabet=st.sampled_from(list("0123456789abcdefxX.:[]%@-_ü") + ["\x00", " ", "\u3002"]),
    max_size=80,
)


@FUZZ
@given(st.one_of(_hostish, st.text(max_size=120)))
def test_address_parser_raises_only_address_error(text: str) -> None:
    try:
        parse_literal(text)
    except AddressError:
        pass


@FUZZ
@given(st.one_of(_hostish, st.text(max_size=300)))
def test_host_and_authority_parsers_raise_only_host_name_error(text: str) -> None:
    for fn in (
        lambda: parse_host(text),
        lambda: parse_authority(text, None),
        lambda: parse_authority(text, 80),
    ):
        try:
            fn()
        except HostNameError as exc:
            assert isinstance(exc, GuestError)


@FUZZ
@given(_hostish)
def test_a_parsed_host_is_a_fixed_point(text: str) -> None:
    """Normalising twice changes nothing: one canonical form per host."""
    try:
        h = parse_host(text)
    except HostNameError:
        return
    again = parse_host(h.name)
    assert again.name == h.name and (again.literal is None) == (h.literal is None)
