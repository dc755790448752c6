"""The door end to end over memory streams: fake signer, resolver, clock, origins."""

from __future__ import annotations

import asyncio
import ipaddress
import json
from typing import Any

from tkbox.doors.network.config import OperatorConfig
from tkbox.doors.network.door import EgressDoor
from tkbox.doors.network.testing import (
    MemoryOrigin,
    aiotest,
    client_hello,
    make_door,
    records,
    server_hello,
)
from tkbox.doors.network.tunnel import TLS_ACCESS_DENIED
from tkbox.protocol.streams import ByteStream, MemoryStream, memory_stream_pair
from tkbox.record.testing import FakeSigner

PUBLIC = "93.184.215.14"
PUBLIC6 = "2606:2800:21f:cb07:6820:80da:af6b:8b2c"


async def settle(n: int = 50) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def open_conn(door: EgressDoor, raw: bytes) -> tuple[MemoryStream, asyncio.Task[None]]:
    guest, ours = memory_stream_pair()
    task = asyncio.ensure_future(door.handle(ours))
    await guest.send_all(raw)
    return guest, task


async def read_head(guest: ByteStream) -> bytes:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = await guest.receive()
        if not chunk:
            break
        buf += chunk
    return buf


async def read_all(guest: ByteStream) -> bytes:
    buf = b""
    while chunk := await guest.receive():
        buf += chunk
    return buf


def connect(host: str, port: int = 443) -> bytes:
    return f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


def decisions(signer: FakeSigner) -> list[dict[str, Any]]:
    return [r for r in signer.records if r["kind"] == "tkbox.decision"]


def refusals(signer: FakeSigner) -> list[dict[str, Any]]:
    return [r["body"] for r in signer.records if r["kind"] == "tkbox.egress.refused"]


class RecordingOrigin:
    """An origin that keeps every byte it got and answers a ServerHello."""

    def __init__(self) -> None:
        self.got = b""

    async def __call__(self, stream: ByteStream) -> None:
        while data := await stream.receive():
            first = not self.got
            self.got += data
            if first:
                await stream.send_all(records(server_hello()) + b"\x17\x03\x03\x00\x02hi")
        await stream.send_eof()


@aiotest
async def test_allowed_tunnel_is_decided_dialed_spliced_and_completed() -> None:
    origin = RecordingOrigin()
    door, signer, dialer, _ = make_door(
        ["example.org"], dns={"example.org": [PUBLIC]}, handler=origin
    )
    guest, task = await open_conn(door, connect("example.org"))
    assert (await read_head(guest)).startswith(b"HTTP/1.1 200")
    hello = records(client_hello("example.org"))
    await guest.send_all(hello)
    got = b""
    while len(got) < 10:
        got += await guest.receive()
    await guest.send_all(b"\x17\x03\x03\x00\x05hello")
    await guest.send_eof()
    await read_all(guest)
    await task
    assert dialer.dialed == [(PUBLIC, 443)]
    assert origin.got == hello + b"\x17\x03\x03\x00\x05hello"
    [d] = decisions(signer)
    assert d["action"] == "Connect" and d["resource"] == {
        "host": "example.org",
        "port": 443,
        "addresses": [PUBLIC],
    }
    assert d["context"]["rule"] == "allow example.org" and d["context"]["tls_required"] is True
    [c] = [r for r in signer.records if r["kind"] == "tkbox.complete"]
    out = c["outcome"]
    assert c["decision"] == d["id"] and out["address"] == PUBLIC
    assert out["bytes_up"] == len(origin.got) and out["bytes_down"] > 0
    assert out["tls"] is True and out["server_name"] == "example.org"


