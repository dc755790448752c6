"""Plain http://, once decided and dialed: one request relayed, re-framed by h11.

The guest's request (already parsed by `request.RequestHeadParser`, whose
h11 connection holds the rest of its bytes) is re-serialised by h11 in origin
form with `Connection: close`; its body is relayed event by event. The
origin's response is parsed by a second h11 connection and re-serialised to
the guest with hop-by-hop headers (and those named in `Connection`) removed.
What crosses is always bytes h11 wrote from parsed events, never the peer's.

Who was wrong decides the error: the guest's body that cannot be relayed is a
`BadRequest` (400, `Stage.REQUEST_BODY`); an origin whose response cannot be
carried is an `OriginError` (502, `Stage.ORIGIN`). If the response has not
begun, the guest gets that status with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import h11

from tkbox.doors.network.connection import Connection, Ending, TimeLimits, run_crossing
from tkbox.doors.network.errors import OriginError
from tkbox.doors.network.request import HOP_BY_HOP, BadRequest, ProxyRequest, answer
from tkbox.protocol.streams import ByteStream


async def relay(
    guest: ByteStream,
    origin: ByteStream,
    conn: Connection,
    req: ProxyRequest,
    gconn: h11.Connection,
    leftover: bytes,
    limits: TimeLimits,
    chunk: int,
) -> Ending:
    """Relay one request and its response; see the module docstring."""
    oconn = h11.Connection(h11.CLIENT)
    started = False
    status: int | None = None
    await origin.send_all(
        oconn.send(h11.Request(method=req.method, target=req.path, headers=list(req.headers)))
    )
    gconn.receive_data(leftover)

    async def up_events() -> str:
        while True:
            ev = await next_event(gconn, guest, chunk, lambda why: BadRequest(
                400, f"refused: malformed request body ({why})"))
            if isinstance(ev, h11.Data):
                await origin.send_all(oconn.send(h11.Data(data=ev.data)) or b"")
                conn.up += len(ev.data)
            elif isinstance(ev, h11.EndOfMessage):
                await origin.send_all(oconn.send(h11.EndOfMessage()) or b"")
                return "request sent"
            else:
                return "client closed"

    async def down_events() -> str:
        nonlocal started, status
        while True:
            ev = await next_event(oconn, origin, chunk, lambda why: OriginError(
                f"the origin sent a malformed response ({why})"))
            if isinstance(ev, h11.InformationalResponse):
                if ev.status_code == 101:
                    raise OriginError(
                        "the origin switched protocols, which the proxy does not carry"
                    )
                await guest.send_all(forward_head(gconn, ev))
            elif isinstance(ev, h11.Response):
                started, status = True, ev.status_code
                await guest.send_all(forward_head(gconn, ev))
            elif isinstance(ev, h11.Data):
                await guest.send_all(gconn.send(h11.Data(data=ev.data)) or b"")
                conn.down += len(ev.data)
            elif isinstance(ev, h11.EndOfMessage):
                await guest.send_all(gconn.send(h11.EndOfMessage()) or b"")
                return "response sent"
            else:
                raise OriginError("the origin closed the connection before its response ended")

    async def up() -> str:
        try:
            return await up_events()
        except h11.LocalProtocolError as exc:
            raise BadRequest(400, f"refused: the request cannot be relayed ({exc})") from None

    async def down() -> str:
        try:
            return await down_events()
        except h11.LocalProtocolError as exc:
            raise OriginError(f"the origin's response cannot be relayed ({exc})") from None

    ending = await run_crossing(conn, limits, up, down)
    if ending.refused is not None and not started:
        with contextlib.suppress(Exception):
            await guest.send_all(answer(ending.refused.status, ending.refused.reason))
    ending.facts["status"] = status
    return ending


def response_headers(headers: Any, final: bool) -> list[tuple[bytes, bytes]]:
    """The origin's headers for the guest: hop-by-hop ones and those named in
    `Connection` removed (`Content-Length` kept); a final response says
    `Connection: close`."""
    pairs = [(bytes(n).lower(), bytes(v)) for n, v in headers]
    named: set[bytes] = set()
    for n, v in pairs:
        if n == b"connection":
            named.update(t.strip().lower() for t in v.split(b","))
    named -= {b"content-length"}
    out = [(n, v) for n, v in pairs if n not in HOP_BY_HOP and n not in named]
    if final:
        out.append((b"connection", b"close"))
    return out


def forward_head(gconn: h11.Connection,
                 ev: h11.InformationalResponse | h11.Response) -> bytes:
    """The origin's response head (interim or final) as sent on to the guest, its
    headers filtered by `response_headers` (framing headers only on a final one)."""
    head = type(ev)(status_code=ev.status_code, reason=ev.reason,
                    headers=response_headers(ev.headers, isinstance(ev, h11.Response)))
    return gconn.send(head) or b""


async def next_event(conn: h11.Connection, stream: ByteStream, chunk: int,
                     error: Callable[[str], Exception]) -> Any:
    """`conn`'s next event (never NEED_DATA), reading `stream` as it needs. A protocol
    error is raised as `error(why)`, `why` cut to 120 characters: h11's text may quote
    what the peer sent."""
    while True:
        try:
            ev = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise error(str(exc)[:120]) from None
        if ev is not h11.NEED_DATA:
            return ev
        conn.receive_data(await stream.receive(chunk))
