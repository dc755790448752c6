"""`tkbox mcp` as a subprocess, driven by the `mcp` package's own stdio client session,
against the real daemon API (fake VMs)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from sdk_daemon import SdkDaemon

SECRET = "sk-test-VALUE-must-never-show"


def params(daemon: SdkDaemon) -> StdioServerParameters:
    env = {**os.environ, "TKBOX_HOME": str(daemon.home),
           "TKBOX_RUNTIME": str(daemon.socket.parent), "MY_KEY": SECRET}
    return StdioServerParameters(command=sys.executable, args=["-m", "tkbox.cli", "mcp"],
                                 env=env)


async def call(s: ClientSession, tool: str, **args: Any) -> tuple[bool, Any, str]:
    r = await s.call_tool(tool, args)
    text = "".join(getattr(c, "text", "") for c in r.content)
    return r.isError, r.structuredContent, text


def test_a_job_through_an_mcp_client_session(daemon: SdkDaemon, ws: Path, tmp_path: Path):
    seen: list[str] = []

    async def main() -> None:
        async with stdio_client(params(daemon)) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            tools = {t.name for t in (await s.list_tools()).tools}
            assert {"run", "exec", "stop", "patch", "apply", "export", "approvals",
                    "approve"} <= tools
            err, out, text = await call(s, "run", workspace=str(ws), name="m1",
                                        secrets={"K": "env:MY_KEY@model.test"})
            seen.append(text)
            assert not err and out["state"] == "running", text
            err, out, text = await call(s, "exec", box="m1", argv=["pytest", "-q"])
            seen.append(text)
            assert not err and out["status"] == 0
            assert out["stdout"]["text"] == "pytest -q\n"
            err, out, text = await call(s, "apply", box="m1")
            assert err and "it is running" in text
            err, out, text = await call(s, "stop", box="m1")
            assert not err and out["state"] == "stopped"
            err, out, text = await call(s, "patch", box="m1")
            assert out["text"].startswith("diff --git a/hello.txt")
            err, out, text = await call(s, "apply", box="m1")
            assert out["dry_run"] is True and out["files"][0]["path"] == "hello.txt"
            assert not (ws / "hello.txt").exists(), "apply is a dry run unless asked"
            err, out, text = await call(s, "approvals")
            assert not err and out["approvals"] == []
            err, out, text = await call(s, "export", box="m1", path=str(tmp_path / "m1.tkb"))
            assert not err and Path(out["bundle"]).is_file()
            assert Path(out["trust"]).name == "m1.trust.json"
            # a value where a reference belongs: refused, and the value is not echoed
            err, out, text = await call(s, "run", workspace=str(ws), name="m2",
                                        secrets={"K": SECRET})
            seen.append(text)
            assert err and "never the value itself" in text
            err, out, text = await call(s, "exec", box="nope", argv=["ls"])
            assert err and text.endswith("UserError: no box named 'nope'; see 'tkbox ls'")

    asyncio.run(asyncio.wait_for(main(), 120))
    assert all(SECRET not in t for t in seen)
    assert SECRET not in json.dumps(daemon.signer.records)
