"""Security: the signer's workload-token check (`tkbox.signer.oidc`), each attack its
own test. The issuer here is an `httpx.MockTransport` serving its discovery document
and JWKS, and the clock is a fake: no network, no real time.

The real issuer on loopback, the real signer process and the real client are in
tests/integration/signer/test_signer_remote.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from typing import Any

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import ECKey, KeySet, RSAKey

from tkbox.signer.oidc import Issuer, TokenRefused, Verifier

ISS = "https://issuer.test"
AUD = "tkbox-signer"
NOW = 1_800_000_000
KEY = RSAKey.generate_key(2048, parameters={"kid": "k1"})


class World:
    def __init__(self, keys: list[Any] | None = None) -> None:
        self.keys = keys or [KEY]
        self.fetches = 0
        self.now = float(NOW)
        self.mono = 0.0

        def handler(req: httpx.Request) -> httpx.Response:
            if req.url.path == "/.well-known/openid-configuration":
                return httpx.Response(200, json={"issuer": ISS, "jwks_uri": ISS + "/jwks"})
            if req.url.path == "/jwks":
                self.fetches += 1
                return httpx.Response(200, json=KeySet(self.keys).as_dict(private=False))
            return httpx.Response(404)

        self.http = httpx.AsyncClient(transport=httpx.MockTransport(handler))

    def verifier(self, allow: tuple[str, ...] = ()) -> Verifier:
        return Verifier([Issuer(ISS, AUD, allow)], now=lambda: self.now,
                        monotonic=lambda: self.mono, http=self.http)


def mint(key: Any = KEY, alg: str = "RS256", **over: Any) -> str:
    claims = {"iss": ISS, "aud": AUD, "sub": "repo:o/r:ref:refs/heads/main", "iat": NOW,
              "nbf": NOW, "exp": NOW + 300, "jti": str(uuid.uuid4()), "repository": "o/r",
              "run_id": "7", "run_attempt": "1", "workflow": "wf", "ref": "refs/heads/main",
              "sha": "ab" * 20}
    claims.update(over)
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode({"alg": alg, "kid": getattr(key, "kid", None) or "k1"}, claims, key,
                      algorithms=[alg])


def verify(w: World, token: str, **kw: Any) -> Any:
    return asyncio.run(w.verifier(**kw).verify(token))


def refused(w: World, token: str, match: str, **kw: Any) -> str:
    with pytest.raises(TokenRefused) as info:
        verify(w, token, **kw)
    why = str(info.value)
    assert match in why, why
    assert "\n" not in why and token not in why
    sig = (token.split(".") + ["", ""])[2]
    assert len(sig) < 16 or sig not in why
    return why


def test_a_good_token_names_its_workload_and_binds_its_jti() -> None:
    w = World()
    ident = verify(w, mint(jti="j-1"))
    assert ident.principal == f"oidc|{ISS}|repo:o/r|run:7|attempt:1"
    assert ident.jti == f"{ISS}#j-1"
    assert ident.workload["kind"] == "github" and ident.workload["sha"] == "ab" * 20


def test_alg_none_is_refused() -> None:
    head = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=").decode()
    body = {"iss": ISS, "aud": AUD, "iat": NOW, "exp": NOW + 60, "jti": "x"}
    payload = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    refused(World(), f"{head}.{payload}.", "algorithm")


def test_an_hmac_token_keyed_with_the_issuers_public_key_is_refused() -> None:
    """Algorithm confusion: HS256 with the public key's bytes as the shared secret."""
    import hashlib
    import hmac

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    body = {"iss": ISS, "aud": AUD, "iat": NOW, "nbf": NOW, "exp": NOW + 60, "jti": "x"}
    signing = b64(b'{"alg":"HS256","kid":"k1"}') + "." + b64(json.dumps(body).encode())
    mac = hmac.new(KEY.as_pem(private=False), signing.encode(), hashlib.sha256).digest()
    refused(World(), signing + "." + b64(mac), "algorithm")


def test_a_token_signed_by_another_key_with_the_same_kid_is_forged() -> None:
    other = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    refused(World(), mint(key=other), "signature does not verify")


