"""The job summary says where the time went and whether each cache hit (`action/run.py`):
the Action's own phases from its steps' marks, then whatever phases `tkbox agent --json`
reports, bounded and made safe for a Markdown table."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from action import run

CACHE_ENV = {f"TKBOX_CACHE_{n.upper()}{s}" for n, _ in run.CACHES for s in ("", "_KEY")}


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in (*CACHE_ENV, "TKBOX_ACTION_MARKS"):
        monkeypatch.delenv(k, raising=False)


def write_marks(tmp: Path, monkeypatch: pytest.MonkeyPatch, **at: float) -> None:
    now = time.time()
    f = tmp / "marks"
    f.write_text("".join(f"{k.replace('_', '-')} {now - 100 + v:.3f}\n" for k, v in at.items())
                 + "garbage line here\nkeyed not-a-number\n")
    monkeypatch.setenv("TKBOX_ACTION_MARKS", str(f))


def test_the_actions_phases_then_tkbox_agents_in_its_order(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    write_marks(tmp_path, monkeypatch, start=0, prepared=1, install_end=31, keyed=32,
                guest_start=34, guest_end=40)
    phases = {"image": 3.0, "box start": 2.0, "agent": 10.0, "apply": 0.5, "export": 0.5}
    rows = run.timing_rows(phases, 17.0)
    names = [k for k, _ in rows]
    assert names == ["install", "cache restore", "guest", "image", "box start", "agent",
                     "apply", "export", "tkbox agent, other", "total"]
    got = dict(rows)
    assert got["install"] == pytest.approx(30, abs=0.01)
    assert got["cache restore"] == pytest.approx(2, abs=0.01)
    assert got["guest"] == pytest.approx(6, abs=0.01)
    assert got["tkbox agent, other"] == pytest.approx(1.0)
    assert got["total"] == pytest.approx(100, abs=5)
    table = run.timing_table(phases, 17.0)
    assert "| install | 30.0 |\n" in table and "| box start | 2.0 |\n" in table


def test_a_skipped_install_says_so_and_no_marks_means_no_action_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    write_marks(tmp_path, monkeypatch, start=0, prepared=1, keyed=2, guest_start=3,
                guest_end=4)
    assert run.timing_rows(None, 5.0)[0] == ("install", None)
    assert "| install | skipped |" in run.timing_table(None, 5.0)
    monkeypatch.delenv("TKBOX_ACTION_MARKS")
    assert run.timing_rows(None, 5.0) == [("tkbox agent", 5.0)]


def test_phases_are_bounded_and_safe_in_a_table():
    hostile: dict[str, object] = {"a|b`c\n| injected | 1 |": 1.0, "nan": float("nan"),
                                  "text": "12", "bool": True, "negative": -1.0,
                                  "huge": 1e12, "x" * 100: 2.0}
    hostile.update({f"p{i}": 0.1 for i in range(40)})
    rows = run.timing_rows(hostile, 100.0)
    names = [k for k, _ in rows]
    assert names[0] == "a?b?c?? injected ? 1 ?" and names[1] == "x" * 40
    assert len(rows) <= run.MAX_PHASES + 1
    assert all("|" not in k and "`" not in k and "\n" not in k for k in names)
    assert not {"nan", "text", "bool", "negative", "huge"} & set(names)


def test_each_cache_says_whether_it_hit(monkeypatch: pytest.MonkeyPatch):
    assert run.cache_states() == [] and run.cache_table() == "", \
        "run.py outside the Action: no cache lines"
    monkeypatch.setenv("TKBOX_CACHE_GUEST_KEY", "tkbox-guest-v1-x")
    monkeypatch.setenv("TKBOX_CACHE_GUEST", "true")
    monkeypatch.setenv("TKBOX_CACHE_IMAGES_KEY", "tkbox-images-v1-x")
    monkeypatch.setenv("TKBOX_CACHE_IMAGES", "false")
    monkeypatch.setenv("TKBOX_CACHE_TEMPLATES_KEY", "tkbox-templates-v1-x")
    states = {what: state for what, state, _ in run.cache_states()}
    assert states == {"tkbox's Python environment": "not used", "guest build": "hit",
                      "booted templates": "miss: filled by this run, saved when the job "
                                          "succeeds",
                      "pulled images": "restored from an older key",
                      "agent tool disks": "not used"}
    assert "tkbox: cache guest build: hit (tkbox-guest-v1-x)" in run.cache_lines()
    assert "| guest build | hit | `tkbox-guest-v1-x` |" in run.cache_table()
