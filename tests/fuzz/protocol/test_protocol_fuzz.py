"""Fuzz: the two framings every guest byte crosses first, the serial mux and port frames.

Promises: `MuxCore.receive_data` raises only `MuxError`, whatever the peer sends
and however it is split; it never holds more than one frame of input, never more
streams than its limit, and never delivers more DATA on a stream than the window
plus the credit it granted (a flood cannot grow memory). `FrameDecoder.feed` raises
only `FrameError`, never buffers more than one frame, and yields only maps with
string keys.
"""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.protocol.framing import MAX_FRAME, FrameDecoder, FrameError, encode
from tkbox.protocol.mux import HEADER, MAX_PAYLOAD, Data, MuxCore, MuxError, Opened, T
from tkbox.protocol.ports import PortError
from tkbox.protocol.streams import StreamClosed

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
WINDOW = 4096
MAX_STREAMS = 8


@st.composite
def mux_frame(draw: st.DrawFn, peer: list[int]) -> bytes:
    """Mostly well-formed frames on the peer's streams (so the per-stream rules are
    reached), sometimes anything at all."""
    if draw(st.integers(0, 3)) == 0:
        t = draw(st.integers(0, 255))
        sid = draw(st.one_of(st.integers(0, 12), st.integers(0, 2**32 - 1)))
        payload = draw(st.binary(max_size=64))
    else:
        t = draw(st.sampled_from([T.DATA, T.DATA, T.DATA, T.CREDIT, T.EOF, T.RESET, T.OPEN,
                                  T.ACCEPT]))
        sid = draw(st.one_of(st.sampled_from(peer), st.integers(0, 12)))
        if t in (T.OPEN, T.CREDIT):
            payload = struct.pack(">I", draw(st.one_of(st.integers(0, 3 * WINDOW),
                                                       st.integers(0, 2**32 - 1))))
        elif t == T.DATA:
            payload = b"x" * draw(st.one_of(st.integers(1, 64),  # around the window's edge
                                            st.integers(WINDOW - 8, WINDOW + 8),
                                            st.integers(WINDOW // 2, 2 * WINDOW)))
        elif t == T.RESET:
            payload = draw(st.binary(max_size=600))
        else:
            payload = b""
    n = len(payload)
    if draw(st.integers(0, 20)) == 0:  # a lying length field
        n = draw(st.integers(0, 2**32 - 1))
    return HEADER.pack(t, sid, n) + payload


@st.composite
def mux_session(draw: st.DrawFn) -> tuple[bool, list[tuple[str, int]], bytes, list[int]]:
    initiator = draw(st.booleans())
    local = draw(st.lists(st.tuples(st.sampled_from(["open", "send", "consume", "eof", "reset"]),
                                    st.integers(0, 12)), max_size=12))
    # Often open a few streams the peer may open (its parity) first, so that later
    # frames reach the per-stream rules and not only the framing.
    peer = [2 * i + (0 if initiator else 1) for i in range(1, 4)]
    opens = [HEADER.pack(T.OPEN, sid, 4) + struct.pack(">I", 80)
             for sid in draw(st.sampled_from([peer, peer[:1], []]))]
    wire = b"".join(opens + draw(st.lists(mux_frame(peer), max_size=24)))
    if draw(st.booleans()):
        wire += draw(st.binary(max_size=200))
    cuts = sorted(draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    return initiator, local, wire, cuts


def _local(core: MuxCore, action: str, arg: int) -> None:
    try:
        if action == "open":
            core.open(80 + arg)
        elif action == "send" and core.is_open(arg):
            core.send(arg, b"y" * 100)
        elif action == "consume" and core.is_open(arg):
            core.consumed(arg, arg)
        elif action == "eof" and core.is_open(arg):
            core.eof(arg)
        elif action == "reset" and core.is_open(arg):
            core.reset(arg, "fuzz")
    except (PortError, MuxError, StreamClosed):
        pass  # our own calls out of order: the local API's errors, not the peer's


@FUZZ
@given(mux_session())
def test_mux_input_raises_only_mux_error_and_stays_bounded(
        session: tuple[bool, list[tuple[str, int]], bytes, list[int]]) -> None:
    initiator, local, wire, cuts = session
    core = MuxCore(initiator=initiator, window=WINDOW, max_streams=MAX_STREAMS)
    for action, arg in local[: len(local) // 2]:
        _local(core, action, arg)
    received: dict[int, int] = {}
    pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    try:
        for i, piece in enumerate(pieces):
            for ev in core.receive_data(piece):
                if isinstance(ev, Opened):
                    received[ev.sid] = 0
                elif isinstance(ev, Data):
                    received[ev.sid] = received.get(ev.sid, 0) + len(ev.data)
                    # nothing consumed was credited back: at most one window per stream
                    assert received[ev.sid] <= WINDOW
            assert len(core._inbuf) < HEADER.size + MAX_PAYLOAD  # noqa: SLF001
            assert core.stream_count <= MAX_STREAMS + len(local)
            if i < len(local) // 2:
                _local(core, *local[len(local) // 2 + i])
            core.data_to_send()
    except MuxError as exc:
        assert str(exc)


@st.composite
def frame_bytes(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=400))
    msgs = draw(st.lists(st.dictionaries(st.text(max_size=6), st.one_of(
        st.integers(-(2**63), 2**63 - 1), st.binary(max_size=20), st.text(max_size=20),
        st.none()), max_size=4), max_size=5))
    data = bytearray(b"".join(encode(m) for m in msgs))
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        data[i] = draw(st.integers(0, 255))
    return bytes(data)


@FUZZ
@given(frame_bytes(), st.integers(1, 64))
def test_port_frames_raise_only_frame_error_and_stay_bounded(data: bytes, step: int) -> None:
    dec = FrameDecoder(max_frame=MAX_FRAME)
    try:
        for i in range(0, len(data), step):
            for msg in dec.feed(data[i : i + step]):
                assert isinstance(msg, dict) and all(isinstance(k, str) for k in msg)
            assert dec.pending <= 4 + MAX_FRAME
    except FrameError as exc:
        assert str(exc)


def test_a_flood_past_the_window_is_a_mux_error() -> None:
    """The bound the fuzz target checks is enforced, not assumed."""
    core = MuxCore(initiator=True, window=WINDOW, max_streams=MAX_STREAMS)
    core.receive_data(HEADER.pack(T.OPEN, 2, 4) + struct.pack(">I", 80))
    core.receive_data(HEADER.pack(T.DATA, 2, WINDOW) + b"x" * WINDOW)
    try:
        core.receive_data(HEADER.pack(T.DATA, 2, 1) + b"x")
    except MuxError as exc:
        assert "credit" in str(exc)
    else:
        raise AssertionError("a peer sent past its window and nothing stopped it")
