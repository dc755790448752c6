"""The guest agent RPC conformance suite: what the host relies on from a guest agent,
checked against every implementation, through the host's own client (`GuestClient`).

- `fake`: `tkbox.guest.testing.FakeGuest`, the fake users' tests run against;
- `agent`: the real agent's serve loop (`tkbox.guest.serve.Agent.handle_rpc`), run in
  this process on the host: commands start through a `tkbox-spawn` built from
  `spawn.c` as the guest build does (`compile_spawn`), the box's root is `/` (the
  helper chroots there: root only), the workspace layers are two directories of
  a temporary folder, and "kill every process" is a recorder (on a host it would
  kill the test runner).

Both are reached over `MemoryPorts` (memory streams, no VM). What only a VM can
show is not here, and why: the workspace as an overlay of the lower and upper
disks (the host has no such mount, so each harness sets a change up in its own
layers, `change`); the commands' cgroup and the image's user (PID 1's boot
duties, `tkbox.guest.boot`); the e2e tests boot the real guest for those.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tkbox.daemon.guest_client import GuestClient, PatchProgress
from tkbox.doors.changes.patch import apply_section, parse_patch
from tkbox.errors import GuestError, HostError
from tkbox.guest import rpc
from tkbox.guest.boot import Reaper
from tkbox.guest.diff import WHY_IGNORED
from tkbox.guest.serve import Agent
from tkbox.guest.testing import FakeGuest, MemoryPorts
from tkbox.protocol.framing import GUEST_FRAMES, FramedStream
from tkbox.protocol.ports import PORT_RPC

SPAWN_C = Path(rpc.__file__).with_name("spawn.c")


@dataclass
class Harness:
    name: str
    client: GuestClient
    ports: MemoryPorts
    cwd: str  # the directory commands run in
    path: Callable[[str], str]  # a workspace-relative path as the box names it
    change: Callable[[str, bytes | None, bytes | None], None]  # set up a workspace change
    kills: Callable[[], int]  # how often the guest stopped every process


@contextlib.asynccontextmanager
async def fake_harness(tmp: Path) -> AsyncIterator[Harness]:
    guest = FakeGuest()

    def change(rel: str, old: bytes | None, new: bytes | None) -> None:
        if old is not None:
            guest.lower[rel] = old
        guest.files.pop("/workspace/" + rel, None)
        if new is not None:
            guest.files["/workspace/" + rel] = (0o100644, new)

    ports = MemoryPorts(guest.handle_rpc)
    try:
        yield Harness("fake", GuestClient(ports, "conformance"), ports, "/workspace",
                      lambda rel: "/workspace/" + rel, change, lambda: guest.kills)
    finally:
        await ports.aclose()


@contextlib.asynccontextmanager
async def agent_harness(tmp: Path, helper: Path) -> AsyncIterator[Harness]:
    lower, upper, ws = tmp / "lower", tmp / "upper", tmp / "workspace"
    for d in (lower, upper, ws):
        d.mkdir()
    loop = asyncio.get_running_loop()
    reaper = Reaper()
    reaper.install(loop)
    kills: list[int] = []
    agent = Agent(MemoryPorts(lambda s: s.aclose()),
                  {"env": {"PATH": "/usr/bin:/bin"}, "root": "/"}, reaper, helper=str(helper),
                  lower=lower, upper=upper, kill_all=lambda: kills.append(1))

    def change(rel: str, old: bytes | None, new: bytes | None) -> None:
        # What the overlay would hold: the checkout in lower, the new content in upper.
        if old is not None:
            (lower / rel).write_bytes(old)
        if new is not None:
            (upper / rel).write_bytes(new)
        else:
            os.mknod(upper / rel, 0o020000, os.makedev(0, 0))  # an overlay whiteout

    ports = MemoryPorts(agent.handle_rpc)
    try:
        yield Harness("agent", GuestClient(ports, "conformance"), ports, str(ws),
                      lambda rel: str(ws / rel), change, lambda: len(kills))
    finally:
        await ports.aclose()
        loop.remove_signal_handler(signal.SIGCHLD)


@pytest.fixture(scope="module")
def spawn_helper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tkbox.image.initramfs import compile_spawn

    try:
        built = compile_spawn(SPAWN_C)
    except HostError as exc:
        pytest.skip(f"the real agent's commands need tkbox-spawn: {exc}")
    out = tmp_path_factory.mktemp("spawn") / "tkbox-spawn"
    out.write_bytes(built)
    out.chmod(0o755)
    return out


Case = Callable[[Harness], Coroutine[Any, Any, None]]


@pytest.fixture(params=["fake", "agent"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[Case], None]:
    """Run one case against the harness the test is parametrised with."""
    if request.param == "agent":
        if os.geteuid() != 0:
            pytest.skip("the real agent's commands chroot (root only)")
        helper = request.getfixturevalue("spawn_helper")

        def make() -> contextlib.AbstractAsyncContextManager[Harness]:
            return agent_harness(tmp_path, helper)
    else:
        def make() -> contextlib.AbstractAsyncContextManager[Harness]:
            return fake_harness(tmp_path)

    def go(case: Case) -> None:
        async def main() -> None:
            async with make() as h:
                await case(h)

        asyncio.run(asyncio.wait_for(main(), 60))

    return go


async def _exec(h: Harness, argv: list[str], stdin: bytes | None = None
                ) -> tuple[int, str, dict[int, bytes]]:
    out: dict[int, bytes] = {1: b"", 2: b""}

    async def sink(fd: int, data: bytes) -> None:
        out[fd] += data

    r = await h.client.exec(argv, cwd=h.cwd, env={"TKBOX_CASE": "1"}, stdin=stdin,
                            output=sink, signals=asyncio.Queue())
    return r.status, r.error, out


def test_exec_feeds_stdin_in_chunks_and_returns_output_and_exit_status(
        run: Callable[[Case], None]) -> None:
    data = bytes(range(256)) * 2000  # 512 KiB: more than one stdin and output frame

    async def case(h: Harness) -> None:
        status, error, out = await _exec(h, ["cat"], data)
        assert (status, error, out) == (0, "", {1: data, 2: b""})
        status, error, out = await _exec(h, ["false"])
        assert (status, error, out[1]) == (1, "", b"")
        status, error, _ = await _exec(h, ["echo", "hello", "there"])
        assert status == 0

    run(case)


def test_a_command_that_cannot_start_exits_127_and_says_why(
        run: Callable[[Case], None]) -> None:
    async def case(h: Harness) -> None:
        status, error, out = await _exec(h, ["no-such-command-here"])
        assert status == 127 and out == {1: b"", 2: b""}
        assert error == "cannot start 'no-such-command-here': No such file or directory"

    run(case)


def test_a_file_written_reads_back_byte_for_byte(run: Callable[[Case], None]) -> None:
    data = os.urandom(rpc.CHUNK * 2 + 17)  # three data frames each way

    async def case(h: Harness) -> None:
        await h.client.write_file(h.path("notes/deep/a.bin"), data, mode=0o600)
        sink = io.BytesIO()
        assert await h.client.read_file(h.path("notes/deep/a.bin"), sink) == len(data)
        assert sink.getvalue() == data
        await h.client.write_file(h.path("empty"), b"")
        empty = io.BytesIO()
        assert await h.client.read_file(h.path("empty"), empty) == 0

    run(case)


def test_a_write_below_a_file_and_a_read_of_nothing_are_refused_with_error(
        run: Callable[[Case], None]) -> None:
    async def case(h: Harness) -> None:
        await h.client.write_file(h.path("plain.txt"), b"x")
        with pytest.raises(GuestError, match="guest agent error: FileExistsError"):
            await h.client.write_file(h.path("plain.txt/child"), b"y")
        with pytest.raises(GuestError, match="guest agent error: FileNotFoundError"):
            await h.client.read_file(h.path("never-written"), io.BytesIO())
        with pytest.raises(GuestError, match="guest agent error: .*path"):
            await h.client.read_file("relative/path", io.BytesIO())

    run(case)


def test_ping_answers_with_an_uptime(run: Callable[[Case], None]) -> None:
    async def case(h: Harness) -> None:
        up = await h.client.ping()
        assert isinstance(up, float) and 0 <= up < 60

    run(case)


def test_diff_of_a_small_change_is_a_patch_that_applies(run: Callable[[Case], None]) -> None:
    async def case(h: Harness) -> None:
        h.change("a.txt", b"one\ntwo\nthree\n", b"one\n2\nthree\n")
        h.change("new.txt", None, b"hello\n")
        h.change("gone.txt", b"bye\n", None)
        sink, progress = io.BytesIO(), PatchProgress()
        await h.client.diff(sink, progress, kill=True)
        assert h.kills() == 1  # nothing may change the workspace while it is read
        assert progress.done and progress.marked == progress.bytes == len(sink.getvalue())
        old = {"a.txt": b"one\ntwo\nthree\n", "gone.txt": b"bye\n"}
        sections = parse_patch(sink.getvalue()).sections
        assert sorted(s.path for s in sections) == ["a.txt", "gone.txt", "new.txt"]
        after = {s.path: apply_section(s, old.get(s.path), 1 << 20) for s in sections}
        assert after == {"a.txt": b"one\n2\nthree\n", "new.txt": b"hello\n", "gone.txt": None}
        assert {k: progress.stats[k] for k in ("added", "modified", "deleted")} == \
            {"added": 1, "modified": 1, "deleted": 1}

    run(case)


def test_diff_asks_which_paths_are_ignored_and_sets_them_apart(
        run: Callable[[Case], None]) -> None:
    async def case(h: Harness) -> None:
        h.change("keep.txt", None, b"keep\n")
        h.change("debug.log", None, b"noise\n")
        asked: list[list[bytes]] = []

        async def ignored(paths: list[bytes]) -> set[bytes]:
            asked.append(sorted(paths))
            return {b"debug.log"}

        sink, progress = io.BytesIO(), PatchProgress()
        await h.client.diff(sink, progress, kill=False, ignored=ignored)
        assert asked == [[b"debug.log", b"keep.txt"]] and h.kills() == 0
        assert [s.path for s in parse_patch(sink.getvalue()).sections] == ["keep.txt"]
        assert [(a.path, a.change, a.size, a.why) for a in progress.set_apart] == \
            [("debug.log", "added", 6, WHY_IGNORED)]

    run(case)


def test_an_unknown_op_or_a_malformed_request_is_answered_with_error(
        run: Callable[[Case], None]) -> None:
    async def case(h: Harness) -> None:
        for request, why in [({"op": "frobnicate"}, "unknown op 'frobnicate'"),
                             ({"op": "read", "path": "relative"}, "('path')"),
                             ({"op": "exec", "argv": []}, "('argv')"),
                             ({"op": "ping", "smuggled": 1}, "unknown key 'smuggled'"),
                             ({"nop": 1}, "a request without an op")]:
            fs = FramedStream(await h.ports.connect(PORT_RPC), limits=GUEST_FRAMES)
            await fs.send(request)
            answer = rpc.parse_event("ping", await fs.receive())
            assert isinstance(answer, rpc.Error) and why in answer.message, (request, answer)
            await fs.aclose()

    run(case)


def test_shutdown_stops_every_process_and_says_ok(run: Callable[[Case], None]) -> None:
    async def case(h: Harness) -> None:
        await h.client.shutdown()
        assert h.kills() == 1

    run(case)
