"""The signer's network listener: the same framed protocol as its Unix socket, over TLS.

    tkbox signer serve --listen HOST:PORT --tls-cert CERT --tls-key KEY
                       [--client-ca CA]                       mutual TLS
                       [--oidc-issuer URL --oidc-audience AUD  workload identity
                        [--oidc-allow OWNER/REPO …] [--oidc-ca PEM]]

The stream is TLS 1.3 (Python's `ssl`: the library does the protocol work),
and inside it the frames of `formats.wire`, exactly as on the Unix socket. Who
may record:

- **mutual TLS**: with `--client-ca`, a client certificate is verified against
  that CA alone (pinned: not the system's store). A certificate from another CA
  fails the handshake: nothing is read from that connection. The certificate's
  SHA-256 is the connection's principal.
- **workload identity**: with an issuer configured, a connection may come
  without a certificate and send `{"op": "auth", "token": …}` first
  (`signer.oidc`); the token's claims become the connection's workload.

A connection that has proved neither may only `ping` and `auth`, and is closed
if it has not authenticated within `AUTH_DEADLINE` seconds. A remote
connection may never hold, release or quarantine (those are the signer's own
user's, on its Unix socket), and writes only to runs its own principal opened.
"""

from __future__ import annotations

import hashlib
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tkbox.errors import UserError
from tkbox.formats import workload as wl
from tkbox.signer.oidc import Identity, Issuer

AUTH_DEADLINE = 10.0
MAX_CONNECTIONS = 1024  # remote connections at once; beyond, new ones are closed at once


@dataclass
class RemoteConfig:
    host: str
    port: int
    cert: Path
    key: Path
    client_ca: Path | None = None
    issuers: list[Issuer] = field(default_factory=list)

    def check(self) -> None:
        if self.client_ca is None and not self.issuers:
            raise UserError("--listen needs a way to tell daemons apart: --client-ca (mutual "
                            "TLS) and/or --oidc-issuer with --oidc-audience (workload identity)")
        for p in (self.cert, self.key, *( [self.client_ca] if self.client_ca else [])):
            if not p.is_file():
                raise UserError(f"{p} does not exist")
        for i in self.issuers:
            i.check()

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise UserError(f"cannot use --tls-cert {self.cert} / --tls-key {self.key}: "
                            f"{_why(exc)}") from None
        if self.client_ca is not None:
            try:
                ctx.load_verify_locations(cafile=str(self.client_ca))
            except (OSError, ssl.SSLError) as exc:
                raise UserError(f"cannot use --client-ca {self.client_ca}: {_why(exc)}") from None
            # Without an issuer every daemon must present a certificate; with one, a
            # daemon may come without and authenticate by its token instead. Either way a
            # certificate that is presented must chain to this CA, or the handshake fails.
            ctx.verify_mode = ssl.CERT_OPTIONAL if self.issuers else ssl.CERT_REQUIRED
        else:
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


def certificate_identity(ssl_object: Any) -> Identity | None:
    """The principal of a verified client certificate, or None when none was presented."""
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    from cryptography import x509

    subject = x509.load_der_x509_certificate(der).subject.rfc4514_string()
    fp = hashlib.sha256(der).hexdigest()
    w = wl.from_certificate(subject or "(no subject)", fp)
    return Identity(w["principal"], w, None)


def parse_listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:7390")
    return host, int(port)


def _why(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or exc.__class__.__name__
