"""The real Claude Code (its npm package's native program) in a real box, through the doors.

No image is built for it. The box runs an ordinary image that has never seen npm,
`python:3.12-slim` by its Docker Hub name, pulled by the daemon through its registry
mirror (`--registry-mirror docker.io=https://127.0.0.1:PORT --registry-mirror-only`:
Debian's docker-registry on loopback, holding a Debian image with Python and no npm
under that name). Claude Code's program comes on its own read-only disk
(`tkbox.image.tools`, fetched by the install step from its npm package and checked),
and the run's open record names that disk's digest.

The model is a stand-in of the Messages API: TLS on loopback (a test CA the
daemon trusts with --ca-cert; `api.anthropic.com` mapped to 127.0.0.1 with
--egress-hosts; loopback reached through --egress-permit), answering with
scripted SSE tool calls: Read the code, Edit it, run the test with Bash, then
a last text answer. It accepts a request only with the *real* key in
`x-api-key`, and logs what it got.

The box holds only a placeholder for the key (the agent's Bash call writes
`$ANTHROPIC_API_KEY` to a file, which comes back in the patch); the door swaps
the value in for the model host only and records each model call. The agent's
Bash call also tries a host it was not allowed: refused, and recorded.

One job each through the CLI (`tkbox agent`), the SDK (`tkbox.agents.job`), an
MCP client session (`tkbox mcp`) and the Action's script (`action/run.py`);
bad input (no daemon, an empty prompt, a missing key, an agent exiting
non-zero, an agent past --timeout) each gets a one-line error, a non-zero
exit, and, once a box existed, its bundle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_stack import TKBOX, Stack, bundle_records, fresh_name, make_home, stack_env

from tkbox.agents.testing import MessagesStandIn, failing_checkout, fix_script
from tkbox.image.testing import LocalRegistry, ScratchCA, push_image

# Each job is one booted box (a few minutes under emulation); the image is pushed once.
pytestmark = pytest.mark.timeout(3600)
#: the ordinary image the agents' boxes run, as a person names it (docs/agents.md)
IMAGE = "python:3.12-slim"

KEY = "sk-ant-e2eAgentKeyValue-9c41d7"
ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Make the failing test in test_calc.py pass. Do not change the test."


def script(port: int) -> list[dict[str, Any]]:
    """The agent's turns: Read, Edit, Bash (the test, npm's absence, the key's
    placeholder, a refused host)."""
    return fix_script("python3 -B test_calc.py && echo TESTS-PASSED; "
                      "command -v npm node || echo NO-NPM-IN-THIS-IMAGE; "
                      "printf '%s\\n' \"$ANTHROPIC_API_KEY\" > key_seen.txt; "
                      f"curl -sS -m 30 -o /dev/null https://other.test:{port}/ 2>&1 | "
                      "head -c 300; true")


def push_python_image(reg: LocalRegistry, tmp: Path) -> str:
    """`library/python:3.12-slim` in the loopback registry: the root filesystem of the
    Debian image the setup built (Python, a shell, no npm, no Node), as one layer."""
    from tkbox.image.store import ImageStore

    with ImageStore() as store:
        rootfs = store.inspect("tkbox/default").rootfs
    tar = subprocess.run(["sqfs2tar", str(rootfs)], capture_output=True, check=True).stdout
    config = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                      "LANG=C.UTF-8"], "Cmd": ["python3"]}
    with reg.client() as c:
        return push_image(c, "library/python", "3.12-slim", [tar], compression="zstd",
                          config=config).digest


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("agents")
    scratch = ScratchCA.create(tmp / "tls", ["api.anthropic.com", "other.test"])
    ca = scratch.ca_pem
    reg = LocalRegistry(tmp / "registry", scratch).start()
    digest = push_python_image(reg, tmp)
    model = MessagesStandIn(scratch, KEY, lambda: script(model.port),
                            markers={"passed": b"TESTS-PASSED",
                                     "no_npm": b"NO-NPM-IN-THIS-IMAGE"}).start()
    log, port = model.log, model.port
    hosts = tmp / "hosts"
    hosts.write_text("127.0.0.1 api.anthropic.com other.test\n")
    home = make_home(tmp)
    # the registry mirror's CA: the daemon (which pulls) trusts it
    s = Stack(home, {**stack_env(home), "SSL_CERT_FILE": str(ca)})
    s.env["ANTHROPIC_API_KEY"] = KEY
    s.start_signer()
    daemon_args = ["--egress-permit", "127.0.0.1/32", "--egress-hosts", str(hosts),
                   "--ca-cert", str(ca), "--approval-wait", "1",
                   "--registry-mirror", f"docker.io=https://{reg.host}", "--registry-mirror-only"]
    s.start_daemon(*daemon_args)
    s.tk("image", "rm", f"docker.io/library/{IMAGE}", check=False)  # each run pulls it
    w = {"stack": s, "port": port, "tmp": tmp, "log": log, "ca": ca, "hosts": hosts,
         "daemon_args": daemon_args, "model_host": f"api.anthropic.com:{port}",
         "registry": reg, "image_digest": digest}
    yield w
    for p in list(s.procs):
        s.stop(p)
    model.stop()
    reg.stop()


def check_job(w: dict[str, Any], ws: Path, outcome: dict[str, Any], since: int,
              *, agent_result: bool = True) -> None:
    """What every driver's job must show, judged by its effects."""
    s: Stack = w["stack"]
    assert outcome["error"] is None and outcome["status"] == 0, outcome
    patch = Path(outcome["patch"]).read_text()
    assert "-    return a - b\n+    return a + b" in patch, patch
    assert "test_calc.py" not in patch.split("diff --git")[0]
    # the box held a placeholder, never the key
    seen = [line for line in patch.splitlines() if line.startswith("+tkbox_ANTHROPIC_API_KEY_")]
    assert len(seen) == 1, patch
    assert KEY not in patch
    # the stand-in saw the real key in its header, and only there
    calls = w["log"][since:]
    posts = [c for c in calls if c["method"] == "POST" and c["path"].startswith("/v1/messages")]
    assert len([c for c in posts if c.get("turn") is not None]) >= 4, calls
    assert all(c["key_ok"] for c in posts), calls
    # Claude Code's own JSON result: a success after its tool calls
    if agent_result:
        res = outcome["agent_result"]
        assert res and res.get("is_error") is False and res.get("num_turns", 0) >= 3, res
    recs = bundle_records(s, outcome["bundle"])
    text = json.dumps(recs)
    assert KEY not in text
    kinds = [r["kind"] for r in recs]
    model = [r["body"] for r in recs if r["kind"] == "tkbox.model.call"
             and r["body"]["path"].startswith("/v1/messages")]
    assert len(model) >= 4, kinds
    assert all(m["host"] == "api.anthropic.com" and m["status"] == 200 for m in model), model
    assert any(m.get("model") and m.get("usage", {}).get("input_tokens") == 321
               and m["usage"].get("output_tokens") == 57 for m in model), model
    assert "other.test" in text, "the refused host is in the record"
    # the test ran and passed in the box, an image without npm or Node
    assert any(c.get("passed") for c in calls) and any(c.get("no_npm") for c in calls), calls
    # the run names the image the mirror answered and the agent's program's disk
    from tkbox.image import tools

    opened = next(r["body"] for r in recs if r["kind"] == "tkbox.run.open")["facts"]
    assert opened["image_digest"] == w["image_digest"]
    disk = tools.lookup(tools.ToolRef.parse("claude-code"), "glibc")
    assert disk is not None
    assert opened["tools"]["disk"] == disk.disk and opened["tools"]["variant"] == "glibc"
    assert opened["tools"]["package"] == "@anthropic-ai/claude-code-linux-x64"
    assert opened["tools"]["integrity"] == disk.integrity


