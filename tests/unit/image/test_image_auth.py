"""The anonymous Bearer-token challenge, parsed and answered without I/O."""

from __future__ import annotations

import json

import pytest

from tkbox.errors import RegistryError
from tkbox.image.auth import parse_challenges, parse_token_response, token_request


def test_bearer_challenge_as_registries_send_it() -> None:
    (c,) = parse_challenges(
        'Bearer realm="https://auth.example/token",service="registry.example",'
        'scope="repository:org/app:pull"')
    assert c.scheme == "bearer"
    assert c.get("realm") == "https://auth.example/token"
    assert c.get("service") == "registry.example"
    assert c.get("scope") == "repository:org/app:pull"
    req = token_request(c, "org/app")
    assert req.url == ("https://auth.example/token?service=registry.example"
                       "&scope=repository%3Aorg%2Fapp%3Apull")


def test_scope_defaults_to_pull_of_the_repository_and_realm_query_is_kept() -> None:
    (c,) = parse_challenges('Bearer realm="https://a.example/t?x=1"')
    assert token_request(c, "a/b").url == "https://a.example/t?x=1&scope=repository%3Aa%2Fb%3Apull"


def test_several_challenges_quoted_escapes_and_token68() -> None:
    cs = parse_challenges('Negotiate abc==, Basic realm="x\\"y", Bearer realm="https://t"')
    assert [c.scheme for c in cs] == ["negotiate", "basic", "bearer"]
    assert cs[0].get("token68") == "abc=="
    assert cs[1].get("realm") == 'x"y'
    assert cs[2].get("realm") == "https://t"


@pytest.mark.parametrize("bad", [
    'Bearer realm="unterminated', 'Bearer realm="a" service="b"', "Bearer realm=https://t",
    'Bearer realm="a",realm="b"', "=", "Bearer realm=a,,=b", "x" * 9000,
])
def test_malformed_challenges_are_registry_errors(bad: str) -> None:
    with pytest.raises(RegistryError):
        parse_challenges(bad)


def test_token_realm_over_plain_http_is_refused() -> None:
    """A token fetched over http could be read or swapped on the way: refuse the realm."""
    (c,) = parse_challenges('Bearer realm="http://auth.example/token"')
    with pytest.raises(RegistryError, match="not an https URL"):
        token_request(c, "a/b")
    (c,) = parse_challenges('Bearer service="x"')
    with pytest.raises(RegistryError, match="no realm"):
        token_request(c, "a/b")


def test_token_answer_forms() -> None:
    assert parse_token_response(b'{"token":"abc"}') == "abc"
    assert parse_token_response(b'{"access_token":"def","expires_in":60}') == "def"


@pytest.mark.parametrize("body", [
    b"", b"[]", b'{"token":""}', b'{"token":5}', b"\xff", b"{" * 10 + b"}" * 10,
    json.dumps({"token": "a" * 20000}).encode(), b'{"x":1}',
])
def test_bad_token_answers_are_registry_errors(body: bytes) -> None:
    with pytest.raises(RegistryError):
        parse_token_response(body)


def test_header_injection_through_the_token_is_refused() -> None:
    """A token with CR/LF would let the token service write headers into our requests."""
    for token in ("abc\r\nX-Evil: 1", "abc def", "abc\x00"):
        with pytest.raises(RegistryError, match="header cannot carry"):
            parse_token_response(json.dumps({"token": token}).encode())
