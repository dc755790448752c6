"""The SDK's request core, sans-IO: what to ask the daemon, and what its answer means.

Every API call is written here once, as a `Call`: the `Request` to send (method,
path, query, JSON body; `stream` when the answer is newline-delimited JSON events)
and `parse`, which turns the answer's JSON into the SDK's typed result. `answer`
reads a status and body into that JSON or the error the daemon named; `event` reads
one line of a stream; `ExecReader` turns an exec stream's events into `Chunk`s and an
`ExecResult`. Nothing here opens a socket or imports an HTTP library: the blocking
`tkbox.Client` and the asyncio `tkbox.AsyncClient` (`tkbox.sdk`) are thin shells
that carry a `Request` over their transport and hand the bytes back here, so the
two clients cannot drift apart, and this module is tested by feeding it bytes.

The wire (`tkbox.daemon.api`): an error is `{"error": {"type": KIND, "message":
…}}` with an HTTP status >= 400, KIND one of `KINDS`; a request body the API cannot
read is a 422 with pydantic's `detail`.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

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
T = TypeVar("T")


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
        if not isinstance(d, dict):
            raise HostError("the daemon sent a box that is not an object")
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
                   patch=_b64(b64, "patch") if b64 is not None else None)


@dataclass(frozen=True)
class ExportResult:
    bundle: Path
    trust: Path


# ---- requests: each API call, once ---------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request to the daemon's API, as data."""

    method: str
    url: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    #: the answer is newline-delimited JSON events, read as they come (no timeout)
    stream: bool = False

    def options(self) -> dict[str, Any]:
        """The request's query and body, as an HTTP client's keyword arguments."""
        kw: dict[str, Any] = {}
        if self.params is not None:
            kw["params"] = dict(self.params)
        if self.json is not None:
            kw["json"] = self.json
        return kw


@dataclass(frozen=True)
class Call(Generic[T]):
    """A request and how to read its answer's JSON into the SDK's result."""

    request: Request
    parse: Callable[[Any], T]


def _none(_: Any) -> None:
    return None