@aiotest
async def test_dns_rebinding_between_check_and_dial_cannot_work() -> None:
    """Stops a name that answers a public address to the check and loopback to the dial."""
    door, signer, dialer, _ = make_door(
        ["rebind.example"], dns={"rebind.example": [[PUBLIC], ["127.0.0.1"], ["127.0.0.1"]]}
    )
    guest, task = await open_conn(door, connect("rebind.example"))
    assert (await read_head(guest)).startswith(b"HTTP/1.1 200")
    await guest.aclose()
    await task
    # resolved once, dialed exactly the address that was checked
    assert door.resolver.calls == ["rebind.example"]  # type: ignore[attr-defined]
    assert dialer.dialed == [(PUBLIC, 443)]
    # the next connection gets the rebound answer, and it is refused before any dial
    guest, task = await open_conn(door, connect("rebind.example"))
    head = await read_head(guest)
    await task
    assert head.startswith(b"HTTP/1.1 403") and b"loopback" in head
    assert dialer.dialed == [(PUBLIC, 443)]


@aiotest
async def test_dns_answer_mixing_public_and_private_dials_only_the_public() -> None:
    """Stops a name listing a private address next to a public one."""
    door, signer, dialer, _ = make_door(
        ["mixed.example"], dns={"mixed.example": ["10.0.0.7", PUBLIC6, "169.254.169.254"]}
    )
    guest, task = await open_conn(door, connect("mixed.example"))
    assert (await read_head(guest)).startswith(b"HTTP/1.1 200")
    await guest.aclose()
    await task
    assert dialer.dialed == [(PUBLIC6, 443)]
    ctx = decisions(signer)[0]["context"]
    assert ctx["refused_addresses"] == ["10.0.0.7", "169.254.169.254"]


SPELLINGS = [
    "127.0.0.1",
    "2130706433",
    "0x7f000001",
    "017700000001",
    "0x7f.1",
    "127.1",
    "0177.0.0.1",
    "[::1]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::127.0.0.1]",
    "[64:ff9b::7f00:1]",
    "[2002:7f00:1::]",
    "[2001:0:4136:e378:8000:63bf:80ff:fffe]",
    "[fe80::1%eth0]",
    "169.254.169.254",
    "0xa9fea9fe",
    "2852039166",
    "[::ffff:a9fe:a9fe]",
    "[fd00:ec2::254]",
    "100.100.100.200",
    "0.0.0.0",
    "0",
    "10.1",
    "192.168.1.1",
]


@aiotest
async def test_every_address_spelling_is_refused_without_dns_or_dial() -> None:
    """Stops loopback, private and metadata addresses in every spelling, even if allowed."""
    allow = [s + ":443" if not s.startswith("[") else s + ":443" for s in SPELLINGS]
    door, signer, dialer, _ = make_door(allow)
    for spelling in SPELLINGS:
        guest, task = await open_conn(door, connect(spelling))
        head = await read_head(guest)
        await task
        assert head.startswith(b"HTTP/1.1 403"), (spelling, head)
        assert b"X-Tkbox-Reason: refused:" in head
    assert dialer.dialed == [] and door.resolver.calls == []  # type: ignore[attr-defined]
    assert decisions(signer) == [] and len(refusals(signer)) == len(SPELLINGS)
    assert door.board.list() == []


@aiotest
async def test_metadata_address_is_refused_at_once_never_asked() -> None:
    door, signer, dialer, _ = make_door([])
    guest, task = await open_conn(
        door,
        b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n",
    )
    head = await read_head(guest)
    await task
    assert head.startswith(b"HTTP/1.1 403") and b"metadata" in head
    assert door.board.list() == [] and dialer.dialed == []
    assert "metadata" in refusals(signer)[0]["reason"]


@aiotest
async def test_not_allowed_host_waits_and_passes_once_approved() -> None:
    door, signer, dialer, _ = make_door([], dns={"example.com": [PUBLIC]}, box="demo")
    guest, task = await open_conn(door, connect("example.com"))
    await settle()
    [p] = door.board.list()
    assert (p.box, p.host, p.port) == ("demo", "example.com", 443)
    assert door.resolver.calls == []  # type: ignore[attr-defined]  # no DNS before a person said yes
    await door.board.answer("demo", p.id, allow=True)
    assert (await read_head(guest)).startswith(b"HTTP/1.1 200")
    await guest.aclose()
    await task
    assert decisions(signer)[0]["context"]["rule"] == "approval 1"
    # remembered for the box: the next connection does not ask again
    guest, task = await open_conn(door, connect("example.com"))
    assert (await read_head(guest)).startswith(b"HTTP/1.1 200")
    await guest.aclose()
    await task
    assert door.board.list() == []


