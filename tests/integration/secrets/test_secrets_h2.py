"""HTTP/2 on the hosts the secrets door reads: real curl (`--http2`) and a raw h2
client through the network and secrets doors to an HTTP/2 origin stand-in on
loopback over TLS (`h2origin.H2Origin`, written with the `h2` library).

Checked, per stream of one connection: the swap; a leak refused on its stream
while the others pass; redaction identical however the origin splits DATA
frames (trailers too); a DELETE refused by the rules beside a GET that passes;
`:authority`/`host` that differ from the tunnel's, CONNECT and extended CONNECT
refused; `tkbox.model.call` per stream. And the attack classes cut off with
bounded work and memory: rapid reset (CVE-2023-44487), CONTINUATION flood, HPACK
bomb (CVE-2016-6581), settings and ping storms, more streams than advertised, a
box that does not read, an origin that floods or resets.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from h2client import H2Client
from hpack import Encoder
from hyperframe.frame import (
    ContinuationFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)
from secretsdoor_rig import Origin, Rig, make_ca

from tkbox.doors.network import OperatorConfig
from tkbox.doors.secrets.spec import Secret, SecretSpec
from tkbox.doors.secrets.testing import H2Origin

pytestmark = pytest.mark.integration

if shutil.which("curl") is None or "HTTP2" not in subprocess.run(
        ["curl", "-V"], capture_output=True, text=True).stdout:
    pytest.skip("curl with HTTP/2 is not installed", allow_module_level=True)

VALUE = b"ghp_RealTokenValue0123456789"
PH = b"tkbox_GH_5f1d3c2b1a0998877665544332211000"
BOUND, RULED, MODEL, OTHER = "api.bound.test", "api.rules.test", "api.anthropic.com", \
    "other.test"
NAMES = [BOUND, RULED, MODEL, OTHER]
RULES = "GET HEAD /**; POST /repos/acme/app/pulls"


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("h2")
    ca, cert, key = make_ca(d, NAMES)
    origin = H2Origin(cert, key)
    port = origin.port
    h1 = Origin(cert, key)  # an origin that speaks HTTP/1.1 only
    hosts = d / "hosts"
    hosts.write_text("127.0.0.1 " + " ".join(NAMES) + "\n")
    op = OperatorConfig.from_flags(permit=["127.0.0.1/32"], hosts_file=hosts)
    sec = Secret(SecretSpec("GH", "env", "GH", (BOUND,), ports=((BOUND, port),)), VALUE, PH)
    rig = Rig([f"{BOUND}:{port}", f"{MODEL}:{port}", f"{OTHER}:{port}", f"{OTHER}:{h1.port}",
               f"{RULED}:{port} {RULES}"], op, [sec], [ca.read_text()],
              model_hosts=[MODEL], inspect=[OTHER])
    assert rig.mitm.ca_pem is not None
    box_ca = d / "box-ca.pem"
    box_ca.write_text(rig.mitm.ca_pem)
    yield {"rig": rig, "origin": origin, "port": port, "box_ca": box_ca, "dir": d, "h1": h1}
    rig.close()
    origin.close()
    h1.close()


def curl(w: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(w["dir"])}
    return subprocess.run(
        ["curl", "-sS", "--http2", "--max-time", "60", "--proxy", w["rig"].proxy,
         "--cacert", str(w["box_ca"]), *args],
        capture_output=True, text=True, env=env, timeout=90)


def url(w: dict[str, Any], path: str, host: str = BOUND) -> str:
    return f"https://{host}:{w['port']}{path}"


def client(w: dict[str, Any], host: str = BOUND) -> H2Client:
    return H2Client(w["rig"].port, host, w["port"], w["box_ca"])


def bodies(w: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r["body"] for r in w["rig"].records(kind)]


def last_completion(w: dict[str, Any], before: int) -> dict[str, Any]:
    """The completion of the newest tunnel: the one for the last Connect decision (an
    earlier test's tunnel can complete after `before` was counted, and come last)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done = w["rig"].records("tkbox.complete")
        if len(done) > before:
            connects = [d["id"] for d in w["rig"].records("tkbox.decision")
                        if d["action"] == "Connect"]
            mine = [c for c in done if c["decision"] == connects[-1]]
            if mine:
                outcome: dict[str, Any] = mine[-1]["outcome"]
                return outcome
        time.sleep(0.1)  # sleep-ok: an integration test polling a record it waits for
    raise AssertionError("the tunnel did not complete")


def no_value_anywhere(w: dict[str, Any]) -> None:
    """The value is in no record (secrets never appear in records)."""
    assert VALUE.decode() not in json.dumps(w["rig"].records())


# --- what each stream gets ----------------------------------------------------------


def test_curl_speaks_h2_and_the_placeholder_is_swapped_on_every_stream(
        w: dict[str, Any]) -> None:
    origin = w["origin"]
    n, conns, uses = len(origin.log), origin.connections, len(bodies(w, "tkbox.secret.use"))
    p = curl(w, "-w", "%{http_version} %{http_code}\n",
             "-H", f"Authorization: Bearer {PH.decode()}", url(w, "/user"),
             url(w, "/repos"))
    assert p.stdout.count("2 200") == 2, p.stdout + p.stderr
    assert origin.connections == conns + 1  # both streams on one connection
    for entry in origin.log[n:]:
        assert ("authorization", f"Bearer {VALUE.decode()}") in entry["headers"]
        assert entry["authority"] == f"{BOUND}:{w['port']}"
    assert len(bodies(w, "tkbox.secret.use")) == uses + 2
    no_value_anywhere(w)


def test_a_leak_is_refused_on_its_stream_while_the_others_pass(w: dict[str, Any]) -> None:
    """Attack: the placeholder or value outside the bound header, on some streams of
    a connection: each of those is answered 403 and recorded; the rest pass."""
    origin = w["origin"]
    leaks = len(bodies(w, "tkbox.secret.leak"))
    c = client(w)
    try:
        ok1 = c.request("GET", "/echo", extra=[(b"authorization", b"Bearer " + PH)])
        head = c.request("GET", "/a", extra=[(b"x-debug", PH)])
        body = c.request("POST", "/b", body=b"k=" + base64.b64encode(VALUE) + b"&pad" * 10)
        trail = c.request("POST", "/c", body=b"fine", trailers=[(b"x-t", PH)])
        url_leak = c.request("GET", "/d?t=" + VALUE.hex())
        ok2 = c.request("GET", "/echo")
        c.wait([ok1, head, body, trail, url_leak, ok2])
        assert [c.status(s) for s in (ok1, head, body, trail, url_leak, ok2)] == [
            200, 403, 403, 403, 403, 200]
        assert not c.closed
        for sid, where in ((head, "x-debug"), (body, "body"), (trail, "trailer"),
                           (url_leak, "URL")):
            reason = c.responses[sid]["headers"][b"x-tkbox-reason"].decode()
            assert "secret GH" in reason and where in reason
            assert VALUE.decode() not in reason
        echoed = json.loads(c.responses[ok1]["body"])
        assert VALUE.decode() not in json.dumps(echoed)  # reflected, and redacted
    finally:
        c.close()
    got = bodies(w, "tkbox.secret.leak")[leaks:]
    assert sorted(g["where"] for g in got) == sorted(
        ["header x-debug", "body", "trailer header x-t", "URL"])
    assert all(VALUE not in e["body"] and PH not in e["body"] for e in origin.log)
    assert all(e["path"] not in ("/a", "/d") for e in origin.log)
    no_value_anywhere(w)


@pytest.mark.parametrize("via", ["curl", "raw"])
def test_redaction_is_identical_however_the_origin_splits_data_frames(
        w: dict[str, Any], via: str) -> None:
    """The value (raw, percent-encoded, base64) in a response body and trailer is
    redacted the same whether the origin sends 1-byte DATA frames or 16 KiB ones,
    on streams interleaved on one connection."""
    origin = w["origin"]
    origin.text = (b"a " + VALUE + b" b " + "".join(f"%{c:02X}" for c in VALUE).encode()
                   + b" c " + base64.b64encode(b"x:" + VALUE) + b" d" + b"." * 300)
    splits = [1, 3, 7, 64, 16384]
    if via == "curl":
        outs = []
        for n in splits:
            p = curl(w, url(w, f"/split/{n}"))
            assert p.returncode == 0, p.stderr
            outs.append(p.stdout.encode())
        trailers = [None]
    else:
        c = client(w)
        try:
            sids = [c.request("GET", f"/split/{n}") for n in splits]
            c.wait(sids, timeout=60)
            outs = [c.responses[s]["body"] for s in sids]
            trailers = [c.responses[s]["trailers"] for s in sids]
            fields = [c.responses[s]["headers"][b"x-echo-header"] for s in sids]
        finally:
            c.close()
        assert all(t is not None for t in trailers)
        assert len({t[b"x-echo-trailer"] for t in trailers if t}) == 1
        assert all(VALUE not in t[b"x-echo-trailer"] for t in trailers if t)
        assert len(set(fields)) == 1 and VALUE not in fields[0] and b"*" * len(VALUE) in fields[0]
    assert len(set(outs)) == 1, "redaction differs with how the origin split the body"
    out = outs[0]
    assert VALUE not in out and VALUE.lower() not in out.lower()
    assert base64.b64encode(b"x:" + VALUE) not in out
    assert out.startswith(b"a ") and out.endswith(b"." * 300)
    assert len(out) == len(origin.text)


def test_rules_refuse_a_delete_on_one_stream_while_a_get_on_another_passes(
        w: dict[str, Any]) -> None:
    origin = w["origin"]
    n, conns = len(origin.log), origin.connections
    refused = len(bodies(w, "tkbox.http.refused"))
    reqs = len(bodies(w, "tkbox.http.request"))
    p = curl(w, "-w", "\n%{http_version} %{http_code}\n", "-D", "-",
             url(w, "/repos/acme/app", RULED), "--next", "--http2", "--proxy",
             w["rig"].proxy, "--cacert", str(w["box_ca"]), "-X", "DELETE", "-D", "-",
             "-w", "\n%{http_version} %{http_code}\n", url(w, "/repos/acme/app", RULED),
             "--next", "--http2", "--proxy", w["rig"].proxy, "--cacert", str(w["box_ca"]),
             "-w", "\n%{http_version} %{http_code}\n", url(w, "/repos/acme/app/pulls", RULED))
    codes = [line for line in p.stdout.splitlines() if line.startswith("2 ")]
    assert codes == ["2 200", "2 403", "2 200"], p.stdout + p.stderr
    assert f"no rule of {RULED}" in p.stdout
    assert origin.connections == conns + 1
    assert [(e["method"], e["path"]) for e in origin.log[n:]] == [
        ("GET", "/repos/acme/app"), ("GET", "/repos/acme/app/pulls")]
    [r] = bodies(w, "tkbox.http.refused")[refused:]
    assert (r["method"], r["path"], r["host"]) == ("DELETE", "/repos/acme/app", RULED)
    got = bodies(w, "tkbox.http.request")[reqs:]
    assert [(g["method"], g["status"]) for g in got] == [("GET", 200), ("GET", 200)]
    decisions = {d["id"]: d for d in w["rig"].records("tkbox.decision")}
    assert decisions[got[0]["decision"]]["context"]["http_version"] == "2"


def test_an_http2_request_is_normalised_by_the_same_matcher(w: dict[str, Any]) -> None:
    """Attack: encoded slashes, dot segments, lower-case methods, an override header,
    sent as HTTP/2 pseudo-fields: read as the HTTP/1.1 rules read them."""
    origin = w["origin"]
    n = len(origin.log)
    c = client(w, RULED)
    try:
        cases = [("POST", "/repos/acme/app/pulls", [], 200),
                 ("POST", "/repos/acme/app%2Fpulls/../x", [], 403),
                 ("get", "/repos/acme/app", [], 403),
                 ("GET", "/repos/acme/app", [(b"x-http-method-override", b"DELETE")], 403),
                 ("POST", "/Repos/ACME/app/pulls", [], 403)]
        sids = [c.request(m, p, body=b"{}", extra=x) for m, p, x, _ in cases]
        c.wait(sids)
        assert [c.status(s) for s in sids] == [want for *_, want in cases]
    finally:
        c.close()
    assert [(e["method"], e["path"]) for e in origin.log[n:]].count(
        ("POST", "/repos/acme/app/pulls")) == 1


@pytest.mark.parametrize("head,why", [
    ([(b":authority", OTHER.encode())], "not the tunnel's host"),
    ([(b"host", OTHER.encode())], "differs from its :authority"),
    ([(b":method", b"CONNECT")], "CONNECT"),
    ([(b":protocol", b"websocket"), (b":method", b"CONNECT")], "CONNECT"),
    ([(b":scheme", b"http")], "scheme"),
])
def test_a_request_for_another_host_or_a_tunnel_in_the_tunnel_is_refused(
        w: dict[str, Any], head: list[tuple[bytes, bytes]], why: str) -> None:
    """Attack: an `:authority` or `host` that differs from the tunnel's host, CONNECT
    and extended CONNECT (RFC 8441) inside an intercepted tunnel."""
    origin = w["origin"]
    n = len(origin.log)
    c = client(w)
    try:
        sid = c.conn.get_next_available_stream_id()
        base = {b":method": b"GET", b":scheme": b"https", b":path": b"/x",
                b":authority": c.authority}
        extra = []
        for k, v in head:
            if k in base:
                base[k] = v
            else:
                extra.append((k, v))
        fields = [(k, v) for k, v in base.items()] + extra
        if base[b":method"] == b"CONNECT" and not any(k == b":protocol" for k, _ in extra):
            fields = [(k, v) for k, v in fields if k not in (b":path", b":scheme")]
        c.conn.send_headers(sid, fields, end_stream=True)
        c.responses[sid] = {"headers": None, "body": b"", "trailers": None, "ended": False,
                            "reset": None}
        c.flush()
        ok = c.request("GET", "/echo")
        c.wait([sid, ok])
        if c.responses[sid]["headers"] is not None:
            assert c.status(sid) == 403
            assert why in c.responses[sid]["headers"][b"x-tkbox-reason"].decode()
            assert c.status(ok) == 200
        else:
            # h2 itself refuses a malformed block (a pseudo-field the door did not
            # offer): the stream or the connection is ended, nothing is relayed
            assert c.responses[sid]["reset"] is not None or c.closed
    finally:
        c.close()
    assert all(e["path"] != "/x" for e in origin.log[n:])


def test_each_stream_to_a_model_host_is_recorded_with_its_model(w: dict[str, Any]) -> None:
    calls = len(bodies(w, "tkbox.model.call"))
    c = client(w, MODEL)
    try:
        sids = [c.request("POST", "/v1/messages",
                          body=json.dumps({"model": m}).encode(),
                          extra=[(b"content-type", b"application/json")])
                for m in ("claude-a", "claude-b")]
        c.wait(sids)
        assert [c.status(s) for s in sids] == [200, 200]
    finally:
        c.close()
    got = bodies(w, "tkbox.model.call")[calls:]
    assert sorted(g["model"] for g in got) == ["claude-a", "claude-b"]
    assert all(g["usage"] == {"input_tokens": 11, "output_tokens": 7} and g["status"] == 200
               and "ended" not in g for g in got)


def test_h2_is_offered_to_the_box_only_where_the_origin_speaks_it(w: dict[str, Any]) -> None:
    """curl offers h2; an origin that speaks only HTTP/1.1 makes both legs HTTP/1.1."""
    p = curl(w, "-w", "\n%{http_version} %{http_code}",
             f"https://{OTHER}:{w['h1'].port}/x")
    assert p.stdout.endswith("1.1 200"), p.stdout + p.stderr


def test_curl_over_http11_still_gets_http11(w: dict[str, Any]) -> None:
    p = curl(w, "--http1.1", "-w", "%{http_version}", url(w, "/x"))
    # the stand-in answers HTTP/1.1 with 426: the door chose 1.1 on both legs
    assert p.stdout.endswith("1.1"), p.stdout + p.stderr


def test_every_stream_is_recorded_however_it_ends(w: dict[str, Any]) -> None:
    """Each stream's `tkbox.http.request` is completed in its `finally`: a stream the
    box resets mid-response, and the streams still open when the connection is cut
    (here by a PING flood), are recorded with how they ended."""
    reqs = len(bodies(w, "tkbox.http.request"))
    decided = len(w["rig"].records("tkbox.decision"))
    w["origin"].slow_seconds = 30
    c = client(w, RULED)
    try:
        big = c.request("GET", "/big/64")
        deadline = time.monotonic() + 30
        while c.responses[big]["headers"] is None and time.monotonic() < deadline:
            c.pump()
        c.conn.reset_stream(big, 8)  # CANCEL, mid-response
        c.flush()
        slow = [c.request("GET", "/slow") for _ in range(3)]
        # read on (the door queues what it sent before the reset) until the three
        # are decided and under way: streams cut before their decision have none
        deadline = time.monotonic() + 30
        while len(w["rig"].records("tkbox.decision")) < decided + 4 and c.pump() \
                and time.monotonic() < deadline:
            pass
        for i in range(1000):  # then a flood cuts the connection
            if not c.send_raw(PingFrame(0, opaque_data=i.to_bytes(8, "big")).serialize()):
                break
        c.wait_closed()
        assert len(slow) == 3
    finally:
        w["origin"].slow_seconds = 0
        c.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(bodies(w, "tkbox.http.request")) < reqs + 4:
        time.sleep(0.1)
    got = bodies(w, "tkbox.http.request")[reqs:]
    assert len(got) == 4, got
    first = next(g for g in got if g["path"] == "/big/64")
    assert first["status"] == 200 and first["ended"] == "client reset the stream"
    assert 0 < first["bytes_down"] < 64 << 20
    rest = [g for g in got if g["path"] == "/slow"]
    assert len(rest) == 3 and all(g["status"] is None and g.get("ended") for g in rest)


# --- attacks --------------------------------------------------------------------------


def _flood(w: dict[str, Any], host: str, frames: Any, limit: int = 20_000) -> H2Client:
    """Send `frames(i)` until the door cuts the connection (or `limit` sends)."""
    c = client(w, host)
    c.pump(0.5)  # the door's SETTINGS, acknowledged: from here only raw frames
    for i in range(limit):
        if not c.send_raw(frames(i)):
            break
        if i % 50 == 0 and not c.pump_raw():
            break
    c.wait_closed()
    return c


def _cut_with(w: dict[str, Any], c: H2Client, before: int, words: str) -> None:
    # The GOAWAY can be lost: the door closes with the flood unread in its socket,
    # and the kernel's reset may discard what the client had not read yet. The
    # tunnel's record is what says why it ended.
    if c.goaway is not None:
        assert c.goaway.error_code == 11  # ENHANCE_YOUR_CALM
        assert words in (c.goaway.additional_data or b"").decode()
    outcome = last_completion(w, before)
    assert outcome["ended"] == "refused request" and words in outcome["reason"]
    c.close()


def test_rapid_reset_is_cut_off_before_it_costs_more_than_its_budget(
        w: dict[str, Any]) -> None:
    """Attack: rapid reset (CVE-2023-44487): streams opened and reset at once, on a
    ruled host where each stream costs a gate decision. Cut off after the burst; the
    decisions made stay bounded however many the box sent."""
    enc = Encoder()
    done = len(w["rig"].records("tkbox.complete"))
    decisions = len(w["rig"].records("tkbox.decision"))
    authority = f"{RULED}:{w['port']}".encode()

    def frames(i: int) -> bytes:
        sid = 2 * i + 1
        h = HeadersFrame(sid)
        h.data = enc.encode([(b":method", b"GET"), (b":scheme", b"https"),
                             (b":authority", authority), (b":path", b"/repos/x")])
        h.flags.add("END_HEADERS")
        h.flags.add("END_STREAM")
        return h.serialize() + RstStreamFrame(sid, error_code=8).serialize()

    c = _flood(w, RULED, frames)
    _cut_with(w, c, done, "rapid reset")
    made = len(w["rig"].records("tkbox.decision")) - decisions
    assert made < 400  # the burst (200) and what the refill gave, not 20,000


def test_continuation_flood_is_cut_off_with_bounded_memory(w: dict[str, Any]) -> None:
    """Attack: CONTINUATION flood: one header block that never ends, 16 KiB at a
    time; the door stops it at its header-block bound, holding at most that."""
    done = len(w["rig"].records("tkbox.complete"))
    tracemalloc.start()
    try:
        def frames(i: int) -> bytes:
            if i == 0:
                h = HeadersFrame(1)
                h.data = b"\x82"
                return h.serialize()
            f = ContinuationFrame(1)
            f.data = b"\x40\x01a\x01b" * 3000
            return f.serialize()

        c = _flood(w, BOUND, frames, limit=4000)  # up to 60 MiB if never cut
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"CONTINUATION flood: peak {peak >> 10} KiB")
    _cut_with(w, c, done, "CONTINUATION flood")
    assert peak < 8 * 1024 * 1024


