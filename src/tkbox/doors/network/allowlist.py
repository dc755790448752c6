"""The box's allowlist: entries from `--allow`, presets expanded.

Pure. An entry is `host` (ports 443 and 80), `host:port` (that port only),
`host:low-high` (those ports only) or a preset name (`PRESET@host[:port]` for
a ruled preset aimed at another host). Hosts are normalised by
`names.parse_host`, so matching is exact equality of canonical forms: no
suffix or wildcard matching, so `example.org` never admits
`evil.example.org` nor `example.org.evil.net`.

An entry may carry method and path rules after a space (`httprules`):
`api.github.com GET HEAD /**`. A host and port that any entry gives rules is
*ruled*: its requests are read (the secrets door terminates its TLS) and each
must be allowed by the rules of the entries naming it (`rules_for`); entries
without rules (a secret's binding, a plain preset) only admit the port.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tkbox.doors.network.httprules import Rule, RuleError, RuleSet, parse_rules, split_entry
from tkbox.doors.network.names import Host, HostNameError, parse_host, parse_port, split_authority
from tkbox.doors.network.presets import preset_entries
from tkbox.errors import UserError

DEFAULT_PORTS = (443, 80)
MAX_ENTRIES = 4096


@dataclass(frozen=True)
class Entry:
    host: Host
    low: int
    high: int
    explicit_port: bool  # the entry names its port(s): non-TLS tunnels allowed
    source: str  # the `--allow` text (or `preset:name`) it came from
    rules: tuple[Rule, ...] | None = None  # method and path rules (None: none stated)

    def allows_port(self, port: int) -> bool:
        if not self.explicit_port:
            return port in DEFAULT_PORTS
        return self.low <= port <= self.high

    @property
    def text(self) -> str:
        if not self.explicit_port:
            return str(self.host)
        return (
            f"{self.host}:{self.low}"
            if self.low == self.high
            else f"{self.host}:{self.low}-{self.high}"
        )

    @property
    def text_with_rules(self) -> str:
        if self.rules is None:
            return self.text
        return self.text + " " + "; ".join(r.text for r in self.rules)


@dataclass(frozen=True)
class Match:
    entry: Entry

    @property
    def rule(self) -> str:
        src = self.entry.source
        if len(src) > 200:
            src = src[:200] + "..."
        return f"allow {self.entry.text}" + (f" ({src})" if src != self.entry.text else "")


def parse_entry(text: str, source: str | None = None) -> Entry:
    """One `host`, `host:port` or `host:low-high` entry, with its rules after a space
    if any. Raises UserError."""
    hostport, rules_text = split_entry(text)
    rules = None
    if rules_text is not None:
        try:
            rules = parse_rules(rules_text)
        except RuleError as exc:
            raise UserError(f"--allow {text[:120]!r}: {exc.message}") from None
    try:
        host_text, port_text = split_authority(hostport)
        host = parse_host(host_text)
        if port_text is None:
            low = high = 0
        else:
            low_text, dash, high_text = port_text.partition("-")
            low = parse_port(low_text)
            high = parse_port(high_text) if dash else low
    except HostNameError as exc:
        raise UserError(f"--allow {text!r}: {exc.message.removeprefix('refused: ')}") from None
    if high < low:
        raise UserError(f"--allow {text!r}: port range {low}-{high} runs backwards")
    if rules is not None and host.literal is not None:
        raise UserError(f"--allow {text[:120]!r}: rules need a host name the box's TLS can "
                        "be read for, not an IP address")
    return Entry(host, low, high, port_text is not None, source or text, rules)


class Allowlist:
    """The entries of one box, with its presets expanded once at start."""

    def __init__(
        self,
        allow: Iterable[str],
        expand: Callable[[str], tuple[str, ...] | None] = preset_entries,
    ) -> None:
        self.entries: list[Entry] = []
        self.unknown_empty: list[str] = []  # presets that mean nothing on this host
        for raw in allow:
            text = raw.strip()
            name = text.split("@", 1)[0]
            expanded = (expand(text) if ":" not in name and "." not in name
                        and not any(c.isspace() for c in text) else None)
            if expanded is None and "@" in text and expand(name) is not None:
                raise UserError(f"--allow {text[:120]!r}: PRESET@HOST needs a host name, and "
                                "only a ruled preset can be aimed at one "
                                "(github-read@HOST[:PORT])")
            if expanded is not None:
                if not expanded:
                    self.unknown_empty.append(text)
                for e in expanded:
                    self.entries.append(parse_entry(e, source=f"preset {text}"))
            else:
                self.entries.append(parse_entry(text))
            if len(self.entries) > MAX_ENTRIES:
                raise UserError(f"--allow: more than {MAX_ENTRIES} entries; use fewer or presets")

    def add(self, entry: Entry) -> None:
        self.entries.append(entry)

    def match(self, host: Host, port: int) -> Match | None:
        """The first entry naming this host and admitting this port."""
        for e in self.entries:
            if e.host.name == host.name and e.allows_port(port):
                return Match(e)
        return None

    def names_host(self, host: Host) -> list[Entry]:
        return [e for e in self.entries if e.host.name == host.name]

    def rules_for(self, host: str, port: int) -> RuleSet | None:
        """The rules of `host:port` (every ruled entry naming it, together), or None
        when no entry naming it has rules."""
        rules: list[Rule] = []
        ruled = False
        for e in self.entries:
            if e.host.name == host and e.rules is not None and e.allows_port(port):
                ruled = True
                rules.extend(r for r in e.rules if r not in rules)
        return RuleSet(host if port == 443 else f"{host}:{port}", tuple(rules)) if ruled else None

    def ruled_names(self) -> frozenset[str]:
        """Every host name some entry gives rules (the door reads them)."""
        return frozenset(e.host.name for e in self.entries
                         if e.rules is not None and e.host.literal is None)
