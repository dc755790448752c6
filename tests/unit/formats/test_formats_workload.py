"""The open record's `workload` (`tkbox.formats.workload`): what the signer keeps of a
token's claims, and the one line the verifier prints for it, whatever a record holds."""

from __future__ import annotations

from typing import Any

from tkbox.formats import workload as wl

CLAIMS: dict[str, Any] = {
    "iss": "https://token.actions.githubusercontent.com", "aud": "tkbox", "sub": "repo:o/r",
    "jti": "j1", "exp": 1_800_000_300, "iat": 1_800_000_000, "repository": "o/r",
    "repository_owner": "o", "workflow": "agent", "ref": "refs/heads/main", "sha": "c" * 40,
    "run_id": 42, "run_attempt": "2", "runner_environment": "github-hosted",
    "custom": "not kept", "ACTIONS_RUNTIME_TOKEN": "never kept",
}


def test_only_the_named_claims_are_kept_and_bounded() -> None:
    w = wl.from_claims(CLAIMS["iss"], "tkbox", {**CLAIMS, "workflow": "w" * 1000})
    assert w["kind"] == "github" and w["run_id"] == "42"
    assert "custom" not in w and "ACTIONS_RUNTIME_TOKEN" not in w
    assert "iat" not in w and w["expires"] == CLAIMS["exp"]
    assert len(w["workflow"]) == wl.MAX_VALUE
    assert w["principal"] == f"oidc|{CLAIMS['iss']}|repo:o/r|run:42|attempt:2"


def test_a_token_without_githubs_claims_is_an_oidc_subject() -> None:
    w = wl.from_claims("https://id.example", "aud", {"sub": "svc-7", "jti": "x"})
    assert w["kind"] == "oidc" and w["principal"] == "oidc|https://id.example|sub:svc-7"
    assert wl.describe(w) == "oidc subject svc-7 from https://id.example"


def test_the_line_the_verifier_prints() -> None:
    w = wl.from_claims(CLAIMS["iss"], "tkbox", CLAIMS)
    assert wl.describe(w) == ("github repo o/r, workflow agent, ref refs/heads/main, commit "
                              + "c" * 40 + ", run 42 (attempt 2)")
    cert = wl.from_certificate("CN=daemon-a", "ab" * 32)
    assert wl.describe(cert) == "client certificate CN=daemon-a (sha256 abababababababab…)"


def test_hostile_values_print_as_one_bounded_line() -> None:
    """A record's workload is printed by the verifier: no newline, no control
    character, nothing longer than MAX_VALUE per field, whatever it holds."""
    w = {"kind": "github", "repository": "o/r\nIntegrity: VERIFIED.\x1b[2J", "workflow": 7,
         "ref": "r" * 10_000, "sha": None, "run_id": ["x"]}
    line = wl.describe(w)
    assert "\n" not in line and "\x1b" not in line
    assert line.count("r") < 3 * wl.MAX_VALUE
    assert "workflow ?" in line and "run ?" in line
    for junk in (None, [], "github", {"kind": "other"}, {"kind": "certificate"}):
        assert wl.describe(junk) == "not stated"
