"""`tkbox mcp`: an MCP server on stdio, so that an agent host can drive boxes.

Built on the official `mcp` package (FastMCP). It is one more client of the
daemon's API through the SDK (`tkbox.sdk.AsyncClient`); it talks to no VM and
no signer itself. Tools:

| tool | does |
| --- | --- |
| `run` | create and boot a box (image, workspace, allow, env, secrets by reference) |
| `exec` | run a command in a box; its status and (bounded) output |
| `stop` | stop a box: egress closes, the patch is saved |
| `patch` | the saved patch, as text (bounded) |
| `apply` | decide the patch file by file; a dry run unless `write=true` |
| `export` | close the run, write the bundle and trust file |
| `approvals` | connections waiting for a person's answer |
| `approve` | answer one of them (allow or deny); only with `--answer-approvals` |

Whatever an agent-facing tool receives may have been written by a box: the
agent driving this server reads what the box's commands print, and a box can
print "call run with secrets={...}" as easily as anything else. So nothing an
agent passes widens what the operator fixed when `tkbox mcp` started
(`Operator`): the hosts a box may reach (`--allow`), the secrets bound and to
which hosts (`--secret`), the hosts read as model calls (`--model-host`), and the
one folder every path a tool names must be inside (`--workspace-root`, default
the folder `tkbox mcp` starts in: `run`'s workspace, `apply`'s checkout,
`export`'s bundle, which may not overwrite a file). An agent may narrow them
(a subset of the hosts, of the secrets by name); it may widen them only where the
operator opted in (`--agent-may-allow`, `--agent-may-bind-secrets`, each named
unsafe), and the run's open record says what the agent chose and which opt-ins
were in effect (`client`).

An approval asks a person. For the same reason the server offers `approve` only
when started with `--answer-approvals`; its answers are then recorded as an
agent's (through `tkbox mcp`), not a person's.

No tool input or output carries a secret value: secrets are named by
reference (`env:VAR@host`), which the SDK checks before sending, and the box
itself only ever holds placeholders. Errors are the SDK's one-line messages.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError

from tkbox.errors import Refused, TkboxError, UserError
from tkbox.sdk import AsyncClient, Chunk, secret_specs

#: output kept per stream of one exec; the rest is counted, not returned
OUTPUT_LIMIT = 64 * 1024
PATCH_LIMIT = 1024 * 1024


def _bounded(data: bytes, limit: int) -> dict[str, Any]:
    return {"text": data[:limit].decode("utf-8", errors="replace"), "bytes": len(data),
            "truncated": len(data) > limit}


#: set-apart changes of a stopped box's patch shown to the agent (the rest counted)
APART_SHOWN = 50


def _box_view(raw: dict[str, Any]) -> dict[str, Any]:
    keep = ("name", "state", "run_id", "image", "image_digest", "accel", "boot_seconds",
            "error", "allow", "env_names", "secrets", "model_hosts", "patch", "workspace",
            "tools")
    view = {k: raw[k] for k in keep if k in raw}
    patch = view.get("patch")
    if isinstance(patch, dict) and isinstance(patch.get("set_apart"), list):
        view["patch"] = {**patch, "set_apart": patch["set_apart"][:APART_SHOWN]}
    return view


@dataclass(frozen=True)
class Operator:
    """What the operator fixed when `tkbox mcp` started. A box started through MCP gets
    these hosts, secret bindings and model hosts, or fewer; every path a tool names is
    inside `root`. `agent_may_allow` and `agent_may_bind` (UNSAFE) let the agent add
    hosts and bind secrets of its own."""

    root: Path
    allow: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()  # NAME=SOURCE@host specs
    model_hosts: tuple[str, ...] = ()
    agent_may_allow: bool = False
    agent_may_bind: bool = False
    names: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        specs = secret_specs(list(self.secrets))  # a bad --secret fails at start
        self.names.update({s.partition("=")[0]: s for s in specs})

    @property
    def unsafe(self) -> list[str]:
        return [f for f, on in (("--agent-may-allow", self.agent_may_allow),
                                ("--agent-may-bind-secrets", self.agent_may_bind)) if on]

    def allow_for(self, requested: list[str] | None) -> list[str]:
        """The operator's hosts, or the subset the agent asked for; a host beyond them
        only with `agent_may_allow`."""
        if requested is None:
            return list(self.allow)
        extra = [a for a in requested if a not in self.allow]
        if extra and not self.agent_may_allow:
            raise Refused(f"allow {extra[0][:80]!r} is not one of the hosts the operator "
                          f"gave tkbox mcp ({', '.join(self.allow) or 'none'}); a box's "
                          "hosts are the operator's to choose: start 'tkbox mcp --allow "
                          "HOST'")
        return list(requested)

    def secrets_for(self, requested: list[str] | dict[str, str] | None) -> list[str]:
        """The operator's bindings, or those the agent named; a binding of the agent's
        own (NAME: SOURCE@host) only with `agent_may_bind`."""
        if requested is None:
            return list(self.names.values())
        if isinstance(requested, dict):
            if not self.agent_may_bind:
                raise Refused("secrets are bound by the operator, not through MCP: a "
                              "binding sends a real credential to a host, and a box can "
                              "ask the agent for one; name the operator's bindings "
                              f"({', '.join(self.names) or 'none'}), or start 'tkbox mcp "
                              "--secret NAME=env:VAR@host'")
            return secret_specs(requested)
        unknown = [n for n in requested if n not in self.names]
        if unknown:
            raise Refused(f"no secret named {unknown[0][:64]!r} was given to tkbox mcp "
                          f"({', '.join(self.names) or 'none'}); start 'tkbox mcp --secret "
                          "NAME=env:VAR@host'")
        return [self.names[n] for n in requested]

    def inside(self, path: str | None, what: str) -> Path:
        """`path` (relative to `root`, or absolute) resolved, if it is inside `root`."""
        root = Path(os.path.realpath(self.root))
        target = Path(os.path.realpath(root / (path if path is not None else ".")))
        if target != root and root not in target.parents:
            raise Refused(f"{what} {str(path)[:200]!r} is outside the folder tkbox mcp "
                          f"works in ({root}); start 'tkbox mcp --workspace-root DIR'")
        return target


def build_server(socket: str | None = None, *, answer_approvals: bool = False,
                 operator: Operator | None = None) -> FastMCP:
    """The tools, on the daemon at `socket`; `approve` only with `answer_approvals`;
    boxes and paths within `operator` (default: no hosts, no secrets, the current
    folder)."""
    operator = operator or Operator(Path.cwd())
    server = FastMCP("tkbox", instructions=(
        "Run each agent job in its own micro-VM: run a box, exec commands in it, stop it, "
        "look at its patch, apply it (a dry run unless write=true) and export the signed "
        "bundle. Secrets are given by reference (env:VAR@host), never by value."),
        log_level="WARNING")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    def client() -> AsyncClient:
        return AsyncClient(socket)

    async def guarded(coro: Any) -> Any:
        try:
            return await coro
        except TkboxError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from None

    @server.tool()
    async def run(workspace: str | None = None, image: str = "tkbox/default",
                  name: str | None = None, allow: list[str] | None = None,
                  env: dict[str, str] | None = None,
                  secrets: list[str] | dict[str, str] | None = None,
                  tools: str | None = None) -> dict[str, Any]:
        """Create and boot a box with `workspace` (a folder inside the server's, by
        default that folder) copied in. `allow`: a subset of the operator's entries
        (hosts, presets, each maybe with method and path rules; default: all of them).
        `secrets`: names of the operator's bindings (default: all of them). `tools`: an
        agent's program on its own disk, on PATH (`claude-code`, `codex` or `gemini`,
        as NAME[@VERSION][:BUILD])."""
        async def go() -> dict[str, Any]:
            chose = [k for k, v in (("workspace", workspace), ("allow", allow),
                                    ("secrets", secrets), ("env", env), ("tools", tools))
                     if v is not None]
            if image != "tkbox/default":
                chose.append("image")
            ws = operator.inside(workspace, "workspace")
            hosts = operator.allow_for(allow)
            specs = operator.secrets_for(secrets)
            async with client() as c:
                box = await c.run(image=image, workspace=ws, name=name, allow=hosts,
                                  env=env or {}, secrets=specs,
                                  model_hosts=operator.model_hosts, via="mcp",
                                  agent_chose=chose, unsafe=operator.unsafe,
                                  tools=tools or "")
                return _box_view(box.info.raw)
        return dict(await guarded(go()))

    @server.tool(name="exec")
    async def exec_(box: str, argv: list[str], cwd: str | None = None) -> dict[str, Any]:
        """Run `argv` in the box (decided and recorded by the signer); returns its exit
        status and its output (each stream cut at 64 KiB)."""
        async def go() -> dict[str, Any]:
            async with client() as c:
                b = await c.box(box)
                out = {1: bytearray(), 2: bytearray()}
                result: Any = None
                async for item in b.exec_stream(argv, cwd=cwd):
                    if isinstance(item, Chunk):
                        out[item.fd] += item.data
                    else:
                        result = item
                return {"status": result.status, "signal": result.signal,
                        "error": result.error, "command": result.command,
                        "stdout": _bounded(bytes(out[1]), OUTPUT_LIMIT),
                        "stderr": _bounded(bytes(out[2]), OUTPUT_LIMIT)}
        return dict(await guarded(go()))

    @server.tool()
    async def stop(box: str) -> dict[str, Any]:
        """Stop a box: egress closes at once, the workspace patch is saved, the VM ends."""
        async def go() -> dict[str, Any]:
            async with client() as c:
                return _box_view((await (await c.box(box)).stop()).raw)
        return dict(await guarded(go()))

    @server.tool()
    async def patch(box: str) -> dict[str, Any]:
        """The patch a stopped box saved (git format), cut at 1 MiB."""
        async def go() -> dict[str, Any]:
            async with client() as c:
                return _bounded(await (await c.box(box)).patch(), PATCH_LIMIT)
        return dict(await guarded(go()))

    @server.tool()
    async def apply(box: str, write: bool = False, checkout: str | None = None) -> dict[str, Any]:
        """Decide a stopped box's patch file by file. A dry run (nothing written) unless
        `write` is true; sensitive files are always held back here."""
        async def go() -> dict[str, Any]:
            async with client() as c:
                b = await c.box(box)
                target = operator.inside(checkout if checkout is not None else
                                         str(b.info.raw.get("workspace", "")), "checkout")
                r = await b.apply(dry_run=not write, checkout=str(target))
                return dict(r.raw)
        return dict(await guarded(go()))

    @server.tool()
    async def export(box: str, path: str | None = None) -> dict[str, Any]:
        """Close the box's run and write its bundle (default NAME.tkb, in the server's
        folder) and trust file; neither may exist already."""
        async def go() -> dict[str, Any]:
            target = operator.inside(path if path is not None else f"{box}.tkb", "bundle path")
            trust = target.with_name(target.name.removesuffix(".tkb") + ".trust.json")
            if target.suffix != ".tkb":
                raise UserError(f"the bundle path must end in .tkb, not {target.name!r}")
            for p in (target, trust):
                if os.path.lexists(p):
                    raise Refused(f"{p} exists already; export through MCP writes new "
                                  "files only")
            async with client() as c:
                r = await c.export(box, str(target))
                return {"bundle": str(r.bundle), "trust": str(r.trust)}
        return dict(await guarded(go()))

    @server.tool()
    async def approvals() -> dict[str, Any]:
        """Connections waiting for a person's answer (`tkbox approve BOX ID` on the host)."""
        async def go() -> dict[str, Any]:
            async with client() as c:
                return {"approvals": await c.approvals()}
        return dict(await guarded(go()))

    if not answer_approvals:
        return server

    @server.tool()
    async def approve(box: str, approval_id: int, allow: bool) -> dict[str, Any]:
        """Answer one waiting connection: allow it, or deny it (recorded as answered by
        an agent through tkbox mcp, not by a person)."""
        async def go() -> dict[str, Any]:
            async with client() as c:
                return await c.answer(box, approval_id, allow, via="mcp")
        return dict(await guarded(go()))

    return server


def serve_stdio(socket: str | None = None, *, answer_approvals: bool = False,
                operator: Operator | None = None) -> None:
    build_server(socket, answer_approvals=answer_approvals, operator=operator).run("stdio")
