"""`tkbox daemon --unrecorded`: a box works (egress, apply) and says it is unrecorded.

This would have caught the bug where the network door asked an in-memory fake
signer that held no open run: the first connection's decision failed, and the
box was contained as if its record could not be kept. A real VM, a real curl
in it, a TLS origin on loopback (reached through the operator's permit and a
hosts map, as in test_network.py), and no signer process at all.
"""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_stack import Stack, fresh_name, make_home, stack_env
from test_network import make_ca


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    ca, cert, key = make_ca(tmp_path)
    www = tmp_path / "www"
    www.mkdir()
    (www / "hello").write_text("hello, unrecorded\n")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, directory=str(www), **kw)  # type: ignore[arg-type]

        def log_message(self, *a: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1], ca
    httpd.shutdown()
    httpd.server_close()


def test_unrecorded_box_reaches_the_network_and_its_patch_applies(
        tmp_path: Path, origin: tuple[int, Path]) -> None:
    port, ca = origin
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 origin.test\n")
    home = make_home(tmp_path)
    s = Stack(home, stack_env(home))
    s.start_daemon("--unrecorded", "--egress-permit", "127.0.0.1/32", "--egress-hosts",
                   str(hosts), "--ca-cert", str(ca))
    assert "--unrecorded" in s.log_tail("daemon")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "x").write_text("x\n")
    name = fresh_name("unrec")
    try:
        s.tk("run", "--name", name, "--workspace", str(ws), "--allow", f"origin.test:{port}")
        got = s.tk("exec", name, "--", "sh", "-c",
                   f"curl -sS --max-time 60 https://origin.test:{port}/hello && "
                   "echo made-inside > /workspace/new.txt", timeout=180, check=False)
        assert got.returncode == 0, got.stdout + got.stderr + s.log_tail("daemon")
        assert "hello, unrecorded" in got.stdout
        listing = s.tk("ls").stdout
        assert "[UNRECORDED]" in listing and "running" in listing, listing
        s.tk("stop", name, timeout=300)
        s.tk("apply", name, timeout=120)
        assert (ws / "new.txt").read_text() == "made-inside\n"
        exported = s.tk("export", name, check=False)
        assert exported.returncode != 0 and "--unrecorded" in exported.stderr
    finally:
        s.tk("rm", "--force", name, check=False)
        for proc in list(s.procs):
            s.stop(proc)
