"""The guest agent: PID 1 inside the VM, and the `init` the initramfs runs.

`main` is PID 1's whole life in order: the early mounts and kernel modules
(`tkbox.guest.boot`), the mux port or vsock, the boot config on port 1026
(once), the reseed, the disks, the user, the CA, `lo`, the commands' cgroup,
then the RPC on port 1024 and the egress forwarder on 127.0.0.1:3128
(`tkbox.guest.serve`, which starts commands with `tkbox.guest.spawn`), until
the host asks it to shut down; then the VM powers off. As PID 1 it reaps every
orphan.

Template boot (`tkbox.template=1` on the kernel command line, see
`tkbox.vm.template`): the agent loads every module but `virtio_blk`, so no
disk is probed or read, writes `PARKED` on the mux port and blocks until the
host writes `WAKE`. The host saves the VM there once; each box is restored from
that state and woken, then the agent loads `virtio_blk` (the disks are probed
fresh, at the box's own sizes) and boots on as above. The boot config's
`seed` (host randomness) is credited to the kernel and the generator reseeded
before anything else, so boxes restored from one template share no random state
from that point on; a template boot without a seed refuses to start.

Trust: this code runs in the VM and is not trusted by the host. It trusts the
host completely (the host built this initramfs). Standard library, `msgpack`,
and `tkbox.protocol`/`tkbox._tasks`/`tkbox.errors`/`tkbox.guest` only; the
guest build ships every module of `tkbox/guest/`. The agent's modules, one
idea each: `boot` (PID 1's duties), `spawn` (starting a command), `serve` (the
RPC handlers), `rpc` (the messages), `diff` (the patch), `oomwatch` (the
memory watch).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from typing import Any

from tkbox._tasks import TaskOwner
from tkbox.guest import oomwatch, rpc
from tkbox.guest.boot import (
    BLOCK_MODULE,
    COMMANDS_CGROUP,
    PORTS_ARG,
    Reaper,
    confine_commands,
    early_mounts,
    find_mux_port,
    install_ca,
    kernel_arg,
    lo_up,
    load_modules,
    log,
    park,
    power_off,
    prepare_user,
    reseed,
    setup_disks,
    template_boot,
    wait_for,
    write_etc,
)
from tkbox.guest.serve import Agent
from tkbox.guest.spawn import FdStream
from tkbox.protocol.budget import Budget
from tkbox.protocol.framing import FramedStream
from tkbox.protocol.mux import MAX_STREAMS, MuxPorts
from tkbox.protocol.ports import PORT_BOOT, PORT_RPC, Ports
from tkbox.protocol.vsock import GuestVsockPorts

PROXY_ADDR = ("127.0.0.1", 3128)


def _failed(exc: Exception) -> dict[str, Any]:
    """The boot stream's answer when the box cannot start: why, in one bounded line."""
    return rpc.Error(f"{exc.__class__.__name__}: {exc}"[:rpc.MAX_TEXT]).wire()


async def amain(fd: int | None, templated: bool) -> None:
    """Boot and serve; `fd` is the mux port, or None where the ports are AF_VSOCK."""
    loop = asyncio.get_running_loop()
    reaper = Reaper()
    reaper.install(loop)
    ports: Ports
    owner = TaskOwner("agent")  # the transport and the shutdown wait, for the agent's life
    mux_task: asyncio.Future[Any]
    if fd is None:
        ports = GuestVsockPorts()
        mux_task = owner.spawn(ports.wait_closed(), "transport")
    else:
        # the guest opens one stream per proxied connection: as many as the host accepts
        mux = MuxPorts(FdStream(fd), initiator=False, max_own=MAX_STREAMS,
                       budget=Budget.unlimited())
        ports = mux
        mux_task = owner.spawn(mux.run(), "transport")
    boot = FramedStream(await ports.connect(PORT_BOOT))
    cfg = await boot.receive()
    if not isinstance(cfg, dict):
        raise RuntimeError("no boot config from the host")
    try:
        reseed(cfg.get("seed"), required=templated)
    except Exception as exc:
        with contextlib.suppress(Exception):
            await boot.send(_failed(exc))
        raise
    if isinstance(cfg.get("time"), (int, float)):
        with contextlib.suppress(OSError):
            time.clock_settime(time.CLOCK_REALTIME, float(cfg["time"]))
    try:
        setup_disks(cfg)
        prepare_user(cfg)
        install_ca(cfg)
        write_etc(cfg)
        lo_up()
        log(confine_commands())
        if (COMMANDS_CGROUP / "memory.max").exists():
            oomwatch.start(COMMANDS_CGROUP, log)
        agent = Agent(ports, cfg, reaper)
        server = await asyncio.start_server(agent.forward, *PROXY_ADDR)
        ports.serve(PORT_RPC, agent.handle_rpc)
    except Exception as exc:
        # The host learns why the box cannot start, on the stream it is waiting on.
        with contextlib.suppress(Exception):
            await boot.send(_failed(exc))
        raise
    # Readiness goes back on the boot stream itself, which is then closed for good.
    await boot.send(rpc.Ready(time.monotonic() - agent.started).wire())
    await boot.aclose()
    await asyncio.wait([mux_task, owner.spawn(agent.shutting_down.wait(), "shutdown")],
                       return_when=asyncio.FIRST_COMPLETED)
    await asyncio.sleep(0.1)  # let the last answer leave
    server.close()
    await owner.aclose()


def main() -> None:
    try:
        early_mounts()
        templated = template_boot()
        load_modules(want=(lambda m: m != BLOCK_MODULE) if templated else (lambda m: True))
        if kernel_arg(PORTS_ARG) == "vsock":  # vhost vsock (QEMU) or Firecracker's
            wait_for(lambda: os.path.exists("/dev/vsock"), "/dev/vsock")
            asyncio.run(amain(None, templated=False))
            return
        dev = find_mux_port()
        fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
        if templated:
            park(fd)
            load_modules(want=lambda m: m == BLOCK_MODULE)
        asyncio.run(amain(fd, templated))
    except BaseException as exc:  # noqa: BLE001 - PID 1 must never just die
        log(f"fatal: {exc.__class__.__name__}: {exc}")
    finally:
        power_off()


if __name__ == "__main__":
    main()
    sys.exit(0)
