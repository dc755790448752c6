"""What a box's patch leaves out reaches the box, the run and `tkbox apply`; a guest
that answers its diff wrongly costs no more than the files it did not finish.

The daemon (`BoxManager`) runs for real against a real git checkout; the guest is a
coroutine behind a real serial mux (the fake launcher) that writes the `diff`
answers a test gives it. Each hostile case is named for what it tries.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fake_guests import PATCH, answer_diff_start, diff_by  # noqa: E402
from test_host_bounds import cleanup, create, make  # noqa: E402

from tkbox.guest import rpc  # noqa: E402
from tkbox.guest.testing import answer_diff  # noqa: E402
from tkbox.protocol.framing import FramedStream  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".gitignore").write_text("node_modules/\n*.log\n")
    (ws / "kept.log").write_text("tracked, so never ignored\n")
    (ws / "a.txt").write_text("a\n")
    env = {"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for argv in (["init", "-q"], ["add", "-A"], ["add", "-f", "kept.log"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        subprocess.run(["git", *argv], cwd=ws, env=env, check=True)
    return ws


def test_the_host_tells_the_guest_which_changed_paths_the_checkout_ignores(
        tmp_path: Path, repo: Path) -> None:
    """The guest asks; the host answers with the checkout's own git, as apply decides.
    A path git cannot be asked about (outside the checkout, git's own) is not ignored."""
    asked = [b"debug.log", b"kept.log", b"node_modules/x/a.js", b"src/x.py", b"../escape",
             b".git/config", b"a//b"]
    told: dict[str, set[bytes]] = {}

    async def answer(fs: FramedStream, req: dict[str, Any]) -> None:
        assert req["ask_ignored"] is True
        await fs.send({"ev": "paths", "data": b"\x00".join(asked) + b"\x00"})
        await fs.send({"ev": "paths_end", "count": len(asked)})
        bits = (await fs.receive())["bits"]  # type: ignore[index]
        told["ignored"] = {p for i, p in enumerate(asked) if bits[i >> 3] & (1 << (i & 7))}
        await fs.send({"ev": "end", "stats": {}})

    async def main() -> None:
        m, _ = make(tmp_path, diff_by(answer))
        await create(m, "ask", repo)
        box = await m.stop("ask")
        assert box.state == "stopped" and box.info.patch["partial"] is False
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))
    assert told["ignored"] == {b"debug.log", b"node_modules/x/a.js"}


BIG = {"path": b".tools/claude", "change": "added", "size": 373_019_152,
       "sha256": hashlib.sha256(b"claude").hexdigest(), "why": "file-too-large"}
IGNORED = {"path": b"node_modules/x.js", "change": "added", "size": 12,
           "sha256": hashlib.sha256(b"x").hexdigest(), "why": "ignored"}


def test_set_apart_changes_reach_the_box_the_run_and_apply(tmp_path: Path, repo: Path) -> None:
    async def answer(fs: FramedStream, req: dict[str, Any]) -> None:
        await answer_diff(fs, req, PATCH, apart=[BIG, IGNORED],
                          stats={"added": 1, "apart_file-too-large": 1,
                                 "apart_file-too-large_bytes": BIG["size"],
                                 "apart_ignored": 1, "apart_ignored_bytes": 12})

    async def main() -> None:
        m, signer = make(tmp_path, diff_by(answer))
        await create(m, "apart", repo)
        box = await m.stop("apart")
        p = box.info.patch
        assert p["partial"] is False
        assert [a["path"] for a in p["set_apart"]] == [".tools/claude", "node_modules/x.js"]
        assert p["apart"] == {"file-too-large": {"count": 1, "bytes": BIG["size"]},
                              "ignored": {"count": 1, "bytes": 12}}
        rec = signer.of_run(box.run_id, "tkbox.patch")[0]["body"]
        assert rec["set_apart"][0] == {"path": ".tools/claude", "change": "added",
                                       "size": BIG["size"], "sha256": BIG["sha256"],
                                       "why": "file-too-large"}
        assert (rec["set_apart_count"], rec["added"], rec["partial"]) == (2, 1, False)
        report = await m.apply("apart", None, allow_sensitive=False, dry_run=False)
        rows = {f["path"]: f for f in report["files"]}
        assert rows["hello.txt"]["status"] == "applied"
        assert rows[".tools/claude"]["status"] == "set apart"
        assert rows[".tools/claude"]["sha256"] == BIG["sha256"]
        assert "node_modules/x.js" not in rows  # counted in a note: apply ignores it too
        assert any("1 changes the checkout's git ignores" in n for n in report["notes"])
        assert report["counts"]["set apart"] == 1
        assert (repo / "hello.txt").read_text() == "hello\n"
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 60))


