"""Real git through the doors under `github-read`: clone and fetch pass, push is refused
with a message git prints, naming the rule.

The origin is `git http-backend` behind a small TLS server on loopback (a test CA),
with pushes enabled, so that only the door stands between the client and a push. The
client is the host's own git, told to use the door as its proxy and to trust only the
box CA, as it is in a box (the e2e test runs the same in a real box).
"""

from __future__ import annotations

import http.server
import os
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secretsdoor_rig import Rig, make_ca

from tkbox.doors.network import OperatorConfig

pytestmark = pytest.mark.integration

if shutil.which("git") is None:
    pytest.skip("git is not installed", allow_module_level=True)

HOST = "git.rules.test"


def backend(www: Path, log: list[tuple[str, str]]) -> type[http.server.BaseHTTPRequestHandler]:
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def _serve(self) -> None:
            n = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(n) if n else b""
            log.append((self.command, self.path))
            path, _, query = self.path.partition("?")
            env = {"GIT_PROJECT_ROOT": str(www), "GIT_HTTP_EXPORT_ALL": "1",
                   "PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": self.command,
                   "CONTENT_TYPE": self.headers.get("content-type", ""),
                   "CONTENT_LENGTH": str(len(body)), "REMOTE_USER": "t",
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
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _serve

    return H


def git(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=check)


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("gitread")
    ca, cert, key = make_ca(d, [HOST])
    src = d / "src"
    git("init", "-q", "-b", "main", str(src))
    (src / "hello.txt").write_text("from the origin\n")
    git("add", ".", cwd=src)
    git("commit", "-qm", "init", cwd=src)
    bare = d / "www" / "acme" / "app.git"
    bare.parent.mkdir(parents=True)
    git("clone", "-q", "--bare", str(src), str(bare))
    git("-C", str(bare), "config", "http.receivepack", "true")
    log: list[tuple[str, str]] = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), backend(d / "www", log))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    hosts = d / "hosts"
    hosts.write_text(f"127.0.0.1 {HOST}\n")
    op = OperatorConfig.from_flags(permit=["127.0.0.1/32"], hosts_file=hosts)
    rig = Rig([f"github-read@{HOST}:{port}"], op, [], [ca.read_text()])
    assert rig.mitm.ca_pem is not None
    box_ca = d / "box-ca.pem"
    box_ca.write_text(rig.mitm.ca_pem)
    env = {"PATH": os.environ["PATH"], "HOME": str(d), "GIT_CONFIG_NOSYSTEM": "1",
           "HTTPS_PROXY": rig.proxy, "GIT_SSL_CAINFO": str(box_ca), "NO_PROXY": ""}
    yield {"rig": rig, "port": port, "env": env, "d": d, "src": src, "bare": bare, "log": log}
    rig.close()
    httpd.shutdown()
    httpd.server_close()


def test_clone_and_fetch_pass_push_is_refused_naming_the_rule(w: dict[str, Any]) -> None:
    url = f"https://{HOST}:{w['port']}/acme/app.git"
    clone = w["d"] / "clone"
    git("clone", "-q", url, str(clone), env=w["env"])
    assert (clone / "hello.txt").read_text() == "from the origin\n"
    (w["src"] / "more.txt").write_text("later\n")
    git("add", ".", cwd=w["src"])
    git("commit", "-qm", "more", cwd=w["src"])
    git("push", "-q", str(w["bare"]), "main", cwd=w["src"])
    for protocol in ("2", "0"):  # git's wire protocol v2 (its default) and v0
        git("-c", f"protocol.version={protocol}", "fetch", "-q", "origin", cwd=clone,
            env=w["env"])
    assert git("show", "origin/main:more.txt", cwd=clone).stdout == "later\n"
    before = git("-C", str(w["bare"]), "rev-parse", "main").stdout
    git("commit", "-q", "--allow-empty", "-m", "from the box", cwd=clone)
    p = git("push", "origin", "HEAD:main", cwd=clone, env=w["env"], check=False)
    assert p.returncode != 0
    assert (f"remote: refused: no rule of {HOST}:{w['port']} allows GET "
            "/acme/app.git/info/refs?service=git-receive-pack") in p.stderr, p.stderr
    assert git("-C", str(w["bare"]), "rev-parse", "main").stdout == before
    assert not [path for _, path in w["log"] if "receive-pack" in path]
    recs = w["rig"].records()
    passed = [r["body"] for r in recs if r["kind"] == "tkbox.http.request"]
    refused = [r["body"] for r in recs if r["kind"] == "tkbox.http.refused"]
    assert any(b["method"] == "POST" and b["path"] == "/acme/app.git/git-upload-pack"
               and b["status"] == 200 for b in passed), passed
    assert [b["path"] for b in refused] == [
        "/acme/app.git/info/refs?service=git-receive-pack"]
