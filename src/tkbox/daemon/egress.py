"""Wiring the network door into the daemon: one board, one door per box."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tkbox.daemon.manager import Box, BoxManager, Options
from tkbox.doors.network import (
    ApprovalBoard,
    EgressDoor,
    OperatorConfig,
    SystemClock,
    SystemResolver,
    describe_presets,
)
from tkbox.doors.network.allowlist import Allowlist
from tkbox.doors.network.presets import MODEL_PRESETS, preset_entries
from tkbox.doors.secrets import SecretsDoor
from tkbox.errors import SignerUnavailable, TkboxError
from tkbox.record.client import SignerClient

log = logging.getLogger("tkbox.daemon")


async def install(manager: BoxManager, opts: Options, signer: SignerClient) -> OperatorConfig:
    """Give `manager` a network door per box, sharing one approval board."""
    op = OperatorConfig.from_flags(opts.egress_block, opts.egress_permit, opts.egress_hosts)
    # Presets read the clients' own definitions (npm may take seconds): warm them here,
    # off the event loop, not inside the first box's create.
    await asyncio.to_thread(describe_presets)
    clock = SystemClock()
    board = ApprovalBoard(signer, clock, wait_seconds=opts.approval_wait)
    resolver = SystemResolver()
    loop = asyncio.get_running_loop()

    def factory(box: Box) -> EgressDoor:
        def lost(exc: TkboxError) -> None:
            # A connection record that cannot be kept stops the box (fail closed).
            loop.create_task(manager.contain(box, f"an egress record could not be kept ({exc})"))

        # Binding a secret to a host allows that host on 443 (docs/secrets.md).
        bound = sorted({h for s in box.secrets for h in s.spec.hosts})
        allow = list(box.s["allow"]) + [f"{h}:443" for h in bound]
        names = {e.host.name for e in Allowlist(allow).entries if e.host.literal is None}
        models = {h for p in MODEL_PRESETS for h in (preset_entries(p) or ())} & names
        inspect = names if box.s.get("inspect") == "all" else set()

        async def record(kind: str, body: dict[str, Any]) -> None:
            if box.s.get("unrecorded"):
                return
            try:
                await signer.event(box.run_id, kind, body)
            except SignerUnavailable as exc:
                lost(exc)

        mitm = None
        if bound or inspect or models:
            mitm = SecretsDoor(box.name, box.secrets, inspect_hosts=inspect, model_hosts=models,
                               ca_pems=opts.ca_certs, record=record)
        return EgressDoor(box.run_id, signer, allow, op, resolver, board, clock,
                          box=box.name, on_record_lost=lost, mitm=mitm)

    manager.door_factory = factory
    manager.approvals = board
    manager.operator_facts = op.facts()
    return op

