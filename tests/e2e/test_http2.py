"""HTTP/2 in a real box: curl --http2 through the doors to an HTTP/2 origin stand-in.

The stand-in (`tkbox.doors.secrets.testing.H2Origin`, the `h2` library over TLS on
loopback; a test CA the daemon trusts with --ca-cert, its name mapped with
--egress-hosts, 127.0.0.1 reached through --egress-permit) serves `api.h2.test`.
The box is allowed `api.h2.test:PORT GET /**` and has a secret bound to it: the
door reads the host, offers h2 to the box because the origin speaks it, and
applies per stream what an HTTP/1.1 request gets.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_stack import Stack, export_verified, fresh_name, make_home, stack_env

from tkbox.doors.secrets.testing import H2Origin
from tkbox.image.testing import ScratchCA

HOST = "api.h2.test"
VALUE = "ghp_H2RealTokenValue0123456789abcd"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("h2")
    ca = ScratchCA.create(tmp, [HOST])
    origin = H2Origin(ca.cert_pem, ca.key_pem)
    port = origin.port
    hosts = tmp / "hosts"
    hosts.write_text(f"127.0.0.1 {HOST}\n")
    home = make_home(tmp)
    s = Stack(home, stack_env(home))
    s.env["GH_TOKEN"] = VALUE
    s.start_signer()
    s.start_daemon("--egress-permit", "127.0.0.1/32", "--egress-hosts", str(hosts),
                   "--ca-cert", str(ca.ca_pem))
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "x").write_text("x\n")
    name = fresh_name("h2")
    s.tk("run", "--name", name, "--workspace", str(ws),
         "--allow", f"{HOST}:{port} GET /**",
         "--secret", f"GH=env:GH_TOKEN@{HOST}:{port}")
    yield {"stack": s, "box": name, "port": port, "origin": origin}
    s.tk("rm", "--force", name, check=False)
    for n in list(s.procs):
        s.stop(n)
    origin.close()


def sh(w: dict[str, Any], script: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    s: Stack = w["stack"]
    return s.tk("exec", str(w["box"]), "--", "sh", "-c", script, check=check, timeout=300)


def test_a_ruled_get_passes_over_h2_with_the_secret_swapped(world: dict[str, Any]) -> None:
    url = f"https://{HOST}:{world['port']}/echo"
    r = sh(world, f'curl -sS --http2 -m 60 -w "\\n%{{http_version}} %{{http_code}}" '
                  f'-H "Authorization: Bearer $GH" {url}', check=True)
    body, _, tail = r.stdout.rpartition("\n")
    assert tail == "2 200", r.stdout + r.stderr
    echoed = json.loads(body)
    assert VALUE not in body  # reflected, and redacted on the way back
    assert ["authorization", "Bearer " + "*" * len(VALUE)] in echoed["headers"]
    got = [e for e in world["origin"].log if e["path"] == "/echo"][-1]
    assert ("authorization", f"Bearer {VALUE}") in got["headers"]  # swapped at the door


def test_a_post_is_refused_over_h2_with_a_403_naming_the_rule(world: dict[str, Any]) -> None:
    url = f"https://{HOST}:{world['port']}/echo"
    r = sh(world, f'curl -sS --http2 -m 60 -i -X POST -d "{{}}" {url}')
    assert "\r\nHTTP/2 403 \r\n" in r.stdout, r.stdout + r.stderr  # after the CONNECT
    assert f"no rule of {HOST}:{world['port']} allows POST /echo" in r.stdout
    assert not [e for e in world["origin"].log if e["method"] == "POST"]


def test_the_bundle_records_both_over_h2(world: dict[str, Any], tmp_path: Path) -> None:
    """Runs last: the box stops, its run is exported and verified."""
    s: Stack = world["stack"]
    s.tk("stop", str(world["box"]))
    recs = export_verified(s, str(world["box"]), tmp_path)
    passed = [r["body"] for r in recs if r["kind"] == "tkbox.http.request"]
    refused = [r["body"] for r in recs if r["kind"] == "tkbox.http.refused"]
    uses = [r["body"] for r in recs if r["kind"] == "tkbox.secret.use"]
    assert any(p["method"] == "GET" and p["path"] == "/echo" and p["status"] == 200
               for p in passed), passed
    assert any(r["method"] == "POST" and r["path"] == "/echo" for r in refused), refused
    assert any(u["name"] == "GH" and u["host"] == HOST for u in uses)
    http = [r["body"] for r in recs if r["kind"] == "tkbox.decision"
            and r["body"]["action"] == "Http"]
    assert http and all(d["context"]["http_version"] == "2" for d in http)
    assert VALUE not in json.dumps(recs)
