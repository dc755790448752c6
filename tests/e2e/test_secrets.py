"""Secrets never enter the box: real clients in a real box hold only placeholders.

The box gets `$GH` and `$ANTHROPIC_API_KEY` as placeholders. The origins are
TLS servers on loopback (a test CA the daemon trusts with --ca-cert; names
mapped with --egress-hosts; 127.0.0.1 reached through --egress-permit) that
accept a request only with the *real* value, and log every header they get:

- origin.test: a PEP 503 index wanting the token in Basic auth (pip), git
  smart HTTP (`git http-backend`) with the token, `/user` with Bearer (curl),
  `/echo` reflecting what it got (the guest must get the value back redacted);
- api.anthropic.com: a stand-in of the Messages API, JSON and SSE, wanting
  the key (in `x-api-key` or `Authorization: Bearer`, as SDK versions
  differ: both headers are bound); the `anthropic` SDK is pip-installed in the box from the index
  above (its wheels fetched on the host by pip, skipped if that fails).

At the end, everything the run left (daemon state, logs, console, bundle,
this test's captured outputs) is scanned for the values in every form.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_stack import Stack, fresh_name, make_home, stack_env

from tkbox import paths
from tkbox.doors.secrets.leaks import LeakScanner, patterns
from tkbox.image.testing import ScratchCA

GH_VALUE = "ghp_e2eRealTokenValue_7f3a9c"
AK_VALUE = "sk-ant-e2eRealKeyValue-4b8d2e"
ALL_OUTPUT: list[str] = []


def make_ca(tmp: Path) -> tuple[Path, Path, Path]:
    """A test CA and one leaf for the stand-ins' names (PEM files)."""
    ca = ScratchCA.create(tmp, ["origin.test", "api.anthropic.com"])
    return ca.ca_pem, ca.cert_pem, ca.key_pem


def _authorized(h: http.server.BaseHTTPRequestHandler) -> bool:
    auth = h.headers.get("authorization", "")
    if h.headers.get("x-api-key") == AK_VALUE:
        return True
    if auth in (f"Bearer {GH_VALUE}", f"token {GH_VALUE}", f"Bearer {AK_VALUE}"):
        return True
    if auth.startswith("Basic "):
        try:
            user, _, pw = base64.b64decode(auth[6:]).decode().partition(":")
        except ValueError:
            return False
        return GH_VALUE in (user, pw)
    return False


