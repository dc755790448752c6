"""Each named agent's own report, read from what it printed in the box (hostile bytes):
only known fields, bounded, one line each; and what it says failed."""

from __future__ import annotations

import json

import pytest

from tkbox.agents.job import AGENT_TABLE

CODEX, GEMINI = AGENT_TABLE["codex"], AGENT_TABLE["gemini"]


def lines(*events: object) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def test_codex_success_failure_and_nothing() -> None:
    ok = lines({"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"},
               {"type": "item.completed", "item": {"type": "agent_message", "text": "done"}},
               {"type": "turn.completed", "usage": {"input_tokens": 5, "output_tokens": 2}})
    res = CODEX.result(b"Reading additional input from stdin...\n" + ok)
    assert res == {"turns_completed": 1, "turns_failed": 0, "last_message": "done",
                   "usage": {"input_tokens": 5, "output_tokens": 2}}
    assert CODEX.failed(res) is None
    bad = lines({"type": "error", "message": "Reconnecting... 1/5"},
                {"type": "turn.failed", "error": {"message": "quota\nexceeded"}})
    res = CODEX.result(bad)
    assert CODEX.failed(res) == "Codex reported an error (quota exceeded)"
    assert CODEX.failed(CODEX.result(b"not json\n[1]\n")) == \
        "Codex printed no result (no turn.completed event)"


def test_gemini_success_failure_and_nothing() -> None:
    ok = json.dumps({"session_id": "s", "response": "done", "stats": {"models": {
        "gemini-x": {"tokens": {"prompt": 9, "candidates": 3, "weird": "x"}}}}},
        indent=2).encode()
    res = GEMINI.result(b"\n" + ok)
    assert res == {"response": "done", "tokens": {"gemini-x": {"prompt": 9, "candidates": 3}}}
    assert GEMINI.failed(res) is None
    bad = json.dumps({"session_id": "s", "error": {"type": "FatalAuthenticationError",
                                                   "message": "bad key\nsecond", "code": 41}})
    assert GEMINI.failed(GEMINI.result(bad.encode())) == \
        "Gemini CLI reported an error (FatalAuthenticationError: bad key second)"
    assert GEMINI.failed(GEMINI.result(b"Error: no\n")) == "Gemini CLI printed no JSON result"


@pytest.mark.parametrize("agent", ["codex", "gemini"])
def test_a_report_is_bounded_whatever_the_box_printed(agent: str) -> None:
    huge = "x" * 100_000
    many = {f"k{i}": i for i in range(10_000)}
    if agent == "codex":
        out = lines({"type": "item.completed", "item": {"type": "agent_message",
                                                        "text": huge}},
                    {"type": "turn.completed", "usage": many},
                    {"type": "turn.failed", "error": {"message": huge}})
    else:
        out = json.dumps({"response": huge, "error": {"type": huge, "message": huge},
                          "stats": {"models": {f"m{i}": {"tokens": many}
                                               for i in range(100)}}}).encode()
    res = AGENT_TABLE[agent].result(out)
    assert res is not None and len(json.dumps(res)) < 8_000
    said = AGENT_TABLE[agent].failed(res)
    assert said is not None and len(said) < 300 and "\n" not in said
