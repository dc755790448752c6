"""`tkbox.agents.job` through the SDK against the real API (fake VMs): every path that
gets as far as a box ends with the box stopped, its patch kept and its bundle out."""

from __future__ import annotations

import re
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
from tkbox.image import tools
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
    with pytest.raises(UserError, match="unknown agent 'aider'"):
        check(spec(ws, tmp_path, agent="aider"))
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
    assert o["model_hosts"] == ["api.anthropic.com"]
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


# ---- Codex CLI and Gemini CLI, the same way -----------------------------------------


def test_codex_gets_its_key_in_the_bearer_header_and_its_own_sandbox_off():
    s = AgentSpec(agent="codex", prompt="-p fix it", workspace=Path("."))
    o = box_options(s)
    assert o["secrets"] == ["OPENAI_API_KEY=env:OPENAI_API_KEY@api.openai.com;"
                            "header=authorization"]
    assert o["allow"] == ["api.openai.com"] and o["model_hosts"] == ["api.openai.com"]
    assert o["tools"] == "codex" and o["image"] == DEFAULT_IMAGE
    argv = agent_argv(s)
    assert "setpriv --reuid=1000" in argv[2] and argv[4:6] == ["codex", "exec"]
    assert "--dangerously-bypass-approvals-and-sandbox" in argv and "--json" in argv
    assert 'model_providers.tkbox.base_url="https://api.openai.com/v1"' in argv
    assert 'model_providers.tkbox.env_key="OPENAI_API_KEY"' in argv
    assert argv[-2:] == ["--", "-p fix it"], "a prompt that looks like a flag stays the prompt"


def test_gemini_gets_its_key_in_x_goog_api_key_and_headless_settings():
    s = AgentSpec(agent="gemini", prompt="--yolo please", workspace=Path("."))
    o = box_options(s)
    assert o["secrets"] == ["GEMINI_API_KEY=env:GEMINI_API_KEY@"
                            "generativelanguage.googleapis.com;header=x-goog-api-key"]
    assert o["model_hosts"] == ["generativelanguage.googleapis.com"]
    assert o["env"] == {"GEMINI_CLI_NO_RELAUNCH": "true", "GEMINI_SANDBOX": "false"}
    argv = agent_argv(s)
    assert argv[4:] == ["gemini", "--prompt=--yolo please", "--output-format", "json",
                        "--approval-mode", "yolo", "--skip-trust"]
    # its settings, written as the agent's own before it runs: API-key auth, no usage
    # statistics (another host), no update checks
    script = argv[2]
    assert "/home/tkbox-agent/.gemini/settings.json" in script
    assert '"usageStatisticsEnabled":false' in script and '"gemini-api-key"' in script
    assert script.index("settings.json") < script.index("exec setpriv")


@pytest.mark.parametrize("agent, host, env, url", [
    ("claude-code", "gw.example:8443/anthropic", "ANTHROPIC_BASE_URL",
     "https://gw.example:8443/anthropic"),
    ("codex", "my.openai.azure.com/openai/v1", None,
     'model_providers.tkbox.base_url="https://my.openai.azure.com/openai/v1"'),
    ("codex", "gw.example:8443", None, 'model_providers.tkbox.base_url="https://gw.example:8443/v1"'),
    ("gemini", "gw.example", "GOOGLE_GEMINI_BASE_URL", "https://gw.example"),
])
def test_a_compatible_endpoint_gets_the_key_and_the_agent_is_pointed_at_it(
        agent: str, host: str, env: str | None, url: str):
    s = AgentSpec(agent=agent, prompt="p", workspace=Path("."), model_host=host)
    o = box_options(s)
    netloc = host.split("/")[0]
    assert o["allow"] == [netloc] and o["model_hosts"] == [netloc.split(":")[0]]
    assert o["secrets"][0].split("@")[1].startswith(netloc + ";header=")
    if env is not None:
        assert o["env"][env] == url
    else:
        assert url in agent_argv(s)


