"""The signer's framing: bounded, canonical, refused with WireError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tkbox.formats import wire


def test_roundtrip_in_any_split() -> None:
    frames = [wire.encode({"id": i, "op": "ping", "x": "é" * i}) for i in range(5)]
    data = b"".join(frames)
    for cut in range(1, len(data)):
        d = wire.Decoder()
        got = []
        for piece in (data[:cut], data[cut:]):
            d.feed(piece)
            while (f := d.next()) is not None:
                got.append(f)
        assert [f["id"] for f in got] == list(range(5))


@pytest.mark.parametrize("data", [
    struct.pack(">I", 0), struct.pack(">I", wire.MAX_FRAME + 1),
    struct.pack(">I", 3) + b"[1]", struct.pack(">I", 8) + b'{"a": 1}',
    struct.pack(">I", 4) + b"\xff\xfe{}",
])
def test_bad_frames(data: bytes) -> None:
    d = wire.Decoder()
    with pytest.raises(wire.WireError):
        d.feed(data)
        d.next()


@given(st.binary(max_size=300))
def test_garbage_is_refused_with_wire_error_only(data: bytes) -> None:
    d = wire.Decoder()
    try:
        d.feed(data)
        while d.next() is not None:
            pass
    except wire.WireError:
        pass
    assert d.buffered <= len(data)


def test_floats_cannot_be_sent() -> None:
    with pytest.raises(wire.WireError):
        wire.encode({"id": 1, "x": 0.5})
