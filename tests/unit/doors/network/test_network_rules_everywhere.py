"""The same request rules in every front end: the Action's `allow` input, the SDK and
MCP (which pass `allow` strings through unchanged to the daemon, which parses them
with the door's `Allowlist`), and Cedar in the signer (each request on a ruled host
is an `Http` decision the operator's policy can refuse)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tkbox.doors.network.allowlist import Allowlist
from tkbox.doors.secrets.hosts import read_hosts
from tkbox.signer.cedarpolicy import PolicyEngine

ROOT = Path(__file__).parents[4]


def _action() -> object:
    spec = importlib.util.spec_from_file_location("tkbox_action_run", ROOT / "action" / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_actions_allow_input_keeps_an_entry_with_rules_whole() -> None:
    split = _action().split_allow  # type: ignore[attr-defined]
    text = "pypi, npm\napi.test GET HEAD /a,b/**; ask DELETE /x/**\ngithub-read@ghe.test"
    got = split(text)
    assert got == ["pypi", "npm", "api.test GET HEAD /a,b/**; ask DELETE /x/**",
                   "github-read@ghe.test"]
    rules = Allowlist(got, expand=lambda n: () if n in ("pypi", "npm") else None
                      if "@" not in n else ("ghe.test GET /**",)).rules_for("api.test", 443)
    assert rules is not None and rules.decide_raw(b"GET", b"/a,b/c", []).action == "allow"


def test_a_ruled_host_is_read_by_the_door_even_with_no_secret_bound() -> None:
    h = read_hosts(["api.test GET /**", "plain.test"], [], "", expand=lambda n: None)
    assert h.ruled == {"api.test"} and h.any
    assert "plain.test" not in h.ruled


def test_the_operators_cedar_policy_refuses_delete_everywhere(tmp_path: Path) -> None:
    policy = tmp_path / "policy.cedar"
    policy.write_text('@id("no-delete")\n@reason("DELETE is refused on every host")\n'
                      'forbid (principal, action == Action::"Http", resource)\n'
                      'when { context.resource.method == "DELETE" };\n')
    engine = PolicyEngine(policy)
    res = {"host": "api.test", "port": 443, "method": "DELETE", "path": "/repos/a/b"}
    d = engine.decide("run-1", "Http", res, {"rule": "DELETE /**", "http_version": "1.1"})
    assert not d.allowed and d.reason == "DELETE is refused on every host"
    d = engine.decide("run-1", "Http", {**res, "method": "GET"}, {"rule": "GET /**"})
    assert d.allowed
    # without the operator's file, the built-in packs allow what the rules allowed
    assert PolicyEngine(None).decide("run-1", "Http", res, {}).allowed
