"""The SDK's request core, fed bytes, and its two shells over a fake transport.

No daemon: the core (`tkbox.sdk.core`) is sans-IO, and `Client` / `AsyncClient`
take any httpx transport (`transport=`), here `httpx.MockTransport`. The same
scripted answers must give the same results and the same errors through both
shells, since both only carry the core's requests.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tkbox import AsyncClient, Client
from tkbox.errors import GuestError, HostError, Refused, TkboxError, UserError
from tkbox.sdk import core
from tkbox.sdk.core import BoxInfo, Chunk, ExecResult

Handler = Callable[[httpx.Request], httpx.Response]


def ndjson(*events: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, content=b"".join(json.dumps(e).encode() + b"\n"
                                                for e in events))


def out(fd: int, data: bytes) -> dict[str, Any]:
    return {"ev": "out", "fd": fd, "data": base64.b64encode(data).decode()}


BOX = {"name": "b1", "state": "running", "run_id": "b1-1", "image": "i",
       "image_digest": "sha256:" + "0" * 64, "accel": "tcg"}


def script(seen: list[tuple[str, str, Any]],
           exec_events: list[dict[str, Any]] | None = None) -> Handler:
    """A daemon as a table of answers, recording each request (method, path, body)."""
    def handle(req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content) if req.content else None
        seen.append((req.method, req.url.path + (f"?{req.url.query.decode()}"
                                                 if req.url.query else ""), body))
        match req.method, req.url.path:
            case "GET", "/v1/boxes":
                return httpx.Response(200, json={"boxes": [BOX]})
            case "POST", "/v1/boxes":
                return httpx.Response(200, json=BOX)
            case "POST", "/v1/boxes/b1/exec":
                return ndjson(*(exec_events if exec_events is not None else [
                    {"ev": "started", "exec_id": "e1", "command": "make"},
                    out(1, b"built\n"), out(2, b"warn\n"), out(1, b"done\n"),
                    {"ev": "exit", "status": 2, "signal": None, "error": None}]))
            case "POST", "/v1/boxes/b1/stop":
                return httpx.Response(200, json={**BOX, "state": "stopped"})
            case "GET", "/v1/boxes/b1/patch":
                return httpx.Response(200, json={"patch_b64": base64.b64encode(b"P").decode()})
            case "DELETE", "/v1/boxes/b1":
                return httpx.Response(200, json={"removed": "b1"})
            case "GET", "/v1/boxes/gone":
                return httpx.Response(404, json={"error": {"type": "UserError",
                                                           "message": "no box named 'gone'"}})
            case "POST", "/v1/boxes/b1/apply":
                return httpx.Response(403, json={"error": {"type": "Refused",
                                                           "message": "the signer\nsaid no"}})
        return httpx.Response(404, json={"detail": "Not Found"})
    return handle


def run_sync(handler: Handler, tmp_path: Path) -> list[Any]:
    with Client(transport=httpx.MockTransport(handler)) as c:
        box = c.run(workspace=tmp_path, name="b1", allow=["pypi"])
        got: list[Any] = [box.info, c.boxes(), box.exec(["make"])]
        got.append(list(box.exec_stream(["make"])))
        got += [box.stop(), box.patch()]
        box.rm(force=True)
    return got


def run_async(handler: Handler, tmp_path: Path) -> list[Any]:
    async def go() -> list[Any]:
        async with AsyncClient(transport=httpx.MockTransport(handler)) as c:
            box = await c.run(workspace=tmp_path, name="b1", allow=["pypi"])
            got: list[Any] = [box.info, await c.boxes(), await box.exec(["make"])]
            got.append([i async for i in box.exec_stream(["make"]) if isinstance(i, Chunk)])
            got += [await box.stop(), await box.patch()]
            await box.rm(force=True)
        return got
    return asyncio.run(go())


def test_both_shells_send_the_same_requests_and_read_the_same_results(tmp_path: Path) -> None:
    sync_seen: list[tuple[str, str, Any]] = []
    async_seen: list[tuple[str, str, Any]] = []
    got = run_sync(script(sync_seen), tmp_path)
    assert run_async(script(async_seen), tmp_path) == got
    assert sync_seen == async_seen
    assert [s[:2] for s in sync_seen] == [
        ("POST", "/v1/boxes"), ("GET", "/v1/boxes"), ("POST", "/v1/boxes/b1/exec"),
        ("POST", "/v1/boxes/b1/exec"), ("POST", "/v1/boxes/b1/stop"),
        ("GET", "/v1/boxes/b1/patch"), ("DELETE", "/v1/boxes/b1?force=true")]
    assert sync_seen[0][2]["allow"] == ["pypi"] and sync_seen[0][2]["name"] == "b1"
    assert sync_seen[2][2] == {"argv": ["make"], "cwd": None, "env": {}}
    info, boxes, result, chunks, stopped, patch = got
    assert info == BoxInfo.from_json(BOX) and boxes == [info]
    assert result == ExecResult(2, None, None, b"built\ndone\n", b"warn\n", "make")
    assert chunks == [Chunk(1, b"built\n"), Chunk(2, b"warn\n"), Chunk(1, b"done\n")]
    assert stopped.state == "stopped" and patch == b"P"


@pytest.mark.parametrize("shell", [run_sync, run_async])
@pytest.mark.parametrize("events, error, said", [
    ([{"ev": "started", "exec_id": "e"}, {"ev": "error", "message": "guest\nwent away"}],
     GuestError, "guest went away"),
    ([{"ev": "started", "exec_id": "e"}, out(1, b"x")], HostError, "without an exit status"),
    ([{"ev": "out", "fd": 1, "data": "%%%"}], HostError, "output that is not base64"),
])
def test_a_broken_exec_stream_is_one_typed_error(shell: Callable[[Handler, Path], Any],
                                                 events: list[dict[str, Any]],
                                                 error: type[TkboxError], said: str,
                                                 tmp_path: Path) -> None:
    with pytest.raises(error, match=said):
        shell(script([], events), tmp_path)


@pytest.mark.parametrize("line", ["not json", "[1, 2]", "\x00\xff"])
def test_a_stream_line_that_is_no_event_is_a_host_error(line: str) -> None:
    with pytest.raises(HostError):
        core.event(line)


def test_errors_come_back_as_the_kind_the_daemon_names(tmp_path: Path) -> None:
    handler = script([])
    with Client(transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(UserError, match="no box named 'gone'"):
            c.box("gone")
        with pytest.raises(Refused, match="^the signer said no$"):
            c.box("b1", fetch=False).apply()
        with pytest.raises(UserError, match=r"refused the request \(404\)"):
            c.approvals()


@pytest.mark.parametrize("status, content, cls", [
    (400, b'{"error": {"type": "Refused", "message": "no"}}', Refused),
    (500, b'{"error": {"type": "Bogus", "message": "x"}}', HostError),
    (422, b'{"detail": [{"loc": ["body", "argv"], "msg": "field required"}]}', UserError),
    (502, b"<html>\n\x1b[31m</html>", UserError),
    (500, b"\xff\xfe", UserError),
])
def test_the_core_reads_any_error_body_into_one_line(status: int, content: bytes,
                                                     cls: type[TkboxError]) -> None:
    err = core.error_of(status, content)
    assert type(err) is cls and "\n" not in str(err)
    with pytest.raises(cls):
        core.answer_of(core.Request("GET", "/x"), status, content)


def test_an_answer_that_is_not_json_is_a_host_error() -> None:
    with pytest.raises(HostError, match="answer to GET /v1/info is not JSON"):
        core.answer_of(core.Request("GET", "/v1/info"), 200, b"<html>")
    with pytest.raises(HostError, match="has no 'boxes'"):
        core.boxes().parse({"nope": []})


def test_a_transport_that_cannot_connect_means_no_daemon() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    async def ask_async() -> None:
        async with AsyncClient(transport=httpx.MockTransport(refuse)) as c:
            await c.info()

    with pytest.raises(HostError, match="the tkbox daemon is not running"), \
            Client(transport=httpx.MockTransport(refuse)) as c:
        c.info()
    with pytest.raises(HostError, match="the tkbox daemon is not running"):
        asyncio.run(ask_async())


def test_the_core_is_sans_io() -> None:
    """`tkbox.sdk.core` imports no HTTP client, socket or event loop: the shells do."""
    tree = ast.parse(Path(core.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    names |= {(n.module or "").split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom)}
    assert not names & {"httpx", "httpcore", "socket", "asyncio", "ssl", "urllib"}, names


def test_without_a_transport_the_client_still_asks_the_socket(tmp_path: Path) -> None:
    with pytest.raises(HostError, match=f"no answer on {tmp_path / 'none.sock'}"), \
            Client(tmp_path / "none.sock") as c:
        c.info()


def test_the_low_level_call_takes_only_what_the_core_sends() -> None:
    with Client(transport=httpx.MockTransport(script([]))) as c, \
            pytest.raises(TypeError, match="timeout"):
        c.call("GET", "/v1/boxes", timeout=3)
