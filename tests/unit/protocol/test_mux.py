"""The serial mux: streams, credit, and a hostile peer."""

from __future__ import annotations

import asyncio
import struct

import pytest

from tkbox.protocol.mux import HEADER, MAX_PAYLOAD, WINDOW, MuxCore, MuxError, MuxPorts, T
from tkbox.protocol.ports import PortError
from tkbox.protocol.streams import ByteStream, memory_stream_pair


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


async def pair(**kw):
    a, b = memory_stream_pair()
    host = MuxPorts(a, initiator=True, **kw)
    guest = MuxPorts(b, initiator=False, **kw)
    tasks = [asyncio.ensure_future(host.run()), asyncio.ensure_future(guest.run())]
    return host, guest, tasks


async def echo(stream: ByteStream) -> None:
    while data := await stream.receive():
        await stream.send_all(data)
    await stream.send_eof()


async def read_all(stream: ByteStream) -> bytes:
    out = bytearray()
    while data := await stream.receive():
        out += data
    return bytes(out)


def test_streams_in_both_directions_carry_bytes_and_half_close():
    async def main():
        host, guest, tasks = await pair()
        guest.serve(1024, echo)
        host.serve(1025, echo)
        s1 = await host.connect(1024)
        s2 = await guest.connect(1025)
        payload = bytes(range(256)) * 4000  # 1 MB: several windows

        async def send_then_eof():
            await s1.send_all(payload)
            await s1.send_eof()

        send = asyncio.ensure_future(send_then_eof())
        await s2.send_all(b"from guest")
        await s2.send_eof()
        assert await read_all(s2) == b"from guest"
        assert await read_all(s1) == payload
        await send
        await host.aclose()
        await guest.aclose()
        for t in tasks:
            t.cancel()

    run(main())


def test_connect_to_port_without_listener_is_refused_clearly():
    async def main():
        host, guest, tasks = await pair()
        with pytest.raises(PortError, match="no listener on port 9"):
            await host.connect(9)
        await host.aclose()
        await guest.aclose()

    run(main())


def test_flood_on_one_stream_does_not_starve_another():
    """A guest that floods a stream the host never reads cannot block other streams."""

    async def main():
        host, guest, tasks = await pair()

        async def flood(stream: ByteStream) -> None:
            await stream.send_all(b"x" * (WINDOW * 8))

        guest.serve(1, flood)
        guest.serve(2, echo)
        flooded = await host.connect(1)
        while len(flooded._buf) < WINDOW:  # the flooder has used its whole window
            flooded._readable.clear()
            await flooded._readable.wait()
        other = await host.connect(2)
        await other.send_all(b"ping")
        await other.send_eof()
        assert await read_all(other) == b"ping"
        # The flooder got no more than its window through.
        assert len(flooded._buf) <= WINDOW
        await host.aclose()
        await guest.aclose()

    run(main())


def test_peer_sending_past_its_credit_kills_the_mux():
    core = MuxCore(initiator=True, window=1024)
    sid = core.open(5)
    core.receive_data(HEADER.pack(T.ACCEPT, sid, 0))
    chunk = b"a" * 1024
    core.receive_data(HEADER.pack(T.DATA, sid, len(chunk)) + chunk)
    with pytest.raises(MuxError, match="credit"):
        core.receive_data(HEADER.pack(T.DATA, sid, 1) + b"b")


@pytest.mark.parametrize(
    "frame, match",
    [
        (HEADER.pack(99, 2, 0), "unknown mux frame type"),
        (HEADER.pack(T.DATA, 2, MAX_PAYLOAD + 1), "exceeds"),
        (HEADER.pack(T.OPEN, 1, 4) + struct.pack(">I", 1), "our parity"),
        (HEADER.pack(T.OPEN, 2, 3) + b"abc", "4 bytes"),
    ],
)
def test_malformed_frames_are_protocol_violations(frame, match):
    core = MuxCore(initiator=True)
    with pytest.raises(MuxError, match=match):
        core.receive_data(frame)


def test_too_many_streams_from_peer_are_rejected_not_fatal():
    core = MuxCore(initiator=True, max_streams=2)
    evs = []
    for sid in (2, 4, 6):
        evs += core.receive_data(HEADER.pack(T.OPEN, sid, 4) + struct.pack(">I", 1024))
    assert len(evs) == 2
    out = core.data_to_send()
    assert HEADER.unpack_from(out)[0] == T.RESET
    assert b"too many open streams" in out


def test_garbage_link_ends_mux_and_fails_streams():
    async def main():
        a, b = memory_stream_pair()
        host = MuxPorts(a, initiator=True)
        t = asyncio.ensure_future(host.run())
        await b.send_all(b"\xff" * 64)
        await asyncio.wait_for(t, 5)
        assert host.dead and "protocol violation" in host.dead
        with pytest.raises(PortError, match="transport is down"):
            await host.connect(1024)

    run(main())
