"""Fuzzing the pure parts of HTTP/2 on an intercepted tunnel (`h2core`).

Promise of each target: for any bytes, `FrameGuard.feed` raises nothing but
`H2Flood` and holds at most one frame header; for any header list, `read_request`
returns a request whose head has exactly one `host`, or raises `BadTunnelRequest`
with a one-line message that quotes nothing it was given.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.doors.secrets.h2core import PREFACE, FrameGuard, H2Flood, H2Limits, read_request
from tkbox.doors.secrets.rules import BadTunnelRequest

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MARK = b"tkbox_GH_0123456789abcdef0123456789abcdef"


def _frame(ftype: int, flags: int, sid: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([ftype, flags]) + sid.to_bytes(4, "big") \
        + payload


_frames = st.builds(_frame, st.integers(0, 12), st.integers(0, 255), st.integers(0, 9),
                    st.binary(max_size=64))


@FUZZ
@given(st.lists(st.one_of(_frames, st.binary(max_size=40)), max_size=60),
       st.integers(1, 17), st.booleans())
def test_frame_guard_takes_any_bytes_at_any_split(parts: list[bytes], step: int,
                                                  preface: bool) -> None:
    data = (PREFACE if preface else b"") + b"".join(parts)
    g = FrameGuard("the box", H2Limits(burst=20), lambda: 0.0, preface=preface)
    try:
        for i in range(0, len(data), step):
            g.feed(data[i:i + step])
            assert len(g._head) < 9
    except H2Flood as flood:
        assert "\n" not in flood.reason and flood.reason.startswith("refused: ")


_names = st.sampled_from([b":method", b":scheme", b":path", b":authority", b":protocol",
                          b":status", b"host", b"x-a", b"expect", MARK])
_values = st.sampled_from([b"GET", b"CONNECT", b"https", b"http", b"/", b"", b"a.test",
                           b"b.test", b"100-continue", MARK])


@FUZZ
@given(st.lists(st.tuples(_names, _values), max_size=12))
def test_read_request_reads_or_refuses_any_header_list(
        headers: list[tuple[bytes, bytes]]) -> None:
    try:
        r = read_request(headers)
    except BadTunnelRequest as exc:
        assert "\n" not in exc.message and MARK.decode() not in exc.message
        return
    assert [n for n, _ in r.head].count(b"host") == 1
    assert r.method not in (b"CONNECT",) and r.path
