"""Encrypted ClientHello, in every form its drafts ever had, is refused.

ECH (RFC 9849) and its ancestor ESNI move the real server name into an
encrypted extension while the clear `server_name` names a public front: the
door would check the front and the origin would serve the hidden name. Every
code point the drafts assigned (read from tlswg/draft-ietf-tls-esni, every
revision), both `ECHClientHello` forms (outer and inner), and the blocks those
code points were drawn from are refused; GREASE and ordinary extensions pass.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tkbox.doors.network.names import parse_host
from tkbox.doors.network.testing import CCS, client_hello, ext, records, server_hello
from tkbox.doors.network.tls import (
    ECH_CODE_POINTS,
    EXT_RENEGOTIATION_INFO,
    Phase,
    TLSRefused,
    TunnelInspector,
    is_ech_code_point,
    parse_client_hello,
)

# (code point, what the drafts called it)
DRAFT_CODE_POINTS = [
    (0xFFCE, "encrypted_server_name, ESNI -00 to -05"),
    (0xFF02, "encrypted_client_hello, -06 era"),
    (0xFF03, "ech_nonce"),
    (0xFF04, "outer_extension"),
    (0xFF08, "encrypted_client_hello, early -07 editors' copy"),
    (0xFFCD, "outer_extension"),
    (0xFE00, "outer_extensions"),
    (0xFD00, "ech_outer_extensions, -07 onwards"),
    (0xFE08, "encrypted_client_hello -07/-08"),
    (0xFE09, "encrypted_client_hello -09"),
    (0xFE0A, "encrypted_client_hello -10"),
    (0xFE0B, "encrypted_client_hello -11"),
    (0xFE0C, "encrypted_client_hello -12"),
    (0xFE0D, "encrypted_client_hello -13 to -25, RFC 9849"),
    (0xDA09, "ech_is_inner -09/-10"),
]


def _inspector(host: str = "front.example") -> TunnelInspector:
    return TunnelInspector(parse_host(host), True)


def _outer(config_id: int = 7) -> bytes:
    """ECHClientHello outer form: type 0, cipher suite, config id, enc, payload."""
    return (b"\x00" + b"\x00\x01\x00\x01" + bytes([config_id]) + b"\x00\x20" + os.urandom(32)
            + b"\x00\x40" + os.urandom(64))


def test_the_list_covers_every_draft_code_point() -> None:
    assert {c for c, _ in DRAFT_CODE_POINTS} == ECH_CODE_POINTS


@pytest.mark.parametrize(("code", "what"), DRAFT_CODE_POINTS, ids=[f"{c:#06x}" for c, _ in
                                                                    DRAFT_CODE_POINTS])
def test_draft_ech_code_point_hiding_the_real_name_is_refused(code: int, what: str) -> None:
    """Stops ECH/ESNI of any draft: clear SNI names the allowed front, the real name hides."""
    hello = client_hello("front.example", [ext(code, _outer())])
    insp = _inspector()
    with pytest.raises(TLSRefused, match="Encrypted ClientHello") as e:
        insp.client_data(records(hello))
    assert f"0x{code:04x}" in str(e.value)
    assert insp.phase is Phase.HELLO  # nothing of it was released to the origin


@pytest.mark.parametrize("form", ["outer", "inner"])
def test_ech_outer_and_inner_forms_are_both_refused(form: str) -> None:
    """Stops an ECH extension slipping through by claiming to be the (empty) inner form."""
    data = _outer() if form == "outer" else b"\x01"
    with pytest.raises(TLSRefused, match=f"{form} form"):
        _inspector().client_data(records(client_hello("front.example", [ext(0xFE0D, data)])))


def test_malformed_or_empty_ech_extension_is_refused() -> None:
    """Stops an ECH extension whose payload our parser would not understand passing unseen."""
    for data in (b"", b"\x07garbage"):
        with pytest.raises(TLSRefused, match="malformed form"):
            _inspector().client_data(records(client_hello("front.example",
                                                          [ext(0xFE0D, data)])))


def test_ech_hidden_behind_many_other_extensions_is_refused() -> None:
    """Stops burying the ECH extension after GREASE and padding at the end of the hello."""
    extra = [ext(0x0A0A, b""), ext(0x0017, b""), ext(0x4A4A, b"\x00"), ext(0xFE0A, _outer())]
    with pytest.raises(TLSRefused, match="0xfe0a"):
        _inspector().client_data(records(client_hello("front.example", extra, padding=200)))


def test_ech_in_the_second_hello_after_retry_is_refused() -> None:
    """Stops passing the first check, then offering a draft ECH in the retried hello."""
    insp = _inspector()
    insp.client_data(records(client_hello("front.example")))
    insp.server_data(records(server_hello(retry=True)) + CCS)
    insp.client_data(CCS)
    with pytest.raises(TLSRefused, match="second ClientHello"):
        insp.client_data(records(client_hello("front.example", [ext(0xFE09, _outer())])))


@given(st.integers(min_value=0xFD00, max_value=0xFFFF).filter(
    lambda c: c != EXT_RENEGOTIATION_INFO))
def test_every_code_point_of_the_ech_blocks_is_refused(code: int) -> None:
    """Stops the next draft's new code point: the whole blocks are refused, not a list."""
    assert is_ech_code_point(code)
    hello = client_hello("front.example", [ext(code, b"\x00")])
    with pytest.raises(TLSRefused, match="Encrypted ClientHello"):
        _inspector().client_data(records(hello))


@given(st.integers(min_value=0, max_value=0xFCFF).filter(lambda c: c not in (0, 0xDA09, 0x002B)))
def test_other_extensions_are_not_mistaken_for_ech(code: int) -> None:
    hello = parse_client_hello(client_hello("front.example", [ext(code, b"")])[4:])
    assert not hello.offers_ech


@pytest.mark.parametrize("code", [0x0A0A, 0x1A1A, 0xDADA, 0xEAEA, 0xFAFA, EXT_RENEGOTIATION_INFO])
def test_grease_and_renegotiation_info_pass(code: int) -> None:
    insp = _inspector()
    insp.client_data(records(client_hello("front.example", [ext(code, b"\x00")])))
    assert insp.phase is Phase.WAIT_SERVER
