"""Helpers to test against real images: layers built in memory, a loopback registry, a pusher.

- `LayerBuilder`: a layer tar made entry by entry (files, dirs, links,
  devices, whiteouts, xattrs), compressed as asked.
- `ScratchCA`: a throwaway CA and a server certificate for 127.0.0.1 (cryptography).
- `LocalRegistry`: Debian's `docker-registry` (distribution 2.8) on 127.0.0.1
  over TLS with that CA, its storage in a temporary directory.
- `push_image` / `push_index`: the registry API's upload side (monolithic blob
  uploads, manifests, indexes) with httpx, enough for tests and benchmarks.
- `StandInMirror`: a mirror in front of that registry, under any API root, whose
  answers a test can rewrite (a mirror that lies).
- `NpmRegistry`: an npm registry on 127.0.0.1 over TLS (abbreviated metadata and
  tarballs), for the agents' tool disks (`tkbox.image.tools`).

Used by tkbox's own tests and benchmarks; nothing in tkbox imports it.
"""

from __future__ import annotations

import base64
import datetime as _dt
import gzip
import hashlib
import http.server
import io
import ipaddress
import json
import shutil
import socket
import ssl
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import zstandard

from tkbox.image import oci

# --- layers ---------------------------------------------------------------------------


class LayerBuilder:
    def __init__(self) -> None:
        self._buf = io.BytesIO()
        self._tf = tarfile.open(fileobj=self._buf, mode="w", format=tarfile.PAX_FORMAT)

    def _add(self, name: str, type_: bytes, data: bytes = b"", **attrs: Any) -> LayerBuilder:
        info = tarfile.TarInfo(name)
        info.type = type_
        info.mode = attrs.pop("mode", 0o755 if type_ == tarfile.DIRTYPE else 0o644)
        info.mtime = attrs.pop("mtime", 1_700_000_000)
        xattrs = attrs.pop("xattrs", {})
        for k, v in attrs.items():
            setattr(info, k, v)
        info.pax_headers = {**info.pax_headers, **{f"SCHILY.xattr.{k}": v
                                                   for k, v in xattrs.items()}}
        if type_ == tarfile.REGTYPE:
            info.size = len(data)
            self._tf.addfile(info, io.BytesIO(data))
        else:
            self._tf.addfile(info)
        return self

    def dir(self, name: str, **attrs: Any) -> LayerBuilder:
        return self._add(name, tarfile.DIRTYPE, **attrs)

    def file(self, name: str, data: bytes = b"", **attrs: Any) -> LayerBuilder:
        return self._add(name, tarfile.REGTYPE, data, **attrs)

    def symlink(self, name: str, target: str, **attrs: Any) -> LayerBuilder:
        return self._add(name, tarfile.SYMTYPE, linkname=target, mode=0o777, **attrs)

    def hardlink(self, name: str, target: str) -> LayerBuilder:
        return self._add(name, tarfile.LNKTYPE, linkname=target)

    def device(self, name: str, major: int, minor: int, *, block: bool = False,
               **attrs: Any) -> LayerBuilder:
        kind = tarfile.BLKTYPE if block else tarfile.CHRTYPE
        return self._add(name, kind, devmajor=major, devminor=minor, **attrs)

    def fifo(self, name: str, **attrs: Any) -> LayerBuilder:
        return self._add(name, tarfile.FIFOTYPE, **attrs)

    def whiteout(self, path: str) -> LayerBuilder:
        parent, _, base = path.rpartition("/")
        return self.file(f"{parent}/.wh.{base}" if parent else f".wh.{base}")

    def opaque(self, directory: str) -> LayerBuilder:
        return self.file(f"{directory.rstrip('/')}/.wh..wh..opq")

    def tar(self) -> bytes:
        self._tf.close()
        return self._buf.getvalue()


def compress(tar: bytes, how: str) -> tuple[bytes, str]:
    """(blob, media type) for `how` in none | gzip | zstd."""
    if how == "gzip":
        return gzip.compress(tar, mtime=0), oci.OCI_LAYER + "+gzip"
    if how == "zstd":
        return zstandard.ZstdCompressor().compress(tar), oci.OCI_LAYER + "+zstd"
    return tar, oci.OCI_LAYER


# --- TLS --------------------------------------------------------------------------------


