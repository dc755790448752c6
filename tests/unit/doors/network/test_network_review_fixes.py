"""Fixes from a review of the network door: each test fails without its fix."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from tests.unit.doors.network.test_network_door import (
    PUBLIC,
    connect,
    decisions,
    open_conn,
    read_head,
    refusals,
)

from tkbox.doors.network import tls
from tkbox.doors.network.names import parse_host
from tkbox.doors.network.request import BadRequest, RequestHeadParser
from tkbox.doors.network.testing import aiotest, client_hello, make_door, records, server_hello
from tkbox.doors.network.tls import (
    MAX_HANDSHAKE,
    TLSRefused,
    TunnelInspector,
    parse_client_hello,
)
from tkbox.protocol.streams import ByteStream


def _vec(d: bytes, n: int) -> bytes:
    return len(d).to_bytes(n, "big") + d


def _hello_body(ext_types: list[int], host: bytes = b"allowed.example") -> bytes:
    """A ClientHello body with these empty extensions, then the server name."""
    sni = (0).to_bytes(2, "big") + _vec(_vec(b"\x00" + _vec(host, 2), 2), 2)
    exts = b"".join(t.to_bytes(2, "big") + b"\x00\x00" for t in ext_types) + sni
    return (b"\x03\x03" + b"\x00" * 32 + _vec(b"", 1) + _vec(b"\x13\x01", 2)
            + _vec(b"\x00", 1) + _vec(exts, 2))


# --- 1a. the duplicate-extension check is linear ------------------------------


def test_a_hello_full_of_distinct_empty_extensions_parses() -> None:
    n = (MAX_HANDSHAKE - 200) // 4  # ~8,000: as many as a 32 KiB hello holds
    hello = parse_client_hello(_hello_body([t + 1 for t in range(n)]))
    assert hello.server_name == "allowed.example"
    assert len(hello.extensions) == n + 1
    assert not hello.offers_ech


def test_a_repeated_extension_is_still_refused() -> None:
    with pytest.raises(TLSRefused, match="repeats extension 7"):
        parse_client_hello(_hello_body([*range(1, 50), 7]))
    n = (MAX_HANDSHAKE - 200) // 4
    with pytest.raises(TLSRefused, match="repeats extension 1"):
        parse_client_hello(_hello_body([*range(1, n), 1]))


class _Counted(int):
    """An extension type that counts the equality comparisons made on it."""

    eqs = 0

    def __eq__(self, other: object) -> bool:
        _Counted.eqs += 1
        return int(self) == other

    __hash__ = int.__hash__


def test_the_duplicate_check_compares_a_linear_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An operation count, not a time: a list's `in` compares each new type with
    every earlier one (n²/2 comparisons); a set's does not."""
    real_u16 = tls._Reader.u16

    def u16(self: Any) -> int:
        value = real_u16(self)
        return _Counted(value) if self.what == "ClientHello extensions" else value

    monkeypatch.setattr(tls._Reader, "u16", u16)
    n = 1000
    _Counted.eqs = 0
    parse_client_hello(_hello_body([t + 1 for t in range(n)]))
    assert _Counted.eqs <= 4 * n  # quadratic would be ~n²/2 = 500,000


# --- 1b. the held-back ClientHello is bounded, however it is cut ------------

HELD_BOUND = MAX_HANDSHAKE + 1024  # tls.MAX_HELD is 33,417 bytes; 1-byte records held ~196 KB


def _feed(insp: TunnelInspector, raw: bytes) -> bytes:
    out = b""
    for i in range(0, len(raw), 65536):
        out += insp.client_data(raw[i : i + 65536])
    return out


def test_a_big_hello_in_one_byte_records_is_refused_before_it_holds_much() -> None:
    hello = client_hello("allowed.example", padding=MAX_HANDSHAKE - 200)
    insp = TunnelInspector(parse_host("allowed.example"), True)
    with pytest.raises(TLSRefused, match="ClientHello records hold more than"):
        _feed(insp, records(hello, size=1))
    assert len(insp._held) <= HELD_BOUND


def test_the_held_bound_never_grows_past_its_cap() -> None:
    hello = client_hello("allowed.example", padding=MAX_HANDSHAKE - 200)
    raw = records(hello, size=1)
    insp = TunnelInspector(parse_host("allowed.example"), True)
    high = 0
    with pytest.raises(TLSRefused):
        for i in range(0, len(raw), 4096):
            insp.client_data(raw[i : i + 4096])
            high = max(high, len(insp._held))
    assert high <= HELD_BOUND


