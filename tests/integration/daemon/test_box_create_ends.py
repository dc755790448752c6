"""A box that is never made: its disks' threads end first, and its run says why.

The daemon (`BoxManager`) runs for real, with the real workspace copy
(`build_lower` through tar2sqfs) and the real `mkfs.ext4`; the signer is the
in-process fake, whose records the tests read.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from tkbox.daemon import manager as manager_mod
from tkbox.daemon import workspace as workspace_mod
from tkbox.daemon.manager import BoxManager, BoxSpec, Options
from tkbox.daemon.testing import FakeBuild, FakeBuilder, FakeImages
from tkbox.errors import HostError
from tkbox.record.testing import FakeSigner
from tkbox.vm.fake import FakeLauncher


async def no_guest(ports: object, spec: object) -> None:
    raise AssertionError("a box that is never made boots no guest")


def manager(tmp: Path, signer: FakeSigner) -> BoxManager:
    return BoxManager(launcher=FakeLauncher(no_guest), signer=signer, options=Options(),
                      images=FakeImages(tmp), home=tmp / "home",
                      guest_build=FakeBuilder(FakeBuild(tmp / "k", tmp / "i")))


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(50):
        (ws / f"f{i}.txt").write_text(f"{i}\n")
    return ws


def left_in(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".creating-"))


def the_run(signer: FakeSigner) -> str:
    (opened,) = [r for r in signer.records if r["kind"] == "tkbox.run.open"]
    return str(opened["run"])


def test_a_create_cancelled_while_the_workspace_is_copied_stops_the_copy_and_says_so(
        tmp_path: Path, checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon stopping cancels a create while its copy thread runs: the task ends
    only once the thread has (stopped at the next file, tar2sqfs killed), nothing is
    left under the daemon's root, and the run records why it ended and is closed."""
    copying, release = threading.Event(), threading.Event()
    ended: list[str] = []
    real_configs = workspace_mod._git_configs
    real_build = workspace_mod.build_lower

    def slow_configs(root: Path, stats: dict[str, int]) -> Any:
        copying.set()
        release.wait(10)  # the cancellation arrives here, before the first file
        return real_configs(root, stats)

    def build_lower(*args: Any, **kw: Any) -> dict[str, int]:
        try:
            return real_build(*args, **kw)
        except BaseException as exc:
            ended.append(str(exc))
            raise

    monkeypatch.setattr(workspace_mod, "_git_configs", slow_configs)
    monkeypatch.setattr(manager_mod, "build_lower", build_lower)
    signer = FakeSigner()

    async def main() -> None:
        m = manager(tmp_path, signer)
        task = asyncio.create_task(m.create(BoxSpec(name="b", image="x",
                                                    workspace=str(checkout), disk_mib=64)))
        await asyncio.to_thread(copying.wait, 10)
        task.cancel()
        await asyncio.sleep(0.2)
        assert not task.done(), "the create ended while its copy thread still ran"
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ended == ["the workspace copy was stopped"]
        assert left_in(m.root) == [], "the box's staging directory was left behind"
        assert "b" not in m.boxes

    asyncio.run(main())
    run = the_run(signer)
    (failed,) = signer.of_run(run, "tkbox.box.failed")
    assert failed["body"] == {
        "reason": "cancelled while the box was created (the daemon stopping)",
        "stage": "create"}
    assert [r["kind"] for r in signer.of_run(run)][-1] == "tkbox.run.close"


def test_a_box_whose_disk_cannot_be_made_ends_its_run_with_the_reason(
        tmp_path: Path, checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure after the run was opened (here the upper disk) is in the run's record,
    and the run is closed: before, it stayed open with nothing but its facts."""
    def no_upper(target: Path, size_mib: int, owner: object = None) -> None:
        raise HostError("mkfs.ext4 failed: no space left on device")

    monkeypatch.setattr(manager_mod, "build_upper", no_upper)
    signer = FakeSigner()

    async def main() -> None:
        m = manager(tmp_path, signer)
        with pytest.raises(HostError, match="no space left"):
            await m.create(BoxSpec(name="b", image="x", workspace=str(checkout), disk_mib=64))
        assert left_in(m.root) == []

    asyncio.run(main())
    run = the_run(signer)
    assert [(r["kind"], r.get("body")) for r in signer.of_run(run)][1:] == [
        ("tkbox.box.failed", {"reason": "mkfs.ext4 failed: no space left on device",
                              "stage": "create"}),
        ("tkbox.run.close", None)]


def test_a_signer_gone_when_a_create_fails_leaves_a_gap_for_the_next_flush(
        tmp_path: Path, checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure cannot be recorded now: it waits as a gap, recorded once the signer
    answers again, and the create's own error is the one raised."""
    signer = FakeSigner()

    def no_upper(target: Path, size_mib: int, owner: object = None) -> None:
        signer.available = False  # the signer goes away while the disk is made
        raise HostError("mkfs.ext4 failed: broken")

    monkeypatch.setattr(manager_mod, "build_upper", no_upper)

    async def main() -> None:
        m = manager(tmp_path, signer)
        with pytest.raises(HostError, match="broken"):
            await m.create(BoxSpec(name="b", image="x", workspace=str(checkout), disk_mib=64))
        signer.available = True
        await m.flush_gaps()

    asyncio.run(main())
    run = the_run(signer)
    (gap,) = signer.of_run(run, "tkbox.gap")
    assert gap["body"]["reason"] == "not created: mkfs.ext4 failed: broken"
    assert gap["body"]["box"] == "b"
