"""Who was wrong, by type: a mux whose link ended is `TransportClosed` (on the host:
the VMM ended), a mux the peer broke is a plain `PortError` whose cause was a
`MuxError` (a `RemoteError`: on the host, the guest's doing)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from tkbox._tasks import TaskOwner
from tkbox.errors import RemoteError, TkboxError
from tkbox.protocol.errors import FrameError, MuxError, PortError, StreamClosed, TransportClosed
from tkbox.protocol.mux import MuxPorts
from tkbox.protocol.streams import memory_stream_pair


def test_every_transport_error_is_in_the_tree() -> None:
    for kind in (PortError, TransportClosed, StreamClosed, MuxError, FrameError):
        assert issubclass(kind, TkboxError)
    assert issubclass(MuxError, RemoteError) and issubclass(FrameError, RemoteError)
    assert not issubclass(TransportClosed, RemoteError)


def test_link_end_is_transport_closed() -> None:
    async def main() -> None:
        a, b = memory_stream_pair()
        host = MuxPorts(a, initiator=True)
        engines = TaskOwner("e")
        engine = engines.spawn(host.run())
        await b.aclose()  # the VMM's end goes away
        await engine
        assert not host.violation
        with pytest.raises(TransportClosed):
            await host.connect(1024)
        await host.aclose()
        await engines.aclose()

    asyncio.run(main())


def test_a_protocol_violation_is_not_transport_closed() -> None:
    """Attack: a guest sends a frame type that does not exist. The mux dies, and the
    host says the guest broke it, not that the VM ended."""

    async def main() -> None:
        a, b = memory_stream_pair()
        host = MuxPorts(a, initiator=True)
        engines = TaskOwner("e")
        engine = engines.spawn(host.run())
        await b.send_all(struct.pack(">BII", 99, 2, 0))
        await engine
        assert host.violation and "protocol violation" in (host.dead or "")
        with pytest.raises(PortError) as caught:
            await host.connect(1024)
        assert not isinstance(caught.value, TransportClosed)
        await host.aclose()
        await b.aclose()
        await engines.aclose()

    asyncio.run(main())
