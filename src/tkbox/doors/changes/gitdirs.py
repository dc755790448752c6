"""Directories git would take for a git directory in the final tree (pure).

Git takes a directory for a repository (setup.c `is_git_directory`) when it
holds a `HEAD` and either both `objects` and `refs`, or a `commondir` file.
Such a directory inside the checkout is a bare repository: its `config` is
read by any git run inside it (a shell prompt runs `git status` on `cd`), and
`core.fsmonitor`, `core.pager`, aliases and the rest run commands. Four plain
files (`evil/HEAD`, `evil/objects/keep`, `evil/refs/keep`, `evil/config`)
are enough, and no name rule catches them; the pieces can also come over
several applies. So the door holds back every change below a directory that
is a git directory in the *final* tree: the checkout's entries (read by
`scan.checkout_links`), minus what the patch deletes, plus what it creates.

Names are compared folded (`paths.fold_ntfs`), as a case-insensitive
filesystem would, and directories too: a false alarm holds a change back,
a miss runs a command.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tkbox.doors.changes.paths import fold_ntfs, folded_parts

MARKERS = frozenset(["head", "objects", "refs", "commondir"])
REASON = "inside a directory git would take for a repository (its config can run commands)"


def is_marker(name: str) -> bool:
    """True if a folded `name` is one of the entries `is_git_directory` looks at."""
    return fold_ntfs(name) in MARKERS


def _takes(names: Iterable[str]) -> bool:
    folded = {fold_ntfs(n.rpartition("/")[2]) for n in names}
    return "head" in folded and ({"objects", "refs"} <= folded or "commondir" in folded)


def final_git_dirs(checkout: Mapping[str, set[str]],
                   changes: Iterable[tuple[str, bool, bool]]) -> set[tuple[str, ...]]:
    """The folded paths of every directory git would take for a repository.

    `checkout`: {directory path: paths of its marker entries} as found;
    `changes`: (path, exists before, exists after) for each path the patch names.
    A directory that stops existing is not looked for: kept, if it held a marker.
    """
    entries: dict[tuple[str, ...], set[str]] = {}
    for d, names in checkout.items():
        entries.setdefault(folded_parts(d) if d else (), set()).update(names)
    made: list[tuple[tuple[str, ...], str]] = []
    for path, before, after in changes:
        parts = path.split("/")
        for i in range(len(parts)):
            if not is_marker(parts[i]):
                continue
            key = folded_parts("/".join(parts[:i])) if i else ()
            entry = "/".join(parts[: i + 1])
            if after or i < len(parts) - 1:
                made.append((key, entry))
            elif before:
                entries.setdefault(key, set()).discard(entry)  # the patch deletes this entry
    for key, entry in made:  # after every deletion: a file replaced by a directory stays
        entries.setdefault(key, set()).add(entry)
    return {d for d, names in entries.items() if _takes(names)}


def reason(path: str, git_dirs: set[tuple[str, ...]]) -> str | None:
    """Why `path` is held back: it is below a directory of `git_dirs`, or None."""
    if not git_dirs:
        return None
    parts = folded_parts(path)
    deepest = max(map(len, git_dirs))  # no deeper prefix can match: linear in the path
    for k in range(min(len(parts), deepest + 1)):
        if parts[:k] in git_dirs:
            return REASON
    return None
