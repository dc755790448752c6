"""What, not only who: method and path rules in a real box, with real git and curl.

One TLS server on loopback (a test CA the daemon trusts with --ca-cert; names mapped
with --egress-hosts; 127.0.0.1 reached through --egress-permit) stands in for a
GitHub Enterprise Server at `git.test` (git smart HTTP through `git http-backend`,
with pushes enabled, so that only the door can refuse one) and for a REST API at
`api.rules.test`. The box is allowed:

- `github-read@git.test:PORT`: the `github-read` preset aimed at the stand-in: git
  clone and fetch (`git-upload-pack`) and GETs on `/api/v3`, nothing else;
- `api.rules.test:PORT GET HEAD /**; ask DELETE /repos/acme/app/git/refs/**`.

No secret is bound: the rules alone make the door read both hosts.
"""

from __future__ import annotations

import http.server
import json
import os
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_stack import TKBOX, Stack, export_verified, fresh_name, make_home, stack_env

from tkbox.image.testing import ScratchCA


def make_repo(root: Path) -> Path:
    src = root / "src"
    src.mkdir()
    (src / "hello.txt").write_text("from the stand-in\n")
    g = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", "-C", str(src)]
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True)
    subprocess.run([*g, "add", "."], check=True)
    subprocess.run([*g, "commit", "-qm", "init"], check=True)
    bare = root / "www" / "acme" / "app.git"
    bare.parent.mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(bare)], check=True)
    # pushes would be taken: only the door stands between the box and a push
    subprocess.run(["git", "-C", str(bare), "config", "http.receivepack", "true"], check=True)
    return src


def handler(www: Path, log: list[tuple[str, str]]) -> type[http.server.BaseHTTPRequestHandler]:
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b""):
                            pass
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            n = int(self.headers.get("content-length") or 0)
            return self.rfile.read(n) if n else b""

        def _send(self, code: int, body: bytes, ctype: str = "application/json",
                  extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _serve(self) -> None:
            body = self._body()
            host = self.headers.get("host", "").split(":")[0]
            log.append((self.command, f"{host}{self.path}"))
            if host == "api.rules.test":
                self._send(200, json.dumps({"method": self.command, "path": self.path}).encode())
                return
            path, _, query = self.path.partition("?")
            env = {"GIT_PROJECT_ROOT": str(www), "GIT_HTTP_EXPORT_ALL": "1",
                   "PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": self.command,
                   "CONTENT_TYPE": self.headers.get("content-type", ""),
                   "CONTENT_LENGTH": str(len(body)), "REMOTE_USER": "e2e",
                   "REMOTE_ADDR": "127.0.0.1", "PATH": os.environ["PATH"],
                   "HTTP_GIT_PROTOCOL": self.headers.get("git-protocol", "")}
            out = subprocess.run(["git", "http-backend"], input=body, env=env,
                                 capture_output=True, timeout=60).stdout
            head, _, payload = out.partition(b"\r\n\r\n")
            code, headers = 200, {}
            for line in head.split(b"\r\n"):
                k, _, v = line.decode().partition(":")
                if k.lower() == "status":
                    code = int(v.split()[0])
                elif k:
                    headers[k.strip()] = v.strip()
            ctype = headers.pop("Content-Type", "application/octet-stream")
            self._send(code, payload, ctype, headers)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

    return H


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("rules")
    ca = ScratchCA.create(tmp, ["git.test", "api.rules.test"])
    src = make_repo(tmp)
    log: list[tuple[str, str]] = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler(tmp / "www", log))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(ca.cert_pem, ca.key_pem)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    hosts = tmp / "hosts"
    hosts.write_text("127.0.0.1 git.test api.rules.test\n")
    home = make_home(tmp)
    s = Stack(home, stack_env(home))
    s.start_signer()
    s.start_daemon("--egress-permit", "127.0.0.1/32", "--egress-hosts", str(hosts),
                   "--ca-cert", str(ca.ca_pem), "--approval-wait", "60")
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "x").write_text("x\n")
    name = fresh_name("rules")
    s.tk("run", "--name", name, "--workspace", str(ws),
         "--allow", f"github-read@git.test:{port}",
         "--allow", f"api.rules.test:{port} GET HEAD /**; ask DELETE /repos/acme/app/git/refs/**")
    yield {"stack": s, "box": name, "port": port, "tmp": tmp, "log": log, "src": src}
    s.tk("rm", "--force", name, check=False)
    for n in list(s.procs):
        s.stop(n)
    httpd.shutdown()
    httpd.server_close()


