"""Wiring the network door into the daemon: one board, one door per box."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tkbox.daemon.box import Box
from tkbox.daemon.manager import BoxManager, Options
from tkbox.doors.network import (
    ApprovalBoard,
    EgressDoor,
    OperatorConfig,
    SystemClock,
    SystemResolver,
    describe_presets,
)
from tkbox.doors.network.limits import ConnectionPool, connections_for, raise_nofile
from tkbox.doors.secrets import SecretsDoor
from tkbox.doors.secrets.hosts import read_hosts
from tkbox.errors import SignerUnavailable, TkboxError
from tkbox.record.client import SignerClient

log = logging.getLogger("tkbox.daemon")


async def install(manager: BoxManager, opts: Options, signer: SignerClient | None = None
                  ) -> OperatorConfig:
    """Give `manager` a network door per box, sharing one approval board.

    Doors record through `manager.signer` (the per-run record budget), whatever
    `signer` is passed (kept for callers of the old signature)."""
    signer = manager.signer
    op = OperatorConfig.from_flags(opts.egress_block, opts.egress_permit, opts.egress_hosts)
    # Presets read the clients' own definitions (npm may take seconds): warm them here,
    # off the event loop, not inside the first box's create.
    await asyncio.to_thread(describe_presets)
    clock = SystemClock()
    board = ApprovalBoard(signer, clock, wait_seconds=opts.approval_wait)
    resolver = SystemResolver()
    nofile = raise_nofile()  # at start: one box's tunnels must not take every descriptor
    cap = opts.max_connections or connections_for(nofile)
    pool = ConnectionPool(cap)
    log.info("egress: at most %d connections daemon-wide; tunnels idle %gs, total %gs",
             cap, opts.tunnel_idle, opts.tunnel_total)

    def factory(box: Box) -> EgressDoor:
        def lost(exc: TkboxError) -> None:
            # A connection record that cannot be kept stops the box (fail closed).
            # The box owns the task that stops it, so it ends with the box.
            manager.contain_soon(box, f"an egress record could not be kept ({exc})")

        hosts = read_hosts(box.info.allow, box.secrets, box.info.inspect, box.info.model_hosts)

        async def record(kind: str, body: dict[str, Any]) -> None:
            if box.unrecorded:
                return
            try:
                await signer.event(box.run_id, kind, body)
            except SignerUnavailable as exc:
                lost(exc)

        mitm = None
        if hosts.any:
            mitm = SecretsDoor(box.name, box.secrets, inspect_hosts=hosts.inspect,
                               model_hosts=hosts.models, ruled_hosts=hosts.ruled,
                               ca_pems=opts.ca_certs, record=record)
        return EgressDoor(box.run_id, signer, hosts.allow, op, resolver, board, clock,
                          box=box.name, on_record_lost=lost, pool=pool,
                          tunnel_idle=opts.tunnel_idle, tunnel_total=opts.tunnel_total,
                          mitm=mitm)

    manager.door_factory = factory
    manager.approvals = board
    manager.operator_facts = op.facts()
    return op

