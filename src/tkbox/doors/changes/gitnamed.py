"""Files of the checkout that its own git configuration names (pure).

Git runs programs and reads files that its configuration names: `core.fsmonitor`,
`core.hooksPath`, `core.sshCommand`, `core.editor`, `core.pager`, `pager.*`,
filter (`clean`, `smudge`, `process`), diff (`command`, `textconv`) and merge
(`driver`) drivers, `alias.*` (`!cmd`), `credential.*.helper`,
`gpg.program`, `include.path`, `includeIf.*.path`, `core.excludesFile`, and
more, including keys of tools git does not know. A patch that changes such a
file changes what git runs the next time anyone uses the checkout, without
anyone running the file on purpose: it is sensitive.

The rule is general, not a list of keys: the door reads the whole
configuration with git itself (`git config --list --null --show-origin
--includes`, global and system files included, since a global
`core.hooksPath = .githooks` applies to this checkout too) and, for every
value, takes each word that looks like a path (holds a `/`, or starts with
`.` or `~`), and for keys that name a program or a file (`PROGRAM_KEYS`, and
every `alias.*` and `pager.*`) each word at all. Each is resolved as git
would: `~` against the home directory; a relative path against the
checkout's top level and against the directory of the file that set it
(git resolves `include.path` so). Every result inside the checkout is named;
so is every configuration file that lies inside the checkout (an included
one). A named directory names everything below it.

Reasons name the key only as `section.name` (a subsection can hold a URL with
a credential), never a value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from tkbox.doors.changes.paths import fold_ntfs, folded_parts
from tkbox.doors.changes.trie import Trie
from tkbox.gitconfig import Entry

# variable names that name a program or a file (the last component of the key)
PROGRAM_KEYS = frozenset([
    "fsmonitor", "hookspath", "sshcommand", "editor", "pager", "askpass", "program", "cmd",
    "command", "driver", "textconv", "clean", "smudge", "process", "helper", "path",
    "excludesfile", "attributesfile", "template", "templatedir", "gitproxy", "external",
    "browser", "tool", "uploadpack", "receivepack", "packobjectshook", "proxycommand",
    "allowedsignersfile", "revocationfile", "file", "script", "hook", "exec", "shell",
])
PROGRAM_SECTIONS = frozenset(["alias", "pager"])
MAX_VALUE = 4096  # characters of one value looked at
MAX_WORDS = 64  # words of one value looked at
_SPLIT = re.compile(r"[\s'\"=;|&<>(),`$!:]+")


def _key(e: Entry) -> str:
    return f"{e.section}.{'*.' if e.subsection is not None else ''}{e.name}"


def _inside(path: str, root: str) -> str | None:
    if path.startswith(root + "/"):
        rel = path[len(root) + 1 :]
        return rel or None
    return None


def _candidates(word: str, bases: Iterable[str], home: str) -> list[str]:
    if word.startswith("~"):
        word = home + word[1:] if word == "~" or word.startswith("~/") else word
    if word.startswith("/"):
        return [os.path.normpath(word)]
    return [os.path.normpath(os.path.join(b, word)) for b in bases]


def named_paths(entries: Iterable[Entry], root: str, home: str) -> dict[str, str]:
    """{checkout-relative path: reason} for every file or directory the config names.

    `root` is the checkout's top level, as an absolute path without symlinks.
    """
    named: dict[str, str] = {}

    def add(path: str, why: str) -> None:
        for p in {path, os.path.realpath(path)}:
            rel = _inside(p, root)
            if rel is not None:
                named.setdefault(rel, why)

    for e in entries:
        origin = e.origin_file
        bases = [root]
        if origin is not None:
            origin = os.path.normpath(os.path.join(root, origin))
            add(origin, f"a git configuration file ({_key(e)} is set there)")
            bases.append(os.path.dirname(origin))
        if e.value is None:
            continue
        program = e.name in PROGRAM_KEYS or e.section in PROGRAM_SECTIONS
        why = f"named by the checkout's git configuration ({_key(e)})"
        for word in _SPLIT.split(e.value[:MAX_VALUE])[:MAX_WORDS]:
            if not word or word.startswith("-"):
                continue
            if not (program or "/" in word or word.startswith((".", "~"))):
                continue
            for c in _candidates(word, bases, home):
                add(c, why)
    return named


class Named:
    """Look-ups of `named_paths` on folded components.

    The named paths are kept as a tree of folded components, so that a look-up
    folds and compares one component of the path at a time and stops where no
    named path goes deeper: a deep path costs at most as many steps as the
    deepest named path has components, not a hash of every leading slice.
    """

    def __init__(self, named: dict[str, str]) -> None:
        self.root: Trie[str] = Trie()
        for p, why in sorted(named.items()):
            node = self.root.add(folded_parts(p))
            if node.value is None:
                node.value = why

    def reason(self, path: str) -> str | None:
        """Why `path` is named: it is a named path or below a named directory."""
        for node in self.root.walk(fold_ntfs(part) for part in path.split("/")):
            if node.value is not None:
                return node.value
        return None
