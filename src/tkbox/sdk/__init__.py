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

Why one module (about 650 lines): `Client` and `AsyncClient` are the same
API twice (blocking and async) over one set of request builders and answer
readers (the error mapping, the stream decoders) kept here once; a user reads
one file to see the whole API.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from tkbox import paths
from tkbox.errors import (
    BundleError,
    GuestError,
    HostError,
    InternalError,
    Refused,
    RegistryError,
    SignerUnavailable,
    TkboxError,
    UserError,
)

__all__ = ["ApplyResult", "AsyncBox", "AsyncClient", "Box", "BoxInfo", "Chunk", "Client",
           "ExecResult", "ExecStream", "ExportResult", "FileChange"]

#: error kinds the daemon names in `{"error": {"type": ...}}`
KINDS: dict[str, type[TkboxError]] = {
    "UserError": UserError, "Refused": Refused, "HostError": HostError,
    "GuestError": GuestError, "RegistryError": RegistryError,
    "SignerUnavailable": SignerUnavailable, "PatchRefused": Refused,
    "BundleError": BundleError, "InternalError": InternalError,
}
DEFAULT_TIMEOUT = 600.0
#: the kind of client answering an approval, recorded with the answer ("cli": a
#: person at `tkbox approve`; "sdk": a program; "mcp": `tkbox mcp`)
Via = Literal["cli", "sdk", "mcp"]
SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


# ---- typed results ---------------------------------------------------------------


@dataclass(frozen=True)
class BoxInfo:
    """What the daemon knows about a box (`raw` holds every field it sent)."""

    name: str
    state: str
    run_id: str
    image: str
    image_digest: str
    accel: str
    error: str | None
    raw: dict[str, Any] = field(repr=False)

    @property
    def patch_partial(self) -> bool:
        """The box stopped but its patch is partial: the diff was cut off, and only the
        files that arrived whole were kept (`raw["patch"]["error"]` says why)."""
        return bool((self.raw.get("patch") or {}).get("partial"))

    @property
    def set_apart(self) -> list[dict[str, Any]]:
        """The changes the box's patch left out (path, change, size, sha256, why), the
        first ones listed; `raw["patch"]["apart"]` counts them all by why."""
        return list((self.raw.get("patch") or {}).get("set_apart") or [])

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BoxInfo:
        return cls(name=str(d.get("name", "")), state=str(d.get("state", "")),
                   run_id=str(d.get("run_id", "")), image=str(d.get("image", "")),
                   image_digest=str(d.get("image_digest", "")), accel=str(d.get("accel", "")),
                   error=d.get("error") or None, raw=d)


@dataclass(frozen=True)
class Chunk:
    """Output of a running command: `fd` 1 is stdout, 2 is stderr."""

    fd: int
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ExecResult:
    """How a command ended. `status` is None when it did not finish (see `error`)."""

    status: int | None
    signal: int | None = None
    error: str | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    command: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class FileChange:
    path: str
    kind: str
    status: str
    reason: str
    mode: str | None
    sha256: str | None


@dataclass(frozen=True)
class ApplyResult:
    checkout: str
    patch_sha256: str
    dry_run: bool
    files: tuple[FileChange, ...]
    counts: dict[str, int]
    raw: dict[str, Any] = field(repr=False)
    #: with `apply(with_patch=True)`: the sections of the files applied (or that would
    #: be), byte for byte as in the box's patch; a patch `git apply` takes
    patch: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ApplyResult:
        files = tuple(FileChange(path=str(f.get("path")), kind=str(f.get("kind")),
                                 status=str(f.get("status")), reason=str(f.get("reason", "")),
                                 mode=f.get("mode"), sha256=f.get("sha256"))
                      for f in d.get("files", []))
        b64 = d.get("patch_b64")
        return cls(checkout=str(d.get("checkout")), patch_sha256=str(d.get("patch_sha256")),
                   dry_run=bool(d.get("dry_run")), files=files,
                   counts=dict(d.get("counts", {})),
                   raw={k: v for k, v in d.items() if k != "patch_b64"},
                   patch=base64.b64decode(str(b64)) if b64 is not None else None)


@dataclass(frozen=True)
class ExportResult:
    bundle: Path
    trust: Path


# ---- wire helpers, shared by both clients ------------------------------------------