def make_handler(www: Path, log: list[dict[str, Any]]) -> type[http.server.BaseHTTPRequestHandler]:
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def _send(self, code: int, body: bytes, ctype: str = "text/plain",
                  extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _serve(self) -> None:
            n = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(n) if n else b""
            host = self.headers.get("host", "")
            log.append({"host": host, "path": self.path,
                        "headers": [(k.lower(), v) for k, v in self.headers.items()],
                        "body": body.decode("latin-1")})
            if not _authorized(self):
                self._send(401, b"token required\n", extra={
                    "www-authenticate": 'Basic realm="e2e"'})
                return
            path = self.path.split("?")[0]
            if path.startswith("/v1/messages"):
                self._messages(json.loads(body or b"{}"))
            elif path == "/user":
                self._send(200, b'{"login": "e2e"}', "application/json")
            elif path == "/echo":
                self._send(200, json.dumps(dict(self.headers.items())).encode(),
                           "application/json")
            elif path.startswith("/repo.git"):
                self._git(body)
            elif path.startswith(("/simple/", "/files/")):
                f = www / path.lstrip("/")
                if f.is_dir():
                    f = f / "index.html"
                if f.is_file():
                    ctype = "text/html" if f.suffix == ".html" else "application/octet-stream"
                    self._send(200, f.read_bytes(), ctype)
                else:
                    self._send(404, b"not found\n")
            else:
                self._send(404, b"not found\n")

        def _git(self, body: bytes) -> None:
            path, _, query = self.path.partition("?")
            env = {"GIT_PROJECT_ROOT": str(www), "GIT_HTTP_EXPORT_ALL": "1",
                   "PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": self.command,
                   "CONTENT_TYPE": self.headers.get("content-type", ""),
                   "CONTENT_LENGTH": str(len(body)), "PATH": os.environ["PATH"]}
            out = subprocess.run(["git", "http-backend"], input=body, env=env,
                                 capture_output=True, timeout=60).stdout
            head, _, payload = out.partition(b"\r\n\r\n")
            headers = {}
            code = 200
            for line in head.split(b"\r\n"):
                k, _, v = line.decode().partition(":")
                if k.lower() == "status":
                    code = int(v.split()[0])
                elif k:
                    headers[k.strip()] = v.strip()
            ctype = headers.pop("Content-Type", "application/octet-stream")
            self._send(code, payload, ctype, headers)

        def _messages(self, req: dict[str, Any]) -> None:
            model = str(req.get("model", "m"))
            if not req.get("stream"):
                self._send(200, json.dumps({
                    "id": "msg_e2e", "type": "message", "role": "assistant", "model": model,
                    "content": [{"type": "text", "text": "hello from the stand-in"}],
                    "stop_reason": "end_turn", "stop_sequence": None,
                    "usage": {"input_tokens": 11, "output_tokens": 7}}).encode(),
                    "application/json")
                return
            events = [
                ("message_start", {"type": "message_start", "message": {
                    "id": "msg_e2e", "type": "message", "role": "assistant", "model": model,
                    "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": 23, "output_tokens": 1}}}),
                ("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}}),
                ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                         "delta": {"type": "text_delta", "text": "streamed"}}),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                ("message_delta", {"type": "message_delta", "delta": {
                    "stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 42}}),
                ("message_stop", {"type": "message_stop"}),
            ]
            data = b"".join(f"event: {n}\ndata: {json.dumps(d)}\n\n".encode() for n, d in events)
            self._send(200, data, "text/event-stream")

        do_GET = _serve
        do_POST = _serve

    return H


def make_index(www: Path, wheels: list[Path]) -> None:
    """A PEP 503 simple index of these wheels."""
    (www / "files").mkdir(exist_ok=True)
    projects: dict[str, list[Path]] = {}
    for w in wheels:
        shutil.copy(w, www / "files" / w.name)
        proj = re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower()
        projects.setdefault(proj, []).append(w)
    for proj, ws in projects.items():
        d = www / "simple" / proj
        d.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="/files/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">'
            f"{w.name}</a>\n" for w in ws)
        (d / "index.html").write_text(f"<html><body>{links}</body></html>")


def make_repo(www: Path) -> None:
    src = www.parent / "gitsrc"
    src.mkdir()
    (src / "hello.txt").write_text("from the smart origin\n")
    g = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", "-C", str(src)]
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    subprocess.run([*g, "add", "."], check=True)
    subprocess.run([*g, "commit", "-qm", "init"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(www / "repo.git")], check=True)


def sdk_wheels(tmp: Path) -> list[Path]:
    """The anthropic SDK and its dependencies, fetched on the host by pip."""
    d = tmp / "wheels"
    p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                        "-d", str(d), "anthropic"], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return []
    return sorted(d.glob("*.whl"))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("secrets")
    ca, cert, key = make_ca(tmp)
    www = tmp / "www"
    www.mkdir()
    wheels = sdk_wheels(tmp)
    make_index(www, wheels)
    make_repo(www)
    log: list[dict[str, Any]] = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(www, log))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    hosts = tmp / "hosts"
    hosts.write_text("127.0.0.1 origin.test api.anthropic.com\n")
    home = make_home(tmp)
    s = Stack(home, stack_env(home))
    s.env.update({"GH_TOKEN": GH_VALUE, "AK": AK_VALUE})
    s.start_signer()
    s.start_daemon("--egress-permit", "127.0.0.1/32", "--egress-hosts", str(hosts),
                   "--ca-cert", str(ca))
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "README").write_text("a workspace\n")
    name = fresh_name("sec")
    r = s.tk("run", "--name", name, "--workspace", str(ws),
             "--allow", f"origin.test:{port}", "--allow", f"api.anthropic.com:{port}",
             "--secret", f"GH=env:GH_TOKEN@origin.test:{port}",
             "--secret",
             f"ANTHROPIC_API_KEY=env:AK@api.anthropic.com:{port};header=x-api-key,"
             "authorization")
    ALL_OUTPUT.extend([r.stdout, r.stderr])
    w = {"stack": s, "box": name, "port": port, "tmp": tmp, "log": log, "ws": ws,
         "wheels": wheels}
    yield w
    s.tk("rm", "--force", name, check=False)
    for p in list(s.procs):
        s.stop(p)
    httpd.shutdown()
    httpd.server_close()