def test_no_daemon_empty_prompt_and_missing_key_are_one_line_errors(tmp_path: Path) -> None:
    ws = failing_checkout(tmp_path / f"ws-{fresh_name('w')}")
    env = stack_env(tmp_path / "nohome")
    env["ANTHROPIC_API_KEY"] = KEY
    cases = [
        (["agent", "claude-code", "--prompt", PROMPT, "--workspace", str(ws)], env, 3,
         "daemon is not running"),
        (["agent", "claude-code", "--prompt", "  ", "--workspace", str(ws)], env, 2,
         "the prompt is empty"),
        (["agent", "claude-code", "--prompt", PROMPT, "--workspace", str(ws)],
         {k: v for k, v in env.items() if k != "ANTHROPIC_API_KEY"}, 2,
         "ANTHROPIC_API_KEY is not set"),
    ]
    for args, e, code, needle in cases:
        r = subprocess.run([*TKBOX, *args], env=e, capture_output=True, text=True, timeout=120)
        assert r.returncode == code, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
        assert KEY not in r.stderr + r.stdout


def test_claude_code_through_the_cli(world: dict[str, Any]) -> None:
    s: Stack = world["stack"]
    ws = failing_checkout(world["tmp"] / f"ws-{fresh_name('w')}")
    out = world["tmp"] / "cli-out"
    out.mkdir()
    since = len(world["log"])
    r = s.tk("agent", "claude-code", "--prompt", PROMPT, "--workspace", str(ws),
             "--model-host", world["model_host"], "--output-dir", str(out),
             "--timeout", "900", "--json", timeout=3600)
    outcome = json.loads(r.stdout)
    check_job(world, ws, outcome, since)
    assert KEY not in r.stdout + r.stderr
    assert (ws / "calc.py").read_text().endswith("a - b\n"), "the checkout is untouched"