def error_from(resp: httpx.Response) -> TkboxError:
    """The daemon's `{"error": {"type", "message"}}` as the error it names."""
    try:
        body = resp.json()
        err = body.get("error") if isinstance(body, dict) else None
    except ValueError:
        body, err = None, None
    if not isinstance(err, dict):
        if resp.status_code == 422 and isinstance(body, dict):
            items = body.get("detail", [])
            detail = "; ".join(f"{'.'.join(str(x) for x in i.get('loc', [])[1:])}: "
                               f"{i.get('msg')}" for i in items if isinstance(i, dict))[:300]
        else:
            detail = resp.text[:300]
        return UserError(f"the daemon refused the request ({resp.status_code}): {detail}")
    return KINDS.get(str(err.get("type", "")), HostError)(str(err.get("message", "")))


def secret_specs(secrets: Mapping[str, str] | Sequence[str] | None) -> list[str]:
    """`{"NAME": "env:VAR@host"}` or `["NAME=env:VAR@host"]` → the API's list of specs.

    A spec whose source is not `env:` or `file:` is refused here, and the error
    does not repeat it, so a value pasted in by mistake never leaves this process.
    """
    if not secrets:
        return []
    items = list(secrets.items()) if isinstance(secrets, Mapping) else \
        [tuple(s.split("=", 1)) if "=" in s else (s, "") for s in secrets]
    out = []
    for name, ref in items:
        if not SECRET_NAME.match(name):
            raise UserError(f"secret name {name[:40]!r} is not valid: use letters, digits "
                            "and '_' (e.g. ANTHROPIC_API_KEY=env:ANTHROPIC_API_KEY@host)")
        if not ref.startswith(("env:", "file:")) or "@" not in ref:
            raise UserError(f"secret {name}: give a reference SOURCE@HOST[,HOST] with SOURCE "
                            "env:VAR or file:PATH, never the value itself")
        out.append(f"{name}={ref}")
    return out


