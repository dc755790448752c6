"""Who recorded a run into a remote signer: the open record's `workload`.

A run opened on the signer's network listener (`isolation: remote`) states in
its open record who the daemon proved to be, as the signer checked it:

    "workload": {
      "kind": "github" | "oidc" | "certificate",
      "principal": <what runs this identity may write to: one string>,
      ... for "github" and "oidc" (a workload-identity token, checked by the signer
          against its issuer's keys, audience and times):
      "issuer", "subject", "audience", "jti", "expires" (Unix seconds),
      ... and, with GitHub Actions' claim names (docs.github.com: "About security
          hardening with OpenID Connect"):
      "repository", "repository_owner", "workflow", "workflow_ref", "job_workflow_ref",
      "ref", "sha", "run_id", "run_attempt", "runner_environment", "event_name",
      "actor", "environment",
      ... and when the daemon presented a client certificate:
      "certificate": {"subject": <RFC 4514 text>, "sha256": <hex of the DER>}
    }

Every string is at most `MAX_VALUE` characters; the signer copies only these
claims (`from_claims`), never a token. Pure: the signer builds the object,
the verifier describes it (`describe`), both from this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_VALUE = 256
#: the claims kept from a token, in the record's own names (GitHub's claim names)
GITHUB_CLAIMS = ("repository", "repository_owner", "workflow", "workflow_ref",
                 "job_workflow_ref", "ref", "sha", "run_id", "run_attempt",
                 "runner_environment", "event_name", "actor", "environment")
KINDS = ("github", "oidc", "certificate")


def _text(v: Any) -> str | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        v = str(v)
    if not isinstance(v, str):
        return None
    return v[:MAX_VALUE]


def is_github(claims: Mapping[str, Any]) -> bool:
    """Claims that carry GitHub Actions' names for a repository and a run."""
    return all(isinstance(claims.get(k), (str, int)) and not isinstance(claims.get(k), bool)
               for k in ("repository", "run_id", "run_attempt"))


def principal_of(issuer: str, claims: Mapping[str, Any]) -> str:
    """The one string naming what a token may write to. GitHub: one attempt of one
    run of one repository (a fresh token of that job continues its runs; one of
    another repository or run cannot); other issuers: the token's subject."""
    if is_github(claims):
        return "oidc|{}|repo:{}|run:{}|attempt:{}".format(
            issuer, _text(claims["repository"]), _text(claims["run_id"]),
            _text(claims["run_attempt"]))
    return f"oidc|{issuer}|sub:{_text(claims.get('sub')) or ''}"


def from_claims(issuer: str, audience: str, claims: Mapping[str, Any]) -> dict[str, Any]:
    """The record's workload from a token's verified claims (bounded, no token)."""
    out: dict[str, Any] = {
        "kind": "github" if is_github(claims) else "oidc",
        "principal": principal_of(issuer, claims)[: 4 * MAX_VALUE],
        "issuer": issuer[:MAX_VALUE],
        "audience": audience[:MAX_VALUE],
    }
    for name, key in (("subject", "sub"), ("jti", "jti")):
        v = _text(claims.get(key))
        if v is not None:
            out[name] = v
    exp = claims.get("exp")
    if isinstance(exp, int) and not isinstance(exp, bool) and 0 <= exp < 2**53:
        out["expires"] = exp
    if out["kind"] == "github":
        for k in GITHUB_CLAIMS:
            v = _text(claims.get(k))
            if v is not None:
                out[k] = v
    return out


def from_certificate(subject: str, sha256_hex: str) -> dict[str, Any]:
    """The workload of a daemon known only by its client certificate."""
    return {"kind": "certificate", "principal": f"cert|sha256:{sha256_hex}",
            "certificate": {"subject": subject[:MAX_VALUE], "sha256": sha256_hex}}


def describe(workload: Any) -> str:
    """One line for a person: `github repo OWNER/REPO, workflow W, ref R, commit C,
    run N`; `oidc subject S from ISSUER`; `client certificate SUBJECT (sha256 …)`.
    Anything else in a record is shown as not stated (a verifier prints what the
    signer signed, never guesses)."""
    if not isinstance(workload, dict):
        return "not stated"

    def g(key: str, src: Mapping[str, Any] = workload) -> str:
        v = src.get(key)
        return _show(v if isinstance(v, str) else "?")

    kind = workload.get("kind")
    if kind == "github":
        line = (f"github repo {g('repository')}, workflow {g('workflow')}, ref {g('ref')}, "
                f"commit {g('sha')}, run {g('run_id')}")
        attempt = workload.get("run_attempt")
        if isinstance(attempt, str) and attempt != "1":
            line += f" (attempt {_show(attempt)})"
        return line
    if kind == "oidc":
        return f"oidc subject {g('subject')} from {g('issuer')}"
    if kind == "certificate":
        cert = workload.get("certificate")
        if isinstance(cert, dict):
            return f"client certificate {g('subject', cert)} (sha256 {g('sha256', cert)[:16]}…)"
    return "not stated"


def _show(s: str) -> str:
    """A value for one line of text: printable, bounded."""
    s = "".join(c if c.isprintable() else "?" for c in s[:MAX_VALUE])
    return s or "?"
