"""The --secret flag, the header swap, the request rules, the box CA (model usage:
test_secrets_model_usage.py)."""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509

from tkbox.doors.secrets.ca import BoxCA
from tkbox.doors.secrets.rules import BadTunnelRequest, SecretLeak, TunnelRules
from tkbox.doors.secrets.spec import Secret, SecretSpec, load, parse_spec
from tkbox.doors.secrets.swap import swap
from tkbox.errors import UserError

VALUE = b"ghp_S3cr3tV4lueXYZ"
PH = b"tkbox_GH_00112233445566778899aabbccddeeff"


# --- the flag -------------------------------------------------------------------

def test_parse_full_spec() -> None:
    s = parse_spec("ANTHROPIC_API_KEY=env:KEY@API.Anthropic.com.,b.example;header=x-api-key")
    assert s == SecretSpec("ANTHROPIC_API_KEY", "env", "KEY",
                           ("api.anthropic.com", "b.example"), "x-api-key")


@pytest.mark.parametrize("text,fragment", [
    ("", "empty"),
    ("GH", "no '='"),
    ("1GH=env:X@h.example", "not an environment name"),
    ("GH=env:X", "no '@host'"),
    ("GH=vault:X@h.example", "not env:VAR or file:PATH"),
    ("GH=env:X-Y@h.example", "not an environment variable name"),
    ("GH=env:X@10.0.0.1", "not a DNS name"),
    ("GH=env:X@h.example;header=host", "framing or routing"),
    ("GH=env:X@h.example;header=a b", "not an HTTP header name"),
    ("GH=env:X@h.example;cookie=1", "unknown option"),
    ("GH=env:X@h.example\n", "control characters"),
])
def test_malformed_secret_is_one_line_error(text: str, fragment: str) -> None:
    """A malformed --secret says what to fix, on one line."""
    with pytest.raises(UserError) as e:
        parse_spec(text)
    assert fragment in e.value.message
    assert "\n" not in e.value.message


def test_value_errors_never_show_the_value(tmp_path: Path) -> None:
    """Unset, unreadable, empty, too short, unprintable, overlapping: none print a value."""
    env = {"SHORT": "abc", "EMPTY": "", "SPACE": "abc def ghi", "A": "AAAAsecretvalue1",
           "B": "zzsecretvalue1zz"}
    cases = [("GH=env:NOPE@h.example", "not set"),
             (f"GH=file:{tmp_path}/missing@h.example", "cannot read"),
             ("GH=env:EMPTY@h.example", "empty"),
             ("GH=env:SHORT@h.example", "shorter than 8"),
             ("GH=env:SPACE@h.example", "cannot go in an HTTP header")]
    for text, fragment in cases:
        with pytest.raises(UserError) as e:
            load([text], env)
        assert fragment in e.value.message
        assert "abc" not in e.value.message
    with pytest.raises(UserError) as e:
        load(["A=env:A@h.example", "B=env:B@i.example"], env)
    assert "overlap" in e.value.message and "secretvalue" not in e.value.message


def test_several_headers_and_no_shared_header() -> None:
    s = parse_spec("AK=env:K@api.example;header=X-Api-Key, Authorization")
    assert s.headers == ("x-api-key", "authorization")
    env = {"A": "valueAAAAAAAA1", "B": "valueBBBBBBBB2"}
    with pytest.raises(UserError) as e:
        load(["A=env:A@h.example", "B=env:B@h.example,i.example"], env)
    assert "both bound to header authorization of h.example" in e.value.message


def test_file_value_and_placeholder(tmp_path: Path) -> None:
    f = tmp_path / "tok"
    f.write_bytes(VALUE + b"\n")
    (s,) = load([f"GH=file:{f}@h.example"], {})
    assert s.value == VALUE
    assert s.placeholder.startswith(b"tkbox_GH_") and len(s.placeholder) == 9 + 32
    assert VALUE.decode() not in repr(s)


# --- swap ---------------------------------------------------------------------------

@pytest.mark.parametrize("sent,expected", [
    (PH, VALUE),
    (b"Bearer " + PH, b"Bearer " + VALUE),
    (b"  token " + PH + b" ", b"token " + VALUE),
    (b"Basic " + base64.b64encode(b"user:" + PH), b"Basic " + base64.b64encode(b"user:" + VALUE)),
    (b"Basic " + base64.b64encode(PH + b":x-oauth"),
     b"Basic " + base64.b64encode(VALUE + b":x-oauth")),
])
def test_swap_forms(sent: bytes, expected: bytes) -> None:
    assert swap(sent, PH, VALUE) == expected


