"""What a hostile guest can make the host spend: output, input, streams, decoding, work.

Each test names the attack it stops. The host side is a real `MuxPorts` over
memory streams; the attacker writes raw mux frames on the other end, so it
can do what a well-behaved peer never would (stop reading, open streams to
ports nobody serves, flood one-byte frames).
"""

from __future__ import annotations

import asyncio
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tkbox._clock import FakeClock
from tkbox.daemon.guest_client import check_answer
from tkbox.protocol.budget import Budget
from tkbox.protocol.framing import (
    GUEST_FRAMES,
    HOST_FRAMES,
    FrameDecoder,
    FrameError,
    decode_body,
    encode,
    scan,
)
from tkbox.protocol.mux import (
    HEADER,
    MAX_QUEUED_CONTROL,
    MAX_QUEUED_OUT,
    OPEN_COST,
    WINDOW,
    MuxCore,
    MuxPorts,
    T,
)
from tkbox.protocol.ports import PortError
from tkbox.protocol.streams import memory_stream_pair


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


#: turns of the event loop a bound is watched for (the parts are in memory: each turn
#: moves bytes; no test here waits for wall-clock time to pass)
TURNS = 2000


def open_frame(sid: int, port: int) -> bytes:
    return HEADER.pack(T.OPEN, sid, 4) + struct.pack(">I", port)


# --- output: a guest that does not read -------------------------------------------


def test_guest_that_stops_reading_cannot_grow_the_hosts_output_queue():
    """Attack: stop reading the port, then open streams to a port nobody serves.

    Each OPEN makes the host owe a RESET. The host's queued output stays under
    its bound, the host stops reading the guest, and the guest's own writes
    block: the guest only stalls itself.
    """

    async def main():
        host_end, guest_end = memory_stream_pair(limit=64 * 1024)
        host = MuxPorts(host_end, initiator=True, budget=Budget(rate=1e9, burst=1e9))
        task = asyncio.ensure_future(host.run())
        wire = b"".join(open_frame(2 * i + 2, 4242) for i in range(200_000))  # 2 MB of OPENs

        async def attack():
            for i in range(0, len(wire), 4096):
                await guest_end.send_all(wire[i:i + 4096])

        attacker = asyncio.ensure_future(attack())
        peak = 0
        turns = 0
        # until the host has stopped reading the guest, and for a while after
        while host.paused_reads == 0 or turns < TURNS:
            await asyncio.sleep(0)
            turns += 1
            peak = max(peak, host._core.control_pending + host._ctl_inflight)
        assert not attacker.done(), "the host kept reading a guest that owes it nothing"
        assert host.paused_reads > 0
        # the bound, plus at most one slice of frames parsed before the check
        assert peak <= MAX_QUEUED_CONTROL + 256 * 64, peak
        assert host.dead is None  # not a protocol violation: the guest is only slowed
        attacker.cancel()
        await host.aclose()
        task.cancel()

    run(main())


def test_guest_that_stops_reading_cannot_grow_the_hosts_queued_data():
    """Attack: open many streams whose host side sends (downloads), then stop reading.

    Each stream may queue up to its credit; over all streams, the host queues no
    more than its output bound: the senders wait instead."""

    async def main():
        host_end, guest_end = memory_stream_pair(limit=64 * 1024)
        host = MuxPorts(host_end, initiator=True, budget=Budget(rate=1e9, burst=1e9))
        blob = b"D" * (2 * WINDOW)

        async def download(stream):
            await stream.send_all(blob)

        host.serve(1025, download)
        task = asyncio.ensure_future(host.run())
        await guest_end.send_all(b"".join(open_frame(2 * i + 2, 1025) for i in range(40)))
        peak = 0
        for _ in range(TURNS):  # every turn of the loop while the downloads run
            await asyncio.sleep(0)
            peak = max(peak, host._core.pending_output + host._out_inflight)
        assert peak <= MAX_QUEUED_OUT + 4 * 65536 + 4096, peak
        assert 40 * WINDOW > MAX_QUEUED_OUT + 4 * 65536  # credit alone would have allowed more
        await host.aclose()
        task.cancel()

    run(main())


def test_reset_reasons_from_the_guest_are_printable_and_bounded():
    """Attack: put terminal escapes in a RESET reason that reaches an error message."""
    core = MuxCore(initiator=True)
    sid = core.open(1024)
    evs = core.receive_data(HEADER.pack(T.RESET, sid, 517) + b"\x1b[31m" + b"\x00" * 512)
    assert len(evs[0].reason) <= 512 and all(" " <= c <= "~" for c in evs[0].reason)


