"""The fake launcher: a "VM" whose guest is a coroutine, over a real serial mux.

For tests of everything above the launcher (the daemon, the doors): the host
side gets the same `MuxPorts` it would get from QEMU, carried over an
in-memory byte stream instead of a virtio-serial port, and the guest side runs
`agent(ports)`, any coroutine (a well-behaved fake agent, or a hostile one).

It keeps the launcher contract (`tkbox.vm.base`) as the real ones do: the
"VMM" ends when the agent returns (status 0), fails (1) or is killed (-9);
its tasks (both mux engines, the agent) are owned by the VM and have ended
once `wait` returns; the ports are closed then, so `connect` raises
`TransportClosed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tkbox._tasks import TaskOwner
from tkbox.protocol.budget import Budget
from tkbox.protocol.mux import MAX_STREAMS, MuxPorts
from tkbox.protocol.streams import memory_stream_pair
from tkbox.vm.base import BeforeBoot, Launcher, ManagedVM, VMSpec
from tkbox.vm.errors import VMEnded

Agent = Callable[[MuxPorts, VMSpec], Awaitable[None]]


class FakeVM(ManagedVM):
    def __init__(self, spec: VMSpec, agent: Agent,
                 before_boot: BeforeBoot | None = None) -> None:
        super().__init__()
        a, b = memory_stream_pair()
        self.spec = spec
        self.ports = MuxPorts(a, initiator=True)
        self.guest_ports = MuxPorts(b, initiator=False, max_own=MAX_STREAMS,
                                    budget=Budget.unlimited())  # as the agent
        self.paused = False
        if before_boot is not None:
            before_boot(self.ports)  # before either engine runs: no stream can arrive yet
        self._tasks = TaskOwner(f"tkbox-fake-vm-{spec.name}")
        self._tasks.spawn(self.ports.run())
        self._tasks.spawn(self.guest_ports.run())
        self._ended = asyncio.get_running_loop().create_future()
        self._agent = self._tasks.spawn(self._run_agent(agent))

    async def _run_agent(self, agent: Agent) -> None:
        try:
            await agent(self.guest_ports, self.spec)
        except asyncio.CancelledError:
            self._finish(-9)
            raise
        except Exception:  # noqa: BLE001 - a failing agent is a VM that ended with status 1
            self._finish(1)
        else:
            self._finish(0)

    def _finish(self, code: int) -> None:
        if not self._ended.done():
            self._ended.set_result(code)

    @property
    def accel(self) -> str:
        return "fake"

    def _check_running(self, what: str) -> None:
        if self._ended.done():
            raise VMEnded(f"cannot {what} VM {self.spec.name}: it has ended "
                          f"(status {self._ended.result()})")

    async def pause(self) -> None:
        self._check_running("pause")
        self.paused = True

    async def resume(self) -> None:
        self._check_running("resume")
        self.paused = False

    async def kill(self) -> None:
        self._finish(-9)
        await self.wait()

    async def _cleanup(self) -> None:
        self._tasks.cancel()  # the agent first: a killed guest runs no more
        await self.ports.aclose()
        await self.guest_ports.aclose()
        await self._tasks.aclose()


class FakeLauncher(Launcher):
    name = "fake"

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.started: list[FakeVM] = []

    async def start(self, spec: VMSpec, *, before_boot: BeforeBoot | None = None) -> FakeVM:
        vm = FakeVM(spec, self.agent, before_boot)
        self.started.append(vm)
        return vm