def sh(w: dict[str, Any], script: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    s: Stack = w["stack"]
    return s.tk("exec", str(w["box"]), "--", "sh", "-c", script, check=check, timeout=300)


def test_git_clone_and_fetch_work_under_github_read(world: dict[str, Any]) -> None:
    url = f"https://git.test:{world['port']}/acme/app.git"
    r = sh(world, f"cd /tmp && git clone -q {url} app && cat app/hello.txt", check=True)
    assert r.stdout == "from the stand-in\n"
    src = world["src"]
    (src / "more.txt").write_text("fetched later\n")
    g = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", "-C", str(src)]
    subprocess.run([*g, "add", "."], check=True)
    subprocess.run([*g, "commit", "-qm", "more"], check=True)
    bare = world["tmp"] / "www" / "acme" / "app.git"
    subprocess.run([*g, "push", "-q", str(bare), "main"], check=True)
    r = sh(world, "cd /tmp/app && git fetch -q origin && git show origin/main:more.txt",
           check=True)
    assert r.stdout == "fetched later\n"


def test_git_push_is_refused_with_a_message_naming_the_rule(world: dict[str, Any]) -> None:
    before = subprocess.run(["git", "-C", str(world["tmp"] / "www" / "acme" / "app.git"),
                             "rev-parse", "main"], capture_output=True, text=True).stdout
    r = sh(world, "cd /tmp/app && git -c user.name=b -c user.email=b@b.invalid "
                  "commit -q --allow-empty -m from-the-box && git push origin HEAD:main 2>&1; "
                  "echo rc=$?")
    assert "rc=0" not in r.stdout, r.stdout
    assert (f"remote: refused: no rule of git.test:{world['port']} allows GET "
            "/acme/app.git/info/refs?service=git-receive-pack") in r.stdout, r.stdout
    after = subprocess.run(["git", "-C", str(world["tmp"] / "www" / "acme" / "app.git"),
                            "rev-parse", "main"], capture_output=True, text=True).stdout
    assert before == after
    assert not [p for m, p in world["log"] if "receive-pack" in p]


def test_rest_gets_pass_and_writes_outside_the_rules_are_refused(world: dict[str, Any]) -> None:
    base = f"https://api.rules.test:{world['port']}"
    r = sh(world, f"curl -sS -m 60 {base}/repos/acme/app", check=True)
    assert json.loads(r.stdout) == {"method": "GET", "path": "/repos/acme/app"}
    for method, path in (("DELETE", "/repos/acme/app"), ("POST", "/repos/acme/app/issues")):
        r = sh(world, f"curl -sS -m 60 -i -X {method} -d '{{}}' {base}{path}")
        assert "HTTP/1.1 403" in r.stdout, r.stdout
        assert f"no rule of api.rules.test:{world['port']} allows {method} {path}" in r.stdout
        assert (method, f"api.rules.test{path}") not in world["log"]


def test_an_ask_rule_waits_and_is_approved_from_the_host(world: dict[str, Any]) -> None:
    s: Stack = world["stack"]
    path = "/repos/acme/app/git/refs/heads/tmp"
    url = f"https://api.rules.test:{world['port']}{path}"
    with subprocess.Popen([*TKBOX, "exec", str(world["box"]), "--", "sh", "-c",
                           f"curl -sS -m 120 -X DELETE {url}; echo; echo rc=$?"],
                          env=s.env, stdout=subprocess.PIPE) as proc:
        deadline = time.monotonic() + 90
        pending: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not pending:
            items = json.loads(s.tk("approvals", "--json").stdout)
            pending = [i for i in items if i.get("method") == "DELETE"]
            time.sleep(0.5)
        assert pending, "the DELETE never waited for a person"
        assert pending[0]["path"] == path and pending[0]["host"] == "api.rules.test"
        assert ("DELETE", f"api.rules.test{path}") not in world["log"]
        human = s.tk("approvals").stdout
        assert "DELETE" in human, human  # the table shows the request (it may fold the path)
        s.tk("approve", str(pending[0]["box"]), str(pending[0]["id"]))
        out = proc.communicate(timeout=120)[0].decode()
    assert '"method": "DELETE"' in out and "rc=0" in out, out
    assert ("DELETE", f"api.rules.test{path}") in world["log"]


def test_the_bundle_records_both_what_passed_and_what_was_refused(world: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    """Runs last: the box stops, its run is exported and verified."""
    s: Stack = world["stack"]
    s.tk("stop", str(world["box"]))
    recs = export_verified(s, str(world["box"]), tmp_path)
    passed = [r["body"] for r in recs if r["kind"] == "tkbox.http.request"]
    refused = [r["body"] for r in recs if r["kind"] == "tkbox.http.refused"]
    decisions = [r["body"] for r in recs
                 if r["kind"] == "tkbox.decision" and r["body"]["action"] == "Http"]
    assert any(p["method"] == "POST" and p["path"].endswith("/git-upload-pack")
               and p["status"] == 200 for p in passed), passed
    assert any(p["path"].endswith("service=git-upload-pack") for p in passed)
    assert any(p["method"] == "DELETE" and p["status"] == 200 for p in passed)
    assert any("service=git-receive-pack" in r["path"] and r["host"] == "git.test"
               for r in refused), refused
    assert {("DELETE", "/repos/acme/app"), ("POST", "/repos/acme/app/issues")} <= {
        (r["method"], r["path"]) for r in refused}
    assert len(decisions) >= len(passed)
    approvals = [r["body"] for r in recs if r["kind"] == "tkbox.approval"
                 and r["body"].get("method") == "DELETE"]
    assert [a["state"] for a in approvals] == ["pending", "approved"]