@pytest.mark.parametrize("host", ["Gw.example", "gw.example:0", "gw.example:99999",
                                  "gw.example/a b", 'gw.example/"x', "gw.example/..%2f",
                                  "-gw.example", "gw..example", "https://gw.example"])
def test_a_model_host_that_is_not_host_port_path_is_one_line(host: str, tmp_path: Path):
    with pytest.raises(UserError, match="--model-host") as e:
        check(spec(tmp_path, tmp_path, agent="codex", command=None, model_host=host),
              environ={"OPENAI_API_KEY": "k"})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("agent, key, title", [("codex", "OPENAI_API_KEY", "Codex CLI"),
                                               ("gemini", "GEMINI_API_KEY", "Gemini CLI")])
def test_a_missing_key_is_refused_before_any_box(agent: str, key: str, title: str,
                                                 tmp_path: Path):
    with pytest.raises(UserError, match=f"{key} is not set: {title} needs an API key"):
        check(spec(tmp_path, tmp_path, agent=agent, command=None), environ={})
    check(spec(tmp_path, tmp_path, agent=agent, command=None), environ={key: "k"})


AGENT_KEYS = {"claude-code": "ANTHROPIC_API_KEY", "codex": "OPENAI_API_KEY",
              "gemini": "GEMINI_API_KEY"}


@pytest.mark.parametrize("agent", ["codex", "gemini", "claude-code"])
def test_a_named_agent_runs_from_its_tool_disk_to_its_bundle(
        agent_daemon: SdkDaemon, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        agent: str):
    """The program's disk is fetched, checked and given to the box, recorded in the run;
    the agent's own report is read; the job ends with its patch and its bundle."""
    monkeypatch.setenv(AGENT_KEYS[agent], "sk-test-value-0123456789")
    with Client(agent_daemon.socket) as c:
        o = run_job(c, spec(ws, tmp_path, agent=agent, command=None, name=f"{agent}-1"),
                    log=lambda m: None)
    assert o.error is None and o.status == 0, o.error
    assert o.tools is not None and o.tools["name"] == agent
    assert o.tools["version"] == tools.TOOLS[agent].version
    assert o.tools["variant"] == {"codex": "static"}.get(agent, "glibc")
    assert o.agent_result
    opened = [r for r in agent_daemon.signer.records if r["kind"] == "tkbox.run.open"]
    assert opened and opened[-1]["facts"]["tools"]["name"] == agent, opened
    assert Path(o.bundle or "").is_file() and Path(o.patch or "").is_file()


@pytest.mark.parametrize("agent, needle", [
    ("codex", "Codex reported an error (stand-in model: refused second line)"),
    ("gemini", "Gemini CLI reported an error (Error: stand-in model: refused)"),
    ("claude-code", "Claude Code reported an error (error_during_execution)"),
])
@pytest.mark.parametrize("how", ["report", "status", "timeout"])
def test_a_failing_named_agent_ends_the_same_way_with_its_bundle(
        agent_daemon: SdkDaemon, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        agent: str, needle: str, how: str):
    """Its own error report (while exiting 0), a non-zero exit, and a timeout: each one
    line, the box stopped, the bundle exported, AgentFailed raised after."""
    monkeypatch.setenv(AGENT_KEYS[agent], "sk-test-value-0123456789")
    prompt = {"report": "tkbox-test-agent-error", "status": "tkbox-test-fail",
              "timeout": "tkbox-test-hang"}[how]
    name = f"{agent}-{how}"
    with Client(agent_daemon.socket) as c:
        o = run_job(c, spec(ws, tmp_path, agent=agent, command=None, prompt=prompt,
                            name=name, timeout=1 if how == "timeout" else 600),
                    log=lambda m: None)
        assert c.box(name).info.state == "exported"
    want = {"report": needle, "status": "the agent exited with status 7",
            "timeout": "ran past --timeout 1s"}[how]
    assert o.error is not None and want in o.error and "\n" not in o.error, o.error
    assert Path(o.bundle or "").is_file()
    with pytest.raises(AgentFailed, match=re.escape(want)):
        o.raise_for_error()
