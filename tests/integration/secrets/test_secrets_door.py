"""Real curl through the network door and the secrets door, to TLS origins on loopback.

The client holds only the placeholder and trusts only the box CA (as in a box).
The origin trusts nothing of ours: its own test CA, mapped by an egress-hosts
file and permitted on 127.0.0.1, as an operator's mirror would be.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from secretsdoor_rig import NAMES, Origin, Rig, make_ca, read_all, tunnel

from tkbox.doors.network import OperatorConfig
from tkbox.doors.secrets import Secret, SecretSpec

pytestmark = pytest.mark.integration

if shutil.which("curl") is None:
    pytest.skip("curl is not installed", allow_module_level=True)

VALUE = b"ghp_RealTokenValue0123456789"
PH = b"tkbox_GH_5f1d3c2b1a0998877665544332211000"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("secrets")
    ca, cert, key = make_ca(d)
    origin = Origin(cert, key)
    hosts = d / "hosts"
    hosts.write_text("127.0.0.1 " + " ".join(NAMES) + "\n")
    op = OperatorConfig.from_flags(permit=["127.0.0.1/32"], hosts_file=hosts)
    port = origin.port
    sec = Secret(SecretSpec("GH", "env", "GH", ("api.bound.test",),
                            ports=(("api.bound.test", port),)), VALUE, PH)
    rig = Rig([f"{n}:{port}" for n in NAMES], op, [sec], [ca.read_text()],
              model_hosts=["api.anthropic.com"], inspect=["other.test"])
    box_ca = d / "box-ca.pem"
    assert rig.mitm.ca_pem is not None
    box_ca.write_text(rig.mitm.ca_pem)
    yield {"rig": rig, "origin": origin, "port": port, "box_ca": box_ca, "dir": d}
    rig.close()
    origin.close()


def curl(w: dict[str, Any], url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(w["dir"])}
    return subprocess.run(
        ["curl", "-sS", "--max-time", "60", "--proxy", w["rig"].proxy,
         "--cacert", str(w["box_ca"]), "-w", "\n%{http_code}", *extra, url],
        capture_output=True, text=True, env=env, timeout=90)


def last(w: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = w["origin"].log[-1]
    return entry


def test_bearer_placeholder_swapped_for_the_bound_host_only(world: dict[str, Any]) -> None:
    """The real value leaves only in the bound header to the bound host."""
    n = len(world["origin"].log)
    p = curl(world, f"https://api.bound.test:{world['port']}/user",
             "-H", f"Authorization: Bearer {PH.decode()}")
    assert p.stdout.endswith("200"), p.stderr
    got = last(world)
    assert ("authorization", f"Bearer {VALUE.decode()}") in got["headers"]
    assert len(world["origin"].log) == n + 1
    uses = world["rig"].records("tkbox.secret.use")
    assert uses and uses[-1]["body"] == {"name": "GH", "host": "api.bound.test",
                                         "header": "authorization"}


def test_basic_auth_user_and_password_swapped(world: dict[str, Any]) -> None:
    p = curl(world, f"https://api.bound.test:{world['port']}/simple/",
             "-u", f"x-access-token:{PH.decode()}")
    assert p.stdout.endswith("200"), p.stderr
    auth = dict(last(world)["headers"])["authorization"]
    assert base64.b64decode(auth.split()[1]) == b"x-access-token:" + VALUE


@pytest.mark.parametrize("args,where", [
    (["-H", f"X-Debug: {PH.decode()}"], "header X-Debug"),
    (["--data-binary", base64.b64encode(b"k=" + VALUE).decode()], "body"),
    (["-H", "Transfer-Encoding: chunked", "--data-binary", "a=" + VALUE.hex().upper()], "body"),
])
def test_leak_to_the_bound_host_is_blocked(world: dict[str, Any], args: list[str],
                                           where: str) -> None:
    """Attack: the placeholder or value elsewhere in a request to the bound host."""
    before = len(world["origin"].log)
    p = curl(world, f"https://api.bound.test:{world['port']}/x", *args, "-D", "-")
    assert p.stdout.endswith("403"), p.stderr
    assert "secret GH" in p.stdout and VALUE.decode() not in p.stdout
    leak = world["rig"].records("tkbox.secret.leak")[-1]["body"]
    assert leak["name"] == "GH" and leak["where"] == where
    assert VALUE.decode() not in json.dumps(leak)
    # nothing of a blocked head reached the origin; a blocked body never completed
    if where.startswith("header"):
        assert len(world["origin"].log) == before


def test_placeholder_to_an_unbound_inspected_host_is_blocked(world: dict[str, Any]) -> None:
    """Attack: the guest sends its placeholder (or the value) to a model host it may reach."""
    p = curl(world, f"https://api.anthropic.com:{world['port']}/v1/messages",
             "-H", f"x-api-key: {PH.decode()}", "--data-binary", "{}")
    assert p.stdout.endswith("403")


def test_reflected_value_is_redacted(world: dict[str, Any]) -> None:
    """Attack: recover the value from a host that reflects it (the bound host echoes)."""
    p = curl(world, f"https://api.bound.test:{world['port']}/echo",
             "-H", f"Authorization: token {PH.decode()}")
    assert p.stdout.endswith("200"), p.stderr
    assert VALUE.decode() not in p.stdout
    assert "token " + "*" * len(VALUE) in p.stdout


def test_model_call_recorded_with_model_and_usage(world: dict[str, Any]) -> None:
    for stream in (False, True):
        body = json.dumps({"model": "claude-test-1", "max_tokens": 5, "stream": stream,
                           "messages": [{"role": "user", "content": "hi"}]})
        p = curl(world, f"https://api.anthropic.com:{world['port']}/v1/messages",
                 "-H", "content-type: application/json", "--data-binary", body)
        assert p.stdout.endswith("200"), p.stderr
        call = world["rig"].records("tkbox.model.call")[-1]["body"]
        assert call["host"] == "api.anthropic.com" and call["path"] == "/v1/messages"
        assert call["status"] == 200 and call["model"] == "claude-test-1"
        assert call["usage"] == ({"input_tokens": 23, "output_tokens": 42} if stream
                                 else {"input_tokens": 11, "output_tokens": 7})


def test_keep_alive_requests_each_inspected(world: dict[str, Any]) -> None:
    """Attack: a clean first request, then a leaking one on the same connection."""
    url = f"https://api.bound.test:{world['port']}/a"
    common = ["--proxy", world["rig"].proxy, "--cacert", str(world["box_ca"]),
              "-w", "\n%{http_code} %{num_connects}\n"]
    before = len(world["rig"].records("tkbox.decision"))
    p = subprocess.run(["curl", "-sS", *common, "-H", f"Authorization: Bearer {PH.decode()}",
                        url, "--next", *common, "-H", f"X-Sneak: {PH.decode()}", url],
                       capture_output=True, text=True, timeout=90)
    assert "200 1" in p.stdout and "403 0" in p.stdout, p.stdout + p.stderr
    assert len(world["rig"].records("tkbox.decision")) == before + 1  # one tunnel


def test_plain_http_carrying_a_placeholder_is_refused(world: dict[str, Any]) -> None:
    """Attack: send the placeholder (or value) over plain http, which is never read as TLS."""
    p = subprocess.run(["curl", "-sS", "--proxy", world["rig"].proxy, "-w", "\n%{http_code}",
                        f"http://other.test:{world['port']}/?q=" + PH.hex()],
                       capture_output=True, text=True, timeout=60)
    assert p.stdout.endswith("403") and "secret GH" in p.stdout
    assert world["rig"].records("tkbox.secret.leak")[-1]["body"]["where"] == "URL"


@pytest.mark.parametrize("trailer", [PH, base64.b64encode(VALUE), VALUE.hex().encode()])
def test_leak_in_chunked_trailers_is_blocked(world: dict[str, Any], trailer: bytes) -> None:
    """Attack: hide the placeholder or value in a trailer after a clean chunked body."""
    s = tunnel(world, "api.bound.test")
    before = len(world["origin"].log)
    s.sendall(f"POST /t HTTP/1.1\r\nHost: api.bound.test:{world['port']}\r\n"
              "Transfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n".encode()
              + b"5\r\nhello\r\n0\r\nX-T: " + trailer + b"\r\n\r\n")
    got = read_all(s)
    s.close()
    assert got.startswith(b"HTTP/1.1 403") and b"trailer header X-T" in got
    assert len(world["origin"].log) == before  # the origin never got a complete request


def test_value_split_across_body_chunks_never_reaches_the_origin(world: dict[str, Any]) -> None:
    """Attack: send the value a few bytes per TLS record, hoping each piece passes alone."""
    s = tunnel(world, "api.bound.test")
    body = b"data=" + VALUE + b"&end=1"
    s.sendall(f"POST /split HTTP/1.1\r\nHost: api.bound.test:{world['port']}\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode())
    for i in range(0, len(body), 3):
        s.sendall(body[i:i + 3])
    got = read_all(s)
    s.close()
    assert got.startswith(b"HTTP/1.1 403")
    # The head may have gone on; the body was held back by the scanner's span and then
    # cut. Whether the origin logs the cut request, and when, is its own business (it
    # raced the 403 under load): give it a moment, then check whatever it saw.
    time.sleep(1.0)
    bodies = [e["body"] for e in world["origin"].log if e["path"] == "/split"]
    assert all(VALUE[:6] not in b and b"data=" not in b for b in bodies)


def test_inspect_all_reads_unbound_hosts_and_catches_the_placeholder(world: dict[str, Any]) -> None:
    """Under inspection, an unbound host is read: clean requests pass, a placeholder does not."""
    url = f"https://other.test:{world['port']}/page"
    ok = curl(world, url)
    assert ok.stdout.endswith("200"), ok.stderr
    assert dict(last(world)["headers"]).get("accept-encoding") == "identity"  # it was read
    bad = curl(world, url, "-H", f"Authorization: Bearer {PH.decode()}")
    assert bad.stdout.endswith("403") and "secret GH" in bad.stdout
    leak = world["rig"].records("tkbox.secret.leak")[-1]["body"]
    assert leak["host"] == "other.test" and leak["kind"] == "placeholder"


def test_value_in_the_proxy_target_host_is_never_recorded(world: dict[str, Any]) -> None:
    """Attack: CONNECT to <value>.example, so the value lands in approval or refusal records."""
    host = VALUE.decode().lower().replace("_", "-") + ".example"
    p = subprocess.run(["curl", "-sS", "--proxy", world["rig"].proxy, "-w", "\n%{http_code}",
                        f"https://{host}/"], capture_output=True, text=True, timeout=60)
    assert "403" in p.stdout + p.stderr
    leak = world["rig"].records("tkbox.secret.leak")[-1]["body"]
    assert leak["where"] == "proxy target host" and leak["host"] == "(withheld)"
    everything = json.dumps(world["rig"].records())
    assert VALUE.decode().lower().replace("_", "-") not in everything.lower()


@pytest.mark.parametrize("sni", ["other.test", None])
def test_client_hello_must_name_the_tunnels_host(world: dict[str, Any], sni: str | None) -> None:
    """Attack: open a tunnel to a bound host, then speak TLS for another name (or none)."""
    raw = socket.create_connection(("127.0.0.1", world["rig"].port), timeout=30)
    raw.sendall(f"CONNECT api.bound.test:{world['port']} HTTP/1.1\r\n"
                "Host: api.bound.test\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += raw.recv(4096)
    ctx = ssl.create_default_context(cafile=str(world["box_ca"]))
    ctx.check_hostname = False
    with pytest.raises((ssl.SSLError, ConnectionError)):
        ctx.wrap_socket(raw, server_hostname=sni).sendall(b"GET / HTTP/1.1\r\n\r\n")
    raw.close()


@pytest.mark.parametrize("spelled", ["API.Bound.Test", "api.bound.test.", "Api.BOUND.test.:{port}",
                                     "api.bound.test", " api.bound.test:{port}\t"])
def test_the_origin_gets_the_tunnels_canonical_host_not_the_guests_spelling(
        world: dict[str, Any], spelled: str) -> None:
    """Attack: a spelling of the bound name that an origin matching names exactly would
    route to another site (its default one) on the same address."""
    s = tunnel(world, "api.bound.test")
    before = len(world["origin"].log)
    host = spelled.format(port=world["port"])
    s.sendall(f"GET /h HTTP/1.1\r\nHost:{host}\r\nConnection: close\r\n\r\n".encode())
    got = read_all(s)
    s.close()
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    (req,) = world["origin"].log[before:]
    assert [v for k, v in req["headers"] if k == "host"] == [f"api.bound.test:{world['port']}"]