def test_hpack_bomb_is_refused(w: dict[str, Any]) -> None:
    """Attack: HPACK bomb (CVE-2016-6581): a 4 KiB field put in the dynamic table
    once, then named by its one-byte index thousands of times: a small block that
    decodes to megabytes. The door's decoder stops at its header-list bound."""
    done = len(w["rig"].records("tkbox.complete"))
    c = client(w)
    enc = Encoder()
    first = enc.encode([(b":method", b"GET"), (b":scheme", b"https"),
                        (b":authority", c.authority), (b":path", b"/"),
                        (b"x-bomb", b"b" * 4000)])
    block = first + b"\xbe" * 12000  # index 62: the x-bomb entry, 12,000 times (~48 MB)
    h = HeadersFrame(1)
    h.data = block
    h.flags.add("END_HEADERS")
    h.flags.add("END_STREAM")
    tracemalloc.start()
    try:
        c.send_raw(h.serialize())
        c.wait_closed()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024  # it would decode to 48 MB
    assert c.goaway is None or c.goaway.error_code in (1, 11)  # (see `_cut_with`)
    outcome = last_completion(w, done)
    assert outcome["ended"] == "refused request" and "HTTP/2" in outcome["reason"]
    c.close()


@pytest.mark.parametrize("kind", ["SETTINGS", "PING"])
def test_settings_storm_and_ping_flood_are_cut_off(w: dict[str, Any], kind: str) -> None:
    """Attack: settings (CVE-2019-9515) and ping (CVE-2019-9512) floods."""
    done = len(w["rig"].records("tkbox.complete"))

    def frames(i: int) -> bytes:
        if kind == "PING":
            return PingFrame(0, opaque_data=i.to_bytes(8, "big")).serialize()
        return SettingsFrame(0, settings={3: 100}).serialize()

    c = _flood(w, BOUND, frames)
    _cut_with(w, c, done, kind)