def secret_values(specs: Sequence[str],
                  environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each secret's value, read here (this process's environment, or its file).

    The daemon holds values only in memory and reads none itself: the client
    that names a secret reads it and sends it over the daemon's private socket,
    as `tkbox run --secret` does. Errors name the secret, never its value.
    """
    from tkbox.doors.secrets.spec import parse_spec, read_value

    values: dict[str, str] = {}
    for text in specs:
        spec = parse_spec(text)
        try:
            values[spec.name] = read_value(spec, environ).decode("ascii")
        except UnicodeDecodeError:
            raise UserError(f"secret {spec.name}: the value is not ASCII; a header value "
                            "must be") from None
    return values


def run_body(*, name: str | None, image: str, workspace: str | Path,
             allow: Sequence[str] = (), env: Mapping[str, str] | None = None,
             secrets: Mapping[str, str] | Sequence[str] | None = None,
             memory_mib: int = 1024, vcpus: int = 1, inspect: str = "",
             model_hosts: Sequence[str] = (), timeout_s: int | None = None,
             disk_mib: int = 4096,
             workspace_owner: tuple[int, int] | None = None, via: Via = "sdk",
             agent_chose: Sequence[str] = (), unsafe: Sequence[str] = (),
             tools: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name or "", "image": image,  # "": the daemon picks a name
        "workspace": str(Path(workspace).expanduser().resolve()), "allow": list(allow),
        "env": dict(env or {}), "memory_mib": memory_mib, "vcpus": vcpus,
        "disk_mib": disk_mib}
    specs = secret_specs(secrets)
    if specs:
        body["secrets"] = specs
        body["secret_values"] = secret_values(specs)
    if inspect:
        body["inspect"] = inspect
    if model_hosts:
        body["model_hosts"] = list(model_hosts)
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if workspace_owner is not None:
        body["workspace_owner"] = list(workspace_owner)
    if tools:
        body["tools"] = tools
    if via != "sdk":
        body["via"] = via
    if agent_chose:
        body["agent_chose"] = list(agent_chose)
    if unsafe:
        body["unsafe"] = list(unsafe)
    return body


def _event(line: str) -> dict[str, Any]:
    try:
        ev = json.loads(line)
    except ValueError:
        raise HostError(f"the daemon sent a line that is not JSON: {line[:80]!r}") from None
    if not isinstance(ev, dict):
        raise HostError("the daemon sent an event that is not an object")
    return ev


def _chunk(ev: dict[str, Any]) -> Chunk:
    try:
        data = base64.b64decode(str(ev.get("data", "")), validate=True)
    except ValueError:
        raise HostError("the daemon sent output that is not base64") from None
    return Chunk(fd=2 if ev.get("fd") == 2 else 1, data=data)


def _exit(ev: dict[str, Any], command: str) -> ExecResult:
    status = ev.get("status")
    return ExecResult(status=int(status) if isinstance(status, int) else None,
                      signal=ev.get("signal"), error=ev.get("error") or None, command=command)


def _write_export(data: dict[str, Any], target: Path) -> ExportResult:
    from tkbox._fs import write_atomic
    from tkbox.record.export import trust_path_for

    if not target.parent.is_dir():
        raise UserError(f"directory {target.parent} does not exist")
    try:
        bundle = base64.b64decode(str(data["bundle_b64"]), validate=True)
        trust = base64.b64decode(str(data["trust_b64"]), validate=True)
    except (KeyError, ValueError):
        raise HostError("the daemon's export answer is malformed") from None
    trust_path = trust_path_for(target)
    write_atomic(target, bundle)
    write_atomic(trust_path, trust)
    return ExportResult(bundle=target, trust=trust_path)


def _not_running(path: Path) -> HostError:
    return HostError(f"the tkbox daemon is not running (no answer on {path}); "
                     "start it with 'tkbox daemon &'")


def _check_socket(path: Path) -> None:
    # Also spares httpcore's sync transport a failed connect, whose socket it leaks.
    if not path.is_socket():
        raise _not_running(path)


def _exec_body(argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None,
               stdin: bytes | None) -> dict[str, Any]:
    if isinstance(argv, str):
        raise UserError("give the command as a list of arguments, e.g. ['pytest', '-x']")
    body: dict[str, Any] = {"argv": list(argv), "cwd": cwd, "env": dict(env or {})}
    if stdin is not None:
        body["stdin_b64"] = base64.b64encode(stdin).decode()
    return body


# ---- the synchronous client ------------------------------------------------------------


class Client:
    """A connection to the daemon. Use as a context manager, or call `close()`."""

    def __init__(self, socket: str | Path | None = None, *,
                 timeout: float | None = DEFAULT_TIMEOUT) -> None:
        self.socket = Path(socket) if socket else paths.daemon_socket()
        self._http = httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)),
                                  base_url="http://tkbox", timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # low level: one request, one answer; errors by kind
    def call(self, method: str, url: str, **kw: Any) -> Any:
        _check_socket(self.socket)
        try:
            resp = self._http.request(method, url, **kw)
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError):
            raise _not_running(self.socket) from None
        except httpx.TimeoutException:
            raise HostError(f"the daemon did not answer {method} {url} in time") from None
        except httpx.TransportError as exc:
            raise HostError(f"lost the connection to the daemon: {exc}") from None
        if resp.status_code >= 400:
            raise error_from(resp)
        try:
            return resp.json()
        except ValueError:
            raise HostError(f"the daemon's answer to {method} {url} is not JSON") from None

    def stream(self, method: str, url: str, **kw: Any) -> Iterator[dict[str, Any]]:
        """One request whose answer is newline-delimited JSON events."""
        _check_socket(self.socket)
        try:
            with self._http.stream(method, url, timeout=None, **kw) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise error_from(resp)
                for line in resp.iter_lines():
                    if line:
                        yield _event(line)
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError):
            raise _not_running(self.socket) from None
        except httpx.TransportError as exc:
            raise HostError(f"lost the connection to the daemon: {exc}") from None

    # the daemon
    def info(self) -> dict[str, Any]:
        return dict(self.call("GET", "/v1/info"))

    def boxes(self) -> list[BoxInfo]:
        return [BoxInfo.from_json(b) for b in self.call("GET", "/v1/boxes")["boxes"]]

    def box(self, name: str, *, fetch: bool = True) -> Box:
        """A handle on an existing box (its current state fetched now, unless `fetch=False`)."""
        if not fetch:
            return Box(self, BoxInfo.from_json({"name": name}))
        return Box(self, BoxInfo.from_json(self.call("GET", f"/v1/boxes/{name}")))

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
        return Box(self, BoxInfo.from_json(self.call("POST", "/v1/boxes", json=body)))

    def export(self, box: Box | str, path: str | Path | None = None) -> ExportResult:
        """Close the box's run; write its bundle and trust file (`NAME.tkb`, `.trust.json`)."""
        name = box if isinstance(box, str) else box.name
        target = Path(path) if path is not None else Path(f"{name}.tkb")
        if not target.parent.is_dir():
            raise UserError(f"directory {target.parent} does not exist")
        return _write_export(self.call("POST", f"/v1/boxes/{name}/export"), target)

    def approvals(self) -> list[dict[str, Any]]:
        return list(self.call("GET", "/v1/approvals")["approvals"])

    def answer(self, box: str, approval_id: int, allow: bool,
               via: Via = "sdk") -> dict[str, Any]:
        """Answer a waiting connection. `via`: the kind of client this is, recorded
        with the answer ("cli": a person at tkbox approve; "mcp": tkbox mcp)."""
        return dict(self.call("POST", f"/v1/approvals/{box}/{approval_id}",
                              json={"allow": allow, "via": via}))


