"""The demo's stand-in origins: one HTTPS server on 127.0.0.1 for the names given.

    python scripts/demo_origin.py DIR NAME [NAME...]

Writes DIR/ca.pem (the daemon trusts it with --ca-cert), prints its port,
and serves until killed:

- `GET /user` with `Authorization: Bearer $GH_TOKEN` (the real value, which
  only the door has): `{"login": "demo"}`; without it: 401. It logs to
  DIR/origin.log whether the real token arrived (never the token itself);
- `/simple/tkdemo/` and `/files/tkdemo-1.0-py3-none-any.whl`: a PEP 503
  index of a one-module wheel made here (an operator's package mirror);
- anything else: `hello from <host>`.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import ssl
import sys
import zipfile
from pathlib import Path

from tkbox.image.testing import ScratchCA

WHEEL = "tkdemo-1.0-py3-none-any.whl"


def make_wheel() -> bytes:
    files = {"tkdemo.py": b"VALUE = 42\n",
             "tkdemo-1.0.dist-info/METADATA":
                 b"Metadata-Version: 2.1\nName: tkdemo\nVersion: 1.0\n",
             "tkdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: demo\n"
                                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr("tkdemo-1.0.dist-info/RECORD",
                   "".join(f"{k},,\n" for k in files) + "tkdemo-1.0.dist-info/RECORD,,\n")
    return buf.getvalue()


def main() -> None:
    d = Path(sys.argv[1])
    names = sys.argv[2:]
    d.mkdir(parents=True, exist_ok=True)
    # A CA and a leaf for the stand-in origins' names (the leaf's key appended,
    # as http.server's TLS context loads one file).
    ca = ScratchCA.create(d, names)
    ca.ca_pem.replace(d / "ca.pem")
    (d / "leaf.pem").write_bytes(ca.cert_pem.read_bytes() + ca.key_pem.read_bytes())
    token = os.environ["GH_TOKEN"]
    wheel = make_wheel()
    index = (f'<html><body><a href="/files/{WHEEL}#sha256={hashlib.sha256(wheel).hexdigest()}">'
             f"{WHEEL}</a></body></html>").encode()
    log = open(d / "origin.log", "a", buffering=1)  # noqa: SIM115 - lives as long as the server

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            host = self.headers.get("host", "").split(":")[0]
            if self.path == "/user":
                real = self.headers.get("authorization") == f"Bearer {token}"
                log.write(f"{host} {self.path}: Authorization held the real token: {real}\n")
                body, code = (b'{"login": "demo"}\n', 200) if real else (b"bad token\n", 401)
            elif self.path.rstrip("/") == "/simple/tkdemo":
                log.write(f"{host} {self.path}\n")
                body, code = index, 200
            elif self.path == f"/files/{WHEEL}":
                log.write(f"{host} {self.path}\n")
                body, code = wheel, 200
            else:
                log.write(f"{host} {self.path}\n")
                body, code = f"hello from {host}\n".encode(), 200
            self.send_response(code)
            ctype = "text/html" if self.path.startswith("/simple/") else (
                "application/octet-stream" if self.path.startswith("/files/") else "text/plain")
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "leaf.pem")
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
