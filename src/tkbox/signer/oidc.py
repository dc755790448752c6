"""Workload identity: a daemon proves which job it records for with an OIDC token.

The operator names the issuers it trusts (`tkbox signer serve --oidc-issuer URL
--oidc-audience AUD`, e.g. GitHub Actions' `https://token.actions.githubusercontent.com`)
and, optionally, which repositories may record (`--oidc-allow OWNER/REPO`, `OWNER/*`).
A daemon sends `{"op": "auth", "token": …}` on each connection; `Verifier.verify`:

1. bounds the token (`MAX_TOKEN`), reads its header, and takes only the
   asymmetric algorithms in `ALGORITHMS` (never `none`, never an HMAC the issuer's
   public key could be abused as);
2. checks the signature against the issuer's JWKS (from its
   `/.well-known/openid-configuration`, over HTTPS, or plain HTTP on loopback
   only; kept for `JWKS_TTL`, fetched again for an unknown `kid` at most every
   `REFETCH_AFTER`), with joserfc doing the JOSE work;
3. checks `iss` (exactly the configured URL), `aud` (contains the configured
   audience), `exp` and `nbf` (with `LEEWAY` seconds for clocks), and that it
   has `jti`, `iat` and `exp` at all, and a lifetime of at most `MAX_LIFETIME`;
4. checks the repository against the allow list (GitHub's `repository` claim;
   a token without one is refused where a list is set).

What it returns is the `formats.workload` object the signer records in the run's
open record, and its `principal`: the runs the connection may write to (the
signer refuses any other, and refuses a second run opened with the same `jti`).

Every refusal is `TokenRefused` with one line for a person that never quotes
the token.
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from joserfc import jwt
from joserfc.errors import (
    ExpiredTokenError,
    InvalidClaimError,
    InvalidTokenError,
    JoseError,
    MissingClaimError,
)
from joserfc.jwk import KeySet

from tkbox.errors import RemoteError
from tkbox.formats import workload as wl

log = logging.getLogger("tkbox.signer.oidc")

MAX_TOKEN = 16 * 1024
MAX_DOCUMENT = 256 * 1024  # an openid-configuration or a JWKS
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384")
LEEWAY = 60  # seconds either way for exp, nbf and iat
MAX_LIFETIME = 24 * 3600  # a token that claims to live longer is refused
JWKS_TTL = 3600.0
REFETCH_AFTER = 30.0
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"


class TokenRefused(RemoteError):
    """A workload token the signer will not take; one line, never the token."""


@dataclass(frozen=True)
class Issuer:
    url: str  # exactly the token's `iss`
    audience: str
    allow: tuple[str, ...] = ()  # repository patterns (fnmatch); empty: any
    ca_file: str | None = None  # to reach the issuer over HTTPS (default: the system's)

    def check(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme == "https" and parts.hostname:
            return
        if parts.scheme == "http" and _loopback(parts.hostname or ""):
            return
        raise TokenRefused(f"issuer {self.url!r}: an issuer is an https:// URL (plain http "
                           "only on loopback, for tests)")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class Identity:
    """Who a connection proved to be."""

    principal: str
    workload: dict[str, Any]
    jti: str | None = None  # `issuer#jti`: a token opens one run


@dataclass
class _Keys:
    keys: KeySet | None = None
    fetched: float = -1e18  # monotonic time of the last fetch (tried)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Verifier:
    """Checks tokens of the configured issuers (see the module docstring)."""

    def __init__(self, issuers: list[Issuer], *, now: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 http: httpx.AsyncClient | None = None) -> None:
        for i in issuers:
            i.check()
        self.issuers = {i.url: i for i in issuers}
        self._now = now
        self._monotonic = monotonic
        self._keys = {i.url: _Keys() for i in issuers}
        self._http = http
        self._clients: dict[str | None, httpx.AsyncClient] = {}

    async def verify(self, token: Any) -> Identity:
        if not isinstance(token, str) or not token:
            raise TokenRefused("the token is not a string")
        if len(token) > MAX_TOKEN:
            raise TokenRefused(f"the token is longer than {MAX_TOKEN} characters")
        if token.count(".") != 2 or not token.isascii():
            raise TokenRefused("the token is not a compact JWS (three base64url parts)")
        issuer = self._issuer_of(token)
        keys = await self._keyset(issuer, refresh=False)
        try:
            tok = jwt.decode(token, keys, algorithms=list(ALGORITHMS))
        except (ValueError, TypeError, KeyError, IndexError) as exc:  # hostile bytes
            raise TokenRefused(f"the token cannot be read ({exc.__class__.__name__})") from None
        except JoseError as exc:
            if "kid" in str(exc).lower() or exc.__class__.__name__ in ("InvalidKeyIdError",):
                keys = await self._keyset(issuer, refresh=True)
                try:
                    tok = jwt.decode(token, keys, algorithms=list(ALGORITHMS))
                except JoseError as exc2:
                    raise _refused(exc2) from None
                except (ValueError, TypeError, KeyError, IndexError) as exc2:
                    raise TokenRefused("the token cannot be read "
                                       f"({exc2.__class__.__name__})") from None
            else:
                raise _refused(exc) from None
        claims = tok.claims
        self._check_claims(issuer, claims)
        identity = wl.from_claims(issuer.url, issuer.audience, claims)
        repo = claims.get("repository")
        if issuer.allow:
            if not isinstance(repo, str) or not any(fnmatch.fnmatchcase(repo, p)
                                                     for p in issuer.allow):
                shown = wl.describe(identity) if isinstance(repo, str) else "no repository"
                raise TokenRefused(f"the token's workload ({shown}) is not one this signer's "
                                   "operator allows to record (--oidc-allow)")
        return Identity(identity["principal"], identity, f"{identity['issuer']}#{identity['jti']}")

    def _issuer_of(self, token: str) -> Issuer:
        """The configured issuer the token names (read before its signature is checked,
        only to pick the keys; checked again with the rest of the claims)."""
        from joserfc.jws import extract_compact

        try:
            obj = extract_compact(token.encode())
            claims = json.loads(obj.payload or b"")
        except (JoseError, ValueError, TypeError, KeyError, IndexError, RecursionError):
            raise TokenRefused("the token cannot be read (not a JWT)") from None
        iss = claims.get("iss") if isinstance(claims, dict) else None
        issuer = self.issuers.get(iss) if isinstance(iss, str) else None
        if issuer is None:
            raise TokenRefused("the token's issuer is not one this signer trusts"
                               + (f" ({wl.describe({})})" if iss is None else
                                  f" ({str(iss)[:120]!r})"))
        return issuer

    def _check_claims(self, issuer: Issuer, claims: dict[str, Any]) -> None:
        now = int(self._now())
        registry = jwt.JWTClaimsRegistry(
            now=now, leeway=LEEWAY,
            iss={"essential": True, "value": issuer.url},
            aud={"essential": True, "value": issuer.audience},
            exp={"essential": True}, iat={"essential": True}, jti={"essential": True})
        try:
            registry.validate(claims)
        except ExpiredTokenError:
            raise TokenRefused("the token has expired (exp); ask its issuer for a fresh one"
                               ) from None
        except MissingClaimError as exc:
            raise TokenRefused(f"the token lacks a claim the signer needs ({exc.description})"
                               ) from None
        except InvalidClaimError as exc:
            text = str(exc)
            if "not yet valid" in text or "future" in text or "'nbf'" in text \
                    or "'iat'" in text:
                raise TokenRefused(f"the token is not valid yet ({exc.description}); is a "
                                   "clock wrong?") from None
            if "aud" in str(exc):
                raise TokenRefused(f"the token is for another audience (the signer takes "
                                   f"{issuer.audience!r})") from None
            raise TokenRefused(f"the token's claims do not check ({exc.description})") from None
        except InvalidTokenError as exc:  # nbf or iat in the future
            raise TokenRefused(f"the token is not valid yet ({exc.description}); is a clock "
                               "wrong?") from None
        except JoseError as exc:
            raise _refused(exc) from None
        jti = claims["jti"]
        if not isinstance(jti, str) or not 0 < len(jti) <= wl.MAX_VALUE:
            raise TokenRefused(f"the token's jti is not a string of 1-{wl.MAX_VALUE} characters")
        nbf, iat, exp = claims.get("nbf"), claims["iat"], claims["exp"]
        for name, v in (("iat", iat), ("exp", exp), ("nbf", nbf)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise TokenRefused(f"the token's {name} is not an integer time")
        if isinstance(nbf, int) and nbf > now + LEEWAY:
            raise TokenRefused("the token is not valid yet (nbf); is a clock wrong?")
        if exp - min(iat, nbf if isinstance(nbf, int) else iat) > MAX_LIFETIME:
            raise TokenRefused(f"the token claims to live more than {MAX_LIFETIME} s")

    async def _keyset(self, issuer: Issuer, *, refresh: bool) -> KeySet:
        k = self._keys[issuer.url]
        async with k.lock:
            age = self._monotonic() - k.fetched
            if k.keys is not None and age < JWKS_TTL and not (refresh and age > REFETCH_AFTER):
                return k.keys
            if k.keys is not None and refresh and age <= REFETCH_AFTER:
                return k.keys  # fetched moments ago: an unknown kid stays unknown
            k.fetched = self._monotonic()
            try:
                k.keys = await self._fetch_keys(issuer)
            except TokenRefused:
                if k.keys is None:
                    raise
                log.warning("could not refresh the keys of %s; keeping the ones it had",
                            issuer.url)
            return k.keys

    async def _fetch_keys(self, issuer: Issuer) -> KeySet:
        conf = await self._get_json(issuer, issuer.url.rstrip("/")
                                    + "/.well-known/openid-configuration")
        uri = conf.get("jwks_uri")
        if not isinstance(uri, str):
            raise TokenRefused(f"the issuer {issuer.url} publishes no jwks_uri")
        parts = urlsplit(uri)
        if not (parts.scheme == "https" or (parts.scheme == "http"
                                            and _loopback(parts.hostname or ""))):
            raise TokenRefused(f"the issuer {issuer.url}'s jwks_uri is not https")
        jwks = await self._get_json(issuer, uri)
        try:
            keys = KeySet.import_key_set(jwks)  # type: ignore[arg-type]
        except (JoseError, KeyError, TypeError, ValueError) as exc:
            raise TokenRefused(f"the issuer {issuer.url}'s JWKS cannot be read "
                               f"({exc.__class__.__name__})") from None
        if not keys.keys:
            raise TokenRefused(f"the issuer {issuer.url}'s JWKS holds no key the signer reads")
        return keys

    async def _get_json(self, issuer: Issuer, url: str) -> dict[str, Any]:
        client = self._client(issuer.ca_file)
        try:
            async with client.stream("GET", url) as resp:
                if resp.status_code != 200:
                    raise TokenRefused(f"the issuer answered HTTP {resp.status_code} for {url}")
                body = b""
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_DOCUMENT:
                        raise TokenRefused(f"{url} is larger than {MAX_DOCUMENT} bytes")
        except httpx.HTTPError as exc:
            raise TokenRefused(f"cannot reach the issuer at {url} "
                               f"({' '.join(str(exc).split()) or exc.__class__.__name__})"
                               ) from None
        try:
            obj = json.loads(body)
        except ValueError:
            raise TokenRefused(f"{url} is not JSON") from None
        if not isinstance(obj, dict):
            raise TokenRefused(f"{url} is not a JSON object")
        return obj

    def _client(self, ca_file: str | None) -> httpx.AsyncClient:
        if self._http is not None:
            return self._http
        if ca_file not in self._clients:
            self._clients[ca_file] = httpx.AsyncClient(
                timeout=5.0, trust_env=False, follow_redirects=False,
                verify=ca_file if ca_file else True)
        return self._clients[ca_file]

    async def aclose(self) -> None:
        for c in self._clients.values():
            await c.aclose()
        self._clients.clear()


def _refused(exc: JoseError) -> TokenRefused:
    name = exc.__class__.__name__
    if name == "BadSignatureError":
        return TokenRefused("the token's signature does not verify with its issuer's keys "
                            "(forged, or signed by another key)")
    if name in ("UnsupportedAlgorithmError", "UnsupportedHeaderError"):
        return TokenRefused(f"the token's algorithm is not one the signer takes "
                            f"({', '.join(ALGORITHMS)})")
    return TokenRefused(f"the token is refused ({name}: {exc.description})"[:300])
