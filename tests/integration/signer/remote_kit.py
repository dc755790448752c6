"""A remote signer's world for tests: a CA, certificates, and an OIDC issuer on loopback.

- `Pki(dir)`: a CA (ECDSA P-256) and the certificates it issues: the signer's
  (SAN 127.0.0.1 and localhost) and each daemon's client certificate.
- `Issuer()`: an OIDC issuer on 127.0.0.1 (plain HTTP on loopback, which the
  signer takes for tests only) serving `/.well-known/openid-configuration`,
  its JWKS, and GitHub's id-token request endpoint (`/token?audience=…` with
  `Authorization: bearer <request token>`, answered `{"value": <JWT>}`), as a
  runner does for `permissions: id-token: write`. Tokens carry GitHub's claim
  names; `mint(...)` makes any variation a test needs (audience, times, jti, a
  foreign key for a forgery).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import secrets
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


class Pki:
    def __init__(self, root: Path, name: str = "test-ca") -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(minutes=5))
                     .not_valid_after(now + dt.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                  False, False), True)
                     .sign(self.key, hashes.SHA256()))
        self.ca_path = root / f"{name}.pem"
        self.ca_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, cn: str, *, server: bool) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(self.cert.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5))
             .not_valid_after(now + dt.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), True))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                False).add_extension(x509.ExtendedKeyUsage(
                    [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False)
        else:
            b = b.add_extension(x509.ExtendedKeyUsage(
                [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), False)
        cert = b.sign(self.key, hashes.SHA256())
        cp, kp = self.root / f"{cn}.pem", self.root / f"{cn}.key"
        cp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(kp, key)
        return cp, kp


GITHUB = {
    "repository": "octo-org/octo-repo", "repository_owner": "octo-org",
    "workflow": "agent",
    "workflow_ref": "octo-org/octo-repo/.github/workflows/agent.yml@refs/heads/main",
    "job_workflow_ref": "octo-org/octo-repo/.github/workflows/agent.yml@refs/heads/main",
    "ref": "refs/heads/main", "sha": "0123456789abcdef0123456789abcdef01234567",
    "run_id": "4242", "run_attempt": "1", "runner_environment": "self-hosted",
    "event_name": "workflow_dispatch", "actor": "octocat",
}


class Issuer:
    """An OIDC issuer and a GitHub runner's id-token endpoint, on 127.0.0.1."""

    def __init__(self, audience: str = "tkbox-signer") -> None:
        self.key = RSAKey.generate_key(2048, parameters={"kid": "k1", "use": "sig"})
        self.audience = audience
        self.request_token = secrets.token_urlsafe(24)
        self.claims = dict(GITHUB)  # what /token mints
        self.requests = 0
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                u = urlsplit(self.path)
                if u.path == "/.well-known/openid-configuration":
                    self._json({"issuer": issuer.url, "jwks_uri": issuer.url + "/jwks"})
                elif u.path == "/jwks":
                    self._json(KeySet([issuer.key]).as_dict(private=False))
                elif u.path == "/token":
                    if self.headers.get("Authorization") != f"bearer {issuer.request_token}":
                        self._json({"message": "bad request token"}, 401)
                        return
                    aud = parse_qs(u.query).get("audience", [""])[0]
                    issuer.requests += 1
                    self._json({"value": issuer.mint(aud=aud)})
                else:
                    self._json({}, 404)

            def _json(self, obj: Any, status: int = 200) -> None:
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def request_url(self) -> str:
        """ACTIONS_ID_TOKEN_REQUEST_URL (GitHub's has a query already; so does this one)."""
        return self.url + "/token?api-version=2.0"

    def mint(self, *, aud: str | None = None, iat: int | None = None, nbf: int | None = None,
             exp: int | None = None, jti: str | None = None, key: RSAKey | None = None,
             iss: str | None = None, **claims: Any) -> str:
        now = int(time.time())
        iat = now if iat is None else iat
        body = {**self.claims, **claims, "iss": iss or self.url,
                "aud": self.audience if aud is None else aud,
                "sub": f"repo:{claims.get('repository', self.claims['repository'])}:ref:"
                       f"{self.claims['ref']}",
                "iat": iat, "nbf": iat if nbf is None else nbf,
                "exp": iat + 300 if exp is None else exp,
                "jti": jti or str(uuid.uuid4())}
        k = key or self.key
        return jwt.encode({"alg": "RS256", "kid": k.kid, "typ": "JWT"}, body, k)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
