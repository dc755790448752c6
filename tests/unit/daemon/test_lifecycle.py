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


def test_states_and_events_keep_the_names_written_to_disk_and_shown_by_the_api() -> None:
    assert [s.value for s in lifecycle.STATES] == [
        "creating", "running", "held", "stopping", "stopped", "failed", "quarantined",
        "exported"]
    assert {e.value for e in lifecycle.Event} == set(EVENTS)  # every event has an edge


@pytest.mark.parametrize("state", lifecycle.STATES)
def test_the_named_predicates_agree_with_the_table(state: lifecycle.State) -> None:
    E = lifecycle.Event
    # Live: a restart finds its VM lost.
    assert lifecycle.is_live(state) == lifecycle.can(state, E.DAEMON_LOST)
    # Crossings (exec, cp, egress) only where a box may be held and stopped.
    if lifecycle.takes_crossings(state):
        assert lifecycle.can(state, E.HOLD) and lifecycle.can(state, E.STOP)
    # A VM's end is a crash exactly where a stop could still have ended it cleanly.
    assert lifecycle.vm_end_is_unexpected(state) == lifecycle.can(state, E.STOP)
    if lifecycle.guest_keeps_transport(state):
        assert lifecycle.is_live(state) and state is not lifecycle.State.STOPPING
    # A patch exists only once a stop has succeeded: apply, or the export after it.
    assert lifecycle.has_patch(state) == (lifecycle.can(state, E.APPLY)
                                          or state is lifecycle.State.EXPORTED)
    if lifecycle.stop_began(state):
        assert not lifecycle.can(state, E.STOP)