@dataclass
class ScratchCA:
    ca_pem: Path
    cert_pem: Path
    key_pem: Path

    @classmethod
    def create(cls, directory: Path, names: Sequence[str] = ()) -> ScratchCA:
        """A CA and one server leaf for 127.0.0.1, localhost and `names` (DNS names; the
        first, if any, is also the leaf's common name)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        now = _dt.datetime.now(_dt.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tkbox test CA")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - _dt.timedelta(minutes=5))
              .not_valid_after(now + _dt.timedelta(days=1))
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                           crl_sign=True, content_commitment=False,
                                           key_encipherment=False, data_encipherment=False,
                                           key_agreement=False, encipher_only=False,
                                           decipher_only=False), critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(
                    NameOID.COMMON_NAME, names[0] if names else "127.0.0.1")]))
                .issuer_name(ca_name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - _dt.timedelta(minutes=5))
                .not_valid_after(now + _dt.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.DNSName("localhost"), *(x509.DNSName(n) for n in names)]),
                    critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    ca_key.public_key()), critical=False)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        directory.mkdir(parents=True, exist_ok=True)
        out = cls(directory / "ca.pem", directory / "server.pem", directory / "server.key")
        out.ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        out.cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out.key_pem.write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        out.key_pem.chmod(0o600)
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the registry -----------------------------------------------------------------------


@dataclass
class LocalRegistry:
    """`docker-registry` on 127.0.0.1:<port> over TLS; `stop()` when done."""

    directory: Path
    ca: ScratchCA
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    extra_config: dict[str, Any] = field(default_factory=dict)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def storage(self) -> Path:
        return self.directory / "storage"

    def blob_data_path(self, digest: str) -> Path:
        h = oci.hex_of(digest)
        return self.storage / "docker/registry/v2/blobs/sha256" / h[:2] / h / "data"

    def start(self) -> LocalRegistry:
        exe = shutil.which("docker-registry")
        if exe is None:
            raise RuntimeError("docker-registry is missing: apt-get install docker-registry")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        config = {
            "version": 0.1,
            "log": {"level": "error", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.storage)},
                        "delete": {"enabled": True}},
            "http": {"addr": self.host,
                     "tls": {"certificate": str(self.ca.cert_pem), "key": str(self.ca.key_pem)}},
            **self.extra_config,
        }
        cfg = self.directory / "config.yml"
        cfg.write_text(json.dumps(config))  # JSON is YAML
        log = open(self.directory / "registry.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([exe, "serve", str(cfg)], stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log, close_fds=True)
        log.close()
        deadline = time.monotonic() + 20
        with httpx.Client(verify=self._ssl()) as c:
            while True:
                try:
                    if c.get(f"https://{self.host}/v2/").status_code in (200, 401):
                        return self
                except httpx.TransportError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    msg = (self.directory / "registry.log").read_text(errors="replace")[-2000:]
                    self.stop()
                    raise RuntimeError(f"docker-registry did not start: {msg}")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca.ca_pem))

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=f"https://{self.host}", verify=self._ssl(), timeout=60)


# --- pushing ----------------------------------------------------------------------------


def push_blob(c: httpx.Client, repo: str, data: bytes) -> str:
    digest = oci.sha256_digest(data)
    if c.head(f"/v2/{repo}/blobs/{digest}").status_code == 200:
        return digest
    r = c.post(f"/v2/{repo}/blobs/uploads/")
    r.raise_for_status()
    location = r.headers["location"]
    sep = "&" if "?" in location else "?"
    r = c.put(f"{location}{sep}digest={digest}", content=data,
              headers={"Content-Type": "application/octet-stream"})
    r.raise_for_status()
    return digest


@dataclass
class Pushed:
    digest: str  # manifest digest
    manifest: bytes
    config: bytes
    layers: list[tuple[str, bytes]]  # (digest, blob)


def push_image(c: httpx.Client, repo: str, tag: str | None, layers: list[bytes], *,
               compression: str | list[str] = "gzip", config: dict[str, Any] | None = None,
               docker: bool = False, architecture: str = "amd64") -> Pushed:
    """Push an image of `layers` (uncompressed tars); returns its manifest digest."""
    hows = [compression] * len(layers) if isinstance(compression, str) else compression
    blobs = [compress(t, h) for t, h in zip(layers, hows, strict=True)]
    cfg = {
        "architecture": architecture, "os": "linux",
        "config": config or {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [oci.sha256_digest(t) for t in layers]},
    }
    cfg_bytes = json.dumps(cfg).encode()
    for b, _ in blobs:
        push_blob(c, repo, b)
    cfg_digest = push_blob(c, repo, cfg_bytes)
    if docker:
        mt, cmt = oci.DOCKER_MANIFEST, oci.DOCKER_CONFIG
        lmt = ["application/vnd.docker.image.rootfs.diff.tar.gzip"] * len(blobs)
    else:
        mt, cmt = oci.OCI_MANIFEST, oci.OCI_CONFIG
        lmt = [m for _, m in blobs]
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": mt,
        "config": {"mediaType": cmt, "digest": cfg_digest, "size": len(cfg_bytes)},
        "layers": [{"mediaType": m, "digest": oci.sha256_digest(b), "size": len(b)}
                   for (b, _), m in zip(blobs, lmt, strict=True)],
    }).encode()
    digest = oci.sha256_digest(manifest)
    r = c.put(f"/v2/{repo}/manifests/{tag or digest}", content=manifest,
              headers={"Content-Type": mt})
    r.raise_for_status()
    return Pushed(digest, manifest, cfg_bytes,
                  [(oci.sha256_digest(b), b) for b, _ in blobs])


def push_index(c: httpx.Client, repo: str, tag: str,
               entries: list[tuple[Pushed, str, str, str | None]], *,
               docker: bool = False) -> str:
    """Push an index of (image, os, architecture, variant) entries; returns its digest."""
    mt = oci.DOCKER_LIST if docker else oci.OCI_INDEX
    child = oci.DOCKER_MANIFEST if docker else oci.OCI_MANIFEST
    body = json.dumps({
        "schemaVersion": 2, "mediaType": mt,
        "manifests": [
            {"mediaType": child, "digest": p.digest, "size": len(p.manifest),
             "platform": {"os": os_, "architecture": arch,
                          **({"variant": v} if v else {})}}
            for p, os_, arch, v in entries
        ],
    }).encode()
    r = c.put(f"/v2/{repo}/manifests/{tag}", content=body, headers={"Content-Type": mt})
    r.raise_for_status()
    return oci.sha256_digest(body)


# --- a stand-in mirror --------------------------------------------------------------------

Rewrite = Callable[[str, int, dict[str, str], bytes], tuple[int, dict[str, str], bytes]]


@dataclass
class StandInMirror:
    """A mirror in front of a `LocalRegistry`, on 127.0.0.1 over TLS with the same CA.

    It serves the registry's API under `root` (`/v2` as a plain mirror does,
    `/docker-hub/v2` as an Artifactory or Nexus proxy does, `/v2/hub-proxy` as a Harbor
    proxy project does), passing each answer through `rewrite(path, status, headers,
    body)` first, so a test can make it lie. `requests` holds each path asked, with its
    query. GET only, whole bodies: enough for the small images of tests.
    """

    upstream: LocalRegistry
    root: str = "/v2"
    rewrite: Rewrite | None = None
    requests: list[str] = field(default_factory=list)
    port: int = 0
    _server: Any = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The mirror's URL as an operator writes it (containerd's rule adds `/v2`)."""
        return f"https://{self.host}{self.root.removesuffix('/v2')}"

    def start(self) -> StandInMirror:
        import http.server
        import threading

        mirror = self
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.upstream.ca.cert_pem), str(self.upstream.ca.key_pem))
        upstream = self.upstream.client()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                mirror.requests.append(self.path)
                path = self.path.split("?", 1)[0]
                if not path.startswith(mirror.root + "/"):
                    self.send_error(404)
                    return
                r = upstream.get("/v2/" + path[len(mirror.root) + 1:],
                                 headers={"Accept": self.headers.get("Accept", "*/*")})
                status, body = r.status_code, r.content
                headers = {k: r.headers[k] for k in ("content-type", "docker-content-digest")
                           if k in r.headers}
                if mirror.rewrite is not None:
                    status, headers, body = mirror.rewrite(path, status, headers, body)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = (server, upstream)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            server, upstream = self._server
            server.shutdown()
            server.server_close()
            upstream.close()
            self._server = None

# --- an npm registry ----------------------------------------------------------------------
# A stand-in of an npm registry on loopback, over TLS, for the agent tool disks
# (`tkbox.image.tools`): a package's abbreviated metadata (`GET /@scope%2fname`,
# `versions.V.dist.{integrity, tarball}`) and its tarballs (`GET /-/tarballs/NAME/V.tgz`).
# Each version is given as tarball bytes; its integrity is computed, or set to something
# else (`claims`) to play a registry or mirror serving other bytes than it names. It
# counts the requests it answered, so a test can tell a cache hit from a fetch. npm (and
# so tkbox) is pointed at it as an operator points npm at a mirror: `env()`.


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

