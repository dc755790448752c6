"""What the daemon keeps about one box: `BoxState`, and its form on disk.

The state record is `$TKBOX_HOME/boxes/NAME/box.json`, written atomically
(a temporary file, then a rename), so `ls` and `inspect` survive a restart.
Its JSON form is the one the daemon has always written; `from_json` reads it
(any key it does not know is kept and written back unchanged), `to_json` writes
it. The same dict, less nothing secret (the record holds names of secrets,
never values), is what the API shows for a box.

The box's lifecycle state is read-only here: only `move`, which asks the
table in `tkbox.daemon.lifecycle`, changes it.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tkbox.daemon.lifecycle import Event, State, next_state
from tkbox.errors import HostError

JSON = dict[str, Any]


class BoxStateUnreadable(HostError):
    """A `box.json` that is not the form `to_json` writes (damaged on disk)."""


@dataclass
class BoxState:
    """One box's record: its identity, what it was created with, and what happened."""

    name: str
    run_id: str
    _state: State
    created: float
    updated: float
    image: str
    image_digest: str
    workspace: str  # the checkout, resolved
    allow: list[str]
    env_names: list[str]
    limits: JSON  # memory_mib, vcpus, disk_mib
    unrecorded: bool
    accel: str
    kernel: str
    guest_build: str
    secrets: list[JSON]  # SecretSpec.describe(): names and hosts, never values
    inspect: str
    model_hosts: list[str]
    image_config: JSON
    timeout_s: int | None
    # Set as the box goes (absent from the JSON until then):
    workspace_copy: JSON | None = None  # what build_lower copied (counts)
    start: JSON | None = None  # {"kind", "reason"}: cold boot or template
    boot_seconds: float | None = None
    patch: JSON | None = None  # {"sha256", "bytes", "stats"} once stopped
    #: seconds the create spent, by step: image, tools, guest, workspace, boot
    timings: JSON | None = None
    tools: JSON | None = None  # the agent's program disk (tkbox.image.tools), its facts
    vm_exit: int | None = None
    error: str | None = None  # the first cause of a failure, for a person
    applied: list[JSON] = field(default_factory=list)
    extra: JSON = field(default_factory=dict)  # keys this version does not know

    @property
    def state(self) -> State:
        return self._state

    def move(self, event: Event) -> State:
        """Move by the lifecycle table, or raise its UserError (the state unchanged)."""
        self._state = next_state(self._state, event, f"box {self.name}")
        self.updated = time.time()
        return self._state

    # ---- the JSON form -------------------------------------------------------------

    def to_json(self) -> JSON:
        out: JSON = {
            "name": self.name, "run_id": self.run_id, "state": self._state.value,
            "created": self.created, "updated": self.updated, "image": self.image,
            "image_digest": self.image_digest, "workspace": self.workspace,
            "allow": self.allow, "env_names": self.env_names, "limits": self.limits,
            "unrecorded": self.unrecorded, "accel": self.accel, "kernel": self.kernel,
            "guest_build": self.guest_build, "secrets": self.secrets,
            "inspect": self.inspect, "model_hosts": self.model_hosts,
            "image_config": self.image_config, "timeout_s": self.timeout_s,
        }
        for key in _OPTIONAL:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.applied:
            out["applied"] = self.applied
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    @classmethod
    def from_json(cls, d: object, where: str = "box.json") -> BoxState:
        """The record as `to_json` wrote it; BoxStateUnreadable for anything else."""
        if not isinstance(d, dict):
            raise BoxStateUnreadable(f"{where} is not a JSON object")
        r = _Reader(d, where)
        raw_state = r.text("state")
        try:
            state = State(raw_state)
        except ValueError:
            raise BoxStateUnreadable(f"{where}: unknown state {raw_state[:40]!r}") from None
        box = cls(
            name=r.text("name"), run_id=r.text("run_id"), _state=state,
            created=r.number("created"), updated=r.number("updated"), image=r.text("image"),
            image_digest=r.text("image_digest"), workspace=r.text("workspace"),
            allow=r.texts("allow"), env_names=r.texts("env_names"), limits=r.obj("limits"),
            unrecorded=r.flag("unrecorded"), accel=r.text("accel", ""),
            kernel=r.text("kernel", ""), guest_build=r.text("guest_build", ""),
            secrets=r.objs("secrets"), inspect=r.text("inspect", ""),
            model_hosts=r.texts("model_hosts"), image_config=r.obj("image_config"),
            timeout_s=r.opt_int("timeout_s"),
            workspace_copy=r.opt_obj("workspace_copy"), start=r.opt_obj("start"),
            boot_seconds=r.opt_number("boot_seconds"), patch=r.opt_obj("patch"),
            timings=r.opt_obj("timings"), tools=r.opt_obj("tools"),
            vm_exit=r.opt_int("vm_exit"), error=r.opt_text("error"),
            applied=r.objs("applied"))
        box.extra = {k: v for k, v in d.items() if k not in _KNOWN}
        return box

    def save(self, directory: Path) -> None:
        """Write `directory/box.json` atomically."""
        tmp = directory / f".box.json.{secrets.token_hex(4)}"
        tmp.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True))
        os.replace(tmp, directory / "box.json")

    @classmethod
    def load(cls, path: Path) -> BoxState:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise BoxStateUnreadable(f"{path} cannot be read ({exc.__class__.__name__})"
                                     ) from None
        return cls.from_json(data, str(path))


_OPTIONAL = ("workspace_copy", "start", "boot_seconds", "patch", "timings", "tools",
             "vm_exit", "error")
_KNOWN = frozenset({"name", "run_id", "state", "created", "updated", "image", "image_digest",
                    "workspace", "allow", "env_names", "limits", "unrecorded", "accel",
                    "kernel", "guest_build", "secrets", "inspect", "model_hosts",
                    "image_config", "timeout_s", "applied", *_OPTIONAL})


class _Reader:
    """Typed reads of one JSON object, each failure a BoxStateUnreadable naming the key."""

    def __init__(self, d: JSON, where: str) -> None:
        self.d, self.where = d, where

    def _bad(self, key: str, want: str) -> BoxStateUnreadable:
        return BoxStateUnreadable(f"{self.where}: {key!r} is not {want}")

    def text(self, key: str, default: str | None = None) -> str:
        v = self.d.get(key, default)
        if not isinstance(v, str):
            raise self._bad(key, "a string")
        return v

    def opt_text(self, key: str) -> str | None:
        return None if self.d.get(key) is None else self.text(key)

    def number(self, key: str) -> float:
        v = self.d.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self._bad(key, "a number")
        return float(v) if isinstance(v, float) else v

    def opt_number(self, key: str) -> float | None:
        return None if self.d.get(key) is None else self.number(key)

    def opt_int(self, key: str) -> int | None:
        v = self.d.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._bad(key, "an integer")
        return v

    def flag(self, key: str) -> bool:
        v = self.d.get(key, False)
        if not isinstance(v, bool):
            raise self._bad(key, "true or false")
        return v

    def obj(self, key: str) -> JSON:
        v = self.d.get(key, {})
        if not isinstance(v, dict):
            raise self._bad(key, "an object")
        return v

    def opt_obj(self, key: str) -> JSON | None:
        return None if self.d.get(key) is None else self.obj(key)

    def texts(self, key: str) -> list[str]:
        v = self.d.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self._bad(key, "a list of strings")
        return list(v)

    def objs(self, key: str) -> list[JSON]:
        v = self.d.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
            raise self._bad(key, "a list of objects")
        return list(v)