def _dict(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise HostError("the daemon's answer is not a JSON object")
    return d


def _field(d: Any, key: str) -> Any:
    try:
        return _dict(d)[key]
    except KeyError:
        raise HostError(f"the daemon's answer has no {key!r}") from None


def _b64(text: object, what: str) -> bytes:
    try:
        return base64.b64decode(str(text), validate=True)
    except ValueError:
        raise HostError(f"the daemon sent {what} that is not base64") from None


def info() -> Call[dict[str, Any]]:
    return Call(Request("GET", "/v1/info"), _dict)


def boxes() -> Call[list[BoxInfo]]:
    return Call(Request("GET", "/v1/boxes"),
                lambda d: [BoxInfo.from_json(b) for b in _field(d, "boxes")])


def box(name: str) -> Call[BoxInfo]:
    return Call(Request("GET", f"/v1/boxes/{name}"), BoxInfo.from_json)


def run(body: dict[str, Any]) -> Call[BoxInfo]:
    """Create and boot a box (`body` from `run_body`)."""
    return Call(Request("POST", "/v1/boxes", json=body), BoxInfo.from_json)


def export(name: str) -> Call[tuple[bytes, bytes]]:
    """Close the box's run: its bundle's bytes and its trust file's."""
    def parse(d: Any) -> tuple[bytes, bytes]:
        d = _dict(d)
        if "bundle_b64" not in d or "trust_b64" not in d:
            raise HostError("the daemon's export answer is malformed")
        return _b64(d["bundle_b64"], "a bundle"), _b64(d["trust_b64"], "a trust file")
    return Call(Request("POST", f"/v1/boxes/{name}/export"), parse)


def approvals() -> Call[list[dict[str, Any]]]:
    return Call(Request("GET", "/v1/approvals"), lambda d: list(_field(d, "approvals")))


def answer(box: str, approval_id: int, allow: bool, via: Via) -> Call[dict[str, Any]]:
    return Call(Request("POST", f"/v1/approvals/{box}/{approval_id}",
                        json={"allow": allow, "via": via}), _dict)


def exec_(name: str, argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None,
          stdin: bytes | None) -> Request:
    """A command in the box; its answer is a stream of events (`ExecReader`)."""
    return Request("POST", f"/v1/boxes/{name}/exec", json=exec_body(argv, cwd, env, stdin),
                   stream=True)


def signal(name: str, exec_id: str, sig: int) -> Call[None]:
    return Call(Request("POST", f"/v1/boxes/{name}/exec/{exec_id}/signal",
                        json={"sig": sig}), _none)


def stop(name: str) -> Call[BoxInfo]:
    return Call(Request("POST", f"/v1/boxes/{name}/stop"), BoxInfo.from_json)


def patch(name: str) -> Call[bytes]:
    return Call(Request("GET", f"/v1/boxes/{name}/patch"),
                lambda d: _b64(_field(d, "patch_b64"), "a patch"))


def apply(name: str, *, dry_run: bool, checkout: str | Path | None, allow_sensitive: bool,
          with_patch: bool) -> Call[ApplyResult]:
    body = {"checkout": str(Path(checkout).resolve()) if checkout else None,
            "allow_sensitive": allow_sensitive, "dry_run": dry_run, "with_patch": with_patch}
    return Call(Request("POST", f"/v1/boxes/{name}/apply", json=body),
                lambda d: ApplyResult.from_json(_dict(d)))


def rm(name: str, force: bool) -> Call[None]:
    return Call(Request("DELETE", f"/v1/boxes/{name}", params={"force": force}), _none)


# ---- request bodies ------------------------------------------------------------------


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


def exec_body(argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None,
              stdin: bytes | None) -> dict[str, Any]:
    if isinstance(argv, str):
        raise UserError("give the command as a list of arguments, e.g. ['pytest', '-x']")
    body: dict[str, Any] = {"argv": list(argv), "cwd": cwd, "env": dict(env or {})}
    if stdin is not None:
        body["stdin_b64"] = base64.b64encode(stdin).decode()
    return body


# ---- answers -------------------------------------------------------------------------


def error_of(status: int, content: bytes) -> TkboxError:
    """The daemon's `{"error": {"type", "message"}}` as the error it names."""
    try:
        body = json.loads(content)
        err = body.get("error") if isinstance(body, dict) else None
    except ValueError:
        body, err = None, None
    if not isinstance(err, dict):
        if status == 422 and isinstance(body, dict):
            items = body.get("detail", [])
            detail = "; ".join(f"{'.'.join(str(x) for x in i.get('loc', [])[1:])}: "
                               f"{i.get('msg')}" for i in items
                               if isinstance(i, dict))[:300]
        else:
            detail = content[:300].decode("utf-8", errors="replace")
        return UserError(f"the daemon refused the request ({status}): {detail}")
    return KINDS.get(str(err.get("type", "")), HostError)(str(err.get("message", "")))


def answer_of(request: Request, status: int, content: bytes) -> Any:
    """A whole answer's JSON; the error it names for a status >= 400."""
    if status >= 400:
        raise error_of(status, content)
    try:
        return json.loads(content)
    except ValueError:
        raise HostError(f"the daemon's answer to {request.method} {request.url} is not "
                        "JSON") from None


def event(line: str) -> dict[str, Any]:
    """One line of a stream (`exec`, `logs`): a JSON object."""
    try:
        ev = json.loads(line)
    except ValueError:
        raise HostError(f"the daemon sent a line that is not JSON: {line[:80]!r}") from None
    if not isinstance(ev, dict):
        raise HostError("the daemon sent an event that is not an object")
    return ev


class ExecReader:
    """An exec stream's events, read one at a time (`feed`): `started` names the
    command, each `out` is a `Chunk`, `exit` is the `ExecResult`, `error` raises the
    `GuestError` it carries. `end()` when the stream ends: a stream without an exit
    is a `HostError`."""

    def __init__(self) -> None:
        self.exec_id: str | None = None
        self.command = ""
        self.result: ExecResult | None = None

    def feed(self, ev: dict[str, Any]) -> Chunk | ExecResult | None:
        kind = ev.get("ev")
        if kind == "started":
            self.exec_id = str(ev.get("exec_id"))
            self.command = str(ev.get("command", ""))
        elif kind == "out":
            return Chunk(fd=2 if ev.get("fd") == 2 else 1,
                         data=_b64(ev.get("data", ""), "output"))
        elif kind == "exit":
            status = ev.get("status")
            sig = ev.get("signal")
            self.result = ExecResult(
                status=status if isinstance(status, int) and not isinstance(status, bool)
                else None, signal=sig if isinstance(sig, int) else None,
                error=str(ev["error"]) if ev.get("error") else None, command=self.command)
            return self.result
        elif kind == "error":
            raise GuestError(str(ev.get("message", "the command did not finish")))
        return None

    def end(self) -> ExecResult:
        if self.result is None:
            raise HostError("the daemon ended the command's stream without an exit status")
        return self.result


class Output:
    """A command's output collected to its end, for `exec`."""

    def __init__(self) -> None:
        self._out = {1: bytearray(), 2: bytearray()}

    def add(self, chunk: Chunk) -> None:
        self._out[chunk.fd] += chunk.data

    def result(self, r: ExecResult) -> ExecResult:
        return ExecResult(r.status, r.signal, r.error, bytes(self._out[1]),
                          bytes(self._out[2]), r.command)


def export_target(name: str, path: str | Path | None) -> Path:
    target = Path(path) if path is not None else Path(f"{name}.tkb")
    if not target.parent.is_dir():
        raise UserError(f"directory {target.parent} does not exist")
    return target


def write_export(files: tuple[bytes, bytes], target: Path) -> ExportResult:
    """The bundle at `target`, its trust file beside it (`NAME.trust.json`)."""
    from tkbox._fs import write_atomic
    from tkbox.record.export import trust_path_for

    bundle, trust = files
    trust_path = trust_path_for(target)
    write_atomic(target, bundle)
    write_atomic(trust_path, trust)
    return ExportResult(bundle=target, trust=trust_path)
