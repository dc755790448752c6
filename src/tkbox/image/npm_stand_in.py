"""A stand-in of an npm registry on loopback, over TLS, for tests and benchmarks.

It serves what `tkbox.image.tools` reads of a registry: a package's abbreviated
metadata (`GET /@scope%2fname`, `versions.V.dist.{integrity, tarball}`) and its
tarballs (`GET /-/tarballs/NAME/V.tgz`). Each package version is given as tarball
bytes; its integrity is computed, or set to something else to play a registry or
mirror that serves other bytes than it names. It counts the requests it answered,
so a test can tell a cache hit from a fetch.

Point npm (and so tkbox) at it the way an operator points npm at a mirror: the
`npm_config_registry` and `npm_config_cafile` variables (`env()`).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import ssl
import tarfile
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from tkbox.image.testing import ScratchCA


def package_tgz(files: dict[str, bytes], *, executable: tuple[str, ...] = ()) -> bytes:
    """An npm package tarball: each of `files` under `package/`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            info.mode = 0o755 if name in executable else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


@dataclass
class NpmRegistry:
    ca: ScratchCA
    #: package -> version -> tarball bytes
    packages: dict[str, dict[str, bytes]] = field(default_factory=dict)
    #: (package, version) -> the integrity to claim instead of the true one
    claims: dict[tuple[str, str], str] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    port: int = 0
    _server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/"

    def env(self) -> dict[str, str]:
        """npm's own variables, pointing npm (and tkbox) here."""
        return {"npm_config_registry": self.url, "npm_config_cafile": str(self.ca.ca_pem)}

    def add(self, package: str, version: str, tgz: bytes) -> None:
        self.packages.setdefault(package, {})[version] = tgz

    def start(self) -> NpmRegistry:
        reg = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                reg.requests.append(self.path)
                path = unquote(self.path.split("?", 1)[0])
                if path.startswith("/-/tarballs/"):
                    name, _, file = path[len("/-/tarballs/"):].rpartition("/")
                    data = reg.packages.get(name, {}).get(file.removesuffix(".tgz"))
                    self._send(200 if data is not None else 404, data or b"",
                               "application/octet-stream")
                    return
                name = path.lstrip("/")
                versions = reg.packages.get(name)
                if versions is None:
                    self._send(404, b'{"error":"Not found"}', "application/json")
                    return
                doc = {"name": name, "versions": {v: {"name": name, "version": v, "dist": {
                    "integrity": reg.claims.get((name, v), integrity(data)),
                    "tarball": f"{reg.url}-/tarballs/{name}/{v}.tgz"}}
                    for v, data in versions.items()}}
                self._send(200, json.dumps(doc).encode(),
                           "application/vnd.npm.install-v1+json")

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.ca.cert_pem, self.ca.key_pem)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> NpmRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

