"""The three ports between host and guest, behind one interface.

| port | direction      | use                                              |
| ---- | -------------- | ------------------------------------------------ |
| 1024 | host → guest   | agent RPC, one connection per request             |
| 1025 | guest → host   | egress, one connection per proxied connection     |
| 1026 | guest → host   | boot config, served once, then closed             |

`Ports` is what each side sees: `connect(port)` opens a stream to the other
side's listener, `serve(port, handler)` runs `handler(stream)` for every stream
the other side opens to `port`. Transports behind it: the serial mux
(`tkbox.protocol.mux`, used under QEMU anywhere), hybrid vsock (Firecracker's
Unix-socket convention) and vhost vsock (`AF_VSOCK`).

Standard library only: the guest agent imports this module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable

from tkbox.protocol.budget import Budget
from tkbox.protocol.errors import PortError, TransportClosed
from tkbox.protocol.streams import ByteStream

PORT_RPC = 1024
PORT_EGRESS = 1025
PORT_BOOT = 1026

Handler = Callable[[ByteStream], Awaitable[None]]


__all__ = ["PORT_BOOT", "PORT_EGRESS", "PORT_RPC", "Handler", "PortError", "Ports",
           "TransportClosed"]


class Ports(ABC):
    """Both directions of port streams between one host and one guest.

    `budget`: the work budget the host charges this guest's frames to
    (`tkbox.protocol.budget`); None where the transport has none.
    """

    budget: Budget | None = None

    @abstractmethod
    async def connect(self, port: int, *, reserved: bool = False) -> ByteStream:
        """Open a stream to `port` on the other side. Raises PortError.

        `reserved`: for the host's own use at stop (the diff, shutdown); may
        use slots the other side and ordinary requests cannot take.
        """

    @abstractmethod
    def serve(self, port: int, handler: Handler) -> None:
        """Run `handler(stream)` for each stream the other side opens to `port`.

        The handler owns the stream and must close it. Each handler runs in a
        task owned by the transport; all of them are cancelled by `aclose`.
        """

    @abstractmethod
    async def aclose(self) -> None:
        """Tear down every stream and stop serving. Idempotent."""

    async def wait_closed(self) -> str:
        """Return (with the reason) once the transport is gone for good.

        Transports that cannot tell never return; the VM's own end then tells.
        """
        import asyncio

        await asyncio.Event().wait()
        return ""  # pragma: no cover
