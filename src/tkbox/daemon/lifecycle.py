"""A box's life, as one table.

Everything that moves a box from one state to another is here, so the docs
can draw it and a test can walk every edge (`tests/unit/daemon/test_lifecycle.py`).

```
creating ──booted──▶ running ──stop──▶ stopping ──stopped──▶ stopped ──export──▶ exported
   │                 │  ▲                   │                    │ apply (stays)
   │                 hold release           │                    │
   │                 ▼  │                   │                    │
   │                 held ───stop──────────▶┘                    │
   ├─boot_failed──▶ failed ◀──vm_died── running/held/stopping    │
   └─(any live state)──quarantine──▶ quarantined ──export──▶ exported
```
A daemon that restarts finds boxes in a live state with no VM (`daemon_lost`)
and marks them failed; the loss is recorded as `tkbox.gap`.

States and events are closed enums (`State`, `Event`); their values are the
strings the daemon has always written to `box.json` and shown in its API. Code
outside this module never compares a state to a string: it asks the table
(`can`, `next_state`) or one of the named predicates below, each of which says
what it is for. The only code that changes a box's state is
`tkbox.daemon.boxstate.BoxState.move`, which asks `next_state`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from tkbox.errors import UserError


class State(StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    HELD = "held"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"
    QUARANTINED = "quarantined"
    EXPORTED = "exported"


class Event(StrEnum):
    BOOTED = "booted"
    BOOT_FAILED = "boot_failed"
    HOLD = "hold"
    RELEASE = "release"
    STOP = "stop"
    STOPPED = "stopped"
    STOP_FAILED = "stop_failed"
    VM_DIED = "vm_died"
    QUARANTINE = "quarantine"
    APPLY = "apply"
    EXPORT = "export"
    DAEMON_LOST = "daemon_lost"


S, E = State, Event

STATES: Final = tuple(State)
#: states in which a box has (or is getting, or is giving up) a VM
LIVE: Final = frozenset({S.CREATING, S.RUNNING, S.HELD, S.STOPPING})

TABLE: Final[dict[tuple[State, Event], State]] = {
    (S.CREATING, E.BOOTED): S.RUNNING,
    (S.CREATING, E.BOOT_FAILED): S.FAILED,
    (S.RUNNING, E.HOLD): S.HELD,
    (S.HELD, E.RELEASE): S.RUNNING,
    (S.RUNNING, E.STOP): S.STOPPING,
    (S.HELD, E.STOP): S.STOPPING,
    (S.STOPPING, E.STOPPED): S.STOPPED,
    (S.STOPPING, E.STOP_FAILED): S.FAILED,
    (S.RUNNING, E.VM_DIED): S.FAILED,
    (S.HELD, E.VM_DIED): S.FAILED,
    (S.STOPPING, E.VM_DIED): S.FAILED,
    (S.CREATING, E.QUARANTINE): S.QUARANTINED,
    (S.RUNNING, E.QUARANTINE): S.QUARANTINED,
    (S.HELD, E.QUARANTINE): S.QUARANTINED,
    (S.STOPPING, E.QUARANTINE): S.QUARANTINED,
    (S.STOPPED, E.APPLY): S.STOPPED,
    (S.STOPPED, E.EXPORT): S.EXPORTED,
    (S.FAILED, E.EXPORT): S.EXPORTED,
    (S.QUARANTINED, E.EXPORT): S.EXPORTED,
    (S.CREATING, E.DAEMON_LOST): S.FAILED,
    (S.RUNNING, E.DAEMON_LOST): S.FAILED,
    (S.HELD, E.DAEMON_LOST): S.FAILED,
    (S.STOPPING, E.DAEMON_LOST): S.FAILED,
}

#: what a person should do, by the state that refused an event
HINTS: Final[dict[State, str]] = {
    S.CREATING: "wait until it is running",
    S.RUNNING: "stop it first with 'tkbox stop NAME'",
    S.HELD: "the signer holds it; 'tkbox signer release RUN' or stop it",
    S.STOPPING: "wait until it has stopped",
    S.STOPPED: "it has stopped; start a new box with 'tkbox run'",
    S.FAILED: "it failed; see 'tkbox inspect NAME', then 'tkbox rm NAME'",
    S.QUARANTINED: "the signer quarantined it; export it or remove it",
    S.EXPORTED: "its run is closed; remove it with 'tkbox rm NAME'",
}


def next_state(state: State, event: Event, name: str = "the box") -> State:
    """The state after `event`, or a UserError saying why it cannot happen now."""
    try:
        return TABLE[(state, event)]
    except KeyError:
        raise UserError(f"cannot {event.replace('_', ' ')} {name}: it is {state}; "
                        f"{HINTS.get(state, '')}".rstrip("; ")) from None


def can(state: State, event: Event) -> bool:
    return (state, event) in TABLE


# ---- named predicates: what the rest of the daemon asks of a state -----------------


def is_live(state: State) -> bool:
    """The box has, or is getting, or is giving up a VM (a restart finds it lost)."""
    return state in LIVE


def takes_crossings(state: State) -> bool:
    """Commands, copies and egress connections cross only while the box runs: not
    while it boots, is held by the signer, or stops (egress closes as a stop begins)."""
    return state == S.RUNNING


def has_patch(state: State) -> bool:
    """The box stopped cleanly and its saved patch may be read."""
    return state in (S.STOPPED, S.EXPORTED)


def vm_end_is_unexpected(state: State) -> bool:
    """A VM that ends now has crashed or been killed behind the daemon's back (during
    boot the boot wait reports it; during a stop it is the stop's own doing)."""
    return state in (S.RUNNING, S.HELD)


def guest_keeps_transport(state: State) -> bool:
    """A broken transport now is the guest's doing, not the end of a stop."""
    return state in (S.CREATING, S.RUNNING, S.HELD)


def stop_began(state: State) -> bool:
    """A stop has begun (and so already closed the box's egress)."""
    return state in (S.STOPPING, S.STOPPED)
