"""Every edge of the box lifecycle table, and every refused one."""

from __future__ import annotations

import itertools

import pytest

from tkbox.daemon import lifecycle
from tkbox.errors import UserError

EVENTS = sorted({e for _, e in lifecycle.TABLE})


@pytest.mark.parametrize("state, event", sorted(lifecycle.TABLE))
def test_every_edge_leads_to_a_known_state(state: str, event: str) -> None:
    assert lifecycle.next_state(state, event) in lifecycle.STATES


@pytest.mark.parametrize("state, event", [
    (s, e) for s, e in itertools.product(lifecycle.STATES, EVENTS)
    if (s, e) not in lifecycle.TABLE])
def test_every_missing_edge_is_a_one_line_user_error(state: str, event: str) -> None:
    with pytest.raises(UserError) as exc:
        lifecycle.next_state(state, event, "box x")
    assert state in str(exc.value) and "\n" not in str(exc.value)


def test_every_state_is_reachable_from_creating() -> None:
    seen, todo = {"creating"}, ["creating"]
    while todo:
        s = todo.pop()
        for (a, _), b in lifecycle.TABLE.items():
            if a == s and b not in seen:
                seen.add(b)
                todo.append(b)
    assert seen == set(lifecycle.STATES)


def test_only_stopped_boxes_can_be_applied_and_exported_boxes_are_final() -> None:
    assert [s for s in lifecycle.STATES if lifecycle.can(s, "apply")] == ["stopped"]
    assert not any(a == "exported" for a, _ in lifecycle.TABLE)
