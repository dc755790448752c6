"""A hostile guest cannot crash the daemon, stall other boxes, or grow its memory.

The daemon (`BoxManager`) runs for real, with real disks built from a real
checkout; only the VM is replaced, at the launcher interface, by a guest
coroutine behind a real serial mux. Each attack gets a one-line `GuestError`
for the user, and a well-behaved box next to it keeps working.
"""

from __future__ import annotations

import asyncio
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fake_guests import hostile, link_flooder, polite  # noqa: E402

from tkbox.daemon.manager import BoxManager, BoxSpec, Options  # noqa: E402
from tkbox.daemon.testing import FakeBuild, FakeBuilder, FakeImages  # noqa: E402
from tkbox.errors import GuestError, Refused, UserError  # noqa: E402
from tkbox.guest.testing import answer_diff  # noqa: E402
from tkbox.record.testing import FakeSigner  # noqa: E402
from tkbox.vm.fake import FakeLauncher  # noqa: E402


def make_manager(tmp: Path, agents: dict[str, Any]) -> tuple[BoxManager, FakeSigner]:
    """Boxes named after the agent they get: 'polite-1' runs `polite`, and so on."""

    async def dispatch(ports, spec):
        kind = spec.name.rsplit("-", 1)[0]
        await agents[kind](ports, spec)

    signer = FakeSigner()
    images = FakeImages(tmp)
    build = FakeBuild(tmp / "vmlinux", tmp / "initramfs")
    m = BoxManager(launcher=FakeLauncher(dispatch), signer=signer, options=Options(),
                   images=images, guest_build=FakeBuilder(build), home=tmp / "home")
    return m, signer


async def cleanup(m: BoxManager) -> None:
    for name in list(m.boxes):
        await m.rm(name, force=True)


async def run_cmd(m: BoxManager, name: str, argv: list[str]) -> list[dict[str, Any]]:
    events = []
    async for ev in m.exec(name, argv, None, None, None):
        events.append(ev)
    return events


AGENTS = {"polite": polite, "big": hostile("oversized-frame"), "trunc": hostile("truncated-frame"),
          "garbage": hostile("garbage"), "silent": hostile("never-answers"),
          "flood": hostile("flood"), "wrong": hostile("wrong-events"),
          "notpatch": hostile("not-a-patch"), "linkflood": link_flooder,
          "nested": hostile("nested"), "unknownkey": hostile("unknown-key")}


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    return ws


async def _create(m: BoxManager, name: str, ws: Path) -> None:
    await m.create(BoxSpec(name=name, image="x", workspace=str(ws), disk_mib=64))


@pytest.mark.parametrize("kind, needle", [
    ("big", "malformed frame"),
    ("trunc", "stream ended inside a frame"),
    ("garbage", "malformed frame"),
    ("wrong", "malformed output frame"),
    ("nested", "msgpack array of 60000 entries"),  # refused before decoding
    ("unknownkey", "unknown key 'smuggled'"),
])
def test_malformed_guest_answers_are_a_clear_error_and_other_boxes_keep_working(
        tmp_path: Path, checkout: Path, kind: str, needle: str) -> None:
    async def main() -> None:
        m, signer = make_manager(tmp_path, AGENTS)
        await _create(m, "polite-1", checkout)
        await _create(m, f"{kind}-1", checkout)
        events = await run_cmd(m, f"{kind}-1", ["true"])
        last = events[-1]
        assert last["ev"] == "error" and needle in last["message"], events
        assert "\n" not in last["message"]
        ok = await run_cmd(m, "polite-1", ["echo", "hi"])
        assert ok[-1] == {"ev": "exit", "status": 0, "signal": 0, "error": ""}
        # the attack is in the record too: the Bash decision was completed with the error
        done = [r for r in signer.of_run(m.get(f"{kind}-1").run_id, "tkbox.complete")]
        assert done and needle in done[-1]["outcome"]["error"]
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_guest_that_never_answers_times_out_instead_of_hanging(tmp_path: Path,
                                                               checkout: Path) -> None:
    async def main() -> None:
        m, _ = make_manager(tmp_path, AGENTS)
        await _create(m, "silent-1", checkout)
        m.get("silent-1").guest.timeout = 1.0  # type: ignore[union-attr]
        events = await run_cmd(m, "silent-1", ["true"])
        assert events[-1]["ev"] == "error" and "did not answer within" in events[-1]["message"]
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_output_flood_streams_with_bounded_daemon_memory(tmp_path: Path, checkout: Path) -> None:
    """40 MB of output pass through while the daemon's memory grows by far less."""

    async def main() -> None:
        m, _ = make_manager(tmp_path, AGENTS)
        await _create(m, "flood-1", checkout)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        total = 0
        async for ev in m.exec("flood-1", ["yes"], None, None, None):
            if ev["ev"] == "out":
                total += len(ev["data"])
                await asyncio.sleep(0)  # a slow-ish client
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        assert total == 200 * 200_000
        assert peak < 16 * 1024 * 1024, peak
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 120))


