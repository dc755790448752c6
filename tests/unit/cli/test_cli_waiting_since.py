"""`tkbox approvals` shows when each connection began to wait as a person reads a time:
the local clock and how long ago, never the raw seconds since the epoch."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tkbox.cli.main import waiting_since


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


NOW = 1796386891.617047  # 2026-12-04 12:21:31 UTC, the value the issue quotes


def test_a_wait_of_today_is_its_clock_time_and_seconds_ago():
    assert waiting_since(NOW - 12.4, NOW) == "12:21:19 (12 s ago)"
    assert waiting_since(NOW, NOW) == "12:21:31 (0 s ago)"


def test_longer_waits_count_in_minutes_hours_then_days_with_the_date():
    assert waiting_since(NOW - 119, NOW).endswith("(119 s ago)")
    assert waiting_since(NOW - 120, NOW) == "12:19:31 (2 min ago)"
    assert waiting_since(NOW - 3 * 3600, NOW) == "09:21:31 (3 h ago)"
    assert waiting_since(NOW - 15 * 3600, NOW) == "2026-12-03 21:21:31 (15 h ago)"
    assert waiting_since(NOW - 5 * 86400, NOW) == "2026-11-29 12:21:31 (5 days ago)"


def test_a_time_ahead_of_the_clock_says_so():
    assert waiting_since(NOW + 2, NOW) == "12:21:33 (now)"
    assert waiting_since(NOW + 60, NOW) == "12:22:31 (in the future: check the clocks)"


@pytest.mark.parametrize("bad", [None, "1796386891", True, float("nan"), float("inf"),
                                 -1e300, 1e300, [1]])
def test_anything_but_a_finite_time_is_a_question_mark(bad: object):
    assert waiting_since(bad, NOW) == "?"