def test_streams_beyond_the_advertised_limit_end_the_connection(w: dict[str, Any]) -> None:
    """Attack: more concurrent streams than the door advertised (100): `h2` treats it
    as the connection error RFC 9113 §5.1.2 allows; nothing past the limit is relayed."""
    w["origin"].slow_seconds = 1.0
    done = len(w["rig"].records("tkbox.complete"))
    n = len(w["origin"].log)
    c = client(w)
    try:
        c.pump(0.5)
        enc = Encoder()
        for i in range(130):
            h = HeadersFrame(2 * i + 1)
            h.data = enc.encode([(b":method", b"GET"), (b":scheme", b"https"),
                                 (b":authority", c.authority), (b":path", b"/slow")])
            h.flags.add("END_HEADERS")
            h.flags.add("END_STREAM")
            c.send_raw(h.serialize())
        c.wait_closed()
        assert c.goaway is None or c.goaway.error_code == 1  # PROTOCOL_ERROR
    finally:
        w["origin"].slow_seconds = 0
        c.close()
    outcome = last_completion(w, done)
    assert outcome["ended"] == "refused request" and "TooManyStreams" in outcome["reason"]
    time.sleep(1.5)
    assert len(w["origin"].log) - n <= 100


def _count_resets(data: bytes, code: int | None = None) -> int:
    """RST_STREAM frames in a raw frame stream (after the door's first frames)."""
    i, n = 0, 0
    while i + 9 <= len(data):
        length = int.from_bytes(data[i:i + 3], "big")
        if data[i + 3] == 3 and length == 4 and (
                code is None or int.from_bytes(data[i + 9:i + 13], "big") == code):
            n += 1
        i += 9 + length
    return n


