"""Suite-wide wiring: the Hypothesis profiles, and `make fuzz`'s time budget.

Profiles (pick one with `--hypothesis-profile=NAME`; `ci` is loaded by default):

- `ci`: short, for every test run: 200 examples a target, no deadline.
- `long`: for `make fuzz`: each Hypothesis test in `tests/fuzz` is run again
  and again (fresh random examples each round) until it has run for
  `TKBOX_FUZZ_SECONDS` (default 120) seconds, and the summary prints how many
  examples each target ran. A failure stops the target at once and is shrunk
  and reported as usual.

Targets set only what is theirs (`deadline=None`, health checks); the number of
examples is the profile's, so `make fuzz` is not capped by a target's own count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large,
                                                 HealthCheck.filter_too_much])
settings.load_profile("ci")

_ran: dict[str, tuple[int, float]] = {}


def _budget() -> float:
    return float(os.environ.get("TKBOX_FUZZ_SECONDS", "120"))


def _profile() -> str:
    ask = getattr(settings, "get_current_profile_name", None)  # Hypothesis >= 6.117
    return str(ask() if ask else settings._current_profile)  # noqa: SLF001


def _is_fuzz_target(item: pytest.Item) -> bool:
    fn = getattr(item, "obj", None)
    return (_profile() == "long"
            and "tests/fuzz" in str(getattr(item, "path", ""))
            and hasattr(getattr(fn, "hypothesis", None), "inner_test"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    if not _is_fuzz_target(item):
        return (yield)
    handle = item.obj.hypothesis  # type: ignore[attr-defined]
    inner: Callable[..., Any] = handle.inner_test
    count = [0]

    def counting(*a: Any, **kw: Any) -> Any:
        count[0] += 1
        return inner(*a, **kw)

    handle.inner_test = counting
    t0 = time.monotonic()
    try:
        # The first round is pytest's own call (below); more rounds until the budget is
        # spent. Each round draws fresh examples (the seed is random unless derandomized).
        result = yield  # raises if the round failed: no more rounds
        while time.monotonic() - t0 < _budget():
            item.runtest()
        return result
    finally:
        handle.inner_test = inner
        _ran[item.nodeid] = (count[0], time.monotonic() - t0)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _ran:
        return
    tr = terminalreporter
    tr.section("fuzz: examples run per target")
    total = 0
    for nodeid, (n, secs) in sorted(_ran.items()):
        total += n
        tr.write_line(f"{n:>10} examples  {secs:7.1f} s  {nodeid}")
    tr.write_line(f"{total:>10} examples in {len(_ran)} targets")
