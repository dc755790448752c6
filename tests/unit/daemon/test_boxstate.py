"""A box's state record: the `box.json` of every earlier daemon is read and written
back unchanged, a damaged one is refused with a one-line error, and only the
lifecycle table moves a state."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tkbox.daemon.box import Box
from tkbox.daemon.boxstate import BoxState, BoxStateUnreadable
from tkbox.daemon.lifecycle import Event, State
from tkbox.daemon.manager import BoxManager, Options
from tkbox.daemon.testing import FakeBuild, FakeBuilder, FakeImages
from tkbox.errors import HostError, UserError
from tkbox.record.testing import FakeSigner
from tkbox.vm.fake import FakeLauncher

#: a box.json exactly as the daemon wrote it before the state was typed (a stopped box,
#: applied once); the keys are sorted, as `json.dumps(..., sort_keys=True)` wrote them
OLD_STOPPED: dict[str, Any] = {
    "accel": "tcg", "allow": ["pypi"], "applied": [{"checkout": "/w", "time": 1.5}],
    "boot_seconds": 9.25, "created": 1700000000.125, "env_names": ["A"],
    "guest_build": "ab" * 8, "image": "tkbox/default", "image_config": {},
    "image_digest": "sha256:" + "1" * 64, "inspect": "bound", "kernel": "6.1.0-28-amd64",
    "limits": {"disk_mib": 4096, "memory_mib": 1024, "vcpus": 1}, "model_hosts": [],
    "name": "job-1", "patch": {"bytes": 10, "sha256": "2" * 64, "stats": {"files": 1}},
    "run_id": "job-1-0123456789ab", "secrets": [{"name": "TOKEN", "source": "env:T",
                                                "hosts": ["api.example"], "header": ""}],
    "start": {"kind": "cold", "reason": "no template"}, "state": "stopped",
    "timeout_s": None, "unrecorded": False, "updated": 1700000100, "vm_exit": 0,
    "workspace": "/w", "workspace_copy": {"bytes": 4, "files": 1},
}

#: a box that failed during boot: no start, no boot time, no patch, an error
OLD_FAILED: dict[str, Any] = {
    k: v for k, v in OLD_STOPPED.items()
    if k not in ("applied", "boot_seconds", "patch", "start", "vm_exit")
} | {"state": "failed", "error": "box job-1 did not boot within 180s", "timeout_s": 60}


async def no_guest(ports: object, spec: object) -> None:
    return None


def written(d: dict[str, Any]) -> str:
    return json.dumps(d, indent=1, sort_keys=True)


@pytest.mark.parametrize("old", [OLD_STOPPED, OLD_FAILED], ids=["stopped", "failed"])
def test_an_old_box_json_is_read_and_written_back_byte_for_byte(tmp_path: Path,
                                                               old: dict[str, Any]) -> None:
    (tmp_path / "box.json").write_text(written(old))
    info = BoxState.load(tmp_path / "box.json")
    assert info.state == State(old["state"]) and info.name == "job-1"
    info.save(tmp_path)
    assert (tmp_path / "box.json").read_text() == written(old)


def test_keys_a_newer_daemon_wrote_are_kept(tmp_path: Path) -> None:
    newer = OLD_STOPPED | {"template": {"digest": "x"}}
    info = BoxState.from_json(newer)
    assert info.to_json() == newer


def test_the_api_shows_what_the_daemon_always_showed(tmp_path: Path) -> None:
    box = Box(tmp_path, BoxState.from_json(OLD_STOPPED | {"env_values": {"A": "never shown"}}))
    shown = box.public()
    assert shown == OLD_STOPPED | {"display_name": "job-1"}


@pytest.mark.parametrize("damage, why", [
    ([], "not a JSON object"),
    ({**OLD_STOPPED, "state": "sleeping"}, "unknown state"),
    ({**OLD_STOPPED, "name": 7}, "'name' is not a string"),
    ({**OLD_STOPPED, "created": True}, "'created' is not a number"),
    ({**OLD_STOPPED, "allow": ["a", 1]}, "'allow' is not a list of strings"),
    ({**OLD_STOPPED, "patch": "x"}, "'patch' is not an object"),
    ({**OLD_STOPPED, "unrecorded": "no"}, "'unrecorded' is not true or false"),
    ({**OLD_STOPPED, "vm_exit": 1.5}, "'vm_exit' is not an integer"),
])
def test_a_damaged_box_json_is_a_one_line_host_error(damage: object, why: str) -> None:
    with pytest.raises(BoxStateUnreadable, match=why) as exc:
        BoxState.from_json(damage)
    assert isinstance(exc.value, HostError) and "\n" not in str(exc.value)


def test_a_file_that_is_not_json_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "box.json").write_text("{not json")
    with pytest.raises(BoxStateUnreadable, match="cannot be read"):
        BoxState.load(tmp_path / "box.json")


def test_only_the_table_moves_a_state() -> None:
    info = BoxState.from_json(OLD_STOPPED)
    with pytest.raises(AttributeError):
        info.state = State.RUNNING  # type: ignore[misc]
    with pytest.raises(UserError, match="cannot stop box job-1: it is stopped"):
        info.move(Event.STOP)
    assert info.state == State.STOPPED  # a refused move changes nothing
    assert info.move(Event.EXPORT) == State.EXPORTED and info.to_json()["state"] == "exported"


def test_a_restarted_daemon_reads_old_boxes_fails_the_live_ones_and_records_the_gap(
        tmp_path: Path) -> None:
    """What `tkbox daemon` does at start with the boxes an earlier daemon left."""
    home = tmp_path / "home"
    live = OLD_FAILED | {"name": "was-running", "run_id": "was-running-1", "state": "running"}
    del live["error"]
    boxes = {"was-running": live, "job-1": OLD_STOPPED, "damaged": {"state": 1}}
    for name, d in boxes.items():
        (home / "boxes" / name).mkdir(parents=True)
        (home / "boxes" / name / "box.json").write_text(written(d))
    signer = FakeSigner()

    async def main() -> BoxManager:
        await signer.open_run("was-running-1", {})
        m = BoxManager(launcher=FakeLauncher(no_guest), signer=signer,
                       options=Options(), images=FakeImages(tmp_path),
                       guest_build=FakeBuilder(FakeBuild(tmp_path / "k", tmp_path / "i")),
                       home=home)
        await m.load()
        return m

    m = asyncio.run(main())
    assert sorted(m.boxes) == ["job-1", "was-running"]  # the damaged one is left as is
    assert (home / "boxes" / "damaged" / "box.json").read_text() == written({"state": 1})
    box = m.get("was-running")
    assert box.state == State.FAILED
    assert box.info.error == "the daemon stopped while the box was running; its VM is gone"
    on_disk = json.loads((home / "boxes" / "was-running" / "box.json").read_text())
    assert on_disk == live | {"state": "failed", "error": box.info.error,
                              "updated": on_disk["updated"]}
    gaps = signer.of_run("was-running-1", "tkbox.gap")
    assert [g["body"]["state"] for g in gaps] == ["running"]
    assert m.get("job-1").info.to_json() == OLD_STOPPED  # a final state is left be
