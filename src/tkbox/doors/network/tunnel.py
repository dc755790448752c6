"""CONNECT tunnels, once decided and dialed: spliced through the TLS check, or
handed to the secrets door.

`splice(...)` answers `200`, then copies bytes both ways through a
`tls.TunnelInspector`: the guest's ClientHello is held back until checked
(within `hello_timeout`), nothing from the origin reaches the guest before it
passes, and once a real ServerHello has passed both directions are copied
untouched. A TLS refusal after the `200` can no longer be an HTTP answer: the
guest gets a TLS `access_denied` alert if the origin has sent it nothing yet.

`intercept(...)` answers `200` and hands both streams to an `Interceptor`
(the secrets door, `tkbox.doors.secrets.SecretsDoor`), which terminates TLS
and reads the HTTP inside. Its facts (a dict) come back as an `Ending`.

Both run under the connection's cut and time limits (`Connection.wait_for`).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

from tkbox.doors.network.connection import Connection, Ending, TimeLimits, run_crossing
from tkbox.doors.network.errors import ConnectionEnded, EgressRefused, Stage
from tkbox.doors.network.httpgate import HttpGate
from tkbox.doors.network.request import ProxyRequest
from tkbox.doors.network.tls import TLSRefused, TunnelInspector
from tkbox.protocol.streams import ByteStream

ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
# TLS alert record: fatal (2), access_denied (49), RFC 8446 §6.2
TLS_ACCESS_DENIED = bytes([21, 3, 3, 0, 2, 2, 49])


class Interceptor(Protocol):
    """What the network door asks of the secrets door, which plugs into its tunnels."""

    @property
    def ca_pem(self) -> str | None:
        """The box CA's certificate the guest must trust, if any host is read."""

    def wants(self, host: str, port: int) -> bool:
        """Whether a tunnel to host:port is read (terminated) rather than spliced."""

    async def check_plain(
        self, host: str, port: int, method: str, target: str,
        headers: list[tuple[bytes, bytes]],
    ) -> str | None:
        """The reason a proxy request's head leaks a secret (already recorded), or None."""

    async def tunnel(
        self,
        guest_raw: ByteStream,
        origin_raw: ByteStream,
        host: str,
        port: int,
        leftover: bytes = b"",
        counts: Connection | None = None,
        gate: HttpGate | None = None,
    ) -> dict[str, Any]:
        """Serve one intercepted tunnel to its end; returns the completion's facts
        (`ended`, and for a refusal `reason` and `stage`). Bytes relayed are added
        to `counts.up` and `counts.down` as they pass, so the time limits see them.
        With a `gate` (a ruled host), every request is let through by it first."""


@dataclass(frozen=True)
class Tunnel:
    """One decided, dialed CONNECT: the guest's and the origin's streams."""

    guest: ByteStream
    origin: ByteStream
    conn: Connection
    request: ProxyRequest
    leftover: bytes  # what the guest sent after its request head
    limits: TimeLimits
    chunk: int


async def splice(t: Tunnel, require_tls: bool, hello_timeout: float) -> Ending:
    """Copy the tunnel both ways through the TLS check; see the module docstring."""
    guest, origin, conn, chunk = t.guest, t.origin, t.conn, t.chunk
    await guest.send_all(ESTABLISHED)
    insp = TunnelInspector(t.request.host, require_tls)
    gate = asyncio.Event()
    if insp.server_may_speak:
        gate.set()
    deadline = t.limits.clock.monotonic() + hello_timeout

    async def up() -> str:
        data = t.leftover
        while True:
            if not data:
                if insp.done:
                    data = await guest.receive(chunk)
                else:
                    left = deadline - t.limits.clock.monotonic()
                    try:
                        async with asyncio.timeout(max(left, 0.001)):
                            data = await guest.receive(chunk)
                    except TimeoutError:
                        raise TLSRefused(
                            f"refused: no TLS handshake within {hello_timeout:g} s"
                        ) from None
            if not data:
                await origin.send_eof()
                gate.set()  # let the origin's close (or its last bytes, checked) through
                return "client closed"
            out = insp.client_data(data)
            if out:
                await origin.send_all(out)
                conn.up += len(out)
            if insp.server_may_speak:
                gate.set()
            data = b""

    async def down() -> str:
        await gate.wait()
        while True:
            data = await origin.receive(chunk)
            if not data:
                await guest.send_eof()
                return "origin closed"
            out = insp.server_data(data)
            await guest.send_all(out)
            conn.down += len(out)

    ending = await run_crossing(conn, t.limits, up, down)
    ending.facts["tls"] = insp.tls
    if insp.server_names:
        ending.facts["server_name"] = insp.server_names[-1]
    if insp.retried:
        ending.facts["hello_retry"] = True
    if ending.refused is not None and insp.tls and conn.down == 0:
        with contextlib.suppress(Exception):
            await guest.send_all(TLS_ACCESS_DENIED)
    return ending


async def intercept(t: Tunnel, interceptor: Interceptor, gate: HttpGate | None = None
                    ) -> Ending:
    """Hand the tunnel to the secrets door, under the same cut and time limits
    as a spliced tunnel."""
    await t.guest.send_all(ESTABLISHED)
    req = t.request
    try:
        facts = await t.conn.wait_for(
            interceptor.tunnel(t.guest, t.origin, req.host.name, req.port, t.leftover, t.conn,
                               gate),
            limits=t.limits,
        )
    except ConnectionEnded as e:
        return Ending(e.reason, facts={"intercepted": True})
    return _from_interceptor(facts)


def _from_interceptor(facts: dict[str, Any]) -> Ending:
    """The secrets door's facts as an `Ending`: `ended`, and for a refusal (its TLS
    with the guest failed) the reason and the stage it names (`tls` unless said)."""
    rest = dict(facts)
    ended = str(rest.pop("ended", "closed"))
    if ended != "refused":
        return Ending(ended, facts=rest)
    reason = str(rest.pop("reason", ""))
    stage = rest.pop("stage", Stage.TLS.value)
    known = {s.value: s for s in Stage}
    refused = EgressRefused(400, reason, known.get(stage, Stage.TLS))
    return Ending(ended, refused, rest)

