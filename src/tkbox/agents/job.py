"""One agent job: a box, the agent run headless in it on a prompt, then stop, patch, bundle.

```
check input ─▶ box (image: --image, else the checkout's dev container's, else
               DEFAULT_IMAGE; the agent's program on its own read-only disk;
               workspace, allowlist, secrets by reference)
            ─▶ agent runs as an ordinary uid in /workspace, bounded by --timeout
            ─▶ stop (egress closes, the patch is saved) ─▶ NAME.patch
           [─▶ apply (--apply): the changes door, file by file, into the
               workspace ─▶ NAME.applied.patch, what it wrote]
            ─▶ export ─▶ NAME.tkb + NAME.trust.json
```

With `--apply`, a job whose agent succeeded ends with its patch decided and
written through the changes door into the checkout it was copied from
(`tkbox apply`: sensitive files held back, each write a signed decision in the
run, before the bundle is exported), and `NAME.applied.patch` holds the sections
of the files it wrote, byte for byte: what a later step or job should apply,
rather than the box's own patch. A patch the door refuses fails the job.

Once the box exists, every path ends with the box stopped and its bundle
exported, failure included: the record of a failed job is the product too.
The job is judged by its effects and its exit status, never by what the agent
says about itself: an agent that exits 0 but reports an error (Claude Code's
`is_error`, a Codex `turn.failed` event, Gemini CLI's `error`) failed; one that
reports success has done only what the patch shows.

The agents tkbox knows are one table (`AGENT_TABLE`, docs/agents.md draws it):
per agent, its program's disk, its key's variable and the header its API reads
it in, its API's host, its headless flags and settings, and how its own report
is read.

Errors (`tkbox.errors`): bad input before the box is a `UserError`; once the
box exists, an agent that fails, or runs past `--timeout`, is an `AgentFailed`
(a `GuestError`: what ran in the box failed), raised after the bundle is out.

One idea: one agent job in the order it runs, from checked input to the bundle;
the three agents' drivers (`Agent`: argv, endpoint, result reading) are the
table its steps look up, kept beside them.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import secrets as _random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tkbox.errors import GuestError, Refused, TkboxError, UserError
from tkbox.sdk import Box, BoxInfo, Client

MAX_PROMPT = 64 * 1024
MAX_AGENT_STDOUT = 8 * 1024 * 1024
MAX_HELD_LISTED = 50  # held-back files named in the outcome; the rest counted
AGENT_UID = 1000
KILL_GRACE = 10.0

#: Runs as root in the box, then becomes an ordinary uid for the agent. Claude Code
#: refuses to skip its permission prompts as root, and an agent has no business
#: being root anyway. The workspace's files already belong to that uid (the box is
#: made with `workspace_owner`): a `chown -R` here would copy every file of the
#: checkout up into the overlay's upper layer, a multi-gigabyte tool or dataset
#: included, for nothing. Only a box made without it (by another client) is handed
#: over that way (its patch is right either way: a file copied up unchanged is not
#: a change).
AS_AGENT = f"""set -eu
grep -q '^tkbox-agent:' /etc/passwd || \\
  echo 'tkbox-agent:x:{AGENT_UID}:{AGENT_UID}:tkbox agent:/home/tkbox-agent:/bin/sh' >> /etc/passwd
grep -q '^tkbox-agent:' /etc/group || echo 'tkbox-agent:x:{AGENT_UID}:' >> /etc/group
mkdir -p /home/tkbox-agent
chown {AGENT_UID}:{AGENT_UID} /home/tkbox-agent
[ "$(stat -c %u /workspace)" = {AGENT_UID} ] || chown -R {AGENT_UID}:{AGENT_UID} /workspace
cd /workspace
exec setpriv --reuid={AGENT_UID} --regid={AGENT_UID} --clear-groups \\
  env HOME=/home/tkbox-agent USER=tkbox-agent LOGNAME=tkbox-agent "$@"
