"""The per-box certificate authority and its leaves. Key material in memory only.

- The CA: ECDSA P-256, valid 30 days from the host's clock (minus an hour of
  slack), `BasicConstraints(ca, pathlen 0)` and `NameConstraints` marked
  critical (RFC 5280 §4.2.1.10): permitted DNS names are exactly the hosts it
  may intercept; excluded are `0.0.0.0/0` and `::/0`, so even a stolen CA key
  could not vouch for an IP address or any other name.
- Leaves: one per host, made on first use, ECDSA P-256, valid 24 hours
  (dated by the host's clock, an hour of slack before), SAN = the host only,
  EKU serverAuth; remade when less than an hour is left.
- `ssl` loads a certificate chain only from a path: the PEMs go through an
  anonymous memory file (`memfd_create`), read by `/proc/self/fd/N` and closed
  at once, so the keys never touch a disk.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import time
from collections.abc import Callable, Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tkbox.errors import UserError

CA_DAYS = 30
LEAF_HOURS = 24
SLACK = datetime.timedelta(hours=1)


class BoxCA:
    def __init__(self, box: str, hosts: Iterable[str],
                 clock: Callable[[], float] = time.time) -> None:
        self.hosts = frozenset(hosts)
        if not self.hosts:
            raise UserError("a box CA needs at least one host")
        self.clock = clock
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = self._now()
        self.name = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tkbox"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"tkbox box CA for {box}"[:64]),
        ])
        constraints = x509.NameConstraints(
            permitted_subtrees=[x509.DNSName(h) for h in sorted(self.hosts)],
            excluded_subtrees=[x509.IPAddress(ipaddress.ip_network("0.0.0.0/0")),
                               x509.IPAddress(ipaddress.ip_network("::/0"))],
        )
        self.cert = (
            x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - SLACK).not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(constraints, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM).decode()
        self._leaves: dict[tuple[str, bool], tuple[ssl.SSLContext, datetime.datetime]] = {}

    def _now(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.clock(), datetime.UTC)

    def leaf(self, host: str) -> x509.Certificate:
        return self._make_leaf(host)[0]

    def _make_leaf(self, host: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        if host not in self.hosts:
            raise UserError(f"the box CA may not issue for {host}")
        key = ec.generate_private_key(ec.SECP256R1())
        now = self._now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - SLACK)
            .not_valid_after(now + datetime.timedelta(hours=LEAF_HOURS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return cert, key

    def server_context(self, host: str, h2: bool = False) -> ssl.SSLContext:
        """A TLS server context for `host` (SNI must be `host`): HTTP/1.1 only, or with
        `h2` HTTP/2 first and HTTP/1.1 (ALPN, RFC 7301; the server's order decides).
        No renegotiation: a read and a write of one tunnel may be under way at once
        (`TLSStream`), and a renegotiating write would wait for a read."""
        now = self._now()
        cached = self._leaves.get((host, h2))
        if cached is not None and cached[1] - now > SLACK:
            return cached[0]
        cert, key = self._make_leaf(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.options |= ssl.OP_NO_RENEGOTIATION
        ctx.set_alpn_protocols(["h2", "http/1.1"] if h2 else ["http/1.1"])
        pem = (cert.public_bytes(serialization.Encoding.PEM)
               + key.private_bytes(serialization.Encoding.PEM,
                                   serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
        fd = os.memfd_create("tkbox-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, pem)
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)

        def check_sni(obj: object, name: str | None, c: ssl.SSLContext) -> int | None:
            if name is None or name.lower().rstrip(".") != host:
                return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
            return None

        ctx.sni_callback = check_sni
        self._leaves[(host, h2)] = (ctx, cert.not_valid_after_utc)
        return ctx
