"""`tkbox.agents.job` through the SDK against the real API (fake VMs): every path that
gets as far as a box ends with the box stopped, its patch kept and its bundle out."""

from __future__ import annotations

from pathlib import Path

import pytest
from sdk_daemon import SdkDaemon

from tkbox.agents.job import (
    DEFAULT_IMAGE,
    AgentFailed,
    AgentSpec,
    agent_argv,
    box_options,
    check,
    run_job,
)
from tkbox.errors import UserError
from tkbox.sdk import Client


def spec(ws: Path, out: Path, **kw: object) -> AgentSpec:
    base: dict[str, object] = {"agent": "command", "prompt": "fix the test",
                               "command": "my-agent", "workspace": ws, "out_dir": out}
    base.update(kw)
    return AgentSpec(**base)  # type: ignore[arg-type]


def test_a_job_ends_with_patch_and_bundle(daemon: SdkDaemon, ws: Path, tmp_path: Path):
    with Client(daemon.socket) as c:
        o = run_job(c, spec(ws, tmp_path, name="ok-1"), log=lambda m: None)
    assert o.error is None and o.status == 0 and not o.timed_out
    assert Path(o.patch or "").read_bytes().startswith(b"diff --git a/hello.txt")
    assert Path(o.bundle or "").is_file() and Path(o.trust or "").is_file()
    o.raise_for_error()
    # one command, decided before it ran: the agent as the ordinary uid, in /workspace,
    # with the prompt in its environment (recorded as the signer saw it)
    bash = [r for r in daemon.signer.records if r["kind"] == "tkbox.decision"]
    assert len(bash) == 1 and bash[0]["action"] == "Bash"
    text = str(bash[0]["resource"]) + str(bash[0]["context"])
    assert "setpriv --reuid=1000" in text and "my-agent" in text and "fix the test" in text


@pytest.mark.parametrize("cmd, timeout, needle", [
    ("my-agent tkbox-test-fail", 600, "the agent exited with status 7"),
    ("my-agent tkbox-test-hang", 1, "ran past --timeout 1s"),
])
def test_a_failed_agent_still_exports_its_bundle(daemon: SdkDaemon, ws: Path, tmp_path: Path,
                                                  cmd: str, timeout: float, needle: str):
    with Client(daemon.socket) as c:
        o = run_job(c, spec(ws, tmp_path, command=cmd, timeout=timeout, name="bad-1"),
                    log=lambda m: None)
        assert c.box("bad-1").info.state == "exported"
    assert o.error is not None and needle in o.error
    assert o.timed_out is (timeout == 1)
    assert Path(o.bundle or "").is_file() and Path(o.patch or "").is_file()
    with pytest.raises(AgentFailed, match=needle) as e:
        o.raise_for_error()
    assert str(o.bundle) in str(e.value)


def test_bad_input_is_refused_before_any_box(daemon: SdkDaemon, ws: Path, tmp_path: Path):
    with pytest.raises(UserError, match="the prompt is empty"):
        check(spec(ws, tmp_path, prompt="  \n"))
    with pytest.raises(UserError, match="needs --agent-command"):
        check(spec(ws, tmp_path, command=None))
    with pytest.raises(UserError, match="unknown agent 'codex'"):
        check(spec(ws, tmp_path, agent="codex"))
    with pytest.raises(UserError, match="ANTHROPIC_API_KEY is not set"):
        check(spec(ws, tmp_path, agent="claude-code", command=None), environ={})
    with pytest.raises(UserError, match="--timeout"):
        check(spec(ws, tmp_path, timeout=0))
    with Client(daemon.socket) as c:
        assert c.boxes() == []


def test_claude_code_gets_its_key_by_reference_and_no_root():
    s = AgentSpec(agent="claude-code", prompt="p", workspace=Path("."))
    o = box_options(s)
    assert o["image"] == DEFAULT_IMAGE and "api.anthropic.com" in o["allow"]
    assert o["tools"] == "claude-code" and o["workspace_owner"] == (1000, 1000)
    baked = box_options(AgentSpec(agent="claude-code", prompt="p", workspace=Path("."),
                                  image="tkbox/claude-code"))
    assert "tools" not in baked, "the baked image has Claude Code in it already"
    pinned = box_options(AgentSpec(agent="claude-code", prompt="p", workspace=Path("."),
                                   agent_version="2.0.1", agent_build="musl"))
    assert pinned["tools"] == "claude-code@2.0.1:musl"
    assert o["secrets"] == ["ANTHROPIC_API_KEY=env:ANTHROPIC_API_KEY@api.anthropic.com;"
                            "header=x-api-key"]
    assert o["env"]["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    argv = agent_argv(s)
    assert "setpriv --reuid=1000" in argv[2] and "IS_SANDBOX" not in argv[2]
    assert argv[4:] == ["claude", "-p", "p", "--output-format", "json",
                        "--dangerously-skip-permissions"]
