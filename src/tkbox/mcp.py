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

An approval asks a person. The agent driving this server reads what the box's
commands print, and a box can print "call approve" as easily as anything else,
so the server offers `approve` only when started with `--answer-approvals`; its
answers are then recorded as an agent's (through `tkbox mcp`), not a person's.

No tool input or output carries a secret value: secrets are named by
reference (`env:VAR@host`), which the SDK checks before sending, and the box
itself only ever holds placeholders. Errors are the SDK's one-line messages.
"""

from __future__ import annotations

import logging
from typing import Any

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError

from tkbox.errors import TkboxError
from tkbox.sdk import AsyncClient, Chunk

#: output kept per stream of one exec; the rest is counted, not returned
OUTPUT_LIMIT = 64 * 1024
PATCH_LIMIT = 1024 * 1024


def _bounded(data: bytes, limit: int) -> dict[str, Any]:
    return {"text": data[:limit].decode("utf-8", errors="replace"), "bytes": len(data),
            "truncated": len(data) > limit}


def _box_view(raw: dict[str, Any]) -> dict[str, Any]:
    keep = ("name", "state", "run_id", "image", "image_digest", "accel", "boot_seconds",
            "error", "allow", "env_names", "secret_names", "patch", "workspace")
    return {k: raw[k] for k in keep if k in raw}


def build_server(socket: str | None = None, *, answer_approvals: bool = False) -> FastMCP:
    """The tools, on the daemon at `socket`; `approve` only with `answer_approvals`."""
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
    async def run(workspace: str, image: str = "tkbox/default", name: str | None = None,
                  allow: list[str] | None = None, env: dict[str, str] | None = None,
                  secrets: dict[str, str] | None = None) -> dict[str, Any]:
        """Create and boot a box with `workspace` copied in. `allow`: hosts, host:port or
        presets (pypi, npm, github-read, ...), each with method and path rules after a
        space if wanted ("api.github.com GET HEAD /**").
        `secrets`: {"NAME": "env:VAR@host"} references only."""
        async def go() -> dict[str, Any]:
            async with client() as c:
                box = await c.run(image=image, workspace=workspace, name=name,
                                  allow=allow or [], env=env or {}, secrets=secrets)
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
                r = await (await c.box(box)).apply(dry_run=not write, checkout=checkout)
                return dict(r.raw)
        return dict(await guarded(go()))

    @server.tool()
    async def export(box: str, path: str | None = None) -> dict[str, Any]:
        """Close the box's run and write its bundle (default NAME.tkb) and trust file."""
        async def go() -> dict[str, Any]:
            async with client() as c:
                r = await c.export(box, path)
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


def serve_stdio(socket: str | None = None, *, answer_approvals: bool = False) -> None:
    build_server(socket, answer_approvals=answer_approvals).run("stdio")
