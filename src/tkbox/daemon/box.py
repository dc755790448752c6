"""One box as the daemon holds it: its state record and, while it lives, its VM,
its guest client, its network door and the tasks it owns.

`Box.move` is how the daemon changes a box's state: by the lifecycle table
(`tkbox.daemon.lifecycle`), then written to disk at once.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tkbox._tasks import TaskOwner
from tkbox.daemon.boxstate import BoxState
from tkbox.daemon.guest_client import ExecInput, GuestClient
from tkbox.daemon.lifecycle import Event, State
from tkbox.daemon.roles import NetworkDoor
from tkbox.doors.secrets import Secret, prestart
from tkbox.protocol.budget import Budget
from tkbox.protocol.mux import MuxPorts
from tkbox.vm.base import VM

log = logging.getLogger("tkbox.daemon")


class Box:
    """One box: its state on disk and, while it lives, its VM and doors."""

    def __init__(self, directory: Path, info: BoxState) -> None:
        self.dir = directory
        self.info = info
        self.vm: VM | None = None
        self.guest: GuestClient | None = None
        self.door: NetworkDoor | None = None  # the network door, when one is wired
        # every task of the box, ended with it
        self.tasks = TaskOwner(f"box {info.name}", log, quote=True)
        self.expiry: asyncio.Task[None] | None = None  # --timeout's timer
        self.execs: dict[str, asyncio.Queue[ExecInput]] = {}  # signals and keystrokes, per command
        self.lock = asyncio.Lock()
        self.ready: asyncio.Future[dict[str, Any]] | None = None
        self.boot_served = False
        self.secrets: list[Secret] = []  # values: daemon memory only
        self.input_guards: dict[str, prestart.InputGuard] = {}  # per terminal command

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def state(self) -> State:
        return self.info.state

    @property
    def run_id(self) -> str:
        return self.info.run_id

    @property
    def unrecorded(self) -> bool:
        return self.info.unrecorded

    def save(self) -> None:
        self.info.save(self.dir)

    def move(self, event: Event) -> None:
        """Move by the lifecycle table (a UserError if it refuses), and save."""
        self.info.move(event)
        self.save()

    def budget(self) -> Budget | None:
        """The work budget the guest's frames are charged to, while the VM lives."""
        return self.vm.ports.budget if self.vm is not None else None

    def public(self) -> dict[str, Any]:
        out = {k: v for k, v in self.info.to_json().items() if k != "env_values"}
        out["display_name"] = self.name + (" [UNRECORDED]" if self.unrecorded else "")
        ports = self.vm.ports if self.vm is not None else None
        budget = ports.budget if ports is not None else None
        if budget is not None:
            # How much the guest was slowed by its work budget and output/input bounds.
            out["guest_throttled_s"] = round(budget.throttled, 3)
            out["guest_reads_paused"] = ports.paused_reads if isinstance(ports, MuxPorts) else 0
        return out


@runtime_checkable
class DoorFactory(Protocol):
    """Makes a box's network door as the box is created; a bad `--allow` entry is
    refused here (a UserError), before the run is opened."""

    def __call__(self, box: Box) -> NetworkDoor: ...