def test_every_open_costs_the_guest_its_work_budget_served_or_not():
    """Attack: OPENs to unserved ports (or beyond the stream cap) are not a violation,
    but each one still counts: it costs the host a refusal it must send."""
    small = MuxCore(initiator=True, max_streams=2)
    small.receive_data(b"".join(open_frame(2 * i + 2, 9) for i in range(10)))
    assert small.refused_opens == 8
    assert small.control_pending > 0
    assert small.work_in == 10 * (1 + OPEN_COST)
    tiny = MuxCore(initiator=True)
    tiny.receive_data(HEADER.pack(T.DATA, 99, 1) + b"x")  # a frame for no stream: still parsed
    assert tiny.work_in == 1


# --- input: data nobody reads ----------------------------------------------------


def test_guest_filling_streams_nobody_reads_is_no_longer_read_past_the_bound():
    """Attack: open many streams to a served port whose handler does not read yet,
    and fill every window: received-but-unread bytes stay under the bound."""

    async def main():
        host_end, guest_end = memory_stream_pair()
        host = MuxPorts(host_end, initiator=True, max_buffered_in=512 * 1024,
                        budget=Budget(rate=1e9, burst=1e9))
        stall = asyncio.Event()

        async def slow(stream):
            await stall.wait()
            while await stream.receive():
                pass

        host.serve(1025, slow)
        task = asyncio.ensure_future(host.run())
        chunk = b"Z" * 65536
        frames = []
        for i in range(16):
            sid = 2 * i + 2
            frames.append(open_frame(sid, 1025))
            frames += [HEADER.pack(T.DATA, sid, len(chunk)) + chunk] * 4  # one window each
        wire = b"".join(frames)

        async def attack():
            await guest_end.send_all(wire)

        attacker = asyncio.ensure_future(attack())
        turns = 0
        while host.paused_reads == 0 or turns < TURNS:  # stopped reading, and stays so
            await asyncio.sleep(0)
            turns += 1
        assert host._buffered <= 512 * 1024 + 256 * 65536
        assert host.paused_reads > 0 and not attacker.done()
        stall.set()  # the owner reads again: the guest is read again
        await asyncio.wait_for(attacker, 10)
        await host.aclose()
        task.cancel()

    run(main())


# --- streams: the host keeps its own ------------------------------------------------


def test_guest_holding_every_stream_cannot_stop_the_host_asking_for_the_diff():
    """Attack: open every stream the mux allows, so the host cannot open one at stop."""
    core = MuxCore(initiator=True, max_streams=8, max_own=4, reserved=1)
    core.receive_data(b"".join(open_frame(2 * i + 2, 1025) for i in range(8)))
    assert core.stream_count == 8
    for _ in range(3):
        core.open(1024)  # the guest's streams do not count against the host's
    with pytest.raises(PortError, match="too many open streams"):
        core.open(1024)
    core.open(1024, reserved=True)  # the last slot is the host's own, for stop
    with pytest.raises(PortError):
        core.open(1024, reserved=True)


def test_guest_reopen_after_reset_frees_its_slot_only():
    core = MuxCore(initiator=True, max_streams=2, max_own=2, reserved=0)
    core.receive_data(open_frame(2, 1) + open_frame(4, 1))
    core.receive_data(HEADER.pack(T.RESET, 2, 0))
    core.receive_data(open_frame(6, 1))
    assert core.stream_count == 2 and core.refused_opens == 0
    core.open(1)
    core.open(1)
    assert core.own_stream_count == 2


# --- work: a budget per guest ------------------------------------------------------


def test_budget_refills_at_its_rate_and_says_how_long_to_wait():
    clock = FakeClock()
    b = Budget(rate=100.0, burst=50.0, clock=clock.monotonic)
    assert b.spend(50) == 0.0
    assert b.spend(10) == pytest.approx(0.1)
    clock.advance(1.0)  # 100 units refilled, capped at the burst
    assert b.spend(50) == 0.0
    assert b.spend(1) == pytest.approx(0.01)
    assert b.throttled == pytest.approx(0.11)


def test_one_byte_frame_flood_is_paid_for_frame_by_frame():
    """Attack: one-byte DATA frames (9 bytes of header each) to burn the host's CPU.

    Every frame parsed is charged to the guest's budget, so the flood is read
    at the budget's rate, not as fast as the loop can go."""

    async def main():
        host_end, guest_end = memory_stream_pair()
        clock = FakeClock()
        budget = Budget(rate=20_000, burst=2_000, clock=clock.monotonic, sleep=clock.sleep)
        host = MuxPorts(host_end, initiator=True, budget=budget)

        async def sink(stream):
            while await stream.receive():
                pass

        host.serve(1025, sink)
        task = asyncio.ensure_future(host.run())
        n = 6_000
        wire = open_frame(2, 1025) + (HEADER.pack(T.DATA, 2, 1) + b"x") * n
        await guest_end.send_all(wire)
        while budget.spent < n:
            await asyncio.sleep(0)
            if clock.sleepers:  # the reader waits for its budget to refill
                clock.advance(0.01)
        assert budget.spent >= n  # every frame was charged...
        assert budget.throttled > 0  # ...and past the burst, the reader was made to wait
        await host.aclose()
        task.cancel()

    run(main())