@aiotest
async def test_an_answer_an_agent_gave_is_never_said_to_be_a_persons() -> None:
    door, signer, _, _ = make_door([], dns={"example.com": [PUBLIC], "b.example": [PUBLIC]},
                                   box="demo")
    guest, task = await open_conn(door, connect("example.com"))
    await settle()
    await door.board.answer("demo", 1, allow=True, via="mcp")
    assert (await read_head(guest)).startswith(b"HTTP/1.1 200")
    await guest.aclose()
    await task
    guest, task = await open_conn(door, connect("b.example"))
    await settle()
    await door.board.answer("demo", 2, allow=False, via="mcp")
    head = await read_head(guest)
    await task
    assert b"denied by an agent through tkbox mcp" in head and b"person" not in head
    guest, task = await open_conn(door, connect("b.example"))  # remembered, as the agent's
    head = await read_head(guest)
    await task
    assert b"denied by an agent through tkbox mcp" in head and b"person" not in head
    said = json.dumps(signer.records)
    # the two answers, and the two refusals that name the denial
    assert said.count("an agent through tkbox mcp") == 4 and "person" not in said


@aiotest
async def test_not_allowed_host_fails_when_denied_and_after_the_wait() -> None:
    door, signer, dialer, clock = make_door([], dns={"example.com": [PUBLIC]}, box="demo")
    guest, task = await open_conn(door, connect("example.com"))
    await settle()
    await door.board.answer("demo", 1, allow=False)
    head = await read_head(guest)
    await task
    assert head.startswith(b"HTTP/1.1 403") and b"denied by a person" in head
    guest, task = await open_conn(door, connect("example.com"))
    assert b"denied" in await read_head(guest)  # remembered: refused at once
    await task
    guest, task = await open_conn(door, connect("other.example"))
    await settle()
    clock.advance(120.0)
    head = await read_head(guest)
    await task
    assert head.startswith(b"HTTP/1.1 403") and b"nobody answered approval 2 within 120 s" in head
    assert dialer.dialed == []


@aiotest
async def test_approval_flood_through_the_door_is_refused_at_once() -> None:
    door, signer, dialer, _ = make_door([], box="demo")
    waiting = [await open_conn(door, connect(f"h{i}.example")) for i in range(16)]
    await settle()
    guest, task = await open_conn(door, connect("h99.example"))
    head = await read_head(guest)
    await task
    assert head.startswith(b"HTTP/1.1 429") and b"16 approvals pending" in head
    await door.close()
    for g, t in waiting:
        assert (await read_head(g)).startswith(b"HTTP/1.1 503")
        await t


@aiotest
async def test_sni_mismatch_is_cut_with_an_alert_and_nothing_reaches_the_origin() -> None:
    """Stops domain fronting through an allowed host; the record says why."""
    origin = RecordingOrigin()
    door, signer, dialer, _ = make_door(
        ["allowed.example"], dns={"allowed.example": [PUBLIC]}, handler=origin
    )
    guest, task = await open_conn(door, connect("allowed.example"))
    assert (await read_head(guest)).startswith(b"HTTP/1.1 200")
    await guest.send_all(records(client_hello("evil.example")))
    assert await read_all(guest) == TLS_ACCESS_DENIED
    await task
    assert origin.got == b""
    [c] = [r["outcome"] for r in signer.records if r["kind"] == "tkbox.complete"]
    assert c["ended"] == "refused" and "evil.example" in c["reason"]
    assert refusals(signer)[0]["stage"] == "tls"


@aiotest
async def test_non_tls_tunnel_on_443_is_refused_but_passes_to_an_explicit_port() -> None:
    door, signer, _, _ = make_door(
        ["example.org", "git.example:22"], dns={"example.org": [PUBLIC], "git.example": [PUBLIC]}
    )
    guest, task = await open_conn(door, connect("example.org"))
    await read_head(guest)
    await guest.send_all(b"SSH-2.0-OpenSSH\r\n")
    assert await read_all(guest) == b""
    await task
    assert "not TLS" in refusals(signer)[0]["reason"]
    guest, task = await open_conn(door, connect("git.example", 22))
    await read_head(guest)
    await guest.send_all(b"SSH-2.0-OpenSSH\r\n")
    assert await guest.receive() == b"SSH-2.0-OpenSSH\r\n"  # the echo origin
    await guest.aclose()
    await task


