"""A loopback TCP listener in front of a door, for tests, benchmarks and debugging.

The daemon feeds the door port-1025 streams from the guest; this adapter
feeds it TCP connections instead (each accepted connection wrapped as an
`AsyncioStream`), so real clients on the host (`curl`, `git`, `pip`) can use
a door as their `HTTPS_PROXY`. Only loopback addresses are accepted: a door
is a box's, and must never be reachable from the network.
"""

from __future__ import annotations

import asyncio
import ipaddress

from tkbox.doors.network.door import CHUNK, EgressDoor
from tkbox.errors import UserError
from tkbox.protocol.streams import AsyncioStream


async def serve_tcp(door: EgressDoor, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """Listen on a loopback address; each connection is one `door.handle` call."""
    if not ipaddress.ip_address(host).is_loopback:
        raise UserError(f"a door listens only on loopback, not {host}")

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await door.handle(AsyncioStream(reader, writer))

    return await asyncio.start_server(on_client, host, port, limit=CHUNK, backlog=2048)
