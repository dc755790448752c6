"""Real clients in a real box, through the network door, to origins on loopback.

The origins use TLS from a test CA that the box is told to trust (--ca-cert);
their names are mapped with --egress-hosts and reached only because the
operator permits 127.0.0.1/32 (--egress-permit). 127.0.0.2 is not permitted:
loopback stays refused there, whatever the allowlist says.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import ssl
import subprocess
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_stack import TKBOX, Stack, export_verified, fresh_name, make_home, stack_env

from tkbox.image.testing import ScratchCA

NAMES = ["origin.test", "other.test", "waits.test", "denied.test", "late.test"]


def make_ca(tmp: Path) -> tuple[Path, Path, Path]:
    ca = ScratchCA.create(tmp, NAMES)
    return ca.ca_pem, ca.cert_pem, ca.key_pem


def make_wheel(root: Path) -> None:
    """A one-module wheel and a PEP 503 index page for it."""
    name = "tkdemo-1.0-py3-none-any.whl"
    buf = io.BytesIO()
    files = {"tkdemo.py": b"VALUE = 42\n",
             "tkdemo-1.0.dist-info/METADATA":
                 b"Metadata-Version: 2.1\nName: tkdemo\nVersion: 1.0\n",
             "tkdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{k},,\n" for k in files) + "tkdemo-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(buf, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr("tkdemo-1.0.dist-info/RECORD", record)
    (root / "simple" / "tkdemo").mkdir(parents=True)
    (root / "files").mkdir()
    (root / "files" / name).write_bytes(buf.getvalue())
    digest = hashlib.sha256(buf.getvalue()).hexdigest()
    (root / "simple" / "tkdemo" / "index.html").write_text(
        f'<html><body><a href="/files/{name}#sha256={digest}">{name}</a></body></html>')


def make_git_repo(root: Path) -> None:
    src = root.parent / "gitsrc"
    src.mkdir()
    (src / "hello.txt").write_text("from the origin\n")
    g = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", "-C", str(src)]
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    subprocess.run([*g, "add", "."], check=True)
    subprocess.run([*g, "commit", "-qm", "init"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(root / "repo.git")], check=True)
    subprocess.run(["git", "-C", str(root / "repo.git"), "update-server-info"], check=True)


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    tmp = tmp_path_factory.mktemp("net")
    ca, cert, key = make_ca(tmp)
    www = tmp / "www"
    www.mkdir()
    (www / "hello").write_text("hello through the door\n")
    make_wheel(www)
    make_git_repo(www)

    drips: list[dict[str, float | None]] = []  # /drip downloads: when the origin lost each

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, directory=str(www), **kw)  # type: ignore[arg-type]

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            if self.path != "/drip":
                return super().do_GET()
            # A download that never ends by itself: 1 KiB every 0.1 s.
            rec: dict[str, float | None] = {"closed": None}
            drips.append(rec)
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"x" * 1024)
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                rec["closed"] = time.monotonic()
            return None

        def log_message(self, *a: object) -> None:
            pass

    servers = []
    for addr in ("127.0.0.1", "127.0.0.2"):
        httpd = http.server.ThreadingHTTPServer((addr, 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
    port = servers[0].server_address[1]
    port2 = servers[1].server_address[1]
    hosts = tmp / "hosts"
    hosts.write_text("127.0.0.1 origin.test waits.test denied.test late.test\n"
                     "127.0.0.2 other.test\n")
    home = make_home(tmp)
    s = Stack(home, stack_env(home))
    s.start_signer()
    s.start_daemon("--egress-permit", "127.0.0.1/32", "--egress-hosts", str(hosts),
                   "--ca-cert", str(ca), "--approval-wait", "8")
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "x").write_text("x\n")
    name = fresh_name("net")
    s.tk("run", "--name", name, "--workspace", str(ws), "--allow", f"origin.test:{port}",
         "--allow", f"other.test:{port2}")
    yield {"stack": s, "box": name, "port": port, "port2": port2, "tmp": tmp, "drips": drips}
    s.tk("rm", "--force", name, check=False)
    for name_ in list(s.procs):
        s.stop(name_)
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def sh(net: dict[str, object], script: str,
       check: bool = False) -> subprocess.CompletedProcess[str]:
    s: Stack = net["stack"]  # type: ignore[assignment]
    return s.tk("exec", str(net["box"]), "--", "sh", "-c", script, check=check, timeout=120)


def test_curl_reaches_an_allowed_origin_over_real_tls(net: dict[str, object]) -> None:
    r = sh(net, f"curl -sS -m 30 https://origin.test:{net['port']}/hello", check=True)
    assert r.stdout == "hello through the door\n"


def test_pip_installs_from_an_allowed_index(net: dict[str, object]) -> None:
    r = sh(net, f"python3 -m pip install -q --no-cache-dir --break-system-packages "
                f"--index-url https://origin.test:{net['port']}/simple/ tkdemo && "
                "python3 -c 'import tkdemo; print(tkdemo.VALUE)'", check=True)
    assert r.stdout.strip().endswith("42")


def test_git_clones_over_https_from_an_allowed_origin(net: dict[str, object]) -> None:
    r = sh(net, f"cd /tmp && git clone -q https://origin.test:{net['port']}/repo.git && "
                "cat repo/hello.txt", check=True)
    assert r.stdout == "from the origin\n"


def test_loopback_stays_refused_without_the_operators_permit(net: dict[str, object]) -> None:
    """other.test is on the allowlist, but resolves to 127.0.0.2, which no permit covers."""
    r = sh(net, f"curl -sS -m 30 https://other.test:{net['port2']}/hello 2>&1; echo rc=$?")
    assert "rc=0" not in r.stdout
    assert "403" in r.stdout or "refused" in r.stdout.lower()


def test_metadata_address_is_refused_with_the_reason(net: dict[str, object]) -> None:
    r = sh(net, "curl -sS -m 30 -i http://169.254.169.254/latest/meta-data/; echo rc=$?")
    assert "HTTP/1.1 403" in r.stdout
    assert "metadata" in r.stdout.lower() or "link-local" in r.stdout.lower()


def _wait_pending(s: Stack, host: str) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        items = json.loads(s.tk("approvals", "--json").stdout)
        for i in items:
            if i.get("host") == host:
                return i
        time.sleep(0.3)
    raise AssertionError(f"no pending approval for {host}")


def _curl_bg(net: dict[str, object], host: str) -> subprocess.Popen[bytes]:
    s: Stack = net["stack"]  # type: ignore[assignment]
    return subprocess.Popen([*TKBOX, "exec", str(net["box"]), "--", "sh", "-c",
                             f"curl -sS -m 60 https://{host}:{net['port']}/hello 2>&1; echo rc=$?"],
                            env=s.env, stdout=subprocess.PIPE)


def test_unlisted_host_waits_and_passes_once_a_person_approves(net: dict[str, object]) -> None:
    s: Stack = net["stack"]  # type: ignore[assignment]
    with _curl_bg(net, "waits.test") as proc:
        p = _wait_pending(s, "waits.test")
        s.tk("approve", str(p["box"]), str(p["id"]))
        out = proc.communicate(timeout=90)[0].decode()
    assert "hello through the door" in out and "rc=0" in out


def test_unlisted_host_fails_when_denied(net: dict[str, object]) -> None:
    s: Stack = net["stack"]  # type: ignore[assignment]
    with _curl_bg(net, "denied.test") as proc:
        p = _wait_pending(s, "denied.test")
        s.tk("deny", str(p["box"]), str(p["id"]))
        out = proc.communicate(timeout=90)[0].decode()
    assert "rc=0" not in out and "hello" not in out


def test_unlisted_host_fails_after_the_wait(net: dict[str, object]) -> None:
    """Nobody answers: the connection waits for a person (the approval is pending),
    then after --approval-wait (8 s) it is refused with that reason, and the approval
    is gone. A refusal for any other reason (a denial, the allowlist) says otherwise."""
    s: Stack = net["stack"]  # type: ignore[assignment]
    with subprocess.Popen([*TKBOX, "exec", str(net["box"]), "--", "sh", "-c",
                           f"curl -sS -i -m 60 http://late.test:{net['port']}/hello 2>&1; "
                           "echo rc=$?"], env=s.env, stdout=subprocess.PIPE) as proc:
        p = _wait_pending(s, "late.test")
        out = proc.communicate(timeout=90)[0].decode()
    assert "HTTP/1.1 403" in out, out
    assert f"nobody answered approval {p['id']} within 8 s" in out, out
    assert "hello through the door" not in out
    pending = json.loads(s.tk("approvals", "--json").stdout)
    assert not [i for i in pending if i.get("host") == "late.test"]


def test_stop_closes_egress_and_the_run_verifies(net: dict[str, object], tmp_path: Path) -> None:
    """Runs last in this module. A download in flight when the stop begins is cut by
    the door (its record says "box stopped", not that the client or the origin ended
    it), the origin loses the connection, no connection can be made after, and every
    connection is in the verified bundle."""
    s: Stack = net["stack"]  # type: ignore[assignment]
    box = str(net["box"])
    drips: list[dict[str, float | None]] = net["drips"]  # type: ignore[assignment]
    with subprocess.Popen([*TKBOX, "exec", box, "--", "sh", "-c",
                           f"curl -sS -m 300 https://origin.test:{net['port']}/drip "
                           "-o /dev/null; echo rc=$?"], env=s.env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        deadline = time.monotonic() + 60
        while not drips and time.monotonic() < deadline:
            time.sleep(0.2)
        assert drips, "the download never reached the origin"
        time.sleep(1)
        assert drips[0]["closed"] is None  # still flowing before the stop
        s.tk("stop", box)
        proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while drips[0]["closed"] is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert drips[0]["closed"] is not None, "the origin still has the box's connection"
    r = sh(net, f"curl -sS -m 30 https://origin.test:{net['port']}/hello")
    assert r.returncode != 0 and "stopped" in r.stderr and r.stdout == ""
    assert len(drips) == 1
    recs = export_verified(s, box, tmp_path)
    connects = {r["seq"]: r["body"] for r in recs
                if r["kind"] == "tkbox.decision" and r["body"]["action"] == "Connect"}
    ends = {r["body"]["decision"]: r["body"]["outcome"] for r in recs
            if r["kind"] == "tkbox.complete" and r["body"]["decision"] in connects}
    assert set(ends) == {seq for seq, b in connects.items() if b["allowed"]}
    assert [o for o in ends.values() if o.get("ended") == "box stopped"], ends
