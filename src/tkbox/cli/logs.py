"""`tkbox logs BOX [-f]`: a box's journal as lines a person reads (`--json`: as it is).

`Formatter.line(entry)` turns one journal entry (`tkbox.record.journal`) into one
line, remembering each decision so that its completion can name what completed.
Every value is shown through `_s`: bounded, control characters made visible, so a
hostile command line or host name cannot rewrite the terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _s(v: Any, limit: int = 200) -> str:
    s = v if isinstance(v, str) else "" if v is None else str(v)
    s = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256
                else f"\\u{ord(c):04x}" for c in s[:limit])
    return s + ("…" if isinstance(v, str) and len(v) > limit else "")


def _d(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


@dataclass
class Formatter:
    decisions: dict[str, str] = field(default_factory=dict)

    def line(self, e: dict[str, Any]) -> str | None:
        t = _s(e.get("time"))[11:23]
        op = e.get("op")
        if op == "open":
            facts = _d(e.get("facts"))
            return (f"{t} open      image {_s(facts.get('image'))}, allow "
                    f"{_s(', '.join(map(str, facts.get('allowlist') or [])) or 'nothing')}")
        if op == "decide":
            res = _d(e.get("resource"))
            action = _s(e.get("action"))
            what = {"Bash": lambda: _s(res.get("command")),
                    "Connect": lambda: f"{_s(res.get('host'))}:{_s(res.get('port'))}",
                    "Write": lambda: _s(res.get("path"))}.get(action, lambda: _s(res))()
            self.decisions[_s(e.get("decision"))] = f"{action} {what}"
            verdict = "allowed" if e.get("allowed") else f"REFUSED: {_s(e.get('reason'))}"
            label = {"Bash": "exec", "Connect": "connect", "Write": "write"}.get(action, action)
            return f"{t} {label:<9} {what} → {verdict}"
        if op == "complete":
            what = self.decisions.get(_s(e.get("decision")), "?")
            out = _d(e.get("outcome"))
            if what.startswith("Bash "):
                status = out.get("status")
                dur = out.get("duration_ms")
                took = f" in {dur / 1000:.2f} s" if isinstance(dur, int) else ""
                return (f"{t} exit      {what[5:]} → "
                        f"{'exit ' + str(status) if status is not None else _s(out.get('error'))}"
                        f"{took}")
            if what.startswith("Connect "):
                return (f"{t} closed    {what[8:]} ({_s(out.get('bytes_up'))} B up, "
                        f"{_s(out.get('bytes_down'))} B down)")
            if what.startswith("Write "):
                return (f"{t} written   {what[6:]}" if out.get("written") is not False
                        else f"{t} not written {what[6:]}")
            return f"{t} complete  {what}"
        if op == "event":
            return self._event(t, _s(e.get("kind")), _d(e.get("body")))
        if op == "close":
            return f"{t} close     the run is closed"
        if op == "full":
            return f"{t} (the journal is full; the record goes on: export and verify it)"
        return None

    def _event(self, t: str, kind: str, b: dict[str, Any]) -> str:
        hostport = f"{_s(b.get('host'))}:{_s(b.get('port'))}"
        if kind == "tkbox.egress.refused":
            return f"{t} refused   {hostport}: {_s(b.get('reason'))}"
        if kind == "tkbox.approval":
            state = _s(b.get("state"))
            if state == "pending":
                return (f"{t} waiting   {hostport} for a person: tkbox approve BOX "
                        f"{_s(b.get('id'))}")
            return f"{t} approval  {hostport} {state} ({_s(b.get('by'))})"
        if kind == "tkbox.secret.use":
            return (f"{t} secret    {_s(b.get('name'))} sent to {_s(b.get('host'))} "
                    f"({_s(b.get('header'))})")
        if kind == "tkbox.secret.leak":
            return (f"{t} LEAK      {_s(b.get('name'))} blocked to {_s(b.get('host'))} "
                    f"({_s(b.get('where'))})")
        if kind == "tkbox.model.call":
            u = _d(b.get("usage"))
            tok = (f", {_s(u.get('input_tokens'))} in / {_s(u.get('output_tokens'))} out tokens"
                   if u else "")
            return (f"{t} model     {_s(b.get('host'))} {_s(b.get('model'))} → "
                    f"{_s(b.get('status'))}{tok}")
        if kind == "tkbox.command.refused":
            return f"{t} exec      {_s(b.get('argv0'))} → REFUSED: {_s(b.get('reason'))}"
        if kind == "tkbox.box.ready":
            return f"{t} ready     booted in {_s(b.get('boot_ms'))} ms ({_s(b.get('accel'))})"
        brief = ", ".join(f"{_s(k, 40)}={_s(v, 120)}" for k, v in list(b.items())[:6])
        return f"{t} {kind.removeprefix('tkbox.'):<9} {brief}"
