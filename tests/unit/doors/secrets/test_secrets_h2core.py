"""The pure parts of HTTP/2 on an intercepted tunnel (`h2core`): the frame guard
against the known floods, the request head read from pseudo-fields, the window
and stream limits fitted to the scanner's hold. Fed bytes; no sockets, no clock."""

from __future__ import annotations

import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from tkbox.doors.secrets.h2core import (
    PREFACE,
    FrameGuard,
    H2Flood,
    H2Limits,
    origin_head,
    read_request,
    refusal,
)
from tkbox.doors.secrets.rules import BadTunnelRequest

LIM = H2Limits()


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def guard(limits: H2Limits = LIM, preface: bool = True) -> tuple[FrameGuard, Clock]:
    c = Clock()
    return FrameGuard("the box", limits, c, preface=preface), c


def headers(sid: int, data: bytes = b"\x82", end: bool = True) -> bytes:
    f = HeadersFrame(sid)
    f.data = data
    if end:
        f.flags.add("END_HEADERS")
    return f.serialize()


def cont(sid: int, data: bytes, end: bool = False) -> bytes:
    f = ContinuationFrame(sid)
    f.data = data
    if end:
        f.flags.add("END_HEADERS")
    return f.serialize()


def test_continuation_flood_is_cut_by_block_size() -> None:
    """Attack: CONTINUATION flood (2024): a header block that never ends."""
    g, _ = guard()
    g.feed(PREFACE + headers(1, b"\x82", end=False))
    with pytest.raises(H2Flood, match="CONTINUATION flood"):
        for _ in range(100):
            g.feed(cont(1, b"a" * 16384))
    assert g.frames <= LIM.max_header_block // 16384 + 2


def test_continuation_flood_of_empty_frames_is_cut_by_frame_count() -> None:
    """Attack: CONTINUATION flood with empty fragments (no bytes to count)."""
    g, _ = guard()
    g.feed(PREFACE + headers(1, b"\x82", end=False))
    with pytest.raises(H2Flood, match="CONTINUATION flood"):
        for _ in range(1000):
            g.feed(cont(1, b""))
    assert g.frames <= LIM.max_block_frames + 1


def test_a_header_block_within_the_limits_passes_split_anywhere() -> None:
    g, _ = guard()
    data = PREFACE + headers(1, b"\x82" * 100, end=False) + cont(1, b"a" * 16000) + cont(
        1, b"b" * 16000, end=True) + headers(3) + headers(5)
    for i in range(0, len(data), 7):  # any split of the bytes
        g.feed(data[i:i + 7])
    assert g.frames == 5


@pytest.mark.parametrize("frame,name", [
    (RstStreamFrame(1).serialize(), "RST_STREAM"),
    (PingFrame(0, opaque_data=b"12345678").serialize(), "PING"),
    (SettingsFrame(0).serialize(), "SETTINGS"),
    (PriorityFrame(1).serialize(), "PRIORITY"),
    (WindowUpdateFrame(0, window_increment=1).serialize(), "WINDOW_UPDATE"),
    (DataFrame(1).serialize(), "empty DATA"),
    (bytes([0, 0, 0, 0xEE, 0, 0, 0, 0, 0]), "unknown"),
])
def test_control_frame_floods_are_cut(frame: bytes, name: str) -> None:
    """Attack: rapid reset (CVE-2023-44487), ping (CVE-2019-9512), settings (-9515),
    priority (-9513), window-update dribble (-9511), empty frames (-9518), unknown
    frames: each costs a token, and an empty bucket ends the connection."""
    g, _ = guard()
    g.feed(PREFACE)
    with pytest.raises(H2Flood, match=name.split()[-1]):
        for _ in range(int(LIM.burst) + 10):
            g.feed(frame)


def test_rapid_reset_is_cut_even_at_the_refill_rate_plus_one() -> None:
    """Attack: rapid reset paced just above the refill rate."""
    g, c = guard()
    g.feed(PREFACE)
    with pytest.raises(H2Flood):
        for i in range(10_000):
            c.t = i / (LIM.rate + 20)
            g.feed(headers(2 * i + 1) + RstStreamFrame(2 * i + 1).serialize())