class ExecStream:
    """Iterate for `Chunk`s as they come; `result` holds the `ExecResult` at the end."""

    def __init__(self, events: Iterator[dict[str, Any]]) -> None:
        self._events = events
        self.exec_id: str | None = None
        self.command = ""
        self.result: ExecResult | None = None

    def __iter__(self) -> Iterator[Chunk]:
        for ev in self._events:
            kind = ev.get("ev")
            if kind == "started":
                self.exec_id = str(ev.get("exec_id"))
                self.command = str(ev.get("command", ""))
            elif kind == "out":
                yield _chunk(ev)
            elif kind == "exit":
                self.result = _exit(ev, self.command)
            elif kind == "error":
                raise GuestError(str(ev.get("message", "the command did not finish")))
        if self.result is None:
            raise HostError("the daemon ended the command's stream without an exit status")


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
        self.info = BoxInfo.from_json(self.client.call("GET", f"/v1/boxes/{self.name}"))
        return self.info

    def exec_stream(self, argv: Sequence[str], *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None,
                    stdin: bytes | None = None) -> ExecStream:
        return ExecStream(self.client.stream("POST", f"/v1/boxes/{self.name}/exec",
                                             json=_exec_body(argv, cwd, env, stdin)))

    def exec(self, argv: Sequence[str], *, cwd: str | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | None = None) -> ExecResult:
        """Run a command to its end; output is collected (use `exec_stream` for long output)."""
        s = self.exec_stream(argv, cwd=cwd, env=env, stdin=stdin)
        out = {1: bytearray(), 2: bytearray()}
        for c in s:
            out[c.fd] += c.data
        assert s.result is not None
        r = s.result
        return ExecResult(r.status, r.signal, r.error, bytes(out[1]), bytes(out[2]), r.command)

    def signal(self, exec_id: str, sig: int) -> None:
        self.client.call("POST", f"/v1/boxes/{self.name}/exec/{exec_id}/signal",
                         json={"sig": sig})

    def stop(self) -> BoxInfo:
        """Egress closes at once, the workspace patch is saved, the VM ends."""
        self.info = BoxInfo.from_json(self.client.call("POST", f"/v1/boxes/{self.name}/stop"))
        return self.info

    def patch(self) -> bytes:
        data = self.client.call("GET", f"/v1/boxes/{self.name}/patch")
        return base64.b64decode(str(data["patch_b64"]))

    def apply(self, *, dry_run: bool = True, checkout: str | Path | None = None,
              allow_sensitive: bool = False, with_patch: bool = False) -> ApplyResult:
        """Decide (and, with `dry_run=False`, write) the patch, file by file.
        `with_patch`: the result's `patch` holds the sections of the files applied."""
        body = {"checkout": str(Path(checkout).resolve()) if checkout else None,
                "allow_sensitive": allow_sensitive, "dry_run": dry_run,
                "with_patch": with_patch}
        return ApplyResult.from_json(
            self.client.call("POST", f"/v1/boxes/{self.name}/apply", json=body))

    def export(self, path: str | Path | None = None) -> ExportResult:
        return self.client.export(self, path)

    def rm(self, force: bool = False) -> None:
        self.client.call("DELETE", f"/v1/boxes/{self.name}", params={"force": force})


# ---- the asynchronous client ------------------------------------------------------------