def test_claude_code_through_the_sdk(world: dict[str, Any]) -> None:
    from tkbox.agents.job import AgentSpec, run_job
    from tkbox.sdk import Client

    s: Stack = world["stack"]
    ws = failing_checkout(world["tmp"] / f"ws-{fresh_name('w')}")
    out = world["tmp"] / "sdk-out"
    out.mkdir()
    since = len(world["log"])
    old = os.environ.get("ANTHROPIC_API_KEY")
    os.environ["ANTHROPIC_API_KEY"] = KEY  # the SDK reads the value in this process
    try:
        with Client(s.home / "run" / "daemon.sock") as c:
            o = run_job(c, AgentSpec(agent="claude-code", prompt=PROMPT, workspace=ws,
                                     out_dir=out, model_host=world["model_host"],
                                     timeout=900), log=lambda m: None)
    finally:
        if old is None:
            os.environ.pop("ANTHROPIC_API_KEY", None)
        else:
            os.environ["ANTHROPIC_API_KEY"] = old
    check_job(world, ws, o.to_json(), since)


def test_claude_code_through_an_mcp_client_session(world: dict[str, Any]) -> None:
    import asyncio

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from tkbox.agents.job import AgentSpec, agent_argv, box_options

    s: Stack = world["stack"]
    ws = failing_checkout(world["tmp"] / f"ws-{fresh_name('w')}")
    out = world["tmp"] / "mcp-out"
    out.mkdir()
    since = len(world["log"])
    spec = AgentSpec(agent="claude-code", prompt=PROMPT, workspace=ws,
                     model_host=world["model_host"])
    opts = box_options(spec)
    name = fresh_name("mcp")
    outcome: dict[str, Any] = {"box": name, "error": None}
    # the operator fixes the hosts, the key's binding and the model host when the server
    # starts; the agent driving it picks the workspace and the agent's program
    operator = [a for h in opts["allow"] for a in ("--allow", h)]
    operator += [a for x in opts["secrets"] for a in ("--secret", x)]
    operator += [a for h in opts["model_hosts"] for a in ("--model-host", h)]
    operator += ["--workspace-root", str(world["tmp"])]

    async def main() -> None:
        params = StdioServerParameters(command=sys.executable,
                                       args=["-m", "tkbox.cli", "mcp", *operator], env=s.env)
        async with stdio_client(params) as (rd, wr), ClientSession(rd, wr) as ses:
            await ses.initialize()

            async def call(tool: str, **a: Any) -> Any:
                r = await ses.call_tool(tool, a)
                text = "".join(getattr(c, "text", "") for c in r.content)
                assert KEY not in text
                assert not r.isError, text
                return r.structuredContent

            await call("run", workspace=str(ws), image=opts["image"], name=name,
                       env=opts["env"], tools=opts["tools"])
            r = await call("exec", box=name, argv=agent_argv(spec), cwd="/workspace")
            outcome["status"] = r["status"]
            from tkbox.agents.job import _claude_result

            outcome["agent_result"] = _claude_result(r["stdout"]["text"].encode())
            await call("stop", box=name)
            p = await call("patch", box=name)
            (out / f"{name}.patch").write_text(p["text"])
            outcome["patch"] = str(out / f"{name}.patch")
            dry = await call("apply", box=name)
            assert dry["dry_run"] is True
            assert {"calc.py", "key_seen.txt"} <= {f["path"] for f in dry["files"]}
            e = await call("export", box=name, path=str(out / f"{name}.tkb"))
            outcome["bundle"] = e["bundle"]

    asyncio.run(asyncio.wait_for(main(), 3600))
    check_job(world, ws, outcome, since)
    assert (ws / "calc.py").read_text().endswith("a - b\n"), "apply was a dry run"