async def _paths_then(fs: FramedStream, req: dict[str, Any], *frames: dict[str, Any]) -> None:
    await answer_diff_start(fs, req)
    for f in frames:
        await fs.send(f)


def _case(*frames: dict[str, Any], ask: bool = True) -> Any:
    async def answer(fs: FramedStream, req: dict[str, Any]) -> None:
        if ask:
            await _paths_then(fs, req, *frames)
        else:
            for f in frames:
                await fs.send(f)
    return answer


WHOLE = ({"ev": "data", "data": PATCH}, {"ev": "mark"})
HOSTILE = {
    "data_before_its_paths_end": _case({"ev": "data", "data": PATCH}, ask=False),
    "a_paths_count_that_lies": _case({"ev": "paths", "data": b"a\x00"},
                                     {"ev": "paths_end", "count": 7}, ask=False),
    "paths_not_ended_by_nul": _case({"ev": "paths", "data": b"a"},
                                    {"ev": "paths_end", "count": 1}, ask=False),
    "too_many_paths": _case(*[{"ev": "paths", "data": b"p\x00" * 100_000}
                              for _ in range(rpc.MAX_ASKED // 100_000 + 1)], ask=False),
    "an_apart_entry_with_an_unknown_why": _case({**{"ev": "apart"}, **BIG, "why": "because"}),
    "an_apart_entry_with_a_bad_hash": _case({**{"ev": "apart"}, **BIG, "sha256": "zz"}),
    "an_apart_entry_after_the_patch_began": _case(*WHOLE, {"ev": "apart", **BIG}),
    "more_apart_entries_than_listed": _case(*[{"ev": "apart", **BIG}] * (rpc.MAX_APART + 1)),
    "an_end_inside_a_file": _case(*WHOLE, {"ev": "data", "data": PATCH},
                                  {"ev": "end", "stats": {}}),
    "an_unknown_event": _case(*WHOLE, {"ev": "surprise"}),
    "paths_again_after_the_answer": _case(*WHOLE, {"ev": "paths", "data": b"a\x00"}),
    "a_patch_past_the_limit": _case(*WHOLE, *[{"ev": "data", "data": b"x" * rpc.CHUNK}] * (
        rpc.MAX_PATCH // rpc.CHUNK + 1)),
}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_a_guest_answering_its_diff_wrongly_keeps_only_whole_files(
        tmp_path: Path, repo: Path, attack: str) -> None:
    """Whatever the guest sends, the box ends stopped with a partial patch holding the
    files that arrived whole (none, or the one before the fault), and one line why."""
    async def main() -> None:
        m, signer = make(tmp_path, diff_by(HOSTILE[attack]))
        await create(m, "bad", repo)
        box = await m.stop("bad")
        assert box.state == "stopped"
        assert box.info.patch["partial"] is True
        kept = (box.dir / "patch.diff").read_bytes()
        assert kept in (b"", PATCH)
        err = box.info.patch["error"]
        assert err and "\n" not in err and len(err) <= 500
        assert signer.of_run(box.run_id, "tkbox.patch")[0]["body"]["partial"] is True
        await cleanup(m)

    asyncio.run(asyncio.wait_for(main(), 120))
