"""The Python SDK: `tkbox.Client` and `tkbox.AsyncClient`, over the daemon's API.

The daemon serves HTTP on a Unix socket (`tkbox.daemon.api`); this module is
its one client. The CLI, the MCP server, `tkbox agent` and the GitHub Action
all go through it, so they share its errors and its wire handling.

```python
from tkbox import Client
with Client() as c:
    box = c.run(image="tkbox/default", workspace=".", allow=["pypi"])
    for chunk in box.exec_stream(["pytest", "-x"]):
        print(chunk.text, end="")
    box.stop()
    print(box.apply(dry_run=True).files)
    c.export(box, "job.tkb")
```

Errors are those of `tkbox.errors` (the daemon names the kind, the SDK raises
it): `UserError` for a bad request or an unknown box, `Refused` when a door or
the signer said no, `HostError` when no daemon answers, and so on. Every
message is one line for a person.

Secrets are named by *reference* (`{"NAME": "env:VAR@host"}`): the SDK reads
each value from its own environment (or the file) and sends it only over the
daemon's private socket, which only root and the daemon's user can reach; the
daemon keeps it in memory, and the box gets a placeholder.

`Client` and `AsyncClient` are thin shells over one request core
(`tkbox.sdk.core`, sans-IO): each API call is written there once, as a request
and a reader of its answer; a shell only carries the request over its transport.
The transport is httpx's: by default the daemon's Unix socket; `transport=`
takes any other (`httpx.MockTransport`, or `tkbox.sdk.testing.FakeDaemon`, a
stand-in daemon in memory), so code that uses the SDK is tested without a daemon:

```python
from tkbox import Client
from tkbox.sdk.testing import FakeDaemon

with Client(transport=FakeDaemon().transport()) as c:
    assert c.run(workspace=".").exec(["echo", "hi"]).ok
```
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tkbox import paths
from tkbox.errors import HostError, TkboxError
from tkbox.sdk import core
from tkbox.sdk.core import (
    DEFAULT_TIMEOUT,
    KINDS,
    SECRET_NAME,
    ApplyResult,
    BoxInfo,
    Call,
    Chunk,
    ExecResult,
    ExportResult,
    FileChange,
    Request,
    Via,
    run_body,
    secret_specs,
    secret_values,
)

__all__ = ["DEFAULT_TIMEOUT", "KINDS", "SECRET_NAME", "ApplyResult", "AsyncBox", "AsyncClient",
           "Box", "BoxInfo", "Chunk", "Client", "ExecResult", "ExecStream", "ExportResult",
           "FileChange", "Via", "error_from", "run_body", "secret_specs", "secret_values"]

T = TypeVar("T")


def error_from(resp: httpx.Response) -> TkboxError:
    """The daemon's `{"error": {"type", "message"}}` as the error it names."""
    return core.error_of(resp.status_code, resp.content)


def _not_running(path: Path) -> HostError:
    return HostError(f"the tkbox daemon is not running (no answer on {path}); "
                     "start it with 'tkbox daemon &'")


def _lost(exc: Exception, socket: Path, what: str) -> HostError:
    """An httpx transport error as the SDK's: no daemon, no answer in time, or lost."""
    if isinstance(exc, httpx.ConnectError | FileNotFoundError | ConnectionRefusedError):
        return _not_running(socket)
    if isinstance(exc, httpx.TimeoutException):
        return HostError(f"the daemon did not answer {what} in time")
    return HostError(f"lost the connection to the daemon: {exc}")


#: what a transport may raise that `_lost` turns into a HostError
TRANSPORT_ERRORS = (httpx.TransportError, FileNotFoundError, ConnectionRefusedError)


def _request(method: str, url: str, kw: dict[str, Any]) -> Request:
    extra = set(kw) - {"params", "json"}
    if extra:
        raise TypeError(f"call() takes params= and json=, not {', '.join(sorted(extra))}")
    return Request(method, url, params=kw.get("params"), json=kw.get("json"))


# ---- the synchronous client ------------------------------------------------------------