def test_claude_code_through_the_actions_script(world: dict[str, Any]) -> None:
    s: Stack = world["stack"]
    ws = failing_checkout(world["tmp"] / f"ws-{fresh_name('w')}")
    temp = world["tmp"] / "runner-temp"
    temp.mkdir()
    gh_out = world["tmp"] / "github_output"
    gh_out.write_text("")
    since = len(world["log"])
    env = {**s.env, "GITHUB_WORKSPACE": str(ws), "GITHUB_OUTPUT": str(gh_out),
           "RUNNER_TEMP": str(temp), "INPUT_AGENT": "claude-code", "INPUT_PROMPT": PROMPT,
           "INPUT_MODEL_HOST": world["model_host"], "INPUT_TIMEOUT": "900"}
    r = subprocess.run([sys.executable, str(ROOT / "action" / "run.py")], env=env,
                       capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout + r.stderr
    o = dict(line.split("=", 1) for line in gh_out.read_text().splitlines())
    assert o["status"] == "0" and Path(o["bundle"]).parent == temp / "tkbox-out"
    box = json.loads(s.tk("inspect", o["box"], "--json").stdout)
    assert box["state"] == "exported"
    outcome = {"error": None, "status": int(o["status"]), "patch": o["patch"],
               "bundle": o["bundle"]}
    # the Action's outputs carry no agent result; its step summary and status do
    check_job(world, ws, outcome, since, agent_result=False)
    assert KEY not in r.stdout + r.stderr
    # and it applied the patch through the changes door (its default): the workspace
    # has the fix, the applied patch is the box's (nothing held back), and each file
    # written is a Write decision in the bundle
    assert (ws / "calc.py").read_text().endswith("return a + b\n")
    applied = Path(o["applied-patch"]).read_bytes()
    assert applied == Path(o["patch"]).read_bytes() and o["held-back"] == "0"
    writes = [r["body"]["resource"]["path"] for r in bundle_records(s, o["bundle"])
              if r["kind"] == "tkbox.decision" and r["body"]["action"] == "Write"]
    assert "calc.py" in writes and all(f"b/{p}".encode() in applied for p in writes), writes


@pytest.mark.parametrize("command, timeout, needle", [
    ("echo working; exit 9", "600", "the agent exited with status 9"),
    ("echo started > started.txt; sleep 600", "20", "ran past --timeout 20s"),
])
def test_failing_agents_still_export_their_bundle(world: dict[str, Any], command: str,
                                                   timeout: str, needle: str) -> None:
    s: Stack = world["stack"]
    ws = failing_checkout(world["tmp"] / f"ws-{fresh_name('w')}")
    out = world["tmp"] / f"fail-{fresh_name('o')}"
    out.mkdir()
    r = s.tk("agent", "command", "--agent-command", command, "--prompt", PROMPT,
             "--workspace", str(ws), "--output-dir", str(out), "--timeout", timeout,
             "--json", check=False, timeout=1200)
    assert r.returncode == 4, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("tkbox: error: ") and needle in last
    outcome = json.loads(r.stdout)
    assert needle in outcome["error"]
    recs = bundle_records(s, outcome["bundle"])
    assert any("setpriv" in json.dumps(x) for x in recs), "the agent's command is recorded"
    if "sleep" in command:
        assert "+started" in Path(outcome["patch"]).read_text()
