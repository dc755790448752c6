"""Frames on ports 1024/1026: length prefix + msgpack map, at most 1 MiB."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tkbox.protocol.framing import MAX_FRAME, FrameDecoder, FrameError, decode_body, encode


def test_round_trip_of_maps_split_at_every_byte():
    frames = [encode({"op": "exec", "argv": ["sh", "-c", "true"]}), encode({"data": b"\x00" * 70})]
    wire = b"".join(frames)
    for cut in range(len(wire) + 1):
        dec = FrameDecoder()
        got = dec.feed(wire[:cut]) + dec.feed(wire[cut:])
        assert got == [{"op": "exec", "argv": ["sh", "-c", "true"]}, {"data": b"\x00" * 70}]


def test_frame_announcing_more_than_1_mib_is_refused_before_buffering():
    """A guest cannot make the host buffer an oversized frame: the length is checked first."""
    dec = FrameDecoder()
    with pytest.raises(FrameError, match="limit"):
        dec.feed(struct.pack(">I", MAX_FRAME + 1))


def test_encoding_more_than_1_mib_is_refused():
    with pytest.raises(FrameError, match="1 MiB"):
        encode({"data": b"x" * MAX_FRAME})


@pytest.mark.parametrize(
    "body",
    [msgpack.packb([1, 2]), msgpack.packb({1: 2}), b"\xc1", msgpack.packb({"a": 1}) + b"\x00",
     msgpack.packb(msgpack.ExtType(1, b"x"))],
)
def test_bodies_that_are_not_a_single_string_keyed_map_are_refused(body):
    with pytest.raises(FrameError):
        decode_body(body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_garbage_raises_only_frame_error(data):
    dec = FrameDecoder()
    try:
        dec.feed(data)
    except FrameError:
        pass
