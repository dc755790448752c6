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
"""

from __future__ import annotations

from typing import Final

from tkbox.errors import UserError

STATES: Final = ("creating", "running", "held", "stopping", "stopped", "failed",
                 "quarantined", "exported")
LIVE: Final = frozenset({"creating", "running", "held", "stopping"})

TABLE: Final[dict[tuple[str, str], str]] = {
    ("creating", "booted"): "running",
    ("creating", "boot_failed"): "failed",
    ("running", "hold"): "held",
    ("held", "release"): "running",
    ("running", "stop"): "stopping",
    ("held", "stop"): "stopping",
    ("stopping", "stopped"): "stopped",
    ("stopping", "stop_failed"): "failed",
    ("running", "vm_died"): "failed",
    ("held", "vm_died"): "failed",
    ("stopping", "vm_died"): "failed",
    ("creating", "quarantine"): "quarantined",
    ("running", "quarantine"): "quarantined",
    ("held", "quarantine"): "quarantined",
    ("stopping", "quarantine"): "quarantined",
    ("stopped", "apply"): "stopped",
    ("stopped", "export"): "exported",
    ("failed", "export"): "exported",
    ("quarantined", "export"): "exported",
    ("creating", "daemon_lost"): "failed",
    ("running", "daemon_lost"): "failed",
    ("held", "daemon_lost"): "failed",
    ("stopping", "daemon_lost"): "failed",
}

#: what a person should do, by the state that refused an event
HINTS: Final[dict[str, str]] = {
    "creating": "wait until it is running",
    "running": "stop it first with 'tkbox stop NAME'",
    "held": "the signer holds it; 'tkbox signer release RUN' or stop it",
    "stopping": "wait until it has stopped",
    "stopped": "it has stopped; start a new box with 'tkbox run'",
    "failed": "it failed; see 'tkbox inspect NAME', then 'tkbox rm NAME'",
    "quarantined": "the signer quarantined it; export it or remove it",
    "exported": "its run is closed; remove it with 'tkbox rm NAME'",
}


def next_state(state: str, event: str, name: str = "the box") -> str:
    """The state after `event`, or a UserError saying why it cannot happen now."""
    try:
        return TABLE[(state, event)]
    except KeyError:
        raise UserError(f"cannot {event.replace('_', ' ')} {name}: it is {state}; "
                        f"{HINTS.get(state, '')}".rstrip("; ")) from None


def can(state: str, event: str) -> bool:
    return (state, event) in TABLE