@pytest.mark.parametrize("sent", [b"Bearer x" + PH, b"Digest " + PH, b"Basic !!!!",
                                  b"Basic " + base64.b64encode(b"user:pw"), b"Bearer " + PH + b"x"])
def test_swap_refuses_other_forms(sent: bytes) -> None:
    assert swap(sent, PH, VALUE) is None


# --- rules ---------------------------------------------------------------------------

def _rules(host: str = "api.example", header: str = "authorization") -> TunnelRules:
    spec = SecretSpec("GH", "env", "X", ("api.example",), header)
    return TunnelRules(host, 443, [Secret(spec, VALUE, PH)])


def test_bound_header_is_swapped_and_use_noted() -> None:
    out, uses = _rules().request(b"GET", b"/user", [(b"Host", b"api.example"),
                                                   (b"Authorization", b"Bearer " + PH),
                                                   (b"Accept-Encoding", b"gzip")])
    assert (b"Authorization", b"Bearer " + VALUE) in out
    assert (b"accept-encoding", b"identity") in out and (b"Accept-Encoding", b"gzip") not in out
    assert [(u.name, u.header) for u in uses] == [("GH", "authorization")]


@pytest.mark.parametrize("headers,target,where", [
    ([(b"X-Other", b"Bearer " + PH)], b"/", "header X-Other"),
    ([], b"/?t=" + PH, "URL"),
    ([(b"Authorization", b"Bearer " + VALUE)], b"/", "header Authorization"),
    ([(b"Authorization", b"Digest " + PH)], b"/", "header Authorization"),
    ([(b"Cookie", base64.b64encode(VALUE))], b"/", "header Cookie"),
])
def test_placeholder_or_value_elsewhere_is_a_leak(headers: list[tuple[bytes, bytes]],
                                                   target: bytes, where: str) -> None:
    """The placeholder outside the bound header, or the value anywhere, blocks the request."""
    with pytest.raises(SecretLeak) as e:
        _rules().request(b"GET", target, [(b"Host", b"api.example"), *headers])
    assert e.value.where == where
    assert VALUE.decode() not in e.value.reason and PH.decode() not in e.value.reason
    assert set(e.value.record()) == {"name", "host", "where", "kind", "form", "escaped"}


def test_placeholder_to_unbound_host_is_a_leak() -> None:
    """Under inspection of another host, even the bound header may not carry it."""
    with pytest.raises(SecretLeak):
        _rules("other.example").request(b"GET", b"/", [(b"Host", b"other.example"),
                                                      (b"Authorization", b"Bearer " + PH)])


@pytest.mark.parametrize("host", [b"evil.example", b"api.example:8443", b""])
def test_host_must_be_the_tunnels(host: bytes) -> None:
    """Attack: a tunnel opened to a checked host carries a request routed to another."""
    with pytest.raises(BadTunnelRequest):
        _rules().request(b"GET", b"/", [(b"Host", host)])


@pytest.mark.parametrize("target", [b"https://evil.example/", b"evil.example:443", b"*", b"x"])
def test_target_must_be_origin_form(target: bytes) -> None:
    """Attack: an absolute URL inside a tunnel, which origins route on before Host."""
    with pytest.raises(BadTunnelRequest):
        _rules().request(b"GET", target, [(b"Host", b"api.example")])


def test_encoded_request_body_refused() -> None:
    """Attack: gzip a body so the scanner sees nothing."""
    with pytest.raises(BadTunnelRequest):
        _rules().request(b"POST", b"/", [(b"Host", b"api.example"),
                                         (b"Content-Encoding", b"gzip")])


def test_response_headers_redacted() -> None:
    out, n = _rules().redact_headers([(b"X-Echo", b"tok=" + VALUE)])
    assert n == 1 and VALUE not in out[0][1] and len(out[0][1]) == len(b"tok=" + VALUE)


# --- the CA ---------------------------------------------------------------------------

def test_ca_is_name_constrained_and_leaves_short_lived() -> None:
    ca = BoxCA("b1", ["api.example", "b.example"], clock=lambda: 1_900_000_000.0)
    nc = ca.cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert nc.critical
    assert {g.value for g in nc.value.permitted_subtrees or []} == {"api.example", "b.example"}
    assert {g.value for g in nc.value.excluded_subtrees or []} == {
        ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")}
    leaf = ca.leaf("api.example")
    assert (leaf.not_valid_after_utc - leaf.not_valid_before_utc).total_seconds() == 25 * 3600
    assert leaf.not_valid_before_utc.timestamp() == 1_900_000_000 - 3600
    with pytest.raises(UserError):
        ca.leaf("other.example")