def test_hellos_cut_into_small_records_within_the_cap_still_pass() -> None:
    # a small hello in 1-byte records, and a 32 KiB one in 256-byte records
    for padding, size in ((0, 1), (MAX_HANDSHAKE - 200, 256)):
        hello = client_hello("allowed.example", padding=padding)
        raw = records(hello, size=size)
        insp = TunnelInspector(parse_host("allowed.example"), True)
        assert _feed(insp, raw) == raw
        assert insp.server_names == ["allowed.example"]


# --- 2. a stream reset right after CONNECT is an ordinary ending -------------


async def _answer_hello(stream: ByteStream) -> None:
    got = False
    while await stream.receive():
        if not got:
            got = True
            await stream.send_all(records(server_hello()))
    await stream.send_eof()


@aiotest
async def test_a_guest_gone_right_after_connect_gets_its_completion_and_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    door, signer, origin, _ = make_door(["example.org"], dns={"example.org": [PUBLIC]},
                                        handler=_answer_hello)
    for _ in range(20):
        guest, task = await open_conn(door, connect("example.org"))
        await guest.aclose()  # the guest resets right after its CONNECT
        await asyncio.wait_for(task, 5)
    assert origin.dialed
    decided = decisions(signer)
    done = [r for r in signer.records if r["kind"] == "tkbox.complete"]
    assert len(decided) == 20
    assert len(done) == 20
    assert all(r["outcome"]["ended"] == "reset" for r in done), done[:1]
    assert refusals(signer) == []  # no internal-error refusal
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


@aiotest
async def test_an_origin_gone_before_a_relayed_request_gets_its_completion(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)

    door, signer, origin, _ = make_door(["example.org"], dns={"example.org": [PUBLIC]})

    async def dial_reset(address: str, port: int) -> ByteStream:
        ours = await origin(address, port)
        await origin.streams[-1].aclose()  # the origin resets before the request's head
        return ours

    door.dial = dial_reset
    raw = b"GET http://example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n"
    guest, task = await open_conn(door, raw)
    await asyncio.wait_for(task, 5)
    await guest.aclose()
    done = [r for r in signer.records if r["kind"] == "tkbox.complete"]
    assert [r["outcome"]["ended"] for r in done] == ["reset"]
    assert all(r.get("body", {}).get("stage") != "internal" for r in signer.records)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


# --- 3. the request method in a decision record is bounded -------------------


def test_a_method_longer_than_32_characters_is_refused_in_parsing() -> None:
    p = RequestHeadParser()
    with pytest.raises(BadRequest, match="method longer than 32") as info:
        p.feed(b"A" * 33 + b" http://example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n")
    assert info.value.status == 501
    ok = RequestHeadParser().feed(
        b"A" * 32 + b" http://example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n"
    )
    assert ok is not None and ok.method == "A" * 32


@aiotest
async def test_an_8k_method_never_reaches_a_decision_record() -> None:
    door, signer, origin, _ = make_door(["example.org"], dns={"example.org": [PUBLIC]})
    raw = ("A" * 8150 + " http://example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n").encode()
    guest, task = await open_conn(door, raw)
    await asyncio.wait_for(task, 5)
    head = await read_head(guest)
    await guest.aclose()
    assert head.startswith(b"HTTP/1.1 501")
    assert decisions(signer) == [] and not origin.dialed
    assert all(len(str(r)) < 1000 for r in signer.records), [len(str(r)) for r in signer.records]
    [refused] = refusals(signer)
    assert refused["stage"] == "request" and refused["status"] == 501


# --- 4. a connection refused while the box is stopping is stage `stop` -------


@aiotest
async def test_a_connection_while_the_box_stops_is_refused_at_stage_stop() -> None:
    door, signer, origin, _ = make_door(["example.org"], dns={"example.org": [PUBLIC]})
    await door.close()
    guest, task = await open_conn(door, connect("example.org"))
    await asyncio.wait_for(task, 5)
    head = await read_head(guest)
    await guest.aclose()
    assert head.startswith(b"HTTP/1.1 503") and b"is stopping" in head
    assert not origin.dialed
    assert [r["stage"] for r in refusals(signer)] == ["stop"]