def test_guest_breaking_the_mux_kills_only_its_own_box(tmp_path: Path, checkout: Path) -> None:
    """Data past its credit ends that box's transport; the daemon and other boxes go on."""

    async def main() -> None:
        m, _ = make_manager(tmp_path, AGENTS)
        await _create(m, "polite-1", checkout)
        try:  # the flood may land before or after the box is ready: both must contain it
            await _create(m, "linkflood-1", checkout)
        except GuestError as exc:
            assert "broke its transport" in str(exc)
        box = m.get("linkflood-1")
        for _ in range(50):  # the daemon first gives the VM a second to show it ended
            if box.state == "failed":
                break
            await asyncio.sleep(0.1)
        assert box.state == "failed"
        assert "broke its transport" in box.info.error
        assert "past its credit" in box.info.error or "unknown mux frame type" in box.info.error
        with pytest.raises(UserError, match="it is failed"):
            await run_cmd(m, "linkflood-1", ["true"])
        ok = await run_cmd(m, "polite-1", ["echo", "still", "fine"])
        assert ok[-1]["status"] == 0
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_patch_that_is_not_a_patch_is_saved_then_refused_by_apply(tmp_path: Path,
                                                                    checkout: Path) -> None:
    async def main() -> None:
        m, _ = make_manager(tmp_path, AGENTS)
        await _create(m, "notpatch-1", checkout)
        await m.stop("notpatch-1")
        with pytest.raises(Refused) as exc:
            await m.apply("notpatch-1", None, False, False)
        assert "\n" not in str(exc.value)
        assert (checkout / "a.txt").read_text() == "a\n"
        assert sorted(p.name for p in checkout.iterdir()) == ["a.txt"]
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_polite_guest_round_trip_records_every_crossing(tmp_path: Path, checkout: Path) -> None:
    async def main() -> None:
        m, signer = make_manager(tmp_path, AGENTS)
        await _create(m, "polite-1", checkout)
        events = await run_cmd(m, "polite-1", ["echo", "hi"])
        assert [e["ev"] for e in events] == ["started", "out", "exit"]
        await m.stop("polite-1")
        report = await m.apply("polite-1", None, False, False)
        assert (checkout / "hello.txt").read_text() == "hello\n"
        assert report["counts"]["applied"] == 1
        run = m.get("polite-1").run_id
        kinds = [r["kind"] for r in signer.of_run(run)]
        assert kinds[0] == "tkbox.run.open"
        actions = [r["action"] for r in signer.of_run(run, "tkbox.decision")]
        assert actions == ["Bash", "Write"]
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def _spying_guest(seen: list[bytearray]) -> Any:
    """The polite guest, keeping every byte each RPC connection brought it."""
    from fake_guests import boot, polite_rpc

    from tkbox.protocol.ports import PORT_RPC
    from tkbox.protocol.streams import ByteStream

    class Tap(ByteStream):
        def __init__(self, inner: ByteStream) -> None:
            self.inner, self.log = inner, bytearray()
            seen.append(self.log)

        async def receive(self, max_bytes: int = 65536) -> bytes:
            data = await self.inner.receive(max_bytes)
            self.log += data
            return data

        async def send_all(self, data: bytes) -> None:
            await self.inner.send_all(data)

        async def send_eof(self) -> None:
            await self.inner.send_eof()

        async def aclose(self) -> None:
            await self.inner.aclose()

    async def agent(ports: Any, spec: Any) -> None:
        await boot(ports)
        done = asyncio.Event()

        async def handler(stream: ByteStream) -> None:
            try:
                await polite_rpc(Tap(stream))
            except SystemExit:
                done.set()

        ports.serve(PORT_RPC, handler)
        await done.wait()

    return agent


