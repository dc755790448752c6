"""A box's tasks end with it: a hostile or forgotten box cannot leave work running
in the daemon after `stop`, `rm` or the daemon's shutdown.

The daemon (`BoxManager`) runs for real, with real disks; the VM is the polite
fake guest behind a real serial mux.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from fake_guests import boot, polite  # noqa: E402

from tkbox.daemon.lifecycle import State  # noqa: E402
from tkbox.daemon.manager import BoxManager, BoxSpec, Options  # noqa: E402
from tkbox.daemon.testing import FakeBuild, FakeBuilder, FakeImages  # noqa: E402
from tkbox.guest.testing import answer_diff  # noqa: E402
from tkbox.protocol.framing import FramedStream  # noqa: E402
from tkbox.protocol.mux import MuxPorts  # noqa: E402
from tkbox.protocol.ports import PORT_RPC  # noqa: E402
from tkbox.protocol.streams import ByteStream  # noqa: E402
from tkbox.record.testing import FakeSigner  # noqa: E402
from tkbox.vm.base import VMSpec  # noqa: E402
from tkbox.vm.fake import FakeLauncher  # noqa: E402


async def deaf(ports: MuxPorts, spec: VMSpec) -> None:
    """Polite, except that a command never ends and ignores every signal."""
    await boot(ports)

    async def rpc(stream: ByteStream) -> None:
        fs = FramedStream(stream)
        req = await fs.receive()
        if req is not None and req.get("op") == "exec":
            await fs.send({"ev": "started", "pid": 2})
            while await fs.receive() is not None:
                pass  # signals and input: ignored
            await asyncio.Event().wait()
        elif req is not None:
            await polite_rpc_answer(fs, req)

    ports.serve(PORT_RPC, rpc)
    await asyncio.Event().wait()


async def polite_rpc_answer(fs: FramedStream, req: dict[str, object]) -> None:
    if req.get("op") == "diff":
        await answer_diff(fs, req, b"")
    else:
        await fs.send({"ev": "ok"})


def make(tmp: Path, agent: Any = polite) -> tuple[BoxManager, FakeSigner]:
    signer = FakeSigner()
    m = BoxManager(launcher=FakeLauncher(agent), signer=signer, options=Options(),
                   images=FakeImages(tmp),
                   guest_build=FakeBuilder(FakeBuild(tmp / "k", tmp / "i")), home=tmp / "home")
    return m, signer


def checkout(tmp: Path) -> Path:
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    return ws


def test_a_stopped_box_keeps_no_timer_and_rm_ends_every_task(tmp_path: Path) -> None:
    """A week-long `--timeout` must not outlive the box it was for."""

    async def main() -> None:
        m, _ = make(tmp_path)
        ws = checkout(tmp_path)
        box = await m.create(BoxSpec(name="t", image="x", workspace=str(ws), disk_mib=64,
                                     timeout_s=7 * 24 * 3600))
        timer = box.expiry
        assert timer is not None and not timer.done() and len(box.tasks) >= 3
        await m.stop("t")
        assert box.state == State.STOPPED and box.expiry is None
        await asyncio.sleep(0)
        assert timer.cancelled()
        await m.rm("t")
        assert len(box.tasks) == 0 and box.tasks.closed

    asyncio.run(asyncio.wait_for(main(), 60))


def test_rm_force_ends_a_running_command_and_records_how_it_ended(tmp_path: Path) -> None:
    """`rm --force` during a command: the command's task ends with the box, and its
    completion is still recorded (no decision is left open)."""

    async def main() -> None:
        m, signer = make(tmp_path, deaf)
        ws = checkout(tmp_path)
        box = await m.create(BoxSpec(name="c", image="x", workspace=str(ws), disk_mib=64))
        events = m.exec("c", ["sleep", "infinity"], None, None, None)
        assert (await events.__anext__())["ev"] == "started"
        command = next(t for t in box.tasks._tasks if "exec" in t.get_name())
        await asyncio.sleep(0.2)  # the guest has the command
        await m.rm("c", force=True)
        assert command.done() and len(box.tasks) == 0 and box.tasks.closed
        rest = [ev async for ev in events]
        assert len(rest) == 1 and rest[0]["ev"] == "error", rest
        [done] = signer.of_run(box.run_id, "tkbox.complete")
        assert done["outcome"]["error"] == rest[0]["message"][:300]
        assert done["outcome"]["status"] is None

    asyncio.run(asyncio.wait_for(main(), 60))


def test_shutdown_stops_every_box_and_ends_every_owner(tmp_path: Path) -> None:
    async def main() -> None:
        m, _ = make(tmp_path)
        ws = checkout(tmp_path)
        boxes = [await m.create(BoxSpec(name=f"s{i}", image="x", workspace=str(ws),
                                        disk_mib=64, timeout_s=3600)) for i in range(2)]
        pushes = m.tasks.spawn(m.watch_pushes(), name="signer pushes")
        await m.shutdown()
        assert all(b.state == State.STOPPED and b.tasks.closed and len(b.tasks) == 0
                   for b in boxes)
        assert m.tasks.closed and pushes.cancelled()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_command_whose_box_ends_its_tasks_says_so_and_is_completed(tmp_path: Path) -> None:
    """The command's task is cancelled by its owner (not by the client): the stream says
    how it ended, the decision is completed, and the client's own request goes on."""

    async def main() -> None:
        m, signer = make(tmp_path, deaf)
        ws = checkout(tmp_path)
        box = await m.create(BoxSpec(name="o", image="x", workspace=str(ws), disk_mib=64))
        events = m.exec("o", ["sleep", "infinity"], None, None, None)
        assert (await events.__anext__())["ev"] == "started"
        await asyncio.sleep(0.2)
        await box.tasks.aclose()
        rest = [ev async for ev in events]
        assert rest == [{"ev": "error", "message": "the command ended with its box"}]
        [done] = signer.of_run(box.run_id, "tkbox.complete")
        assert done["outcome"]["error"] == "the command ended with its box"
        if box.vm is not None:
            await box.vm.kill()

    asyncio.run(asyncio.wait_for(main(), 60))
