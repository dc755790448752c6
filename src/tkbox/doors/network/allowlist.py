"""The box's allowlist: entries from `--allow`, presets expanded.

Pure. An entry is `host` (ports 443 and 80), `host:port` (that port only),
`host:low-high` (those ports only) or a preset name. Hosts are normalised by
`names.parse_host`, so matching is exact equality of canonical forms: no
suffix or wildcard matching, so `example.org` never admits
`evil.example.org` nor `example.org.evil.net`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Match:
    entry: Entry

    @property
    def rule(self) -> str:
        src = self.entry.source
        return f"allow {self.entry.text}" + (f" ({src})" if src != self.entry.text else "")


def parse_entry(text: str, source: str | None = None) -> Entry:
    """One `host`, `host:port` or `host:low-high` entry. Raises UserError."""
    try:
        host_text, port_text = split_authority(text.strip())
        host = parse_host(host_text)
        if port_text is None:
            return Entry(host, 0, 0, False, source or text)
        low_text, dash, high_text = port_text.partition("-")
        low = parse_port(low_text)
        high = parse_port(high_text) if dash else low
    except HostNameError as exc:
        raise UserError(f"--allow {text!r}: {exc.message.removeprefix('refused: ')}") from None
    if high < low:
        raise UserError(f"--allow {text!r}: port range {low}-{high} runs backwards")
    return Entry(host, low, high, True, source or text)


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
            expanded = expand(text) if ":" not in text and "." not in text else None
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