def test_a_token_signed_by_a_key_the_issuer_does_not_publish_is_refused() -> None:
    other = ECKey.generate_key("P-256", parameters={"kid": "k9"})
    refused(World(), mint(key=other, alg="ES256"), "refused")


def test_another_audience_expired_and_not_yet_valid_are_refused() -> None:
    w = World()
    refused(w, mint(aud="other"), "another audience")
    refused(w, mint(iat=NOW - 900, nbf=NOW - 900, exp=NOW - 120), "expired")
    refused(w, mint(nbf=NOW + 600, exp=NOW + 900), "not valid yet")
    refused(w, mint(iat=NOW + 600, nbf=NOW + 600, exp=NOW + 900), "not valid yet")


def test_the_clock_leeway_is_one_minute_either_way() -> None:
    w = World()
    verify(w, mint(iat=NOW - 400, nbf=NOW - 400, exp=NOW - 30))  # 30 s past exp: taken
    refused(w, mint(iat=NOW - 400, nbf=NOW - 400, exp=NOW - 90), "expired")


def test_an_issuer_the_signer_does_not_trust_is_refused() -> None:
    refused(World(), mint(iss="https://evil.test"), "not one this signer trusts")


def test_a_token_without_jti_or_with_an_endless_life_is_refused() -> None:
    w = World()
    refused(w, mint(jti=None), "jti")
    refused(w, mint(exp=NOW + 3 * 24 * 3600), "more than")


def test_the_repository_allow_list() -> None:
    w = World()
    verify(w, mint(), allow=("o/*",))
    refused(w, mint(repository="evil/r"), "not one this signer's operator allows",
            allow=("o/*",))
    refused(w, mint(repository=None), "not one this signer's operator allows",
            allow=("o/r",))


def test_an_oversized_or_malformed_token_is_refused_before_any_fetch() -> None:
    w = World()
    refused(w, "a" * 20000, "longer than")
    refused(w, "not-a-token", "compact JWS")
    refused(w, "a.b.c", "cannot be read")
    assert w.fetches == 0


def test_an_unknown_kid_fetches_the_keys_again_at_most_every_30_s() -> None:
    """A flood of tokens with unknown key ids cannot make the signer hammer the issuer."""
    w = World()
    v = w.verifier()
    asyncio.run(v.verify(mint()))
    assert w.fetches == 1
    stranger = RSAKey.generate_key(2048, parameters={"kid": "k2"})

    async def flood() -> None:
        for _ in range(20):
            with pytest.raises(TokenRefused):
                await v.verify(mint(key=stranger))

    w.mono = 10.0
    asyncio.run(flood())
    assert w.fetches == 1
    w.mono = 45.0  # the issuer rotated its keys: the new kid is fetched once
    w.keys = [KEY, stranger]
    asyncio.run(v.verify(mint(key=stranger)))
    assert w.fetches == 2


def test_a_plain_http_issuer_is_taken_on_loopback_only() -> None:
    Issuer("http://127.0.0.1:8080", AUD).check()
    with pytest.raises(TokenRefused, match="https"):
        Issuer("http://issuer.example", AUD).check()


def test_garbage_tokens_are_only_ever_token_refusals() -> None:
    """Fuzz: any three base64url-ish parts (headers and payloads that are JSON of the
    wrong shapes among them) give TokenRefused, never another exception."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    w = World()
    v = w.verifier()

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    json_ish = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                            lambda c: st.lists(c, max_size=3)
                            | st.dictionaries(st.sampled_from(
                                ["alg", "kid", "iss", "aud", "exp", "typ", "crit", "b64"]),
                                c, max_size=4), max_leaves=8)
    part = st.one_of(st.binary(max_size=40).map(b64),
                     json_ish.map(lambda o: b64(json.dumps(o).encode())),
                     st.text(alphabet="abc-_=.+/", max_size=10))

    @settings(max_examples=300, deadline=None)
    @given(part, part, part, st.booleans())
    def one(h: str, p: str, s: str, real_iss: bool) -> None:
        if real_iss:
            p = b64(json.dumps({"iss": ISS, "aud": AUD, "exp": NOW + 5, "jti": "x"}).encode())
        with pytest.raises(TokenRefused):
            asyncio.run(v.verify(f"{h}.{p}.{s}"))

    one()