@aiotest
async def test_no_signer_no_connection() -> None:
    """Fail closed: a Connect that cannot be recorded does not happen."""
    door, signer, dialer, _ = make_door(["example.org"], dns={"example.org": [PUBLIC]})
    signer.available = False
    guest, task = await open_conn(door, connect("example.org"))
    head = await read_head(guest)
    await task
    assert head.startswith(b"HTTP/1.1 503") and b"signer did not answer" in head
    assert dialer.dialed == []


@aiotest
async def test_signer_policy_refusal_reaches_the_guest() -> None:
    signer = FakeSigner(
        policy=lambda run, action, res, ctx: (False, "policy pack: no tunnels on Sundays")
    )
    door, _, dialer, _ = make_door(["example.org"], dns={"example.org": [PUBLIC]}, signer=signer)
    guest, task = await open_conn(door, connect("example.org"))
    head = await read_head(guest)
    await task
    assert head.startswith(b"HTTP/1.1 403") and b"no tunnels on Sundays" in head
    assert dialer.dialed == [] and decisions(signer)[0]["allowed"] is False


@aiotest
async def test_close_cuts_open_tunnels_at_once_and_refuses_new_ones() -> None:
    door, signer, _, _ = make_door(["git.example:22"], dns={"git.example": [PUBLIC]})
    guest, task = await open_conn(door, connect("git.example", 22))
    await read_head(guest)
    await guest.send_all(b"x")
    assert await guest.receive() == b"x"
    await door.close()
    assert await read_all(guest) == b""
    await task
    [c] = [r["outcome"] for r in signer.records if r["kind"] == "tkbox.complete"]
    assert c["ended"] == "box stopped"
    guest, task = await open_conn(door, connect("git.example", 22))
    head = await read_head(guest)
    await task
    assert head.startswith(b"HTTP/1.1 503") and b"stopping" in head


@aiotest
async def test_malformed_requests_are_answered_and_recorded() -> None:
    door, signer, dialer, _ = make_door(["example.org"])
    guest, task = await open_conn(door, b"GET /local HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await read_head(guest)
    await task
    assert head.startswith(b"HTTP/1.1 400") and b"absolute-form" in head
    assert refusals(signer)[0]["stage"] == "request"


@aiotest
async def test_connection_limit_per_box() -> None:
    door, signer, _, _ = make_door(
        ["git.example:22"], dns={"git.example": [PUBLIC]}, max_connections=2
    )
    open_ = [await open_conn(door, connect("git.example", 22)) for _ in range(2)]
    for g, _t in open_:
        await read_head(g)
    guest, task = await open_conn(door, connect("git.example", 22))
    head = await read_head(guest)
    await task
    assert head.startswith(b"HTTP/1.1 503") and b"connections open" in head
    await door.close()


async def http_origin(stream: ByteStream) -> None:
    buf = b""
    while b"0\r\n\r\n" not in buf and b"\r\n\r\nhello" not in buf:
        chunk = await stream.receive()
        if not chunk:
            break
        buf += chunk
    http_origin.got = buf  # type: ignore[attr-defined]
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nKeep-Alive: x\r\n\r\n"
        b"5\r\nworld\r\n0\r\n\r\n"
    )
    await stream.send_eof()


