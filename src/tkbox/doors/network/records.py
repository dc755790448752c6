"""What the network door writes into a run about a guest: bounded, escaped, summarised.

A refusal is caused by guest bytes, and its reason often quotes them (a
request line, a host name, h11's own message about a malformed head). Every
string that goes into a record passes `excerpt`: printable ASCII kept,
everything else escaped as `\\xNN`, cut at `limit` characters with the count
of what was left out. One refusal is then a record of a few hundred bytes.

A guest can still ask for refusals as fast as it likes. `RefusalLog` (pure,
clock passed in) lets the first `full` refusals of each `interval` through as
records of their own; the rest are counted by stage and host and written as
one `tkbox.egress.refused.summary` record when the interval ends (or the door
closes). The run grows by at most `full + 1` refusal records an interval.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: characters of guest-derived text a record keeps
EXCERPT = 200
#: refusals recorded one by one in each interval
FULL_PER_INTERVAL = 32
#: seconds of one summary interval
INTERVAL = 60.0
#: distinct hosts (and stages) named in a summary
SUMMARY_KEYS = 16


def excerpt(text: object, limit: int = EXCERPT) -> str:
    """`text` safe for a record: printable ASCII, other characters escaped, bounded."""
    s = text if isinstance(text, str) else str(text)
    if len(s) <= limit and s.isascii() and s.isprintable() and "\\" not in s:
        return s  # nothing to escape or cut (the common case, checked in C)
    out: list[str] = []
    size = 0
    for i, c in enumerate(s):
        piece = c if " " <= c <= "~" and c != "\\" else (
            "\\\\" if c == "\\" else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
            if ord(c) < 0x10000 else f"\\U{ord(c):08x}")
        if size + len(piece) > limit:
            return "".join(out) + f"...(+{len(s) - i} chars)"
        out.append(piece)
        size += len(piece)
    return "".join(out)


@dataclass
class RefusalLog:
    """Which refusals get a record of their own, and the summary of the rest."""

    full: int = FULL_PER_INTERVAL
    interval: float = INTERVAL
    _start: float | None = None
    _recorded: int = 0
    _stages: Counter[str] = field(default_factory=Counter)
    _hosts: Counter[str] = field(default_factory=Counter)
    _suppressed: int = 0

    def admit(self, now: float, stage: str, host: str | None) -> tuple[bool, dict[str, Any] | None]:
        """Whether this refusal gets its own record, and a summary now due (or None)."""
        due = None
        if self._start is None or now - self._start >= self.interval:
            due = self.flush(now)
            self._start = now
        if self._recorded < self.full:
            self._recorded += 1
            return True, due
        self._suppressed += 1
        if stage in self._stages or len(self._stages) < SUMMARY_KEYS:
            self._stages[stage] += 1
        key = excerpt(host or "-", 80)
        if key in self._hosts or len(self._hosts) < SUMMARY_KEYS:
            self._hosts[key] += 1
        return False, due

    def flush(self, now: float) -> dict[str, Any] | None:
        """The summary of refusals not recorded one by one since the interval began."""
        summary = None
        if self._suppressed:
            start = self._start if self._start is not None else now
            summary = {
                "refusals": self._suppressed,
                "seconds": max(0, round(now - start)),
                "recorded_individually": self._recorded,
                "by_stage": dict(self._stages.most_common(SUMMARY_KEYS)),
                "by_host": dict(self._hosts.most_common(SUMMARY_KEYS)),
            }
        self._start, self._recorded, self._suppressed = None, 0, 0
        self._stages.clear()
        self._hosts.clear()
        return summary
