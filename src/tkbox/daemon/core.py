"""The box manager's core: its boxes, their records, and containment.

`ManagerCore` holds what every verb needs: the boxes (read from disk at start,
`load`), the signer behind the per-run record budget, the queue of gaps, and
`record`/`contain`, the fail-closed rule (an event that cannot be kept stops
its box). The signer's pushes (hold, release, quarantine) land here too. The
verbs build on it: `commands` (exec), `copies` (cp), and `manager` (create,
stop, apply, export, rm), which puts them together as `BoxManager`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tkbox import paths
from tkbox._tasks import TaskOwner
from tkbox.daemon import lifecycle
from tkbox.daemon.box import Box, DoorFactory
from tkbox.daemon.boxstate import BoxState, BoxStateUnreadable
from tkbox.daemon.lifecycle import Event
from tkbox.daemon.roles import ApprovalsBoard, GuestBuilder, ImageSource, ToolSource
from tkbox.errors import (
    BoxNotFound,
    SignerRefused,
    SignerUnavailable,
    TkboxError,
)
from tkbox.record.budget import RUN_BYTES, RUN_RECORDS, BudgetedSigner
from tkbox.record.client import SignerClient
from tkbox.record.journal import Journals
from tkbox.vm.base import Launcher

log = logging.getLogger("tkbox.daemon")


@dataclass
class Options:
    """What the daemon was started with (the host's settings, never the box's)."""

    unrecorded: bool = False
    egress_block: list[str] = field(default_factory=list)
    egress_permit: list[str] = field(default_factory=list)
    egress_hosts: str | None = None
    ca_certs: list[str] = field(default_factory=list)  # PEM texts
    approval_wait: int = 120  # seconds a connection waits for a person
    run_records: int = RUN_RECORDS  # records a run may hold before its box is stopped
    run_bytes: int = RUN_BYTES  # estimated bundle bytes likewise
    tunnel_idle: float = 300.0  # seconds a tunnel may carry nothing either way
    tunnel_total: float = 4 * 3600.0  # seconds a tunnel may stay open at all
    max_connections: int = 0  # egress connections daemon-wide; 0: from RLIMIT_NOFILE
    # where images are pulled from (tkbox.image.mirrors.Settings, as the flags gave them)
    registry_mirrors: list[str] = field(default_factory=list)
    registry_mirror_only: bool = False
    registry_config: str | None = None  # an absolute path


@dataclass
class BoxSpec:
    name: str
    image: str
    workspace: str
    allow: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    memory_mib: int = 1024
    vcpus: int = 1
    disk_mib: int = 4096
    # `--secret` spec strings; values the client read itself (name -> value), else
    # the daemon reads each source; `--inspect all`. Values live only in Box.secrets.
    secrets: list[str] = field(default_factory=list)
    secret_values: dict[str, str] = field(default_factory=dict, repr=False)
    inspect: str = ""
    model_hosts: list[str] = field(default_factory=list)  # recorded as model calls
    timeout_s: int | None = None  # the box stops by itself after this long (recorded)
    #: (uid, gid) owning the workspace's files; None: the image's user, else root
    workspace_owner: list[int] | None = None
    via: str = "sdk"  # the kind of client that asked (cli, sdk, mcp)
    agent_chose: list[str] = field(default_factory=list)  # what an agent chose (mcp)
    unsafe: list[str] = field(default_factory=list)  # opt-ins in effect (mcp)
    #: an agent's program as a read-only disk: NAME[@VERSION][:BUILD] (tkbox.image.tools)
    tools: str = ""


class ManagerCore:
    """Boxes, records and containment; the verbs are in its subclasses."""

    def __init__(self, *, launcher: Launcher, signer: SignerClient, options: Options,
                 images: ImageSource, guest_build: GuestBuilder, accel_reason: str = "",
                 home: Path | None = None, door_factory: DoorFactory | None = None,
                 approvals: ApprovalsBoard | None = None,
                 tools: ToolSource | None = None) -> None:
        self.launcher = launcher
        self._tools = tools
        # Every record goes through the per-run budget, so every run stays exportable.
        unbounded = options.unrecorded  # nothing is recorded, so there is nothing to bound
        self.signer = BudgetedSigner(signer,
                                     max_records=2**62 if unbounded else options.run_records,
                                     max_bytes=2**62 if unbounded else options.run_bytes,
                                     on_exhausted=self._budget_exhausted)
        self.opts = options
        self.images = images
        self.guest_build = guest_build  # cached after the first call
        self.journals: Journals | None = None  # `tkbox logs` (set by the server)
        self.accel_reason = accel_reason
        self.root = paths.private_dir((home or paths.home()) / "boxes")
        self.vms_root = paths.private_dir(paths.vms(home))
        self.door_factory = door_factory
        self.approvals = approvals
        self.boxes: dict[str, Box] = {}
        self.gaps: list[tuple[str, dict[str, Any]]] = []
        self.operator_facts: dict[str, Any] | None = None
        # The daemon's own background tasks (the signer's pushes, budget stops).
        self.tasks = TaskOwner("the daemon", log, quote=True)

    # ---- start-up ------------------------------------------------------------

    async def load(self) -> None:
        """Read boxes from disk; a box that was live has lost its VM."""
        for d in sorted(self.root.iterdir()):
            f = d / "box.json"
            if not f.is_file():
                if d.name.startswith(".creating-"):
                    shutil.rmtree(d, ignore_errors=True)  # a create that never finished
                continue
            try:
                info = BoxState.load(f)
            except BoxStateUnreadable as exc:
                log.warning("box state %s is unreadable (%s); left as is", f, exc)
                continue
            box = Box(d, info)
            self.boxes[box.name] = box
            if lifecycle.is_live(box.state):
                lost = box.state.value
                box.info.error = f"the daemon stopped while the box was {lost}; its VM is gone"
                box.move(Event.DAEMON_LOST)
                self._gap(box, {"reason": "daemon restart", "state": lost})
        await self.flush_gaps()

    def _gap(self, box: Box, body: dict[str, Any]) -> None:
        if not box.unrecorded:
            self.gaps.append((box.run_id, {"box": box.name, **body,
                                           "time_ms": int(time.time() * 1000)}))

    async def flush_gaps(self) -> None:
        """Record the queued gaps in order. A signer that does not answer keeps them all
        for the next flush; a gap the signer refuses (its run was closed behind the
        daemon's back) is logged and dropped, so it cannot hold back other runs' gaps."""
        while self.gaps:
            run_id, body = self.gaps[0]
            try:
                await self.signer.event(run_id, "tkbox.gap", body)
            except SignerRefused as exc:
                log.warning("gap for %s refused by the signer: %s", run_id, exc)
            except SignerUnavailable:
                return
            except TkboxError as exc:
                log.warning("gap for %s not recordable: %s", run_id, exc)
            self.gaps.pop(0)

    # ---- records ---------------------------------------------------------------

    async def record(self, box: Box, kind: str, body: dict[str, Any]) -> None:
        """An event that must be kept; if it cannot be, the box stops (fail closed)."""
        if box.unrecorded:
            return
        try:
            await self.signer.event(box.run_id, kind, body)
        except TkboxError as exc:
            self._gap(box, {"reason": f"event {kind} not recorded: {exc}", "event": kind})
            await self.contain(box, f"an event could not be recorded ({exc})")

    def _budget_exhausted(self, run_id: str, why: str) -> None:
        """A run reached its record budget: stop its box, and say so in the run."""
        box = next((b for b in self.boxes.values() if b.run_id == run_id), None)
        if box is None:
            return

        async def stop_it() -> None:
            records, size = self.signer.usage(run_id)
            await self.record(box, "tkbox.containment", {
                "reason": why[:500], "budget": "records", "records": records,
                "estimated_bundle_bytes": size})
            await self.contain(box, why)

        if not self.tasks.closed:
            self.tasks.spawn(stop_it(), name=f"stop {box.name}: record budget")

    def contain_soon(self, box: Box, why: str) -> None:
        """`contain` from a callback that cannot wait (a door losing a record): the
        box owns the task, so it ends with the box."""
        if not box.tasks.closed:
            box.tasks.spawn(self.contain(box, why), name="contain")

    async def contain(self, box: Box, why: str) -> None:
        """Stop a box at once because the record cannot be kept."""
        log.warning("box %s stopped: %s", box.name, why)
        if lifecycle.is_live(box.state) or not box.info.error:
            box.info.error = f"stopped: {why}"  # the first cause, not what it then broke
        # The state moves first: the VM watcher must not see a "running" box die.
        if lifecycle.can(box.state, Event.VM_DIED):
            box.move(Event.VM_DIED)
        if box.door is not None:
            with contextlib.suppress(Exception):
                await box.door.close()
        if box.vm is not None:
            await box.vm.kill()

    async def watch_pushes(self) -> None:
        """Holds, releases and quarantines, as the signer pushes them."""
        while True:
            try:
                async for p in self.signer.pushes():
                    await self._on_push(p.kind, p.run_id, p.reason)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reconnect after a pause
                log.info("signer push channel: %s", exc)
            await asyncio.sleep(0.5)

    async def _on_push(self, kind: str, run_id: str, reason: str) -> None:
        box = next((b for b in self.boxes.values() if b.run_id == run_id), None)
        if box is None:
            return
        if kind == "hold" and lifecycle.can(box.state, Event.HOLD) and box.vm is not None:
            await box.vm.pause()
            box.move(Event.HOLD)
        elif kind == "release" and lifecycle.can(box.state, Event.RELEASE) \
                and box.vm is not None:
            await box.vm.resume()
            box.move(Event.RELEASE)
        elif kind == "quarantine" and lifecycle.can(box.state, Event.QUARANTINE):
            box.info.error = f"quarantined by the signer: {reason}".rstrip(": ")
            box.move(Event.QUARANTINE)  # first, so the VM's end is not taken for a crash
            if box.door is not None:
                with contextlib.suppress(Exception):
                    await box.door.close()
            if box.vm is not None:
                await box.vm.kill()

    # ---- lookups -----------------------------------------------------------------

    @property
    def tools(self) -> ToolSource:
        """Agents' tool disks (`--tools`): this user's store unless a test gave another."""
        if self._tools is None:
            from tkbox.image.tools import StoreTools

            self._tools = StoreTools(lambda m: log.info("tools: %s", m))
        return self._tools

    def get(self, name: str) -> Box:
        box = self.boxes.get(name)
        if box is None:
            raise BoxNotFound(f"no box named {name!r}; see 'tkbox ls'")
        return box

    def list_boxes(self) -> list[dict[str, Any]]:
        return [b.public() for b in sorted(self.boxes.values(), key=lambda b: b.info.created)]
