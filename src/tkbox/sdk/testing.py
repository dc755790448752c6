"""A stand-in for the daemon, in memory, for the tests of code that uses the SDK.

```python
from tkbox import Client
from tkbox.sdk.testing import FakeDaemon

daemon = FakeDaemon(patch=b"diff --git a/x b/x\\n…")
with Client(transport=daemon.transport()) as c:     # AsyncClient(transport=…) too
    box = c.run(workspace=".")
    assert box.exec(["make", "test"]).ok
```

It answers the routes of the daemon's API (`tkbox.daemon.api`) that the SDK calls,
with the API's shapes and the API's errors (`{"error": {"type", "message"}}`, 404 for
a box that is not there), and moves each box through the daemon's own lifecycle
table (`tkbox.daemon.lifecycle`), so a call the daemon would refuse in a state is
refused here in the same words. `tests/integration/sdk/test_fake_daemon_conformance.py`
runs one script against the real API and against this fake and compares what the SDK
returns.

What is fake, and says so:

- no VM: `exec` answers with `commands(argv)` (an `ExecResult`; by default the
  command exits 0 and prints its argv, joined by spaces, on stdout);
- the workspace is not read: the patch a box saves at `stop` is the `patch` given
  here, `apply` decides each file in it `would apply` (a dry run) or `applied` and
  writes nothing;
- `export` writes a placeholder bundle and trust file that do **not** verify
  (`tkbox verify` fails on them);
- nothing waits for approval (`approvals()` is empty);
- every request is kept in `requests` (method and path), for a test's assertions.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tkbox import __version__
from tkbox.daemon import lifecycle
from tkbox.daemon.lifecycle import Event, State
from tkbox.errors import BoxNotFound, TkboxError, UserError
from tkbox.sdk.core import ExecResult

#: what `export` writes: not a bundle, and `tkbox verify` says so
PLACEHOLDER_BUNDLE = b"tkbox FakeDaemon: a placeholder, not a bundle; it does not verify\n"
PLACEHOLDER_TRUST = b'{"fake": "tkbox FakeDaemon: not a trust file"}\n'
_FILE = re.compile(rb"^diff --git a/(\S+) b/(\S+)$", re.M)


def echo(argv: list[str]) -> ExecResult:
    """The default command: exit 0, its argv on stdout."""
    return ExecResult(0, stdout=(" ".join(argv) + "\n").encode())


@dataclass
class _Box:
    name: str
    run_id: str
    image: str
    workspace: str
    allow: list[str]
    state: State = State.RUNNING
    patch: dict[str, Any] | None = None
    execs: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "display_name": self.name, "run_id": self.run_id,
            "state": self.state.value, "image": self.image,
            "image_digest": "sha256:" + "0" * 64, "workspace": self.workspace,
            "allow": self.allow, "accel": "fake", "unrecorded": False, **self.extra}
        if self.patch is not None:
            out["patch"] = self.patch
        return out

    def move(self, event: Event) -> None:
        self.state = lifecycle.next_state(self.state, event, f"box {self.name}")


class FakeDaemon:
    """The daemon's API in memory; serve it with `transport()` (sync and async)."""

    def __init__(self, *, patch: bytes = b"",
                 commands: Callable[[list[str]], ExecResult] = echo) -> None:
        self.patch = patch
        self.commands = commands
        self.boxes: dict[str, _Box] = {}
        self.requests: list[tuple[str, str]] = []
        self._made = 0

    def transport(self) -> httpx.MockTransport:
        """For `Client(transport=…)` and `AsyncClient(transport=…)` alike."""
        return httpx.MockTransport(self)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        try:
            return self._route(request)
        except TkboxError as exc:
            status = 404 if isinstance(exc, BoxNotFound) else 400
            return httpx.Response(status, json={"error": {"type": "UserError",
                                                          "message": str(exc)}})

    # ---- the routes ------------------------------------------------------------------

    def _route(self, request: httpx.Request) -> httpx.Response:
        method, parts = request.method, request.url.path.strip("/").split("/")
        body: dict[str, Any] = json.loads(request.content) if request.content else {}
        match method, parts:
            case "GET", ["v1", "info"]:
                return _ok({"version": __version__, "fake": True, "boxes": len(self.boxes)})
            case "GET", ["v1", "boxes"]:
                return _ok({"boxes": [b.public() for b in self.boxes.values()]})
            case "POST", ["v1", "boxes"]:
                return _ok(self._create(body).public())
            case "GET", ["v1", "boxes", name]:
                return _ok(self._get(name).public())
            case "POST", ["v1", "boxes", name, "exec"]:
                return self._exec(self._get(name), body)
            case "POST", ["v1", "boxes", name, "exec", _, "signal"]:
                self._get(name)
                return _ok({"ok": True})
            case "POST", ["v1", "boxes", name, "stop"]:
                return _ok(self._stop(self._get(name)).public())
            case "GET", ["v1", "boxes", name, "patch"]:
                return _ok({"patch_b64": base64.b64encode(self._saved(name)).decode()})
            case "POST", ["v1", "boxes", name, "apply"]:
                return _ok(self._apply(self._get(name), body))
            case "POST", ["v1", "boxes", name, "export"]:
                box = self._get(name)
                box.move(Event.EXPORT)
                return _ok({"bundle_b64": base64.b64encode(PLACEHOLDER_BUNDLE).decode(),
                            "trust_b64": base64.b64encode(PLACEHOLDER_TRUST).decode()})
            case "DELETE", ["v1", "boxes", name]:
                box = self._get(name)
                if lifecycle.is_live(box.state) and request.url.params.get("force") != "true":
                    raise UserError(f"box {name} is {box.state}; stop it first or use --force")
                del self.boxes[name]
                return _ok({"removed": name})
            case "GET", ["v1", "approvals"]:
                return _ok({"approvals": []})
            case "POST", ["v1", "approvals", box, approval_id]:
                self._get(box)
                raise UserError(f"no connection of box {box} waits with id {approval_id}")
        return httpx.Response(404, json={"detail": "Not Found"})

    def _get(self, name: str) -> _Box:
        box = self.boxes.get(name)
        if box is None:
            raise BoxNotFound(f"no box named {name!r}; see 'tkbox ls'")
        return box

    def _create(self, body: dict[str, Any]) -> _Box:
        self._made += 1
        name = str(body.get("name") or f"box-{self._made}")
        if name in self.boxes:
            raise UserError(f"a box named {name!r} exists already; pick another --name "
                            f"or remove it with 'tkbox rm {name}'")
        box = _Box(name=name, run_id=f"{name}-{self._made}", image=str(body.get("image", "")),
                   workspace=str(body.get("workspace", "")),
                   allow=[str(a) for a in body.get("allow", [])], state=State.CREATING)
        box.move(Event.BOOTED)
        self.boxes[name] = box
        return box

    def _exec(self, box: _Box, body: dict[str, Any]) -> httpx.Response:
        if not lifecycle.takes_crossings(box.state):
            raise UserError(f"cannot exec in box {box.name}: it is {box.state}; "
                            f"{lifecycle.HINTS.get(box.state, '')}")
        argv = [str(a) for a in body.get("argv", [])]
        box.execs += 1
        ran = self.commands(argv)
        exec_id = f"{box.name}-{box.execs}"
        events: list[dict[str, Any]] = [
            {"ev": "started", "exec_id": exec_id, "command": " ".join(argv)}]
        events += [{"ev": "out", "fd": fd, "data": base64.b64encode(data).decode()}
                   for fd, data in ((1, ran.stdout), (2, ran.stderr)) if data]
        events.append({"ev": "exit", "status": ran.status, "signal": ran.signal,
                       "error": ran.error})
        return httpx.Response(200, content=b"".join(json.dumps(e).encode() + b"\n"
                                                    for e in events),
                              headers={"content-type": "application/x-ndjson"})

    def _stop(self, box: _Box) -> _Box:
        box.move(Event.STOP)
        box.patch = {"sha256": hashlib.sha256(self.patch).hexdigest(),
                     "bytes": len(self.patch), "stats": {"files": len(self._files())},
                     "partial": False, "set_apart": [], "apart": {}}
        box.move(Event.STOPPED)
        return box

    def _saved(self, name: str) -> bytes:
        box = self._get(name)
        if not lifecycle.has_patch(box.state):
            raise UserError(f"box {name} has no saved patch: it is {box.state}; "
                            f"{lifecycle.HINTS.get(box.state, '')}")
        return self.patch

    def _files(self) -> list[tuple[str, str]]:
        """(path, kind) of each file in the patch, as the changes door names kinds."""
        heads = list(_FILE.finditer(self.patch))
        out = []
        for i, m in enumerate(heads):
            section = self.patch[m.end():heads[i + 1].start() if i + 1 < len(heads) else None]
            kind = "added" if b"\nnew file mode" in section[:200] else \
                "deleted" if b"\ndeleted file mode" in section[:200] else "modified"
            out.append((m.group(2).decode("utf-8", errors="replace"), kind))
        return out

    def _apply(self, box: _Box, body: dict[str, Any]) -> dict[str, Any]:
        box.move(Event.APPLY)
        dry = bool(body.get("dry_run"))
        status = "would apply" if dry else "applied"
        files = [{"path": p, "kind": kind, "status": status, "reason": "", "mode": None,
                  "sha256": None} for p, kind in self._files()]
        out: dict[str, Any] = {
            "checkout": body.get("checkout") or box.workspace,
            "patch_sha256": hashlib.sha256(self.patch).hexdigest(), "dry_run": dry,
            "allow_sensitive": bool(body.get("allow_sensitive")), "files": files,
            "counts": {status: len(files)} if files else {}, "notes": []}
        if body.get("with_patch"):
            out["patch_b64"] = base64.b64encode(self.patch).decode()
        return out


def _ok(data: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, json=data)