@aiotest
async def test_plain_http_is_reframed_in_origin_form() -> None:
    door, signer, dialer, _ = make_door(
        ["example.org"], dns={"example.org": [PUBLIC]}, handler=http_origin
    )
    guest, task = await open_conn(
        door,
        b"POST http://example.org/up?x=1 HTTP/1.1\r\nHost: example.org\r\n"
        b"Proxy-Connection: keep-alive\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    out = await read_all(guest)
    await task
    got: bytes = http_origin.got  # type: ignore[attr-defined]
    assert got.startswith(b"POST /up?x=1 HTTP/1.1\r\n")
    assert b"proxy-connection" not in got.lower() and b"connection: close" in got.lower()
    assert got.endswith(b"5\r\nhello\r\n0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and b"keep-alive" not in out.lower()
    assert out.endswith(b"5\r\nworld\r\n0\r\n\r\n")
    assert decisions(signer)[0]["context"]["path"] == "/up?x=1"


@aiotest
async def test_bad_chunking_in_a_plain_request_body_is_refused() -> None:
    """Stops smuggling through a malformed chunked body."""
    door, signer, _, _ = make_door(
        ["example.org"], dns={"example.org": [PUBLIC]}, handler=http_origin
    )
    guest, task = await open_conn(
        door,
        b"POST http://example.org/ HTTP/1.1\r\nHost: example.org\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        b"zz\r\nhello\r\n0\r\n\r\n",
    )
    out = await read_all(guest)
    await task
    assert out.startswith(b"HTTP/1.1 400") or out == b""
    assert any("malformed request body" in r["reason"] for r in refusals(signer))


@aiotest
async def test_what_h11_quotes_of_a_malformed_body_is_cut_short() -> None:
    """h11's error text quotes the bytes it choked on: a guest's 3,000-byte chunk line
    reaches neither the answer nor the record beyond a short excerpt."""
    door, signer, _, _ = make_door(
        ["example.org"], dns={"example.org": [PUBLIC]}, handler=http_origin
    )
    guest, task = await open_conn(
        door,
        b"POST http://example.org/ HTTP/1.1\r\nHost: example.org\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + b"z" * 3000 + b"\r\n0\r\n\r\n",
    )
    out = await read_all(guest)
    await task
    assert out.count(b"z") < 200, out[:300]
    [reason] = [r["reason"] for r in refusals(signer) if "malformed request body" in r["reason"]]
    assert reason.count("z") < 200, reason[:300]


@aiotest
async def test_operator_hosts_map_and_permit_reach_a_loopback_mirror() -> None:
    op = OperatorConfig(
        permit=(ipaddress.ip_network("127.0.0.1/32"),),
        hosts={"mirror.internal": (ipaddress.ip_address("127.0.0.1"),)},
    )
    door, signer, dialer, _ = make_door(["mirror.internal:8443"], operator=op)
    guest, task = await open_conn(door, connect("mirror.internal", 8443))
    assert (await read_head(guest)).startswith(b"HTTP/1.1 200")
    await guest.aclose()
    await task
    assert dialer.dialed == [("127.0.0.1", 8443)] and door.resolver.calls == []  # type: ignore[attr-defined]
    ctx = decisions(signer)[0]["context"]
    assert ctx["addresses_from"] == "egress-hosts" and ctx["operator"] == ["permit 127.0.0.1/32"]
    # without the permit, the same mirror is refused
    door2, _, dialer2, _ = make_door(
        ["mirror.internal:8443"], operator=OperatorConfig(hosts=op.hosts)
    )
    guest, task = await open_conn(door2, connect("mirror.internal", 8443))
    assert (await read_head(guest)).startswith(b"HTTP/1.1 403")
    await task
    assert dialer2.dialed == []


def test_check_explains_without_dialing() -> None:
    door, _, dialer, _ = make_door(["example.org", "git.example:22"], own=[PUBLIC])
    ex = door.check("EXAMPLE.org", 443)
    assert ex.verdict == "allow" and ex.rule == "allow example.org" and ex.source == "not resolved"
    assert door.check("example.org", 8443).verdict == "ask"
    assert "only example.org is allowed" in door.check("example.org", 8443).reason
    md = door.check("169.254.169.254", 80)
    assert md.verdict == "refuse" and "metadata" in md.reason
    assert door.check(PUBLIC, 443).verdict == "refuse"  # the host's own address
    assert door.check("git.example", 22).require_tls is False
    assert door.check("0x7f.1", 443).to_dict()["addresses"][0]["address"] == "127.0.0.1"
    assert isinstance(dialer, MemoryOrigin) and dialer.dialed == []


def answering(response: bytes):  # type: ignore[no-untyped-def]
    """An origin that reads a request head, then sends `response` and closes."""

    async def origin(stream: ByteStream) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = await stream.receive()
            if not chunk:
                break
            buf += chunk
        await stream.send_all(response)
        await stream.send_eof()

    return origin


def completions(signer: FakeSigner) -> list[dict[str, Any]]:
    return [r["outcome"] for r in signer.records if r["kind"] == "tkbox.complete"]


@aiotest
async def test_an_origins_malformed_response_is_a_502_blamed_on_the_origin() -> None:
    """An origin that breaks HTTP is refused as the origin's fault (stage `origin`, 502),
    never as the guest's."""
    for response, why in [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",
         b"malformed response"),
        # unasked for (the request head refuses Upgrade), so h11 reads it as malformed
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", b"malformed response"),
        (b"NOT HTTP AT ALL\r\n\r\n", b"malformed response"),
    ]:
        door, signer, _, _ = make_door(
            ["example.org"], dns={"example.org": [PUBLIC]}, handler=answering(response)
        )
        guest, task = await open_conn(
            door, b"GET http://example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n"
        )
        out = await read_all(guest)
        await task
        assert out.startswith(b"HTTP/1.1 502") and why in out, out
        [c] = completions(signer)
        assert c["ended"] == "refused" and c["stage"] == "origin" and c["status"] is None
        [r] = refusals(signer)
        assert r["stage"] == "origin" and "status" not in r and r["host"] == "example.org"


@aiotest
async def test_an_interim_response_reaches_the_guest_before_the_final_one() -> None:
    """A 103 before the 200 is passed on as an interim head (no framing headers of its
    own), then the final response with its body; one completion, status 200."""
    response = (b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Origin: yes\r\n\r\nok")
    door, signer, _, _ = make_door(
        ["example.org"], dns={"example.org": [PUBLIC]}, handler=answering(response)
    )
    guest, task = await open_conn(
        door, b"GET http://example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n"
    )
    out = await read_all(guest)
    await task
    interim, final = out.split(b"\r\n\r\n", 1)
    assert interim.startswith(b"HTTP/1.1 103 Early Hints\r\n"), out
    assert b"link: </s.css>; rel=preload" in interim.lower()
    assert b"content-length" not in interim.lower() and b"connection" not in interim.lower()
    assert final.startswith(b"HTTP/1.1 200 OK\r\n") and final.endswith(b"\r\n\r\nok"), out
    assert b"x-origin: yes" in final.lower()
    [c] = completions(signer)
    assert c["status"] == 200


@aiotest
async def test_an_origin_that_stops_mid_response_is_recorded_without_a_second_answer() -> None:
    door, signer, _, _ = make_door(
        ["example.org"], dns={"example.org": [PUBLIC]},
        handler=answering(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"),
    )
    guest, task = await open_conn(
        door, b"GET http://example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n"
    )
    out = await read_all(guest)
    await task
    assert out.startswith(b"HTTP/1.1 200") and b"502" not in out  # the response had begun
    [c] = completions(signer)
    assert c["ended"] == "refused" and c["stage"] == "origin" and c["status"] == 200
    assert "without sending complete message body" in c["reason"]


@aiotest
async def test_no_task_of_a_connection_outlives_the_door_closing() -> None:
    """A box's tasks all end when the box does: after `close()` only the origins'
    handlers (owned by the test's MemoryOrigin) may remain."""
    door, signer, dialer, _ = make_door(
        ["git.example:22", "example.org"], dns={"git.example": [PUBLIC], "example.org": [PUBLIC]}
    )
    conns = [await open_conn(door, connect("git.example", 22)) for _ in range(3)]
    for g, _t in conns:
        assert (await read_head(g)).startswith(b"HTTP/1.1 200")
    waiting = await open_conn(door, connect("example.org", 8443))  # waits for a person
    await settle()
    assert door.open_connections == 4
    await door.close()
    for _g, t in [*conns, waiting]:
        await t
    await dialer.aclose()
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert [c["ended"] for c in completions(signer)] == ["box stopped"] * 3


class _BrokenInterceptor:
    """A secrets door with a bug: its tunnel raises what no crossing maps."""

    ca_pem = None

    def wants(self, host: str, port: int) -> bool:
        return True

    async def check_plain(self, host: str, port: int, method: str, target: str,
                          headers: list[tuple[bytes, bytes]]) -> str | None:
        return None

    async def tunnel(self, guest_raw: ByteStream, origin_raw: ByteStream, host: str,
                     port: int, leftover: bytes = b"", counts: Any = None,
                     gate: Any = None) -> dict[str, Any]:
        counts.up += 7
        raise LookupError("a bug inside the tunnel")


@aiotest
async def test_a_tunnel_that_raises_anything_still_completes_its_decision() -> None:
    """Attack: make the crossing raise past its error mapping (once, h11 inside the
    secrets door) so that the Connect decision is never completed and the tunnel's
    traffic is missing from the record. Whatever the crossing raises, the decision
    is completed (an internal refusal, with the bytes counted so far)."""
    door, signer, _, _ = make_door(["example.org"], dns={"example.org": [PUBLIC]},
                                   mitm=_BrokenInterceptor())
    guest, task = await open_conn(door, connect("example.org"))
    await read_all(guest)
    await task
    [d] = decisions(signer)
    [c] = [r for r in signer.records if r["kind"] == "tkbox.complete"]
    assert c["decision"] == d["id"]
    out = c["outcome"]
    assert out["ended"] == "refused" and out["stage"] == "internal"
    assert "LookupError" in out["reason"] and out["bytes_up"] == 7
    assert out["address"] == PUBLIC
    [r] = refusals(signer)
    assert r["stage"] == "internal" and r["host"] == "example.org"


@aiotest
async def test_plain_http_on_a_ruled_host_goes_through_the_rules() -> None:
    """Attack: skip the rules by speaking plain http:// to a ruled host. The one request
    of the connection is decided like a tunnel's: refused before the origin hears of
    it, or let through with its Http decision and tkbox.http.request."""
    door, signer, _, _ = make_door(
        ["example.org GET /ok/**"], dns={"example.org": [PUBLIC]},
        handler=answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
    guest, task = await open_conn(
        door, b"DELETE http://example.org/ok/x HTTP/1.1\r\nHost: example.org\r\n\r\n")
    out = await read_all(guest)
    await task
    assert out.startswith(b"HTTP/1.1 403") and b"no rule of example.org:80 allows DELETE" in out
    [refused] = [r["body"] for r in signer.records if r["kind"] == "tkbox.http.refused"]
    assert refused["method"] == "DELETE" and refused["path"] == "/ok/x"
    [c] = completions(signer)
    assert c["ended"] == "refused request" and c["bytes_up"] == 0
    guest, task = await open_conn(
        door, b"GET http://example.org/ok/x HTTP/1.1\r\nHost: example.org\r\n\r\n")
    out = await read_all(guest)
    await task
    assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"ok")
    [req] = [r["body"] for r in signer.records if r["kind"] == "tkbox.http.request"]
    assert req["method"] == "GET" and req["status"] == 200 and req["bytes_down"] == 2
    http = [d for d in decisions(signer) if d["action"] == "Http"]
    assert len(http) == 1 and http[0]["id"] == req["decision"]


@aiotest
async def test_a_ruled_host_the_door_cannot_read_is_never_spliced() -> None:
    """A tunnel to a ruled host with no secrets door behind the network door (a
    wiring the daemon never makes) is refused, not spliced past the rules."""
    origin = RecordingOrigin()
    door, signer, _, _ = make_door(["example.org GET /**"], dns={"example.org": [PUBLIC]},
                                   handler=origin)
    guest, task = await open_conn(door, connect("example.org"))
    await guest.send_all(records(client_hello("example.org")))
    out = await read_all(guest)
    await task
    assert b"403" in out and origin.got == b""
    [c] = completions(signer)
    assert c["ended"] == "refused" and c["stage"] == "policy"
