"""A value is swapped on its bound port only (443 unless the spec names another).

Attack: a guest allowed `host:8443` (or any port the network door admits) sends
the placeholder there, so the real value goes to whatever listens on that port
of the bound host. The swap is bound to (host, port): elsewhere the placeholder
is a leak, refused as a placeholder sent to an unbound host is.
"""

from __future__ import annotations

import pytest

from tkbox.doors.secrets.hosts import read_hosts
from tkbox.doors.secrets.rules import SecretLeak, TunnelRules, Use
from tkbox.doors.secrets.spec import Secret, SecretSpec, load, parse_spec
from tkbox.errors import UserError

VALUE = b"ghp_S3cr3tV4lueXYZ"
PH = b"tkbox_GH_00112233445566778899aabbccddeeff"


def _secret(spec: SecretSpec) -> Secret:
    return Secret(spec, VALUE, PH)


def _request(rules: TunnelRules, authority: bytes) -> tuple[list[tuple[bytes, bytes]], list[Use]]:
    return rules.request(b"GET", b"/", [(b"host", authority),
                                       (b"authorization", b"Bearer " + PH)])


def test_a_spec_without_a_port_binds_443_and_reads_as_before() -> None:
    s = parse_spec("GH=env:GH@api.example,b.example")
    assert s == SecretSpec("GH", "env", "GH", ("api.example", "b.example"))
    assert s.binds == (("api.example", 443), ("b.example", 443))
    assert s.describe()["hosts"] == ["api.example", "b.example"]


def test_a_spec_names_a_port() -> None:
    s = parse_spec("GH=env:GH@api.example:8443,api.example,b.example:443;header=x-key")
    assert s.hosts == ("api.example", "b.example")
    assert s.binds == (("api.example", 8443), ("api.example", 443), ("b.example", 443))
    assert s.describe()["hosts"] == ["api.example:8443", "api.example", "b.example"]
    assert s.headers == ("x-key",)


@pytest.mark.parametrize("text", ["GH=env:X@h.example:0", "GH=env:X@h.example:65536",
                                  "GH=env:X@h.example:08443", "GH=env:X@h.example:",
                                  "GH=env:X@h.example:x", "GH=env:X@h.example:1:2"])
def test_a_bad_port_is_one_line_error(text: str) -> None:
    with pytest.raises(UserError) as e:
        parse_spec(text)
    assert "HOST:PORT" in e.value.message and "\n" not in e.value.message


def test_binding_allows_only_the_bound_port() -> None:
    h = read_hosts([], [_secret(parse_spec("GH=env:GH@api.example:8443"))], "",
                   expand=lambda _: None)
    assert h.allow == ["api.example:8443"]
    assert h.bound == {"api.example"}


def test_two_secrets_may_share_a_header_on_different_ports() -> None:
    env = {"A": "AAAAsecretvalue1", "B": "BBBBotherthing22"}
    load(["A=env:A@h.example", "B=env:B@h.example:8443"], env)
    with pytest.raises(UserError, match="header authorization of h.example:8443"):
        load(["A=env:A@h.example:8443", "B=env:B@h.example:8443"], env)


def test_placeholder_to_another_port_of_the_bound_host_is_a_leak_not_a_swap() -> None:
    """Attack: send the placeholder to port 8443 of a host bound (by default) on 443."""
    spec = parse_spec("GH=env:GH@api.example")
    with pytest.raises(SecretLeak) as e:
        _request(TunnelRules("api.example", 8443, [_secret(spec)]), b"api.example:8443")
    assert e.value.hit.kind == "placeholder" and e.value.where == "header authorization"
    assert e.value.record()["host"] == "api.example"
    msg = e.value.reason
    assert "swapped only at api.example, not on port 8443" in msg
    assert "bind it as @api.example:8443" in msg
    assert VALUE.decode() not in msg and VALUE.decode() not in str(e.value.record())
    # on 443 it is swapped
    out, uses = _request(TunnelRules("api.example", 443, [_secret(spec)]), b"api.example")
    assert (b"authorization", b"Bearer " + VALUE) in out and len(uses) == 1


def test_a_bound_port_swaps_and_443_then_does_not() -> None:
    spec = parse_spec("GH=env:GH@api.example:8443")
    out, uses = _request(TunnelRules("api.example", 8443, [_secret(spec)]), b"api.example:8443")
    assert (b"authorization", b"Bearer " + VALUE) in out and len(uses) == 1
    with pytest.raises(SecretLeak, match="swapped only at api.example:8443, not on port 443"):
        _request(TunnelRules("api.example", 443, [_secret(spec)]), b"api.example")


def test_an_agents_model_host_on_a_port_binds_its_key_there() -> None:
    from pathlib import Path

    from tkbox.agents.job import AgentSpec, box_options

    o = box_options(AgentSpec(agent="claude-code", prompt="p", workspace=Path("."),
                              model_host="llm.example:8443"))
    (spec,) = [parse_spec(s) for s in o["secrets"]]
    assert spec.binds == (("llm.example", 8443),) and "llm.example:8443" in o["allow"]


def test_a_plain_http_refusal_never_asks_to_bind_a_port() -> None:
    """Even a secret bound on host:80 is not swapped into plain http: the refusal says
    so, on whatever port the request named, and names no binding to add."""
    sec = _secret(parse_spec("GH=env:GH@api.example:80"))
    for port in (80, 8080):
        with pytest.raises(SecretLeak) as e:
            TunnelRules("api.example", port, [sec], plain=True).check_plain(
                b"GET", b"/", [(b"authorization", b"Bearer " + PH)])
        assert "nothing is ever swapped into a plain http:// request" in e.value.reason
        assert "api.example:80" in e.value.reason and "bind it as" not in e.value.reason
