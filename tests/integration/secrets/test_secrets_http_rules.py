"""Method and path rules on a read host: real curl and raw TLS through the network and
secrets doors to a recording TLS origin on loopback, with the real Cedar engine as the
signer's policy.

The host `api.rules.test` is ruled (no secret bound: a rule alone makes the door read
it). Checked: allowed GETs pass and are recorded (`tkbox.http.request` beside an
`Http` decision); a DELETE and a POST outside the rules are refused with a 403 naming
the rule, recorded as `tkbox.http.refused`, and never reach the origin; an `ask` rule
waits for an answer from the host; the operator's Cedar policy refuses a DELETE the
rules allow; smuggling a second request past the rules inside a keep-alive tunnel
(Content-Length with Transfer-Encoding, two Content-Lengths, obs-fold, a request in a
body, a Host or an absolute-form target naming another host) never gets the origin a
request the rules did not allow.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from secretsdoor_rig import Origin, Rig, _Handler, make_ca, read_all, tunnel

from tkbox.doors.network import OperatorConfig
from tkbox.record.client import Action
from tkbox.record.testing import FakeSigner
from tkbox.signer.cedarpolicy import PolicyEngine

pytestmark = pytest.mark.integration

if shutil.which("curl") is None:
    pytest.skip("curl is not installed", allow_module_level=True)

HOST = "api.rules.test"
RULES = ("GET HEAD /**; POST /repos/acme/app/pulls; ask DELETE /repos/acme/app/git/refs/**; "
         "DELETE /tmp/**; refuse * /admin/**")
OPERATOR_POLICY = """
@id("no-delete-in-tmp")
@reason("the operator refuses DELETE under /tmp on every host")
forbid (principal, action == Action::"Http", resource)
when { context.resource.method == "DELETE" && context.resource.path like "/tmp/*" };
"""


class _AllMethods(_Handler):
    do_DELETE = _Handler._serve
    do_PATCH = _Handler._serve

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
        self.log.append({"method": "HEAD", "path": self.path, "headers": [], "body": b""})
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("rules")
    ca, cert, key = make_ca(d, [HOST])
    origin = Origin(cert, key, _AllMethods)
    hosts = d / "hosts"
    hosts.write_text(f"127.0.0.1 {HOST}\n")
    policy = d / "policy.cedar"
    policy.write_text(OPERATOR_POLICY)
    engine = PolicyEngine(policy)

    def decide(run: str, action: Action, resource: Any, context: Any) -> tuple[bool, str]:
        dec = engine.decide(run, action, dict(resource), dict(context))
        return dec.allowed, dec.reason

    op = OperatorConfig.from_flags(permit=["127.0.0.1/32"], hosts_file=hosts)
    rig = Rig([f"{HOST}:{origin.port} {RULES}"], op, [], [ca.read_text()],
              signer=FakeSigner(policy=decide), approval_wait=30)
    assert rig.mitm.ca_pem is not None
    box_ca = d / "box-ca.pem"
    box_ca.write_text(rig.mitm.ca_pem)
    yield {"rig": rig, "origin": origin, "port": origin.port, "box_ca": box_ca, "dir": d}
    rig.close()
    origin.close()


def curl(w: dict[str, Any], method: str, path: str, *extra: str
         ) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(w["dir"])}
    return subprocess.run(
        ["curl", "-sS", "--max-time", "60", "--proxy", w["rig"].proxy, "--cacert",
         str(w["box_ca"]), "-X", method, "-D", "-", "-w", "\n%{http_code}", *extra,
         f"https://{HOST}:{w['port']}{path}"],
        capture_output=True, text=True, env=env, timeout=90)


def bodies(w: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r["body"] for r in w["rig"].records(kind)]


def seen(w: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["method"], e["path"]) for e in w["origin"].log]


def test_allowed_gets_pass_and_each_is_recorded(w: dict[str, Any]) -> None:
    for path in ("/repos/acme/app", "/repos/acme/app/pulls?state=open"):
        p = curl(w, "GET", path)
        assert p.stdout.endswith("200"), p.stdout + p.stderr
        assert ("GET", path) in seen(w)
    reqs = bodies(w, "tkbox.http.request")
    last = reqs[-1]
    assert last["method"] == "GET" and last["path"] == "/repos/acme/app/pulls?state=open"
    assert last["status"] == 200 and last["rule"] == "GET HEAD /**" and last["bytes_down"] > 0
    decision = next(r for r in w["rig"].records("tkbox.decision") if r["id"] == last["decision"])
    assert decision["action"] == "Http" and decision["allowed"] is True
    assert decision["resource"] == {"host": HOST, "port": w["port"], "method": "GET",
                                    "path": "/repos/acme/app/pulls?state=open"}
    assert decision["context"]["rule"] == "GET HEAD /**"


@pytest.mark.parametrize("method,path,why", [
    ("DELETE", "/repos/acme/app", f"no rule of {HOST}:"),
    ("POST", "/repos/acme/app/issues", f"no rule of {HOST}:"),
    ("PATCH", "/repos/acme/app/pulls", f"no rule of {HOST}:"),
    ("GET", "/admin/users", "matches the rule 'refuse * /admin/**'"),
    ("GET", "/Admin/users", "matches the rule 'refuse * /admin/**'"),
    ("GET", "/x/..%2Fadmin/users", "ambiguous"),
])
def test_requests_outside_the_rules_are_refused_naming_the_rule(
        w: dict[str, Any], method: str, path: str, why: str) -> None:
    before = len(w["origin"].log)
    p = curl(w, method, path, "--path-as-is")
    assert p.stdout.endswith("403"), p.stdout + p.stderr
    assert why in p.stdout and "x-tkbox-reason: refused:" in p.stdout.lower()
    assert len(w["origin"].log) == before  # nothing of it reached the origin
    refused = bodies(w, "tkbox.http.refused")[-1]
    assert refused["method"] == method and refused["path"] == path and refused["host"] == HOST
    assert why in refused["reason"]


def test_an_ask_rule_waits_for_an_answer_from_the_host(w: dict[str, Any]) -> None:
    rig = w["rig"]
    path = "/repos/acme/app/git/refs/heads/tmp"
    out: dict[str, subprocess.CompletedProcess[str]] = {}
    t = threading.Thread(target=lambda: out.setdefault("p", curl(w, "DELETE", path)))
    t.start()
    deadline = time.monotonic() + 30
    pending = []
    while time.monotonic() < deadline and not pending:
        pending = [p for p in rig.board.list() if p.method == "DELETE"]
        time.sleep(0.1)
    assert pending, "no approval opened for the request"
    assert pending[0].path == path and pending[0].host == HOST
    assert ("DELETE", path) not in seen(w)  # it waits: nothing reached the origin yet
    rig.call(rig.board.answer("box", pending[0].id, True, via="cli"))
    t.join(60)
    assert out["p"].stdout.endswith("200"), out["p"].stdout
    assert ("DELETE", path) in seen(w)
    approvals = [b for b in bodies(w, "tkbox.approval") if b.get("method") == "DELETE"]
    assert [a["state"] for a in approvals] == ["pending", "approved"]
    assert approvals[-1]["path"] == path and approvals[-1]["by"] == "a person on the host"


def test_the_operators_cedar_policy_refuses_a_delete_the_rules_allow(w: dict[str, Any]) -> None:
    before = len(w["origin"].log)
    p = curl(w, "DELETE", "/tmp/scratch")
    assert p.stdout.endswith("403"), p.stdout
    assert "refused by policy: the operator refuses DELETE under /tmp" in p.stdout
    assert len(w["origin"].log) == before
    d = [r for r in w["rig"].records("tkbox.decision") if r["action"] == "Http"][-1]
    assert d["allowed"] is False and d["resource"]["method"] == "DELETE"


def _raw(w: dict[str, Any], data: bytes) -> bytes:
    s = tunnel(w, HOST)
    s.sendall(data)
    got = read_all(s)
    s.close()
    return got


HEAD = f"Host: {HOST}\r\n"
INNER = f"DELETE /repos/acme/app HTTP/1.1\r\n{HEAD}\r\n"


def _statuses(got: bytes) -> list[int]:
    """The status of each response the guest got (status lines at a line's start)."""
    return [int(m) for m in re.findall(rb"(?:^|\n)HTTP/1\.1 (\d{3}) ", got)]


@pytest.mark.parametrize("name,second", [
    ("content-length and transfer-encoding",
     f"POST /repos/acme/app/pulls HTTP/1.1\r\n{HEAD}Content-Length: 4\r\n"
     "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nDELETE /repos/acme/app HTTP/1.1\r\n"
     f"{HEAD}\r\n"),
    ("two content-lengths",
     f"POST /repos/acme/app/pulls HTTP/1.1\r\n{HEAD}Content-Length: 0\r\n"
     f"Content-Length: 40\r\n\r\nDELETE /repos/acme/app HTTP/1.1\r\n{HEAD}\r\n"),
    ("an override header in obs-fold",
     f"GET /repos/acme/app HTTP/1.1\r\n{HEAD}X-HTTP-Method-Override:\r\n DELETE\r\n\r\n"),
    ("a request inside a body",
     f"POST /repos/acme/app/pulls HTTP/1.1\r\n{HEAD}Content-Length: {len(INNER)}\r\n"
     "Connection: close\r\n\r\n" + INNER),
    ("another host",
     "DELETE /repos/acme/app HTTP/1.1\r\nHost: other.test\r\n\r\n"),
    ("an absolute-form target",
     f"DELETE https://{HOST}/repos/acme/app HTTP/1.1\r\n{HEAD}\r\n"),
    ("a lower-case method", f"delete /repos/acme/app HTTP/1.1\r\n{HEAD}\r\n"),
    # HTTP/2 is not offered on a read host: its pseudo-headers and preface are refused
    ("an HTTP/2 pseudo-header",
     f"GET /repos/acme/app HTTP/1.1\r\n{HEAD}:method: DELETE\r\n\r\n"),
    ("the HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
])
def test_smuggling_between_keep_alive_requests_never_reaches_the_origin(
        w: dict[str, Any], name: str, second: str) -> None:
    """Attack: a clean first request, then one crafted so that the door and the origin
    could read different requests. The origin only ever gets requests the rules allow,
    each exactly as the door read it (h11 writes what it parsed, never the guest's
    bytes)."""
    before = len(w["origin"].log)
    first = f"GET /repos/acme/app HTTP/1.1\r\n{HEAD}\r\n"
    got = _raw(w, (first + second).encode())
    assert got.startswith(b"HTTP/1.1 200 "), got[:300]
    new = seen(w)[before:]
    assert new[0] == ("GET", "/repos/acme/app")
    assert all(m in ("GET", "HEAD") or (m, p) == ("POST", "/repos/acme/app/pulls")
               for m, p in new), new
    assert ("DELETE", "/repos/acme/app") not in new
    if name == "a request inside a body":
        # the body is a body: the origin gets one POST carrying it, answered 200
        assert new == [("GET", "/repos/acme/app"), ("POST", "/repos/acme/app/pulls")]
        assert _statuses(got) == [200, 200]
    else:
        # the second request is refused by the door (400 or 403), never relayed
        assert new == [("GET", "/repos/acme/app")], new
        statuses = _statuses(got)
        assert statuses[0] == 200 and statuses[1:] in ([400], [403]), got[-400:]


def test_a_refusal_never_keeps_the_tunnel_for_a_second_try(w: dict[str, Any]) -> None:
    """After a refused request the tunnel ends: nothing sent behind it is read."""
    before = len(w["origin"].log)
    got = _raw(w, f"DELETE /repos/acme/app HTTP/1.1\r\n{HEAD}\r\n"
                  f"GET /repos/acme/app HTTP/1.1\r\n{HEAD}\r\n".encode())
    assert _statuses(got) == [403]
    assert len(w["origin"].log) == before
    assert "DELETE" in json.dumps(bodies(w, "tkbox.http.refused")[-1])


def test_a_request_waiting_for_a_person_ends_when_the_box_stops(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A stop cuts a request an `ask` rule holds at once: the approval ends as
    `stopped`, the tunnel's completion says `box stopped`, the origin never hears of
    the request."""
    d = tmp_path_factory.mktemp("rules-stop")
    ca, cert, key = make_ca(d, [HOST])
    origin = Origin(cert, key, _AllMethods)
    hosts = d / "hosts"
    hosts.write_text(f"127.0.0.1 {HOST}\n")
    op = OperatorConfig.from_flags(permit=["127.0.0.1/32"], hosts_file=hosts)
    rig = Rig([f"{HOST}:{origin.port} ask DELETE /**"], op, [], [ca.read_text()],
              approval_wait=60)
    try:
        assert rig.mitm.ca_pem is not None
        box_ca = d / "box-ca.pem"
        box_ca.write_text(rig.mitm.ca_pem)
        w = {"rig": rig, "port": origin.port, "box_ca": box_ca, "dir": d}
        out: dict[str, subprocess.CompletedProcess[str]] = {}
        t = threading.Thread(target=lambda: out.setdefault("p", curl(w, "DELETE", "/x")))
        t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not rig.board.list():
            time.sleep(0.1)
        assert rig.board.list(), "no approval opened"
        started = time.monotonic()
        rig.call(rig.door.close())
        t.join(30)
        assert time.monotonic() - started < 15
        assert not out["p"].stdout.endswith("200")
        assert origin.log == []
        states = [r["body"]["state"] for r in rig.records("tkbox.approval")]
        assert states == ["pending", "stopped"]
        [c] = rig.records("tkbox.complete")
        assert c["outcome"]["ended"] == "box stopped"
    finally:
        rig.close()
        origin.close()
