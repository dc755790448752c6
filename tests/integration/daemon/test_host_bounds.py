"""A hostile guest cannot hold `stop`, take the host's streams, or hide its run.

The daemon (`BoxManager`) runs for real; the VM is a guest coroutine behind a
real serial mux (the fake launcher). The refusal flood runs against a real
network door and, in its export test, a real signer process whose bundle is
verified offline. Each test names the attack it stops.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "signer"))
from fake_guests import (  # noqa: E402
    PATCH,
    answering,
    cut_off,
    flood_refusals,
    hog_streams,
    trickler,
)

from tkbox.daemon import guest_client  # noqa: E402
from tkbox.daemon import manager as manager_mod  # noqa: E402
from tkbox.daemon.manager import BoxManager, BoxSpec, Options  # noqa: E402
from tkbox.daemon.testing import FakeBuild, FakeBuilder, FakeImages, HoldingDoor  # noqa: E402
from tkbox.doors.network import ApprovalBoard, EgressDoor, OperatorConfig, SystemClock  # noqa: E402
from tkbox.doors.network.testing import FakeResolver  # noqa: E402
from tkbox.errors import GuestError  # noqa: E402
from tkbox.protocol.mux import MAX_STREAMS  # noqa: E402
from tkbox.record.client import SignerClient  # noqa: E402
from tkbox.record.testing import FakeSigner  # noqa: E402
from tkbox.vm.fake import FakeLauncher  # noqa: E402


def make(tmp: Path, agent: Any, signer: SignerClient | None = None,
         options: Options | None = None, door: str = "real") -> tuple[BoxManager, Any]:
    signer = signer if signer is not None else FakeSigner()
    m = BoxManager(launcher=FakeLauncher(agent), signer=signer, options=options or Options(),
                   images=FakeImages(tmp), guest_build=FakeBuilder(FakeBuild(tmp / "k", tmp / "i")),
                   home=tmp / "home")
    clock = SystemClock()
    board = ApprovalBoard(m.signer, clock)

    def real_door(box: Any) -> EgressDoor:
        def lost(exc: Exception) -> None:
            m.contain_soon(box, f"an egress record could not be kept ({exc})")

        return EgressDoor(box.run_id, m.signer, [], OperatorConfig(), FakeResolver({}), board,
                          clock, box=box.name, on_record_lost=lost)

    m.door_factory = real_door if door == "real" else (lambda box: HoldingDoor())
    return m, signer


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    return ws


async def create(m: BoxManager, name: str, ws: Path) -> None:
    await m.create(BoxSpec(name=name, image="x", workspace=str(ws), disk_mib=64))


async def cleanup(m: BoxManager) -> None:
    for name in list(m.boxes):
        await m.rm(name, force=True)


def test_guest_trickling_its_patch_cannot_hold_stop_and_the_whole_files_are_kept(
        tmp_path: Path, checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: send the diff one byte at a time, each frame inside the per-frame timeout,
    so `tkbox stop` never returns. Stop has one overall deadline; the files that arrived
    whole are kept as a partial patch, said so in the box and in the run."""
    monkeypatch.setattr(manager_mod, "STOP_DEADLINE", 1.5)

    async def main() -> None:
        m, signer = make(tmp_path, trickler(0.05))
        await create(m, "slow", checkout)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        box = await m.stop("slow")
        assert loop.time() - t0 < 10
        assert box.state == "stopped"
        assert (box.dir / "patch.diff").read_bytes() == PATCH  # the trickled bytes: cut
        assert box.info.patch["partial"] is True
        assert "did not finish sending its patch in time" in box.info.patch["error"]
        rec = signer.of_run(box.run_id, "tkbox.patch")[0]["body"]
        assert rec["partial"] is True and rec["bytes"] == len(PATCH)
        assert "did not finish sending its patch in time" in rec["error"]
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_guest_dying_mid_patch_leaves_a_partial_patch_that_applies(
        tmp_path: Path, checkout: Path) -> None:
    """The guest ends in the middle of its third file: the two whole files are kept, the
    box is stopped (not failed), and the changes door applies what was kept."""
    one = (b"diff --git a/one.txt b/one.txt\nnew file mode 100644\n"
           b"index 0000000000000000000000000000000000000000.."
           b"5626abf0f72e58d7a153368ba57db4c673c0e171\n"
           b"--- /dev/null\n+++ b/one.txt\n@@ -0,0 +1 @@\n+one\n")
    third = PATCH.replace(b"hello", b"three")[:60]

    async def main() -> None:
        m, signer = make(tmp_path, cut_off(one, PATCH, then=third))
        await create(m, "cut", checkout)
        box = await m.stop("cut")
        assert box.state == "stopped" and box.info.patch["partial"] is True
        assert (box.dir / "patch.diff").read_bytes() == one + PATCH
        report = await m.apply("cut", None, allow_sensitive=False, dry_run=False)
        assert {f["path"]: f["status"] for f in report["files"]} == {
            "one.txt": "applied", "hello.txt": "applied"}
        assert any("partial" in n for n in report["notes"])
        assert (checkout / "one.txt").read_text() == "one\n"
        assert (checkout / "hello.txt").read_text() == "hello\n"
        assert signer.of_run(box.run_id, "tkbox.patch")[0]["body"]["partial"] is True
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_guest_trickling_a_file_copied_out_cannot_hold_cp(
        tmp_path: Path, checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: answer `tkbox cp BOX:FILE` one byte a frame, each inside the per-frame
    timeout. The copy has one overall deadline, and nothing crosses: no Write decision."""
    monkeypatch.setattr(guest_client, "READ_DEADLINE", 1.5)

    async def main() -> None:
        m, signer = make(tmp_path, trickler(0.05))
        await create(m, "slow", checkout)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(GuestError, match="did not finish sending '/workspace/notes.txt' "
                                             "in time"):
            await m.copy_out("slow", "notes.txt", str(tmp_path / "out.txt"))
        assert loop.time() - t0 < 10
        assert not signer.of_run(m.get("slow").run_id, "tkbox.decision")
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_guest_holding_every_stream_cannot_stop_exec_or_the_diff(tmp_path: Path,
                                                                 checkout: Path) -> None:
    """Attack: open every mux stream the guest may have (and keep them), so the host
    has none left to run a command or ask for the patch at stop."""

    async def main() -> None:
        m, _ = make(tmp_path, answering(hog_streams), door="hold")
        await create(m, "hog", checkout)
        vm = m.get("hog").vm
        guest_ports = vm.guest_ports  # type: ignore[union-attr]
        for _ in range(200):
            if getattr(guest_ports, "hogged", None) is not None:
                break
            await asyncio.sleep(0.05)
        assert guest_ports.hogged >= MAX_STREAMS - 2  # all it may open (it keeps 2 of its own)
        host_core = vm.ports._core  # type: ignore[union-attr]
        assert host_core.stream_count - host_core.own_stream_count == guest_ports.hogged
        events = [e async for e in m.exec("hog", ["true"], None, None, None)]
        assert events[-1]["ev"] == "exit" and events[-1]["status"] == 0
        box = await m.stop("hog")
        assert box.state == "stopped" and box.info.patch["bytes"] > 0
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_refusal_flood_writes_bounded_excerpts_and_a_summary(tmp_path: Path,
                                                             checkout: Path) -> None:
    """Attack: one bad request after another, each reason quoting 8 KB of guest bytes,
    to grow the shared log without limit. Each record is an escaped excerpt, and past
    the first few a minute, refusals are counted in one summary record."""

    async def main() -> None:
        m, signer = make(tmp_path, answering(flood_refusals))
        await create(m, "flood", checkout)
        run = m.get("flood").run_id
        await asyncio.sleep(1.5)
        await m.stop("flood")
        refusals = signer.of_run(run, "tkbox.egress.refused")
        summaries = signer.of_run(run, "tkbox.egress.refused.summary")
        assert 1 <= len(refusals) <= 32
        assert summaries and summaries[-1]["body"]["refusals"] > 0
        for r in refusals:
            reason = r["body"]["reason"]
            assert len(reason) <= 260 and "\t" not in reason and "chars)" in reason, reason
        size = sum(len(repr(r)) for r in signer.of_run(run))
        assert size < 64 * 1024, size
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_run_past_its_record_budget_stops_the_box_and_still_exports_and_verifies(
        tmp_path: Path, checkout: Path) -> None:
    """Attack: make records until the run is too big to export, so it can never be read.
    The box stops at its budget, a record says so, and the bundle verifies offline."""
    from signer_proc import SignerProc

    from tkbox.verify import verify_bundle

    proc = SignerProc()
    try:
        proc.start()

        async def main() -> Any:
            client = proc.client()
            # a small budget, reached quickly by refusals each recorded on their own
            m, _ = make(tmp_path, answering(flood_refusals), signer=client,
                        options=Options(run_records=60, run_bytes=1 << 30))
            await create(m, "budget", checkout)
            box = m.get("budget")
            box.door._refusals.full = 10**9  # every refusal its own record: reach the budget
            for _ in range(300):
                if box.state == "failed":
                    break
                await asyncio.sleep(0.05)
            assert box.state == "failed", box.state
            assert "record budget" in box.info.error
            await asyncio.sleep(0.2)
            exported = await m.export("budget")  # closes the run: the close is never refused
            await client.aclose()
            return exported

        bundle, trust = asyncio.run(asyncio.wait_for(main(), 120))
        report = verify_bundle(bundle, trust)  # raises on any integrity failure
        text = bundle.decode("utf-8", "replace")
        assert 60 <= report.records <= 60 + 20, report.records
        import base64
        import json

        bodies = [json.loads(base64.b64decode(line[6:]))
                  for line in text.splitlines() if line.startswith("extra ")]
        contained = [b for b in bodies if b.get("kind") == "tkbox.containment"]
        assert contained and "record budget" in json.dumps(contained[0])
    finally:
        proc.cleanup()


def test_guest_flooding_opens_without_reading_grows_no_host_memory(tmp_path: Path,
                                                                   checkout: Path) -> None:
    """Attack: stop reading the port and open streams to a port nobody serves, so the
    host's queue of answers grows until the daemon (and every box) is killed for memory.
    The host stops reading that guest instead; another box keeps working."""
    import tracemalloc

    from fake_guests import open_flood_without_reading, polite

    async def dispatch(ports: Any, spec: Any) -> None:
        agent = answering(open_flood_without_reading) if spec.name == "flood" else polite
        await agent(ports, spec)

    async def main() -> None:
        m, _ = make(tmp_path, dispatch, door="hold")
        await create(m, "polite", checkout)
        await create(m, "flood", checkout)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(10):
            events = [e async for e in m.exec("polite", ["true"], None, None, None)]
            assert events[-1]["ev"] == "exit", events
            await asyncio.sleep(0.2)
        grown = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        ports = m.get("flood").vm.ports  # type: ignore[union-attr]
        assert grown < 8 << 20, grown
        assert ports.budget.throttled > 0 or ports.paused_reads > 0
        assert m.get("flood").state == "running"  # not a violation: only slowed
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_boot_answer_with_a_smuggled_key_fails_the_box(tmp_path: Path, checkout: Path) -> None:
    """Attack: a well-formed boot answer carrying keys the host does not expect."""
    from tkbox.protocol.framing import FramedStream
    from tkbox.protocol.ports import PORT_BOOT

    async def sly(ports: Any, spec: Any) -> None:
        fs = FramedStream(await ports.connect(PORT_BOOT))
        await fs.receive()
        await fs.send({"ev": "ready", "uptime": 1.0, "extra": b"x" * 100})
        await asyncio.Event().wait()

    async def main() -> None:
        m, _ = make(tmp_path, sly)
        with pytest.raises(GuestError, match="unknown keys are refused"):
            await create(m, "sly", checkout)
        assert m.get("sly").state == "failed"
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))
