"""The fake launcher: a "VM" whose guest is a coroutine, over a real serial mux.

For tests of everything above the launcher (the daemon, the doors): the host
side gets the same `MuxPorts` it would get from QEMU, carried over an
in-memory byte stream instead of a virtio-serial port, and the guest side runs
`agent(ports)`, any coroutine (a well-behaved fake agent, or a hostile one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from tkbox.protocol.budget import Budget
from tkbox.protocol.mux import MAX_STREAMS, MuxPorts
from tkbox.protocol.streams import memory_stream_pair
from tkbox.vm.base import VM, Launcher, VMSpec

Agent = Callable[[MuxPorts, VMSpec], Awaitable[None]]


class FakeVM(VM):
    def __init__(self, spec: VMSpec, agent: Agent) -> None:
        a, b = memory_stream_pair()
        self.spec = spec
        self.ports = MuxPorts(a, initiator=True)
        self.guest_ports = MuxPorts(b, initiator=False, max_own=MAX_STREAMS,
                                    budget=Budget.unlimited())  # as the agent
        self.paused = False
        self._tasks = [asyncio.ensure_future(self.ports.run()),
                       asyncio.ensure_future(self.guest_ports.run())]
        self._agent = asyncio.ensure_future(agent(self.guest_ports, spec))
        self._done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._agent.add_done_callback(lambda t: self._finish(0 if not t.cancelled()
                                                             and t.exception() is None else 1))

    def _finish(self, code: int) -> None:
        if not self._done.done():
            self._done.set_result(code)

    @property
    def accel(self) -> str:
        return "fake"

    async def pause(self) -> None:
        self.paused = True

    async def resume(self) -> None:
        self.paused = False

    async def kill(self) -> None:
        self._agent.cancel()
        self._finish(-9)
        await self.wait()

    async def wait(self) -> int:
        code = await asyncio.shield(self._done)
        await self.ports.aclose()
        await self.guest_ports.aclose()
        for t in self._tasks:
            t.cancel()
            with contextlib.suppress(BaseException):
                await t
        return code


class FakeLauncher(Launcher):
    name = "fake"

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.started: list[FakeVM] = []

    async def start(self, spec: VMSpec) -> FakeVM:
        vm = FakeVM(spec, self.agent)
        self.started.append(vm)
        return vm