def test_refused_command_never_reaches_the_guest(tmp_path: Path, checkout: Path) -> None:
    """A command the signer refuses, or cannot decide, is never sent to the guest: the
    guest's own view of its RPC port holds no exec request for it (and does hold one
    once the signer allows, so the spy sees what it should)."""
    from tkbox.protocol.framing import FrameDecoder

    seen: list[bytearray] = []

    def guest_ops() -> list[tuple[str, object]]:
        frames = [f for log in seen for f in FrameDecoder().feed(bytes(log))]
        return [(str(f.get("op")), f.get("argv")) for f in frames]

    async def main() -> None:
        m, signer = make_manager(tmp_path, {**AGENTS, "spy": _spying_guest(seen)})
        signer.policy = lambda run, action, res, ctx: (False, "no commands today")
        await _create(m, "spy-1", checkout)
        with pytest.raises(Refused, match="no commands today"):
            await run_cmd(m, "spy-1", ["echo", "refused"])
        signer.available = False
        with pytest.raises(Refused, match="signer did not answer"):
            await run_cmd(m, "spy-1", ["echo", "undecided"])
        await asyncio.sleep(0.1)  # anything in flight would have arrived by now
        assert [op for op in guest_ops() if op[0] == "exec"] == []
        signer.available = True
        signer.policy = lambda run, action, res, ctx: (True, "ok")
        events = await run_cmd(m, "spy-1", ["echo", "allowed"])
        assert events[-1]["ev"] == "exit"
        assert [op for op in guest_ops() if op[0] == "exec"] == [("exec", ["echo", "allowed"])]
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_hostile_values_in_well_formed_frames_are_sanitised(tmp_path: Path,
                                                           checkout: Path) -> None:
    """inf/NaN uptimes, bytes in patch stats and control characters in messages are
    neither trusted, stored nor shown raw."""
    from fake_guests import PATCH  # noqa: E402

    from tkbox.protocol.framing import FramedStream
    from tkbox.protocol.ports import PORT_BOOT, PORT_RPC

    async def sly(ports, spec):
        fs = FramedStream(await ports.connect(PORT_BOOT))
        await fs.receive()
        await fs.send({"ev": "ready", "uptime": float("inf")})
        await fs.aclose()
        done = asyncio.Event()

        async def rpc(stream):
            fs = FramedStream(stream)
            req = await fs.receive()
            if req["op"] == "exec":
                await fs.send({"ev": "started", "pid": 2})
                await fs.send({"ev": "exit", "status": 1, "signal": 0,
                               "error": "bad\n\x1b[31mtkbox: error: fake\x07"})
            elif req["op"] == "diff":
                await answer_diff(fs, req, PATCH, stats={"files": 1, "evil": b"\xff",
                                                        "huge": 2**60, "n": float("nan")})
            elif req["op"] == "shutdown":
                await fs.send({"ev": "ok"})
                done.set()

        ports.serve(PORT_RPC, rpc)
        await done.wait()

    async def main() -> None:
        m, signer = make_manager(tmp_path, {"sly": sly})
        await _create(m, "sly-1", checkout)
        ready = signer.of_run(m.get("sly-1").run_id, "tkbox.box.ready")
        assert ready[0]["body"]["guest_uptime_ms"] is None
        events = await run_cmd(m, "sly-1", ["true"])
        err = events[-1]["error"]
        assert "\n" not in err and "\x1b" not in err and "\x07" not in err
        box = await m.stop("sly-1")
        assert box.info.patch["stats"] == {"files": 1}
        assert box.state == "stopped"
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_gap_the_signer_refuses_does_not_hold_back_other_runs_gaps(tmp_path: Path,
                                                                     checkout: Path) -> None:
    """One run closed behind the daemon's back: its gap can never be recorded. The gaps
    of other runs are still written; a signer that does not answer keeps them all."""

    async def main() -> None:
        m, signer = make_manager(tmp_path, AGENTS)
        await _create(m, "polite-1", checkout)
        await _create(m, "polite-2", checkout)
        a, b = m.get("polite-1"), m.get("polite-2")
        await signer.close_run(a.run_id)
        m._gap(a, {"reason": "lost in a"})
        m._gap(b, {"reason": "lost in b"})
        await m.flush_gaps()
        assert [r["body"]["reason"] for r in signer.of_run(b.run_id, "tkbox.gap")] == \
            ["lost in b"]
        assert m.gaps == []
        signer.available = False
        m._gap(b, {"reason": "while down"})
        await m.flush_gaps()
        assert [g["reason"] for _, g in m.gaps] == ["while down"]  # kept, not dropped
        signer.available = True
        await m.flush_gaps()
        assert m.gaps == [] and len(signer.of_run(b.run_id, "tkbox.gap")) == 2
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))
