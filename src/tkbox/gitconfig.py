"""Git configuration as git itself reads it: parse `git config --list --null`, render it back.

Pure (no I/O, stdlib only): both the workspace copy (`tkbox.daemon.workspace`,
which rewrites `.git/config` without credentials) and the changes door (which
holds back files the checkout's config names) read configuration through git,
never with a parser of their own, and hand git's output to `parse_list`.

Wire format (git-config(1), `--null`): each entry is the key, then a LF and
the value when there is one, then a NUL; with `--show-origin` each entry is
preceded by its origin (`file:<path>`, `command line:`, ...) and a NUL. A key
is `section.name` or `section.subsection.name`: the section and the name hold
no dot and are lower-cased by git, the subsection keeps its case and may hold
dots, so it is everything between the first and the last dot. A key with no
LF has no value (`[core] bare` alone: git's implicit true), which differs
from an empty value.

`render` writes entries back in the one canonical form git reads (each header
`[section "sub"]` with `\\` and `"` escaped, each value double-quoted with
`\\`, `"`, LF, TAB and BS escaped), so that any value survives, whitespace,
`#` and `;` included. Bytes that are not UTF-8 travel as surrogate escapes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tkbox.errors import HostError

MAX_ENTRIES = 100_000  # of one `git config --list`, more is refused
_SECTION = re.compile(r"[a-z0-9-]+\Z", re.ASCII)
_NAME = re.compile(r"[a-z][a-z0-9-]*\Z", re.ASCII)


class ConfigListError(HostError):
    """Git printed a configuration listing we cannot read (a git we do not know)."""


@dataclass(frozen=True)
class Entry:
    section: str  # lower case, no dot
    subsection: str | None  # case kept; None when the key has none
    name: str  # lower case, no dot
    value: str | None  # None: the key stands alone (implicit true)
    origin: str = ""  # with --show-origin: `file:<path>`, `command line:`, ...

    @property
    def key(self) -> str:
        mid = "" if self.subsection is None else f".{self.subsection}"
        return f"{self.section}{mid}.{self.name}"

    @property
    def group(self) -> tuple[str, str | None]:
        return (self.section, self.subsection)

    @property
    def origin_file(self) -> str | None:
        """The file the entry came from, when git says it came from a file."""
        return self.origin[5:] if self.origin.startswith("file:") else None


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def parse_key(key: str) -> tuple[str, str | None, str]:
    first, last = key.find("."), key.rfind(".")
    if first <= 0 or last == len(key) - 1:
        raise ConfigListError(f"git listed a configuration key we cannot read: {key[:80]!r}")
    section, name = key[:first], key[last + 1 :]
    sub = key[first + 1 : last] if last > first else None
    if not _SECTION.match(section) or not _NAME.match(name):
        raise ConfigListError(f"git listed a configuration key we cannot read: {key[:80]!r}")
    return section, sub, name


def parse_list(out: bytes, *, show_origin: bool = False) -> list[Entry]:
    """Entries of `git config --list --null [--show-origin]`, in git's order."""
    if out and not out.endswith(b"\x00"):
        raise ConfigListError("git's configuration listing does not end with NUL")
    fields = out.split(b"\x00")[:-1]
    if show_origin and len(fields) % 2:
        raise ConfigListError("git's configuration listing has an origin without an entry")
    step = 2 if show_origin else 1
    if len(fields) // step > MAX_ENTRIES:
        raise ConfigListError(f"the git configuration has more than {MAX_ENTRIES} entries")
    entries: list[Entry] = []
    for i in range(0, len(fields), step):
        origin = _text(fields[i]) if show_origin else ""
        raw = fields[i + step - 1]
        key_raw, lf, value_raw = raw.partition(b"\n")
        section, sub, name = parse_key(_text(key_raw))
        entries.append(Entry(section, sub, name, _text(value_raw) if lf else None, origin))
    return entries


def _escape_value(value: str) -> str:
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    return out.replace("\n", "\\n").replace("\t", "\\t").replace("\b", "\\b")


def render(entries: Iterable[Entry]) -> bytes:
    """A config file git reads back as exactly `entries` (see the module docstring)."""
    lines: list[str] = []
    current: tuple[str, str | None] | None = None
    for e in entries:
        if not _SECTION.match(e.section) or not _NAME.match(e.name):
            raise ConfigListError(f"cannot write the configuration key {e.key[:80]!r}")
        if e.group != current:
            current = e.group
            if e.subsection is None:
                lines.append(f"[{e.section}]")
            else:
                if "\n" in e.subsection or "\x00" in e.subsection:
                    raise ConfigListError("a configuration subsection holds a line break")
                sub = e.subsection.replace("\\", "\\\\").replace('"', '\\"')
                lines.append(f'[{e.section} "{sub}"]')
        if e.value is None:
            lines.append(f"\t{e.name}")
        else:
            if "\x00" in e.value:
                raise ConfigListError("a configuration value holds a NUL")
            lines.append(f'\t{e.name} = "{_escape_value(e.value)}"')
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape") if lines else b""


def same(a: Sequence[Entry], b: Sequence[Entry]) -> bool:
    """Whether two listings hold the same keys and values in the same order."""
    return [(e.key, e.value) for e in a] == [(e.key, e.value) for e in b]
