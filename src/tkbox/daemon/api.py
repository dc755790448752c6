"""The daemon's HTTP API, on a Unix socket in a 0700 directory.

The CLI, the SDK, the MCP server and the GitHub Action are all clients of
this one API. The edge parses each request into one of a closed set of typed
actions (the pydantic models below); nothing past it sees raw input. Errors
come back as `{"error": {"type", "message"}}` with a status that matches the
error's kind, and the CLI prints the message as one line.

Peers are checked with `SO_PEERCRED` when the connection is made: only root
and the daemon's own user may talk to it.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import socket
import struct
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from uvicorn.protocols.http.h11_impl import H11Protocol

from tkbox import __version__
from tkbox.daemon import lifecycle
from tkbox.daemon.manager import BoxManager, BoxSpec
from tkbox.daemon.roles import StatusReporter
from tkbox.doors.network import PendingApproval, Via
from tkbox.errors import (
    BoxNotFound,
    GuestError,
    HostError,
    OriginError,
    Refused,
    RegistryError,
    SignerUnavailable,
    TkboxError,
    UserError,
)

log = logging.getLogger("tkbox.daemon")


class RunBody(BaseModel):
    name: str = Field(default="", max_length=63)  # "": the daemon picks one
    image: str = Field(default="tkbox/default", max_length=512)
    workspace: str = Field(max_length=4096)
    allow: list[str] = Field(default_factory=list, max_length=256)
    env: dict[str, str] = Field(default_factory=dict)
    memory_mib: int = 1024
    vcpus: int = 1
    disk_mib: int = Field(default=4096, ge=64, le=1024 * 1024)
    # "NAME=env:VAR@host[,host];header=H" strings; values the client read itself
    # (never echoed: see _invalid below); "all" to read every allowed host.
    secrets: list[str] = Field(default_factory=list, max_length=32)
    secret_values: dict[str, str] = Field(default_factory=dict, max_length=32)
    inspect: str = Field(default="", max_length=16)
    model_hosts: list[str] = Field(default_factory=list, max_length=64)
    timeout_s: int | None = Field(default=None, ge=1)
    #: uid and gid that own the workspace's files (default: the image's user, else root)
    workspace_owner: list[Annotated[int, Field(ge=0, lt=2**32 - 1)]] | None = Field(
        default=None, min_length=2, max_length=2)
    #: the kind of client asking, as it says, and which settings an agent driving it
    #: chose (recorded in the run's open record: `tkbox mcp` says so)
    #: an agent's program as a read-only disk: NAME[@VERSION][:BUILD] (docs/agents.md)
    tools: str = Field(default="", max_length=120)
    via: Via = "sdk"
    agent_chose: list[AgentChoice] = Field(default_factory=list, max_length=8)
    unsafe: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list,
                                                               max_length=4)


AgentChoice = Literal["workspace", "image", "allow", "env", "secrets", "tools"]


class CopyInBody(BaseModel):
    path: str = Field(min_length=1, max_length=4096)
    data_b64: str = Field(max_length=90 * 1024 * 1024)
    mode: int = Field(default=0o644, ge=0, le=0o777)
    host_path: str = Field(default="", max_length=4096)


class CopyOutBody(BaseModel):
    path: str = Field(min_length=1, max_length=4096)
    host_path: str = Field(min_length=1, max_length=4096)


class TtyBody(BaseModel):
    rows: int = Field(ge=1, le=1000)
    cols: int = Field(ge=1, le=1000)


class ExecBody(BaseModel):
    argv: list[str] = Field(min_length=1, max_length=4096)
    cwd: str | None = Field(default=None, max_length=4096)
    env: dict[str, str] = Field(default_factory=dict)
    stdin_b64: str | None = None
    tty: TtyBody | None = None


class InputBody(BaseModel):
    data_b64: str = Field(max_length=64 * 1024)


class SignalBody(BaseModel):
    sig: int


class ApplyBody(BaseModel):
    checkout: str | None = Field(default=None, max_length=4096)
    allow_sensitive: bool = False
    dry_run: bool = False
    with_patch: bool = False  # also return the applied files' sections (`patch_b64`)


class AnswerBody(BaseModel):
    allow: bool
    #: the kind of client answering, as it says (recorded: approvals.ANSWERED_BY)
    via: Via = "sdk"


#: HTTP status by error type; the most specific type in an error's class hierarchy wins
STATUS: dict[type[TkboxError], int] = {
    UserError: 400, BoxNotFound: 404, Refused: 403, HostError: 500, GuestError: 502,
    RegistryError: 502, OriginError: 502, SignerUnavailable: 503}

#: the `type` an error is named by on the wire, where it is not its class's own name:
#: clients know a missing box as a UserError (exit status 2), as they always have
WIRE_TYPE: dict[type[TkboxError], str] = {BoxNotFound: "UserError"}


def status_of(exc: TkboxError) -> int:
    return next((STATUS[t] for t in type(exc).__mro__ if t in STATUS), 500)


def error_response(exc: TkboxError) -> JSONResponse:
    kind = next((WIRE_TYPE[t] for t in type(exc).__mro__ if t in WIRE_TYPE),
                type(exc).__name__)
    return JSONResponse({"error": {"type": kind, "message": str(exc)}},
                        status_code=status_of(exc))


def make_app(manager: BoxManager, info: dict[str, Any]) -> FastAPI:
    app = FastAPI(title="tkbox daemon", version=__version__, docs_url=None, redoc_url=None)

    @app.exception_handler(TkboxError)
    async def _tk(request: Request, exc: TkboxError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Never echo the input: a create body may carry secret values.
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"error": {"type": "UserError", "message":
                             f"bad request body at {where[:100]}: {first.get('msg', 'invalid')}"
                             [:300]}}, status_code=422)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error in %s %s", request.method, request.url.path)
        return JSONResponse({"error": {"type": "InternalError", "message":
                             f"internal error in tkbox ({exc.__class__.__name__}: {exc}); "
                             "this is a bug: see the daemon's log"}}, status_code=500)

    @app.get("/v1/info")
    async def get_info() -> dict[str, Any]:
        return {**info, "boxes": len(manager.boxes)}

    @app.get("/v1/boxes")
    async def ls() -> dict[str, Any]:
        return {"boxes": manager.list_boxes()}

    @app.post("/v1/boxes")
    async def run(body: RunBody) -> dict[str, Any]:
        box = await manager.create(BoxSpec(**body.model_dump()))
        return box.public()

    @app.get("/v1/boxes/{name}")
    async def inspect(name: str) -> dict[str, Any]:
        box = manager.get(name)
        out = box.public()
        if isinstance(box.vm, StatusReporter):
            try:
                out["vm_status"] = await asyncio.wait_for(box.vm.status(), 5)
            except Exception as exc:  # noqa: BLE001 - a status is a nicety, never an error
                out["vm_status"] = f"unknown ({exc.__class__.__name__})"
        return out

    @app.post("/v1/boxes/{name}/exec")
    async def exec_(name: str, body: ExecBody) -> StreamingResponse:
        try:
            stdin = base64.b64decode(body.stdin_b64, validate=True) \
                if body.stdin_b64 is not None else None
        except ValueError:
            raise UserError("stdin_b64 is not valid base64") from None
        events = cast(AsyncGenerator[dict[str, Any], None],
                      manager.exec(name, body.argv, body.cwd, body.env, stdin,
                                   body.tty.model_dump() if body.tty else None))
        # Raise refusals before the stream starts, so they get a proper status.
        first = await events.__anext__()

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield _line(first)
                async for ev in events:
                    yield _line(ev)
            except TkboxError as exc:
                yield _line({"ev": "error", "message": str(exc)})
            finally:
                await events.aclose()

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    @app.post("/v1/boxes/{name}/cp-in")
    async def cp_in(name: str, body: CopyInBody) -> dict[str, Any]:
        try:
            data = base64.b64decode(body.data_b64, validate=True)
        except ValueError:
            raise UserError("data_b64 is not valid base64") from None
        return await manager.copy_in(name, body.path, data, body.mode, body.host_path)

    @app.post("/v1/boxes/{name}/cp-out")
    async def cp_out(name: str, body: CopyOutBody) -> dict[str, Any]:
        data, path = await manager.copy_out(name, body.path, body.host_path)
        return {"path": path, "size": len(data), "data_b64": base64.b64encode(data).decode()}

    @app.get("/v1/boxes/{name}/logs")
    async def logs(name: str, follow: bool = False) -> StreamingResponse:
        box = manager.get(name)  # UserError (404) before the stream starts
        journals = manager.journals
        if journals is None:
            raise UserError("this daemon keeps no journal (it runs --unrecorded)")

        def done() -> bool:
            return not lifecycle.is_live(box.state)

        async def stream() -> AsyncIterator[bytes]:
            async for entry in journals.follow(box.run_id, follow=follow, done=done):
                yield _line(entry)

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    @app.post("/v1/boxes/{name}/exec/{exec_id}/input")
    async def input_(name: str, exec_id: str, body: InputBody) -> dict[str, Any]:
        try:
            data = base64.b64decode(body.data_b64, validate=True)
        except ValueError:
            raise UserError("data_b64 is not valid base64") from None
        await manager.exec_input(name, exec_id, data)
        return {"ok": True}

    @app.post("/v1/boxes/{name}/exec/{exec_id}/resize")
    async def resize(name: str, exec_id: str, body: TtyBody) -> dict[str, Any]:
        await manager.exec_resize(name, exec_id, body.rows, body.cols)
        return {"ok": True}

    @app.post("/v1/boxes/{name}/exec/{exec_id}/signal")
    async def signal_(name: str, exec_id: str, body: SignalBody) -> dict[str, Any]:
        await manager.signal(name, exec_id, body.sig)
        return {"ok": True}

    @app.post("/v1/boxes/{name}/stop")
    async def stop(name: str) -> dict[str, Any]:
        return (await manager.stop(name)).public()

    @app.get("/v1/boxes/{name}/patch")
    async def patch(name: str) -> dict[str, Any]:
        return {"patch_b64": base64.b64encode(manager.patch(name)).decode()}

    @app.post("/v1/boxes/{name}/apply")
    async def apply(name: str, body: ApplyBody) -> dict[str, Any]:
        return await manager.apply(name, body.checkout, body.allow_sensitive, body.dry_run,
                                   with_patch=body.with_patch)

    @app.post("/v1/boxes/{name}/export")
    async def export(name: str) -> dict[str, Any]:
        bundle, trust = await manager.export(name)
        return {"bundle_b64": base64.b64encode(bundle).decode(),
                "trust_b64": base64.b64encode(trust).decode()}

    @app.delete("/v1/boxes/{name}")
    async def rm(name: str, force: bool = False) -> dict[str, Any]:
        await manager.rm(name, force)
        return {"removed": name}

    @app.get("/v1/approvals")
    async def approvals() -> dict[str, Any]:
        board = manager.approvals
        items = [] if board is None else [_approval(p) for p in board.list()]
        return {"approvals": items}

    @app.post("/v1/approvals/{box}/{approval_id}")
    async def answer(box: str, approval_id: int, body: AnswerBody) -> dict[str, Any]:
        board = manager.approvals
        if board is None:
            raise UserError("this daemon has no network door, so nothing waits for approval")
        manager.get(box)
        p = await board.answer(box, approval_id, body.allow, body.via)
        return _approval(p)

    @app.get("/v1/boxes/{name}/egress-check")
    async def egress_check(name: str, host: str, port: int = 443) -> dict[str, Any]:
        box = manager.get(name)
        if box.door is None:
            raise UserError(f"box {name} has no open network door (it is {box.state})")
        return (await box.door.resolve_and_check(host, port)).to_dict()

    return app


def _approval(p: PendingApproval) -> dict[str, Any]:
    return dataclasses.asdict(p)


def _line(ev: dict[str, Any]) -> bytes:
    if "data" in ev and isinstance(ev["data"], bytes):
        ev = {**ev, "data": base64.b64encode(ev["data"]).decode()}
    return (json.dumps(ev) + "\n").encode()


class PeerCheckedH11(H11Protocol):
    """uvicorn's HTTP protocol, refusing peers that are neither root nor us."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", raw)
        except (OSError, AttributeError):
            uid = -1
        if uid not in (0, os.getuid()):
            log.warning("refused an API connection from uid %s", uid)
            transport.abort()
            return
        super().connection_made(transport)