def sh(w: dict[str, Any], script: str, check: bool = False
       ) -> subprocess.CompletedProcess[str]:
    s: Stack = w["stack"]
    r = s.tk("exec", str(w["box"]), "--", "sh", "-c", script, check=check, timeout=600)
    ALL_OUTPUT.extend([r.stdout, r.stderr])
    return r


def _headers_with(w: dict[str, Any], value: str) -> list[tuple[str, str, str]]:
    """(host, path, header) of every header an origin got that holds `value` (Basic decoded)."""
    out = []
    for e in w["log"]:
        for k, v in e["headers"]:
            plain = v
            if v.startswith("Basic "):
                plain += base64.b64decode(v[6:] + "==").decode("latin-1")
            if value in plain:
                out.append((e["host"].split(":")[0], e["path"], k))
    return out


def _files_holding_values(root: Path) -> list[str]:
    pats = patterns([("GH", "value", GH_VALUE.encode()),
                     ("ANTHROPIC_API_KEY", "value", AK_VALUE.encode())])
    found: list[str] = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("www", "wheels", "gitsrc")]
        for f in files:
            p = Path(dirpath) / f
            if p.is_symlink() or not p.is_file():
                continue
            sc = LeakScanner(pats)
            with open(p, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    if sc.feed(chunk):
                        found.append(str(p))
                        break
    return found


def test_the_box_holds_only_placeholders(world: dict[str, Any]) -> None:
    r = sh(world, 'echo "$GH $ANTHROPIC_API_KEY"; env', check=True)
    assert re.search(r"^tkbox_GH_[0-9a-f]{32} tkbox_ANTHROPIC_API_KEY_[0-9a-f]{32}$",
                     r.stdout.splitlines()[0])
    assert GH_VALUE not in r.stdout and AK_VALUE not in r.stdout


def test_curl_bearer_swapped_for_the_bound_host(world: dict[str, Any]) -> None:
    r = sh(world, f'curl -sS -m 60 -H "Authorization: Bearer $GH" '
                  f"https://origin.test:{world['port']}/user", check=True)
    assert r.stdout == '{"login": "e2e"}'
    assert ("origin.test", "/user", "authorization") in _headers_with(world, GH_VALUE)


def test_reflected_value_comes_back_redacted(world: dict[str, Any]) -> None:
    """Attack: a host that reflects the request hands the value to the guest."""
    r = sh(world, f'curl -sS -m 60 -H "Authorization: token $GH" '
                  f"https://origin.test:{world['port']}/echo", check=True)
    assert GH_VALUE not in r.stdout and "*" * len(GH_VALUE) in r.stdout


def test_placeholder_elsewhere_is_blocked_and_never_reaches_the_origin(
        world: dict[str, Any]) -> None:
    """Attack: the placeholder in the URL of a request to the bound host."""
    before = len(world["log"])
    r = sh(world, f'curl -sS -m 60 -i "https://origin.test:{world["port"]}/user?t=$GH"')
    assert "403" in r.stdout and "secret GH" in r.stdout
    assert len(world["log"]) == before


def test_pip_installs_from_an_index_wanting_the_token_in_basic_auth(
        world: dict[str, Any]) -> None:
    if not world["wheels"]:
        pytest.skip("pip could not fetch the anthropic wheels on the host")
    r = sh(world, "python3 -m pip install -q --no-cache-dir --break-system-packages "
                  f"--index-url \"https://__token__:$GH@origin.test:{world['port']}/simple/\" "
                  "anthropic && python3 -c 'import anthropic; print(anthropic.__name__)'")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("anthropic")
    got = [e for e in world["log"] if e["path"].startswith("/simple/anthropic")]
    assert got and all(GH_VALUE in base64.b64decode(dict(e["headers"])["authorization"][6:])
                       .decode() for e in got)


def test_git_clones_over_smart_http_with_a_token(world: dict[str, Any]) -> None:
    r = sh(world, "cd /tmp && git clone -q "
                  f"\"https://x-access-token:$GH@origin.test:{world['port']}/repo.git\" r && "
                  "cat r/hello.txt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == "from the smart origin\n"
    assert any(e["path"].startswith("/repo.git/git-upload-pack") for e in world["log"])


def test_anthropic_sdk_streaming_and_not(world: dict[str, Any]) -> None:
    if not world["wheels"]:
        pytest.skip("pip could not fetch the anthropic wheels on the host")
    script = f"""
import anthropic
c = anthropic.Anthropic(base_url="https://api.anthropic.com:{world['port']}")
m = c.messages.create(model="claude-e2e-1", max_tokens=16,
                      messages=[{{"role": "user", "content": "hi"}}])
print("plain", m.content[0].text, m.usage.input_tokens, m.usage.output_tokens)
with c.messages.stream(model="claude-e2e-2", max_tokens=16,
                       messages=[{{"role": "user", "content": "hi"}}]) as s:
    text = "".join(s.text_stream)
    fin = s.get_final_message()
print("stream", text, fin.usage.output_tokens)
"""
    r = sh(world, f"python3 - <<'EOF'\n{script}\nEOF")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "plain hello from the stand-in 11 7" in r.stdout
    assert "stream streamed 42" in r.stdout
    # SDK versions differ (x-api-key, or Authorization: Bearer): both are bound.
    calls = [dict(e["headers"]) for e in world["log"] if e["path"].startswith("/v1/messages")]
    assert len(calls) == 2
    assert all(h.get("x-api-key") == AK_VALUE or h.get("authorization") == f"Bearer {AK_VALUE}"
               for h in calls)


def test_nothing_the_run_leaves_holds_a_value(world: dict[str, Any]) -> None:
    """Every file of the run (state, logs, console, bundle) and every output: no value."""
    s: Stack = world["stack"]
    name = world["box"]
    info = s.tkjson("inspect", name)
    assert isinstance(info, dict)
    vm_dir = paths.vms(s.home) / str(info["run_id"])  # the VM's files go at stop: read now
    assert (vm_dir / "console.log").is_file(), "no console log to read"
    console = _files_holding_values(vm_dir) + _files_holding_values(s.home)
    s.tk("stop", name)
    bundle = world["tmp"] / "run.tkb"
    s.tk("export", name, "-o", str(bundle))
    v = s.tk("verify", str(bundle), "--trust", str(bundle.with_suffix(".trust.json")),
             check=False)
    ALL_OUTPUT.extend([v.stdout, v.stderr])
    vj = s.tkjson("verify", str(bundle), "--trust", str(bundle.with_suffix(".trust.json")))
    assert isinstance(vj, dict) and vj["secret_uses"] >= 3
    if world["wheels"]:
        assert vj["model_calls"] >= 2
    assert vj["secret_leaks"] >= 1
    pats = patterns([("GH", "value", GH_VALUE.encode()),
                     ("ANTHROPIC_API_KEY", "value", AK_VALUE.encode())])
    sc = LeakScanner(pats)
    assert not sc.feed("\n".join(ALL_OUTPUT).encode()), "a value in a command's output"
    assert console == [] and _files_holding_values(world["tmp"]) == []