def test_a_settings_frame_with_many_entries_costs_more() -> None:
    """Attack: a SETTINGS storm of large frames (every entry is work)."""
    big = bytes([0, 0x3F, 0xFC, 4, 0, 0, 0, 0, 0]) + b"\x00\x03\x00\x00\x00\x64" * 2730
    g, _ = guard()
    g.feed(PREFACE)
    with pytest.raises(H2Flood):
        for _ in range(int(LIM.burst) // 100 + 2):
            g.feed(big)


def test_control_frames_at_an_ordinary_pace_pass() -> None:
    """A client's pings every second and window updates for the data it is sent."""
    g, c = guard()
    g.feed(PREFACE + SettingsFrame(0).serialize())
    for i in range(2000):
        c.t = float(i)
        g.feed(PingFrame(0, opaque_data=b"12345678").serialize())
        g.earn(2)  # a DATA frame the door sent it
        g.feed(WindowUpdateFrame(1, window_increment=16384).serialize()
               + WindowUpdateFrame(0, window_increment=16384).serialize())


def test_data_frames_with_bytes_earn_tokens() -> None:
    g, _ = guard()
    g.feed(PREFACE)
    for i in range(5000):
        d = DataFrame(1)
        d.data = b"x"
        g.feed(d.serialize() + WindowUpdateFrame(0, window_increment=1).serialize())
        assert i >= 0


def test_the_origin_side_has_no_preface() -> None:
    g, _ = guard(preface=False)
    g.feed(SettingsFrame(0).serialize())
    assert g.frames == 1


# --- request heads --------------------------------------------------------------------


def req(*extra: tuple[bytes, bytes], method: bytes = b"GET", path: bytes = b"/x",
        authority: bytes | None = b"api.test", scheme: bytes = b"https"
        ) -> list[tuple[bytes, bytes]]:
    out = [(b":method", method), (b":scheme", scheme), (b":path", path)]
    if authority is not None:
        out.append((b":authority", authority))
    return out + list(extra)


def test_a_request_reads_as_its_http11_head() -> None:
    r = read_request(req((b"user-agent", b"c"), (b"expect", b"100-continue")))
    assert (r.method, r.path, r.expects_continue) == (b"GET", b"/x", True)
    assert r.head[0] == (b"host", b"api.test") and (b"user-agent", b"c") in r.head


@pytest.mark.parametrize("headers,why", [
    (req(method=b"CONNECT", path=b"/"), "CONNECT"),
    (req((b":protocol", b"websocket"), method=b"CONNECT"), "CONNECT"),
    (req((b":protocol", b"websocket")), "CONNECT"),
    (req(scheme=b"http"), "scheme"),
    (req(authority=None), "names no host"),
    (req((b"host", b"other.test")), "differs"),
    (req((b"host", b"a.test"), (b"host", b"b.test"), authority=None), "two host"),
    (req((b":status", b"200")), "pseudo-header"),
    (req() + [(b":path", b"/y")], "repeats"),
    ([(b":scheme", b"https"), (b":path", b"/")], "without :method"),
    (req(path=b""), "without :path"),
])
def test_requests_an_intercepted_tunnel_does_not_carry(
        headers: list[tuple[bytes, bytes]], why: str) -> None:
    """Attack: CONNECT and extended CONNECT inside the tunnel, a host that differs
    from :authority, pseudo-fields that are not a request's."""
    with pytest.raises(BadTunnelRequest, match=why):
        read_request(headers)


def test_a_host_field_alone_stands_for_the_authority() -> None:
    r = read_request(req((b"host", b"api.test"), authority=None))
    assert r.head == [(b"host", b"api.test")]


def test_origin_head_puts_the_tunnels_authority() -> None:
    out = origin_head(b"GET", b"/p", b"api.test:8443",
                      [(b"host", b"API.test"), (b"Authorization", b"Bearer v")])
    assert out[:4] == [(b":method", b"GET"), (b":scheme", b"https"),
                       (b":authority", b"api.test:8443"), (b":path", b"/p")]
    assert out[4:] == [(b"authorization", b"Bearer v")]


def test_refusal_is_printable_and_bounded() -> None:
    head, body = refusal(403, "refused: \x00 x" + "y" * 5000)
    assert head[0] == (b":status", b"403") and len(body) <= 1001
    assert all(32 <= c < 127 for c in body[:-1])


# --- limits ---------------------------------------------------------------------------


@pytest.mark.parametrize("hold", [0, 1000, 12 * 1024, 350 * 1024, 4 * 1024 * 1024])
def test_windows_fit_the_hold(hold: int) -> None:
    """Held bytes of every stream never take the connection window (no stall), and
    one direction holds at most the budget (or one stream's needs, at the least)."""
    lim = LIM.for_hold(hold)
    assert lim.stream_window >= 4 * hold
    assert lim.conn_window >= lim.max_streams * 2 * hold + lim.stream_window
    assert 1 <= lim.max_streams <= LIM.max_streams
    if lim.max_streams > 1:
        assert lim.conn_window <= max(LIM.buffer_budget, LIM.conn_window)