# --- decoding: nothing without a budget -------------------------------------------


@pytest.mark.parametrize("obj, why", [
    ({"ev": [[0] * 15] * 60}, "more than 256 msgpack objects"),
    ({"ev": [0] * 65}, "array of 65 entries"),
    ({"ev": {str(i): i for i in range(65)}}, "map of 65 entries"),
    ({"a": [[[[1]]]]}, "nesting deeper than 3"),
])
def test_frames_of_many_tiny_containers_are_refused_before_decoding(obj, why):
    """Attack: a 1 MiB frame of tiny containers costs the loop ~0.5 s to build; the
    scan refuses it after counting headers, before msgpack builds anything."""
    with pytest.raises(FrameError, match=why):
        decode_body(msgpack.packb(obj), GUEST_FRAMES)


def test_a_megabyte_of_nested_containers_is_never_handed_to_msgpack(monkeypatch):
    """The scan refuses it from its headers: msgpack never builds a single object."""
    import tkbox.protocol.framing as framing

    def boom(*a, **kw):
        raise AssertionError("msgpack was asked to decode an over-budget frame")

    body = msgpack.packb({"x": [[[]] * 15] * 4000})
    assert len(body) > 60_000
    monkeypatch.setattr(framing.msgpack, "unpackb", boom)
    with pytest.raises(FrameError):
        decode_body(body, HOST_FRAMES)
    with pytest.raises(FrameError):
        decode_body(body, GUEST_FRAMES)


@pytest.mark.parametrize("body", [
    b"\x81\xa1a\xc1",  # 0xc1 is never used
    b"\x81\xa1a\xd4\x01\x00",  # fixext
    b"\x81\xa1a\xc7\x01\x01\x00",  # ext 8
    b"\x81\xa1a\xda\xff\xff",  # str 16 past the end
    b"\x81\xa1a\xdc\x00",  # truncated array length
    b"\x81\xa1a\x01\x01",  # trailing byte
    b"\x92\x01\x02",  # not a map
])
def test_malformed_or_extension_bodies_raise_frame_error(body):
    with pytest.raises(FrameError):
        decode_body(body, GUEST_FRAMES)


scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
           | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=5) |
                      st.dictionaries(st.text(max_size=5), c, max_size=5), max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=8), values, max_size=6))
def test_scan_counts_exactly_what_msgpack_decodes(obj):
    body = msgpack.packb(obj, use_bin_type=True)
    n = scan(body, HOST_FRAMES)
    assert n >= 1 + 2 * len(obj)
    assert decode_body(body, HOST_FRAMES) == obj


def test_each_decoded_frame_is_charged_one_unit_plus_its_objects():
    dec = FrameDecoder(limits=GUEST_FRAMES)
    dec.feed(encode({"ev": "out", "fd": 1, "data": b"x"}))
    assert dec.cost == 1 + 7


# --- a strict schema per operation ------------------------------------------------


@pytest.mark.parametrize("op, msg, why", [
    ("exec", {"ev": "out", "fd": 1, "data": b"x", "extra": 1}, "unknown key 'extra'"),
    ("exec", {"ev": "exit"}, "without status"),
    ("exec", {"ev": "exit", "status": True}, "malformed exit status"),
    ("diff", {"ev": "out", "fd": 1, "data": b"x"}, "unexpected event 'out'"),
    ("ping", {"ev": "ok", "uptime": "soon"}, "malformed"),
    ("shutdown", {"ev": "ok", "uptime": 1}, "unknown key 'uptime'"),
    ("exec", {"ev": "error", "message": "x" * 5000}, "malformed"),
])
def test_answers_with_unknown_keys_or_wrong_types_are_refused(op, msg, why):
    """Attack: smuggle data the host does not expect in well-formed frames."""
    assert why in (check_answer(op, msg) or "")


@pytest.mark.parametrize("op, msg", [
    ("exec", {"ev": "started", "pid": 2}),
    ("exec", {"ev": "exit", "status": 0, "signal": 0}),
    ("diff", {"ev": "end", "stats": {"files": 1}}),
    ("ping", {"ev": "ok", "uptime": 1.5}),
    ("shutdown", {"ev": "error", "message": "no"}),
])
def test_the_real_agents_answers_pass(op, msg):
    assert check_answer(op, msg) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_garbage_from_the_guest_raises_only_frame_error(data):
    """Fuzz: whatever bytes a guest sends, the budgeted decoder refuses them with our error."""
    dec = FrameDecoder(limits=GUEST_FRAMES)
    try:
        dec.feed(struct.pack(">I", len(data)) + data)
    except FrameError:
        pass
