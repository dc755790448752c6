"""`tkbox logs`: the journal shows what the signer acknowledged, bounded, and wakes
followers; its lines cannot rewrite a terminal."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tkbox.cli.logs import Formatter
from tkbox.errors import SignerUnavailable
from tkbox.record import journal
from tkbox.record.journal import JournalingSigner, Journals
from tkbox.record.testing import FakeSigner


def lines(j: Journals, run: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in j.path(run).read_text().splitlines()]


def test_only_what_the_signer_acknowledged_is_journaled(tmp_path: Path) -> None:
    fake = FakeSigner(policy=lambda run, action, res, ctx: (res.get("command") != "rm -rf /",
                                                            "no"))
    j = Journals(tmp_path)
    s = JournalingSigner(fake, j)

    async def go() -> None:
        await s.open_run("r1", {"image": "x", "allowlist": ["pypi"]})
        v = await s.decide("r1", "Bash", {"command": "pytest"}, {})
        await s.complete("r1", v.decision_id, {"status": 0, "duration_ms": 1200})
        await s.decide("r1", "Bash", {"command": "rm -rf /"}, {})
        await s.event("r1", "tkbox.egress.refused", {"host": "169.254.169.254", "port": 80,
                                                     "reason": "metadata"})
        fake.available = False
        with pytest.raises(SignerUnavailable):
            await s.event("r1", "tkbox.gap", {"reason": "lost"})

    asyncio.run(go())
    got = lines(j, "r1")
    assert [e["op"] for e in got] == ["open", "decide", "complete", "decide", "event"]
    assert got[3]["allowed"] is False  # a refusal is in the record, so in the journal
    f = Formatter()
    shown = [f.line(e) for e in got]
    assert "exec      pytest → allowed" in shown[1]
    assert "exit      pytest → exit 0 in 1.20 s" in shown[2]  # type: ignore[operator]
    assert "REFUSED: no" in shown[3]  # type: ignore[operator]
    assert "refused   169.254.169.254:80: metadata" in shown[4]  # type: ignore[operator]


def test_a_hostile_value_is_cut_and_cannot_drive_the_terminal(tmp_path: Path) -> None:
    j = Journals(tmp_path)
    j.append("r", {"op": "decide", "action": "Bash", "allowed": True, "decision": "1",
                   "resource": {"command": "\x1b]0;owned\x07" + "x" * 100_000}})
    (e,) = lines(j, "r")
    assert len(json.dumps(e)) < 2 * journal.MAX_FIELD
    out = Formatter().line(e)
    assert out is not None and "\x1b" not in out and "\\x1b]0;owned\\x07" in out


def test_a_journal_stops_at_its_bound_and_says_so(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "MAX_JOURNAL", 4000)
    j = Journals(tmp_path)
    for i in range(200):
        j.append("r", {"op": "event", "kind": "tkbox.x", "body": {"i": i, "pad": "y" * 50}})
    got = lines(j, "r")
    assert j.path("r").stat().st_size <= 4000
    assert got[-1]["op"] == "full" and sum(e["op"] == "full" for e in got) == 1


def test_a_follower_sees_new_lines_as_they_come_and_ends_with_the_box(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No poll within the test: a line seen at all was woken for, not polled for.
    monkeypatch.setattr(journal, "POLL_S", 3600.0)
    j = Journals(tmp_path)
    state = {"done": False}

    async def go() -> list[object]:
        seen: list[object] = []
        each: asyncio.Queue[object] = asyncio.Queue()

        async def follow() -> None:
            async for e in j.follow("r", follow=True, done=lambda: state["done"]):
                seen.append(e["n"])
                each.put_nowait(e["n"])

        task = asyncio.ensure_future(follow())
        for n in range(3):
            j.append("r", {"op": "event", "kind": "k", "n": n})
            assert await asyncio.wait_for(each.get(), 30) == n
        assert seen == [0, 1, 2]  # woken, not polled (POLL_S is an hour here)
        state["done"] = True
        j.wake("r")
        await asyncio.wait_for(task, 30)
        return seen

    assert asyncio.run(go()) == [0, 1, 2]