class AsyncClient:
    """The same API as `Client`, for asyncio code: `async with AsyncClient() as c:`."""

    def __init__(self, socket: str | Path | None = None, *,
                 timeout: float | None = DEFAULT_TIMEOUT) -> None:
        self.socket = Path(socket) if socket else paths.daemon_socket()
        self._http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(self.socket)),
            base_url="http://tkbox", timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def call(self, method: str, url: str, **kw: Any) -> Any:
        try:
            resp = await self._http.request(method, url, **kw)
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError):
            raise _not_running(self.socket) from None
        except httpx.TimeoutException:
            raise HostError(f"the daemon did not answer {method} {url} in time") from None
        except httpx.TransportError as exc:
            raise HostError(f"lost the connection to the daemon: {exc}") from None
        if resp.status_code >= 400:
            raise error_from(resp)
        try:
            return resp.json()
        except ValueError:
            raise HostError(f"the daemon's answer to {method} {url} is not JSON") from None

    async def stream(self, method: str, url: str, **kw: Any) -> AsyncIterator[dict[str, Any]]:
        try:
            async with self._http.stream(method, url, timeout=None, **kw) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise error_from(resp)
                async for line in resp.aiter_lines():
                    if line:
                        yield _event(line)
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError):
            raise _not_running(self.socket) from None
        except httpx.TransportError as exc:
            raise HostError(f"lost the connection to the daemon: {exc}") from None

    async def info(self) -> dict[str, Any]:
        return dict(await self.call("GET", "/v1/info"))

    async def boxes(self) -> list[BoxInfo]:
        return [BoxInfo.from_json(b) for b in (await self.call("GET", "/v1/boxes"))["boxes"]]

    async def box(self, name: str) -> AsyncBox:
        return AsyncBox(self, BoxInfo.from_json(await self.call("GET", f"/v1/boxes/{name}")))

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
        return AsyncBox(self, BoxInfo.from_json(await self.call("POST", "/v1/boxes", json=body)))

    async def export(self, box: AsyncBox | str, path: str | Path | None = None) -> ExportResult:
        name = box if isinstance(box, str) else box.name
        target = Path(path) if path is not None else Path(f"{name}.tkb")
        if not target.parent.is_dir():
            raise UserError(f"directory {target.parent} does not exist")
        return _write_export(await self.call("POST", f"/v1/boxes/{name}/export"), target)

    async def approvals(self) -> list[dict[str, Any]]:
        return list((await self.call("GET", "/v1/approvals"))["approvals"])

    async def answer(self, box: str, approval_id: int, allow: bool,
                     via: Via = "sdk") -> dict[str, Any]:
        """As `Client.answer`."""
        return dict(await self.call("POST", f"/v1/approvals/{box}/{approval_id}",
                                    json={"allow": allow, "via": via}))


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
        self.info = BoxInfo.from_json(await self.client.call("GET", f"/v1/boxes/{self.name}"))
        return self.info

    async def exec_stream(self, argv: Sequence[str], *, cwd: str | None = None,
                          env: Mapping[str, str] | None = None,
                          stdin: bytes | None = None) -> AsyncIterator[Chunk | ExecResult]:
        """Yields `Chunk`s as they come, then one `ExecResult` last."""
        command = ""
        async for ev in self.client.stream("POST", f"/v1/boxes/{self.name}/exec",
                                           json=_exec_body(argv, cwd, env, stdin)):
            kind = ev.get("ev")
            if kind == "started":
                command = str(ev.get("command", ""))
            elif kind == "out":
                yield _chunk(ev)
            elif kind == "exit":
                yield _exit(ev, command)
                return
            elif kind == "error":
                raise GuestError(str(ev.get("message", "the command did not finish")))
        raise HostError("the daemon ended the command's stream without an exit status")

    async def exec(self, argv: Sequence[str], *, cwd: str | None = None,
                   env: Mapping[str, str] | None = None,
                   stdin: bytes | None = None) -> ExecResult:
        out = {1: bytearray(), 2: bytearray()}
        async for item in self.exec_stream(argv, cwd=cwd, env=env, stdin=stdin):
            if isinstance(item, Chunk):
                out[item.fd] += item.data
            else:
                return ExecResult(item.status, item.signal, item.error, bytes(out[1]),
                                  bytes(out[2]), item.command)
        raise HostError("the daemon ended the command's stream without an exit status")

    async def stop(self) -> BoxInfo:
        self.info = BoxInfo.from_json(
            await self.client.call("POST", f"/v1/boxes/{self.name}/stop"))
        return self.info

    async def patch(self) -> bytes:
        data = await self.client.call("GET", f"/v1/boxes/{self.name}/patch")
        return base64.b64decode(str(data["patch_b64"]))

    async def apply(self, *, dry_run: bool = True, checkout: str | Path | None = None,
                    allow_sensitive: bool = False, with_patch: bool = False) -> ApplyResult:
        """As `Box.apply`."""
        body = {"checkout": str(Path(checkout).resolve()) if checkout else None,
                "allow_sensitive": allow_sensitive, "dry_run": dry_run,
                "with_patch": with_patch}
        return ApplyResult.from_json(
            await self.client.call("POST", f"/v1/boxes/{self.name}/apply", json=body))

    async def export(self, path: str | Path | None = None) -> ExportResult:
        return await self.client.export(self, path)

    async def rm(self, force: bool = False) -> None:
        await self.client.call("DELETE", f"/v1/boxes/{self.name}", params={"force": force})