def test_a_box_that_does_not_read_holds_bounded_memory(w: dict[str, Any]) -> None:
    """Attack: internal buffering (CVE-2019-9517): the box opens its windows as wide
    as HTTP/2 allows, asks for 256 MiB, and never reads a byte: the door stops
    feeding it once its output queue is full, and so stops reading the origin."""
    c = client(w)
    c.conn.update_settings({4: 2**31 - 1})  # SETTINGS_INITIAL_WINDOW_SIZE
    c.conn.increment_flow_control_window(2**31 - 1 - 16 * 1024 * 1024 - 65535)
    c.flush()
    c.pump(0.5)
    tracemalloc.start()
    try:
        c.request("GET", "/big/256")
        time.sleep(5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        c.close()
    print(f"box not reading: origin sent {w['origin'].big_sent >> 10} KiB, peak {peak >> 10} KiB")
    assert w["origin"].big_sent < 16 * 1024 * 1024
    assert peak < 8 * 1024 * 1024


@pytest.mark.parametrize("kind", ["settings", "ping", "continuation"])
def test_an_origin_that_floods_is_cut_off(w: dict[str, Any], kind: str) -> None:
    """Attack: the origin floods (a SETTINGS storm, a PING flood, a CONTINUATION flood):
    the box's stream is answered 502 or reset and the connection ends."""
    done = len(w["rig"].records("tkbox.complete"))
    c = client(w)
    try:
        sid = c.request("GET", f"/attack/{kind}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and c.pump():
            r = c.responses[sid]
            if r["ended"] or r["reset"] is not None:
                break
        r = c.responses[sid]
        assert c.status(sid) in (0, 502) and (r["ended"] or r["reset"] is not None
                                              or c.closed)
    finally:
        c.close()
    outcome = last_completion(w, done)
    assert outcome["ended"] == "origin error", outcome
    assert "origin" in outcome["reason"]


def test_an_origin_reset_answers_502_on_that_stream_only(w: dict[str, Any]) -> None:
    c = client(w)
    try:
        bad = c.request("GET", "/attack/reset")
        good = c.request("GET", "/echo")
        c.wait([bad, good])
        assert c.status(bad) == 502 and c.status(good) == 200
    finally:
        c.close()


def test_the_value_appears_in_no_record(w: dict[str, Any]) -> None:
    """After every test above (module order): no record holds the value."""
    no_value_anywhere(w)