"""


def as_agent(files: dict[str, str]) -> str:
    """`AS_AGENT`, first writing `files` (path under the agent's home -> text) as the
    agent's own: an agent's settings for a headless run (Gemini CLI's)."""
    lines = []
    for rel, text in sorted(files.items()):
        assert re.fullmatch(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*", rel) and "'" not in text
        path = f"/home/tkbox-agent/{rel}"
        lines.append(f"mkdir -p '{posixpath.dirname(path)}'")
        lines.append(f"printf '%s' '{text}' > '{path}'")
        top = rel.split("/")[0]
        lines.append(f"chown -R {AGENT_UID}:{AGENT_UID} '/home/tkbox-agent/{top}'")
    head, sep, tail = AS_AGENT.partition("cd /workspace\n")
    return head + "".join(line + "\n" for line in lines) + sep + tail


class AgentFailed(GuestError):
    """The agent in the box failed: it exited non-zero, ran past its time, or said so."""


@dataclass
class AgentSpec:
    agent: str                      # "claude-code", "codex", "gemini" or "command"
    prompt: str
    workspace: Path = Path(".")
    command: str | None = None      # --agent-command: a shell command line
    image: str | None = None
    allow: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)
    name: str | None = None
    memory_mib: int = 2048
    vcpus: int = 1
    timeout: float = 1800.0
    out_dir: Path = Path(".")
    model_host: str = ""            # HOST[:PORT][/PATH]; "": the agent's own API
    key_env: str = ""               # "": the agent's own (ANTHROPIC_API_KEY...)
    apply: bool = False             # --apply: the patch through the changes door
    agent_version: str | None = None  # the agent's package version (default: pinned)
    agent_build: str = "auto"       # glibc, musl, or auto (from the image)


@dataclass
class AgentOutcome:
    box: str
    run_id: str = ""
    status: int | None = None
    timed_out: bool = False
    agent_result: dict[str, Any] | None = None
    patch: str | None = None
    patch_bytes: int = 0
    applied_patch: str | None = None  # --apply: the sections of the files written
    applied: dict[str, int] | None = None  # --apply: files by status (applied, held back…)
    held_back: list[dict[str, str]] = field(default_factory=list)  # path, reason (bounded)
    #: changes the box's patch left out (path, change, size, sha256, why), bounded
    set_apart: list[dict[str, Any]] = field(default_factory=list)
    set_apart_count: int = 0  # all of them, listed or not
    patch_partial: bool = False  # the diff was cut off: only whole files were kept
    bundle: str | None = None
    trust: str | None = None
    error: str | None = None
    refused: bool = False  # the error is a door's refusal (the changes door's, of the patch)
    seconds: float = 0.0
    image: str = ""  # the box's image, and why that one
    image_from: str = ""
    tools: dict[str, Any] | None = None  # the agent's program disk, as the run recorded it
    #: where the time went, in seconds by phase (box: the create, with its image,
    #: tools, workspace and boot; agent; stop; apply; export)
    phases: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def raise_for_error(self) -> None:
        if self.error:
            msg = f"{self.error}; bundle {self.bundle or '(not exported)'}"
            raise Refused(msg) if self.refused else AgentFailed(msg)


@dataclass(frozen=True)
class Endpoint:
    """`--model-host HOST[:PORT][/PATH]`: where the agent's API is (a compatible
    endpoint: a gateway, a proxy, a provider's own path)."""

    host: str
    port: int | None = None
    path: str = ""  # "" or "/a/b"

    @property
    def netloc(self) -> str:
        return self.host + (f":{self.port}" if self.port is not None else "")

    def url(self, default_path: str = "") -> str:
        return f"https://{self.netloc}{self.path or default_path}"

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        m = re.fullmatch(r"([a-z0-9.-]{1,253})(?::([0-9]{1,5}))?((?:/[A-Za-z0-9._~-]+){0,16})",
                         text)
        if m is None or m.group(1).startswith(("-", ".")) or ".." in m.group(1) or \
                (m.group(2) is not None and not 1 <= int(m.group(2)) <= 65535):
            raise UserError(f"--model-host {text[:80]!r} must be HOST, HOST:PORT or "
                            "HOST[:PORT]/PATH (lower-case DNS name; a path of letters, "
                            "digits and ._~-)")
        return cls(m.group(1), int(m.group(2)) if m.group(2) else None, m.group(3))


@dataclass(frozen=True)
class Agent:
    """How tkbox runs one coding agent headless in a box (docs/agents.md's table)."""

    name: str  # as `tkbox agent NAME` takes it
    title: str
    tool: str  # its program's disk (`tkbox.image.tools.TOOLS`)
    key_env: str  # its API key's variable: bound as a secret, the box holds a placeholder
    host: str  # its API's host (the default --model-host)
    header: str  # the header its API reads the key in
    #: its own settings for a headless run in a box (telemetry off, its sandbox off...)
    env: dict[str, str]
    #: how a --model-host other than its API's is given to it (variables)
    endpoint_env: Callable[[Endpoint], dict[str, str]]
    argv: Callable[[str, Endpoint], list[str]]  # (prompt, endpoint) -> its command line
    result: Callable[[bytes], dict[str, Any] | None]  # its own report, from its stdout
    failed: Callable[[dict[str, Any] | None], str | None]  # what that report says failed
    files: dict[str, str] = field(default_factory=dict)  # under its home: its settings


def _claude_argv(prompt: str, ep: Endpoint) -> list[str]:
    return ["claude", "-p", prompt, "--output-format", "json",
            "--dangerously-skip-permissions"]


def _claude_endpoint(ep: Endpoint) -> dict[str, str]:
    # a port other than 443, or a path, goes to Claude Code's base URL
    if (ep.port is None or ep.port == 443) and not ep.path:
        return {}
    return {"ANTHROPIC_BASE_URL": ep.url()}


def _claude_result(stdout: bytes) -> dict[str, Any] | None:
    """Claude Code's `--output-format json` result object: the last JSON line that is one.

    It comes from the box, so it is only read for a few known fields, never trusted.
    """
    for line in reversed(stdout.decode("utf-8", errors="replace").strip().splitlines()):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("type") == "result":
            keep = ("subtype", "is_error", "num_turns", "result", "duration_ms",
                    "permission_denials", "usage", "total_cost_usd")
            return {k: obj[k] for k in keep if k in obj}
    return None


def _claude_failed(res: dict[str, Any] | None) -> str | None:
    if res is None:
        return "Claude Code printed no JSON result"
    if res.get("is_error"):
        return f"Claude Code reported an error ({str(res.get('subtype', 'error'))[:60]})"
    return None


#: Codex's provider, named by tkbox on its command line (the box's HOME is new, so
#: there is no user config): the Responses API over HTTPS at the --model-host, the key
#: from OPENAI_API_KEY. Codex's built-in OpenAI provider tries a WebSocket first, which
#: an intercepted tunnel does not carry; this one speaks HTTPS only.
CODEX_PROVIDER = "tkbox"


def _codex_argv(prompt: str, ep: Endpoint) -> list[str]:
    p = f"model_providers.{CODEX_PROVIDER}"
    return ["codex", "exec", "--json", "--color", "never", "--skip-git-repo-check",
            # its own sandbox (bubblewrap, seccomp) and approvals off: the box is the
            # sandbox, and a headless run has nobody to approve
            "--dangerously-bypass-approvals-and-sandbox", "-C", "/workspace",
            "-c", f'model_provider="{CODEX_PROVIDER}"',
            "-c", f'{p}.name="OpenAI, through tkbox"',
            "-c", f'{p}.base_url="{ep.url("/v1")}"',
            "-c", f'{p}.env_key="OPENAI_API_KEY"',
            "-c", f'{p}.wire_api="responses"',
            # what it reaches besides the model (measured: analytics, ChatGPT apps and
            # plugins, a plugin marketplace on GitHub), off
            "-c", "analytics.enabled=false",
            "--disable", "plugins", "--disable", "apps", "--disable", "remote_plugin",
            "--", prompt]


MAX_RESULT_TEXT = 2000


def _codex_result(stdout: bytes) -> dict[str, Any] | None:
    """Codex's `--json` events (JSON lines): how many turns completed or failed, the
    last turn's usage, its last message and the error it reported. From the box: only
    these fields, each bounded."""
    out: dict[str, Any] = {"turns_completed": 0, "turns_failed": 0}
    seen = False
    for line in stdout.decode("utf-8", errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if not isinstance(ev, dict):
            continue
        kind = ev.get("type")
        if kind == "turn.completed":
            seen = True
            out["turns_completed"] += 1
            if isinstance(ev.get("usage"), dict):
                out["usage"] = _counts(ev["usage"])
        elif kind == "turn.failed":
            seen = True
            out["turns_failed"] += 1
            err = ev.get("error")
            msg = err.get("message") if isinstance(err, dict) else None
            out["error"] = _one_line(str(msg or "turn failed"))
        elif kind == "item.completed" and isinstance(ev.get("item"), dict) and \
                ev["item"].get("type") == "agent_message":
            out["last_message"] = _one_line(str(ev["item"].get("text", "")), MAX_RESULT_TEXT)
    return out if seen else None


def _codex_failed(res: dict[str, Any] | None) -> str | None:
    if res is None:
        return "Codex printed no result (no turn.completed event)"
    if res["turns_failed"]:
        return f"Codex reported an error ({res.get('error', 'turn failed')[:120]})"
    return None


#: Gemini CLI's settings file, in the agent's home: the API-key auth (with
#: GOOGLE_GEMINI_BASE_URL set, version 0.61 picks a "gateway" auth its headless mode
#: refuses), usage statistics off (they go to another Google host), no update checks.
GEMINI_SETTINGS = json.dumps({
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True}},
    separators=(",", ":"))


def _gemini_argv(prompt: str, ep: Endpoint) -> list[str]:
    # --prompt=TEXT: a prompt that begins with '-' is still the prompt
    return ["gemini", f"--prompt={prompt}", "--output-format", "json",
            # every tool call approved: the box is the sandbox, nobody is there to ask
            "--approval-mode", "yolo", "--skip-trust"]


def _gemini_endpoint(ep: Endpoint) -> dict[str, str]:
    if (ep.port is None or ep.port == 443) and not ep.path and \
            ep.host == "generativelanguage.googleapis.com":
        return {}
    return {"GOOGLE_GEMINI_BASE_URL": ep.url()}


def _gemini_result(stdout: bytes) -> dict[str, Any] | None:
    """Gemini CLI's `--output-format json` object (`response`, `stats`, `error`): only
    these fields, bounded."""
    text = stdout.decode("utf-8", errors="replace")
    at = text.find("\n{")
    for start in ([0] if text.lstrip().startswith("{") else []) + ([at + 1] if at >= 0 else []):
        try:
            obj = json.loads(text[start:])
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        out: dict[str, Any] = {}
        if isinstance(obj.get("response"), str):
            out["response"] = _one_line(obj["response"], MAX_RESULT_TEXT)
        err = obj.get("error")
        if isinstance(err, dict):
            out["error"] = {k: _one_line(str(err.get(k, ""))) for k in ("type", "message")}
            if isinstance(err.get("code"), int):
                out["error"]["code"] = err["code"]
        models = (obj.get("stats") or {}).get("models") if isinstance(obj.get("stats"),
                                                                        dict) else None
        if isinstance(models, dict):
            out["tokens"] = {str(m)[:128]: _counts(t.get("tokens"))
                             for m, t in list(models.items())[:16] if isinstance(t, dict)}
        return out
    return None


def _gemini_failed(res: dict[str, Any] | None) -> str | None:
    if res is None:
        return "Gemini CLI printed no JSON result"
    if "error" in res:
        e = res["error"]
        return f"Gemini CLI reported an error ({e.get('type', '')[:40]}: " \
               f"{e.get('message', '')[:120]})"
    return None


def _counts(obj: object) -> dict[str, int]:
    """An agent's own token counts, as it printed them: at most 16, names bounded."""
    if not isinstance(obj, dict):
        return {}
    return {str(k)[:64]: v for k, v in list(obj.items())[:16]
            if isinstance(v, int) and not isinstance(v, bool)}


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


#: The agents tkbox runs by name. Each one's key is bound as a secret to its API host in
#: the header that API reads, so the box only ever holds a placeholder.
AGENT_TABLE: dict[str, Agent] = {a.name: a for a in (
    Agent("claude-code", "Claude Code", "claude-code", "ANTHROPIC_API_KEY",
          "api.anthropic.com", "x-api-key",
          # Claude Code's own settings: no telemetry, error reports or update checks
          {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"},
          _claude_endpoint, _claude_argv, _claude_result, _claude_failed),
    Agent("codex", "Codex CLI", "codex", "OPENAI_API_KEY", "api.openai.com", "authorization",
          {}, lambda ep: {}, _codex_argv, _codex_result, _codex_failed),
    Agent("gemini", "Gemini CLI", "gemini", "GEMINI_API_KEY",
          "generativelanguage.googleapis.com", "x-goog-api-key",
          # one process (its relauncher ignores SIGTERM, so --timeout could not stop it),
          # its own sandbox off (the box is the sandbox)
          {"GEMINI_CLI_NO_RELAUNCH": "true", "GEMINI_SANDBOX": "false"},
          _gemini_endpoint, _gemini_argv, _gemini_result, _gemini_failed,
          {".gemini/settings.json": GEMINI_SETTINGS}),
)}
AGENTS = (*AGENT_TABLE, "command")


def endpoint(spec: AgentSpec) -> Endpoint:
    """The agent's API: --model-host, else the agent's own host."""
    agent = AGENT_TABLE.get(spec.agent)
    return Endpoint.parse(spec.model_host or (agent.host if agent else "api.anthropic.com"))


def key_env(spec: AgentSpec) -> str:
    agent = AGENT_TABLE.get(spec.agent)
    return spec.key_env or (agent.key_env if agent else "")


def check(spec: AgentSpec, environ: dict[str, str] | None = None) -> None:
    """Bad input is refused before any box exists."""
    env = os.environ if environ is None else environ
    if spec.agent not in AGENTS:
        raise UserError(f"unknown agent {spec.agent!r}: use one of {', '.join(AGENTS)} "
                        "(any other agent: 'tkbox agent command --agent-command CMD')")
    if not spec.prompt.strip():
        raise UserError("the prompt is empty: give the agent its task with --prompt TEXT")
    if len(spec.prompt.encode()) > MAX_PROMPT:
        raise UserError(f"the prompt is longer than {MAX_PROMPT // 1024} KiB; put the "
                        "details in a file in the workspace and point the prompt at it")
    if spec.agent == "command" and not (spec.command or "").strip():
        raise UserError("'tkbox agent command' needs --agent-command CMD (a shell command "
                        "line run in /workspace, with the prompt in $TKBOX_PROMPT and on stdin)")
    if not 1 <= spec.timeout <= 24 * 3600:
        raise UserError("--timeout must be between 1 and 86400 seconds")
    if not spec.workspace.is_dir():
        raise UserError(f"workspace {spec.workspace} does not exist or is not a directory")
    if not spec.out_dir.is_dir():
        raise UserError(f"output directory {spec.out_dir} does not exist")
    agent = AGENT_TABLE.get(spec.agent)
    key = key_env(spec)
    if key and not re.fullmatch(r"[A-Z_][A-Z0-9_]{0,63}", key):
        raise UserError(f"the key's variable {key[:40]!r} is not an environment name")
    if agent is not None and not any(s.startswith(key + "=") for s in spec.secrets):
        if not env.get(key):
            raise UserError(f"{key} is not set: {agent.title} needs an API key. Export "
                            f"it (in CI: env: {key}: ${{{{ secrets.{key} }}}}); "
                            "the box will only ever hold a placeholder for it")
    if spec.agent_build not in ("auto", "glibc", "musl"):
        raise UserError(f"--agent-build {spec.agent_build[:20]!r} must be auto, glibc or musl")
    if spec.agent_version is not None and not re.match(r"^[0-9A-Za-z][0-9A-Za-z.+-]{0,63}$",
                                                       spec.agent_version):
        raise UserError(f"--agent-version {spec.agent_version[:40]!r} is not a version")
    choose_image(spec)  # a devcontainer tkbox cannot use is refused before any box
    endpoint(spec)
    if spec.name is not None and not re.match(r"^[a-z0-9][a-z0-9_.-]{0,62}$", spec.name):
        raise UserError(f"box name {spec.name!r} is not valid: use lowercase letters, digits, "
                        "'.', '_' and '-'")


#: the image a box runs when neither --image nor the checkout's dev container names one
#: (docs/agents.md): an ordinary public image, pulled, with Python and a shell; the
#: agent's program comes on its own disk
DEFAULT_IMAGE = "docker.io/library/python:3.12-slim"
#: the image with Claude Code installed in it (`tkbox.agents.image`), for those who
#: want one baked: a box of it gets no tool disk
BAKED_IMAGE = "tkbox/claude-code"


def choose_image(spec: AgentSpec) -> tuple[str, str]:
    """The box's image and where it came from: --image, the checkout's dev container,
    or the default."""
    if spec.image:
        return spec.image, "--image"
    from tkbox.agents import devcontainer

    named = devcontainer.image_of(spec.workspace)
    if named is not None:
        found = devcontainer.find(spec.workspace)
        return named, str(found.relative_to(spec.workspace)) if found else "devcontainer"
    return DEFAULT_IMAGE, "the default"


def tools_ref(spec: AgentSpec, image: str) -> str:
    """The tool disk the box gets (`tkbox.image.tools`), or '' for none."""
    agent = AGENT_TABLE.get(spec.agent)
    if agent is None or spec.command or (spec.agent == "claude-code" and image == BAKED_IMAGE):
        return ""
    ref = agent.tool + (f"@{spec.agent_version}" if spec.agent_version else "")
    return ref + ("" if spec.agent_build == "auto" else f":{spec.agent_build}")


def box_options(spec: AgentSpec) -> dict[str, Any]:
    """What the box is created with, for this agent."""
    allow = list(spec.allow)
    env = dict(spec.env)
    secrets = list(spec.secrets)
    image, _ = choose_image(spec)
    agent = AGENT_TABLE.get(spec.agent)
    ep = endpoint(spec)
    if agent is not None:
        if ep.netloc not in allow:
            allow.append(ep.netloc)
        key = key_env(spec)
        if not any(s.startswith(key + "=") for s in secrets):
            # bound on the model host's port: a value is swapped on its bound port only
            secrets.append(f"{key}=env:{key}@{ep.netloc};header={agent.header}")
        for k, v in {**agent.env, **agent.endpoint_env(ep)}.items():
            env.setdefault(k, v)
    name = spec.name or f"agent-{_random.token_hex(4)}"
    opts: dict[str, Any] = {"name": name, "image": image, "workspace": spec.workspace,
                            "allow": allow, "env": env, "secrets": secrets,
                            "memory_mib": spec.memory_mib, "vcpus": spec.vcpus,
                            "workspace_owner": (AGENT_UID, AGENT_UID)}
    if tools := tools_ref(spec, image):
        opts["tools"] = tools
    if agent is not None:
        # recorded as model calls even when the host is not a preset's (a proxy, a stand-in)
        opts["model_hosts"] = [ep.host]
    return opts


def agent_argv(spec: AgentSpec) -> list[str]:
    agent = AGENT_TABLE.get(spec.agent)
    if spec.command or agent is None:
        return ["sh", "-c", AS_AGENT, "tkbox-agent", "sh", "-c", spec.command or "false"]
    script = as_agent(agent.files) if agent.files else AS_AGENT
    return ["sh", "-c", script, "tkbox-agent", *agent.argv(spec.prompt, endpoint(spec))]


def run_job(client: Client, spec: AgentSpec, *,
            log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
            echo: Callable[[bytes], None] | None = None) -> AgentOutcome:
    """Run one job to its end. Raises `UserError` (or the daemon's refusal) before the box
    exists; once it does, returns the outcome, failed or not (`outcome.error`, and
    `outcome.raise_for_error()`), with the bundle exported."""
    check(spec)
    opts = box_options(spec)
    t0 = time.monotonic()
    out = AgentOutcome(box=opts["name"])
    out.image, out.image_from = choose_image(spec)
    log(f"tkbox: image {out.image} ({out.image_from})"
        + (f"; {opts['tools']} on its own disk" if "tools" in opts else ""))
    box = client.run(**opts)  # a refusal here leaves nothing behind
    out.phases["box"] = round(time.monotonic() - t0, 2)
    for step, secs in (box.info.raw.get("timings") or {}).items():
        if isinstance(secs, (int, float)):
            out.phases[f"box: {step}"] = float(secs)
    out.run_id = box.info.run_id
    log(f"tkbox: {spec.agent} running in box {box.name} ({box.info.accel}); "
        f"timeout {spec.timeout:.0f}s")
    try:
        with _phase(out, "agent"):
            _run_agent(client, box, spec, out, echo)
    except TkboxError as exc:
        out.error = out.error or str(exc)
    finally:
        _finish(client, box, spec, out, log)
        out.seconds = round(time.monotonic() - t0, 1)
    return out


@contextlib.contextmanager
def _phase(out: AgentOutcome, name: str) -> Iterator[None]:
    t0 = time.monotonic()
    try:
        yield
    finally:
        out.phases[name] = round(out.phases.get(name, 0.0) + time.monotonic() - t0, 2)


def _run_agent(client: Client, box: Box, spec: AgentSpec, out: AgentOutcome,
               echo: Callable[[bytes], None] | None) -> None:
    env = {"TKBOX_PROMPT": spec.prompt} if spec.command else {}
    stdin = spec.prompt.encode() if spec.command else b""
    stream = box.exec_stream(agent_argv(spec), cwd="/workspace", env=env, stdin=stdin)
    fired = threading.Event()

    def on_timeout() -> None:
        fired.set()
        # Another connection: the main one is busy reading the agent's output.
        with Client(client.socket) as c:
            for sig, wait in ((15, KILL_GRACE), (9, KILL_GRACE)):
                if stream.exec_id is None or stream.result is not None:
                    return
                try:
                    c.box(box.name, fetch=False).signal(stream.exec_id, sig)
                except TkboxError:
                    return
                time.sleep(wait)
            # The command ignored even SIGKILL's delivery: stopping the box ends it.
            try:
                c.box(box.name, fetch=False).stop()
            except TkboxError:
                pass

    timer = threading.Timer(spec.timeout, on_timeout)
    timer.daemon = True
    timer.start()
    stdout = bytearray()
    broke: str | None = None
    try:
        for chunk in stream:
            if chunk.fd == 1 and len(stdout) < MAX_AGENT_STDOUT:
                stdout += chunk.data[:MAX_AGENT_STDOUT - len(stdout)]
            if echo is not None:
                echo(chunk.data)
    except TkboxError as exc:
        broke = str(exc)
    finally:
        timer.cancel()
    result = stream.result
    out.status = result.status if result else None
    out.timed_out = fired.is_set()
    agent = None if spec.command else AGENT_TABLE.get(spec.agent)
    if agent is not None:
        out.agent_result = agent.result(bytes(stdout))
    if out.timed_out:
        out.error = f"the agent ran past --timeout {spec.timeout:.0f}s and was stopped"
    elif broke is not None:
        out.error = f"the agent's command broke off: {broke}"
    elif result is None or result.status != 0:
        why = f"status {result.status}" if result and result.status is not None else \
            f"signal {result.signal}" if result and result.signal else \
            (result.error if result and result.error else "no exit status")
        out.error = f"the agent exited with {why}"
    elif agent is not None and (said := agent.failed(out.agent_result)) is not None:
        out.error = said


def _finish(client: Client, box: Box, spec: AgentSpec, out: AgentOutcome,
            log: Callable[[str], None]) -> None:
    """Stop, keep the patch, export: each step tried whatever happened before it."""
    try:
        with _phase(out, "stop"):
            state = box.refresh().state
            if state in ("running", "held"):
                box.stop()
    except TkboxError as exc:
        out.error = out.error or f"the box could not be stopped cleanly: {exc}"
    try:
        data = box.patch()
        p = spec.out_dir / f"{box.name}.patch"
        p.write_bytes(data)
        out.patch, out.patch_bytes = str(p), len(data)
        _patch_facts(box.refresh(), out, log)
    except TkboxError as exc:
        log(f"tkbox: no patch: {exc}")
    if spec.apply and out.patch is not None:
        with _phase(out, "apply"):
            _apply(box, spec, out, log)
    if out.patch_partial:
        why = str((box.info.raw.get("patch") or {}).get("error", ""))[:300]
        out.error = out.error or f"the box's patch is partial ({why}): only the files that " \
            "arrived whole were kept"
    try:
        with _phase(out, "export"):
            r = client.export(box, spec.out_dir / f"{box.name}.tkb")
        out.bundle, out.trust = str(r.bundle), str(r.trust)
    except TkboxError as exc:
        out.error = out.error or f"the bundle could not be exported: {exc}"
        log(f"tkbox: no bundle: {exc}")


def _patch_facts(info: BoxInfo, out: AgentOutcome, log: Callable[[str], None]) -> None:
    """What the box's patch left out, and whether it is partial, into the outcome."""
    out.tools = info.raw.get("tools")
    p = info.raw.get("patch") or {}
    out.patch_partial = info.patch_partial
    out.set_apart = info.set_apart[:MAX_HELD_LISTED]
    out.set_apart_count = sum(int(v.get("count", 0)) for v in (p.get("apart") or {}).values()
                              if isinstance(v, dict))
    if out.patch_partial:
        log(f"tkbox: the patch is partial: {str(p.get('error', ''))[:300]}")
    sized = [a for a in info.set_apart if a.get("why") != "ignored"]
    for a in sized[:MAX_HELD_LISTED]:
        log(f"tkbox: set apart, not in the patch: {a.get('path')} ({a.get('size')} bytes, "
            f"{a.get('why')})")


def _apply(box: Box, spec: AgentSpec, out: AgentOutcome, log: Callable[[str], None]) -> None:
    """The patch through the changes door into the workspace, before the export (so the
    run holds its Write decisions); only for a job that did not fail."""
    if out.error is not None:
        log("tkbox: the patch was not applied: the job failed")
        return
    try:
        r = box.apply(dry_run=False, checkout=spec.workspace, with_patch=True)
    except TkboxError as exc:
        out.error = f"the patch was not applied: {exc}"
        out.refused = isinstance(exc, Refused)
        return
    p = spec.out_dir / f"{box.name}.applied.patch"
    p.write_bytes(r.patch or b"")
    out.applied_patch = str(p)
    out.applied = {k: v for k, v in r.counts.items() if v}
    held = [f for f in r.files if f.status == "held back"]
    out.held_back = [{"path": f.path, "reason": f.reason} for f in held[:MAX_HELD_LISTED]]
    if len(held) > MAX_HELD_LISTED:
        out.held_back.append({"path": "", "reason": f"and {len(held) - MAX_HELD_LISTED} more"})
    log(f"tkbox: applied to {spec.workspace}: " + (", ".join(
        f"{v} {k}" for k, v in out.applied.items()) or "the patch changes nothing"))