class Client:
    """A connection to the daemon. Use as a context manager, or call `close()`.

    `transport`: an `httpx.BaseTransport` to carry the requests instead of the
    daemon's socket (`tkbox.sdk.testing.FakeDaemon().transport()`, `httpx.MockTransport`)."""

    def __init__(self, socket: str | Path | None = None, *,
                 timeout: float | None = DEFAULT_TIMEOUT,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.socket = Path(socket) if socket else paths.daemon_socket()
        self._on_socket = transport is None
        self._http = httpx.Client(
            transport=transport or httpx.HTTPTransport(uds=str(self.socket)),
            base_url="http://tkbox", timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _check_socket(self) -> None:
        # Also spares httpcore's sync transport a failed connect, whose socket it leaks.
        if self._on_socket and not self.socket.is_socket():
            raise _not_running(self.socket)

    def send(self, call: Call[T]) -> T:
        """One call of the request core: its request sent, its answer read."""
        return call.parse(self.request(call.request))

    def request(self, req: Request) -> Any:
        self._check_socket()
        try:
            resp = self._http.request(req.method, req.url, **req.options())
        except TRANSPORT_ERRORS as exc:
            raise _lost(exc, self.socket, f"{req.method} {req.url}") from None
        return core.answer_of(req, resp.status_code, resp.content)

    def events(self, req: Request) -> Iterator[dict[str, Any]]:
        """A request whose answer is newline-delimited JSON events, as they come."""
        self._check_socket()
        try:
            with self._http.stream(req.method, req.url, timeout=None, **req.options()) as resp:
                if resp.status_code >= 400:
                    raise core.error_of(resp.status_code, resp.read())
                for line in resp.iter_lines():
                    if line:
                        yield core.event(line)
        except TRANSPORT_ERRORS as exc:
            raise _lost(exc, self.socket, f"{req.method} {req.url}") from None

    # low level: one request, one answer (JSON); errors by kind
    def call(self, method: str, url: str, **kw: Any) -> Any:
        return self.request(_request(method, url, kw))

    def stream(self, method: str, url: str, **kw: Any) -> Iterator[dict[str, Any]]:
        """One request whose answer is newline-delimited JSON events."""
        return self.events(_request(method, url, kw))

    # the daemon
    def info(self) -> dict[str, Any]:
        return self.send(core.info())

    def boxes(self) -> list[BoxInfo]:
        return self.send(core.boxes())

    def box(self, name: str, *, fetch: bool = True) -> Box:
        """A handle on an existing box (its current state fetched now, unless `fetch=False`)."""
        if not fetch:
            return Box(self, BoxInfo.from_json({"name": name}))
        return Box(self, self.send(core.box(name)))

    def run(self, *, image: str = "tkbox/default", workspace: str | Path = ".",
            allow: Sequence[str] = (), env: Mapping[str, str] | None = None,
            secrets: Mapping[str, str] | Sequence[str] | None = None, name: str | None = None,
            memory_mib: int = 1024, vcpus: int = 1, inspect: str = "",
            model_hosts: Sequence[str] = (), timeout_s: int | None = None,
            disk_mib: int = 4096, workspace_owner: tuple[int, int] | None = None,
            tools: str = "") -> Box:
        """Create and boot a box; returns when it is ready. `secrets` are references
        (`{"NAME": "env:VAR@host[,host];header=H"}`); their values are read here and
        sent only over the daemon's private socket; the box gets placeholders."""
        body = run_body(name=name, image=image, workspace=workspace, allow=allow, env=env,
                        secrets=secrets, memory_mib=memory_mib, vcpus=vcpus, inspect=inspect,
                        model_hosts=model_hosts, timeout_s=timeout_s, disk_mib=disk_mib,
                        workspace_owner=workspace_owner, tools=tools)
        return Box(self, self.send(core.run(body)))

    def export(self, box: Box | str, path: str | Path | None = None) -> ExportResult:
        """Close the box's run; write its bundle and trust file (`NAME.tkb`, `.trust.json`)."""
        name = box if isinstance(box, str) else box.name
        target = core.export_target(name, path)
        return core.write_export(self.send(core.export(name)), target)

    def approvals(self) -> list[dict[str, Any]]:
        return self.send(core.approvals())

    def answer(self, box: str, approval_id: int, allow: bool,
               via: Via = "sdk") -> dict[str, Any]:
        """Answer a waiting connection. `via`: the kind of client this is, recorded
        with the answer ("cli": a person at tkbox approve; "mcp": tkbox mcp)."""
        return self.send(core.answer(box, approval_id, allow, via))


class ExecStream:
    """Iterate for `Chunk`s as they come; `result` holds the `ExecResult` at the end."""

    def __init__(self, events: Iterator[dict[str, Any]]) -> None:
        self._events = events
        self._reader = core.ExecReader()
        self.result: ExecResult | None = None

    @property
    def exec_id(self) -> str | None:
        return self._reader.exec_id

    @property
    def command(self) -> str:
        return self._reader.command

    def __iter__(self) -> Iterator[Chunk]:
        for ev in self._events:
            item = self._reader.feed(ev)
            if isinstance(item, Chunk):
                yield item
            elif item is not None:
                self.result = item
        self.result = self._reader.end()


class Box:
    """A box, as this client sees it. Methods call the daemon each time."""

    def __init__(self, client: Client, info: BoxInfo) -> None:
        self.client = client
        self.info = info

    @property
    def name(self) -> str:
        return self.info.name

    def __repr__(self) -> str:
        return f"Box({self.name!r}, {self.info.state})"

    def refresh(self) -> BoxInfo:
        self.info = self.client.send(core.box(self.name))
        return self.info

    def exec_stream(self, argv: Sequence[str], *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None,
                    stdin: bytes | None = None) -> ExecStream:
        return ExecStream(self.client.events(core.exec_(self.name, argv, cwd, env, stdin)))

    def exec(self, argv: Sequence[str], *, cwd: str | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | None = None) -> ExecResult:
        """Run a command to its end; output is collected (use `exec_stream` for long output)."""
        s, out = self.exec_stream(argv, cwd=cwd, env=env, stdin=stdin), core.Output()
        for c in s:
            out.add(c)
        assert s.result is not None  # ExecStream ends with one, or raises
        return out.result(s.result)

    def signal(self, exec_id: str, sig: int) -> None:
        self.client.send(core.signal(self.name, exec_id, sig))

    def stop(self) -> BoxInfo:
        """Egress closes at once, the workspace patch is saved, the VM ends."""
        self.info = self.client.send(core.stop(self.name))
        return self.info

    def patch(self) -> bytes:
        return self.client.send(core.patch(self.name))

    def apply(self, *, dry_run: bool = True, checkout: str | Path | None = None,
              allow_sensitive: bool = False, with_patch: bool = False) -> ApplyResult:
        """Decide (and, with `dry_run=False`, write) the patch, file by file.
        `with_patch`: the result's `patch` holds the sections of the files applied."""
        return self.client.send(core.apply(self.name, dry_run=dry_run, checkout=checkout,
                                           allow_sensitive=allow_sensitive,
                                           with_patch=with_patch))

    def export(self, path: str | Path | None = None) -> ExportResult:
        return self.client.export(self, path)

    def rm(self, force: bool = False) -> None:
        self.client.send(core.rm(self.name, force))


# ---- the asynchronous client ------------------------------------------------------------


class AsyncClient:
    """The same API as `Client`, for asyncio code: `async with AsyncClient() as c:`.

    `transport`: an `httpx.AsyncBaseTransport` instead of the daemon's socket."""

    def __init__(self, socket: str | Path | None = None, *,
                 timeout: float | None = DEFAULT_TIMEOUT,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.socket = Path(socket) if socket else paths.daemon_socket()
        self._http = httpx.AsyncClient(
            transport=transport or httpx.AsyncHTTPTransport(uds=str(self.socket)),
            base_url="http://tkbox", timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(self, call: Call[T]) -> T:
        """One call of the request core: its request sent, its answer read."""
        return call.parse(await self.request(call.request))

    async def request(self, req: Request) -> Any:
        try:
            resp = await self._http.request(req.method, req.url, **req.options())
        except TRANSPORT_ERRORS as exc:
            raise _lost(exc, self.socket, f"{req.method} {req.url}") from None
        return core.answer_of(req, resp.status_code, resp.content)

    async def events(self, req: Request) -> AsyncIterator[dict[str, Any]]:
        try:
            async with self._http.stream(req.method, req.url, timeout=None,
                                         **req.options()) as resp:
                if resp.status_code >= 400:
                    raise core.error_of(resp.status_code, await resp.aread())
                async for line in resp.aiter_lines():
                    if line:
                        yield core.event(line)
        except TRANSPORT_ERRORS as exc:
            raise _lost(exc, self.socket, f"{req.method} {req.url}") from None

    async def call(self, method: str, url: str, **kw: Any) -> Any:
        return await self.request(_request(method, url, kw))

    def stream(self, method: str, url: str, **kw: Any) -> AsyncIterator[dict[str, Any]]:
        return self.events(_request(method, url, kw))

    async def info(self) -> dict[str, Any]:
        return await self.send(core.info())

    async def boxes(self) -> list[BoxInfo]:
        return await self.send(core.boxes())

    async def box(self, name: str) -> AsyncBox:
        return AsyncBox(self, await self.send(core.box(name)))

    async def run(self, *, image: str = "tkbox/default", workspace: str | Path = ".",
                  allow: Sequence[str] = (), env: Mapping[str, str] | None = None,
                  secrets: Mapping[str, str] | Sequence[str] | None = None,
                  name: str | None = None, memory_mib: int = 1024, vcpus: int = 1,
                  inspect: str = "", model_hosts: Sequence[str] = (),
                  timeout_s: int | None = None, disk_mib: int = 4096,
                  workspace_owner: tuple[int, int] | None = None, via: Via = "sdk",
                  agent_chose: Sequence[str] = (), unsafe: Sequence[str] = (),
                  tools: str = "") -> AsyncBox:
        """As `Client.run`. `via`, `agent_chose` and `unsafe` are for clients that an
        agent drives (`tkbox mcp`): which settings the agent chose, and the operator's
        opt-ins that let it, recorded in the run."""
        body = run_body(name=name, image=image, workspace=workspace, allow=allow, env=env,
                        secrets=secrets, memory_mib=memory_mib, vcpus=vcpus, inspect=inspect,
                        model_hosts=model_hosts, timeout_s=timeout_s, disk_mib=disk_mib,
                        workspace_owner=workspace_owner, via=via, agent_chose=agent_chose,
                        unsafe=unsafe, tools=tools)
        return AsyncBox(self, await self.send(core.run(body)))

    async def export(self, box: AsyncBox | str, path: str | Path | None = None) -> ExportResult:
        name = box if isinstance(box, str) else box.name
        target = core.export_target(name, path)
        return core.write_export(await self.send(core.export(name)), target)

    async def approvals(self) -> list[dict[str, Any]]:
        return await self.send(core.approvals())

    async def answer(self, box: str, approval_id: int, allow: bool,
                     via: Via = "sdk") -> dict[str, Any]:
        """As `Client.answer`."""
        return await self.send(core.answer(box, approval_id, allow, via))


class AsyncBox:
    def __init__(self, client: AsyncClient, info: BoxInfo) -> None:
        self.client = client
        self.info = info

    @property
    def name(self) -> str:
        return self.info.name

    def __repr__(self) -> str:
        return f"AsyncBox({self.name!r}, {self.info.state})"

    async def refresh(self) -> BoxInfo:
        self.info = await self.client.send(core.box(self.name))
        return self.info

    async def exec_stream(self, argv: Sequence[str], *, cwd: str | None = None,
                          env: Mapping[str, str] | None = None,
                          stdin: bytes | None = None) -> AsyncIterator[Chunk | ExecResult]:
        """Yields `Chunk`s as they come, then one `ExecResult` last."""
        reader = core.ExecReader()
        async for ev in self.client.events(core.exec_(self.name, argv, cwd, env, stdin)):
            item = reader.feed(ev)
            if isinstance(item, Chunk):
                yield item
            elif item is not None:
                yield item
                return
        reader.end()

    async def exec(self, argv: Sequence[str], *, cwd: str | None = None,
                   env: Mapping[str, str] | None = None,
                   stdin: bytes | None = None) -> ExecResult:
        out = core.Output()
        async for item in self.exec_stream(argv, cwd=cwd, env=env, stdin=stdin):
            if isinstance(item, Chunk):
                out.add(item)
            else:
                return out.result(item)
        raise AssertionError("exec_stream ends with an ExecResult or raises")

    async def signal(self, exec_id: str, sig: int) -> None:
        await self.client.send(core.signal(self.name, exec_id, sig))

    async def stop(self) -> BoxInfo:
        self.info = await self.client.send(core.stop(self.name))
        return self.info

    async def patch(self) -> bytes:
        return await self.client.send(core.patch(self.name))

    async def apply(self, *, dry_run: bool = True, checkout: str | Path | None = None,
                    allow_sensitive: bool = False, with_patch: bool = False) -> ApplyResult:
        """As `Box.apply`."""
        return await self.client.send(core.apply(self.name, dry_run=dry_run,
                                                 checkout=checkout,
                                                 allow_sensitive=allow_sensitive,
                                                 with_patch=with_patch))

    async def export(self, path: str | Path | None = None) -> ExportResult:
        return await self.client.export(self, path)

    async def rm(self, force: bool = False) -> None:
        await self.client.send(core.rm(self.name, force))
