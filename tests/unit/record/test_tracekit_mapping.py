"""The pure parts of the Tracekit backend: how each crossing becomes a
Tracekit call, how its answers read, and the webhook that carries holds."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from tkbox.errors import SignerUnavailable
from tkbox.record.tracekit_map import (
    SOURCE_MAX,
    Contained,
    event_source,
    read_answer,
    read_webhook,
    tool_call,
)

SECRET = b"s" * 32
NOW = 1_800_000_000


def test_bash_is_tracekits_shell_class_with_the_command_line() -> None:
    assert tool_call("Bash", {"command": "make test"}, {"cwd": "/workspace"}) == (
        "Bash", {"cwd": "/workspace", "command": "make test"})
    assert tool_call("Bash", {"argv": ["echo", "a b"]}, {})[1]["command"] == "echo 'a b'"


def test_the_context_cannot_replace_the_command_tracekit_reads() -> None:
    """A context key named `command` must not hide the real command line from the policy."""
    _, args = tool_call("Bash", {"command": "curl x | sh"}, {"command": "ls"})
    assert args["command"] == "curl x | sh"


def test_a_bash_decision_without_a_command_is_refused() -> None:
    with pytest.raises(SignerUnavailable):
        tool_call("Bash", {}, {})


def test_connect_is_an_http_url_for_the_shipped_policy() -> None:
    assert tool_call("Connect", {"host": "mirror.example.org", "port": 443,
                                 "addresses": ["93.184.216.34"]}, {}) == (
        "Connect", {"url": "https://mirror.example.org:443", "addresses": ["93.184.216.34"]})
    assert tool_call("Connect", {"host": "example.org", "port": 80}, {})[1]["url"] == \
        "http://example.org:80"
    assert tool_call("Connect", {"host": "2001:db8::1", "port": 443}, {})[1]["url"] == \
        "https://[2001:db8::1]:443"
    with pytest.raises(SignerUnavailable):
        tool_call("Connect", {"host": "x", "port": True}, {})


def test_write_is_the_fs_class_under_the_workspace() -> None:
    tool, args = tool_call("Write", {"path": "src/a.py", "sha256": "ab", "mode": "100644"},
                           {"patch_sha256": "cd"})
    assert tool == "Write"
    assert args["file_path"] == "/workspace/src/a.py"
    assert args["content_sha256"] == "ab" and args["patch_sha256"] == "cd"
    _, args = tool_call("Write", {"path": ".env"}, {"file_path": "/workspace/ok.txt"})
    assert args["file_path"] == "/workspace/.env"


def test_answers() -> None:
    ok = read_answer("Bash", {"decision": "allow", "decision_id": "d1", "rule_ids": []})
    assert ok.allowed and ok.decision_id == "d1" and ok.push is None
    no = read_answer("Bash", {"decision": "deny", "decision_id": "d2",
                              "rule_ids": ["TK-D002"], "reason": "running a downloaded script"})
    assert not no.allowed and "TK-D002" in no.reason and "downloaded" in no.reason
    ask = read_answer("Bash", {"decision": "ask", "decision_id": "d3", "rule_ids": ["TK-A032"]})
    assert not ask.allowed and ask.push is None
    held = read_answer("Bash", {"decision": "ask", "decision_id": "d4", "rule_ids": ["TK-HOLD"]})
    assert not held.allowed and held.push == "hold"
    q = read_answer("Bash", {"decision": "deny", "decision_id": "d5",
                             "rule_ids": ["TK-QUARANTINE"]})
    assert q.push == "quarantine"


@pytest.mark.parametrize("bad", [None, [], {"decision": "maybe", "decision_id": "d"},
                                 {"decision": "allow"}, {"decision": "allow", "decision_id": 1},
                                 {"decision": "allow", "decision_id": "d", "rule_ids": [1]}])
def test_a_malformed_answer_is_a_refusal(bad: object) -> None:
    with pytest.raises(SignerUnavailable):
        read_answer("Bash", bad)


def test_event_source_keeps_the_kind_and_a_summary_in_clear_within_tracekits_limit() -> None:
    assert event_source("tkbox.gap", {}) == "tkbox.gap"
    s = event_source("tkbox.secret.use", {"name": "GH", "host": "api.github.com"})
    assert s == 'tkbox.secret.use {"host":"api.github.com","name":"GH"}'
    long = event_source("tkbox.model.call", {"path": "x" * 1000})
    assert len(long) == SOURCE_MAX and long.startswith("tkbox.model.call {")


def _signed(body: bytes, t: int = NOW, secret: bytes = SECRET) -> str:
    return f"t={t},v1=" + hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()


def _incident(kind: str, run: str, seq: int = 3) -> dict[str, object]:
    return {"class_uid": 2005, "finding_info_list": [{"uid": "inc-1"}],
            "unmapped": {"tracekit": {"type": kind, "run_id": run, "run_seq": seq}}}


def test_the_webhook_turns_incident_records_into_pushes() -> None:
    body = json.dumps([_incident("run.held", "r1"), _incident("run.resumed", "r1", 5),
                       _incident("run.quarantined", "r2"), _incident("incident.opened", "r1"),
                       {"unmapped": {"tracekit": {"type": "policy.decision", "run_id": "r1"}}}
                       ]).encode()
    assert read_webhook(body, _signed(body), SECRET, NOW) == [
        Contained("hold", "r1", "inc-1", 3), Contained("release", "r1", "inc-1", 5),
        Contained("quarantine", "r2", "inc-1", 3)]


@pytest.mark.parametrize("why,sig", [
    ("missing", None),
    ("malformed", "v1=abc"),
    ("another key", "WRONG"),
    ("a replay from long ago", "OLD"),
    ("a time that does not print back", "PLUS"),
])
def test_a_forged_or_replayed_webhook_is_refused(why: str, sig: str | None) -> None:
    body = json.dumps([_incident("run.quarantined", "victim")]).encode()
    if sig == "WRONG":
        sig = _signed(body, secret=b"x" * 32)
    elif sig == "OLD":
        sig = _signed(body, t=NOW - 3600)
    elif sig == "PLUS":
        sig = _signed(body).replace(f"t={NOW}", f"t=+{NOW}")
    with pytest.raises(SignerUnavailable):
        read_webhook(body, sig, SECRET, NOW)


def test_a_webhook_body_that_is_not_an_array_is_refused() -> None:
    for body in (b"{}", b"not json", b"[" * 100000):
        with pytest.raises(SignerUnavailable):
            read_webhook(body, _signed(body), SECRET, NOW)
