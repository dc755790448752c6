"""From parsed sections and the checkout's current states to a plan (pure).

A plan gives each path the patch touches its old state (as read from the
checkout), its final state (computed by `patch.apply_section`, exactly), a
kind for the report, and a status: to apply, held back, or refused. It also
enforces the rules that need both the patch and the checkout:

- nothing is written, modified or deleted through a symlink, whether the
  symlink is in the checkout or created by the patch, and nothing through a
  path that is (or becomes) a file;
- a symlink the patch creates points inside the checkout and not into
  `.git`: lexically first (`paths.check_symlink_target`), then resolved
  against the final tree (`links.FinalTree`), through the checkout's links and
  the ones the patch creates, as the kernel will resolve it;
- a directory the patch replaces by a file or symlink holds nothing else;
- changes are held back or refused together with the changes they depend on
  (a file replacing a directory, and the deletions emptying that directory).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import islice
from typing import Literal

from tkbox.doors.changes.errors import PatchRefused
from tkbox.doors.changes.links import LOOP, OUTSIDE, FinalTree
from tkbox.doors.changes.patch import MODE_EXEC, MODE_FILE, MODE_LINK, Patch, Section, apply_section
from tkbox.doors.changes.paths import check_symlink_target, folded_parts, is_dotgit
from tkbox.doors.changes.trie import Trie

Kind = Literal["added", "modified", "deleted", "mode", "symlink"]
Status = Literal["apply", "held back", "refused", "set apart"]


@dataclass(frozen=True)
class State:
    """One path in a tree: absent, a file, a symlink, a directory, or other."""

    kind: Literal["absent", "file", "link", "dir", "other"]
    content: bytes = b""  # a file's bytes or a symlink's target
    exec: bool = False
    perm: int = 0o644  # a file's permission bits as found
    ident: tuple[int, ...] = ()  # (dev, ino, mode, size, mtime_ns) as found
    blocked_by: str | None = None  # an ancestor that is not a directory
    below: frozenset[str] = frozenset()  # a directory's non-directory entries (full paths)

    @property
    def mode(self) -> int | None:
        if self.kind == "file":
            return MODE_EXEC if self.exec else MODE_FILE
        if self.kind == "link":
            return MODE_LINK
        return None


ABSENT = State("absent")


def final_state(mode: int | None, content: bytes | None) -> State:
    if mode is None or content is None:
        return ABSENT
    if mode == MODE_LINK:
        return State("link", content)
    return State("file", content, exec=mode == MODE_EXEC)


@dataclass
class FilePlan:
    path: str
    sections: list[Section]
    old: State
    new: State
    kind: Kind
    status: Status = "apply"
    reason: str = ""

    @cached_property
    def sha256(self) -> str | None:
        """Of the new content (hashed once: the decision, the write check and the report
        all name it); `new` is never reassigned."""
        if self.new.kind == "absent":
            return None
        return hashlib.sha256(self.new.content).hexdigest()

    @property
    def mode(self) -> str | None:
        m = self.new.mode
        return None if m is None else f"{m:06o}"


@dataclass
class Plan:
    patch: Patch
    files: list[FilePlan] = field(default_factory=list)
    tree: FinalTree = field(default_factory=lambda: FinalTree({}))
    # folded paths of the directories git would take for a repository (`gitdirs`)
    git_dirs: set[tuple[str, ...]] = field(default_factory=set)

    def kept(self) -> list[FilePlan]:
        return [f for f in self.files if f.status == "apply"]

    def kept_sections(self) -> list[Section]:
        return [s for f in self.kept() for s in f.sections]


def group(patch: Patch) -> list[tuple[str, list[Section]]]:
    """Sections by path, in patch order (a type change is two sections)."""
    out: list[tuple[str, list[Section]]] = []
    for s in patch.sections:
        if out and out[-1][0] == s.path:
            out[-1][1].append(s)
        else:
            out.append((s.path, [s]))
    return out


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _kind(old: State, new: State) -> Kind:
    if new.kind == "link" and (old.kind != "link" or old.content != new.content):
        return "symlink"
    if old.kind == "absent":
        return "added"
    if new.kind == "absent":
        return "deleted"
    if old.kind == new.kind and old.content == new.content:
        return "mode"
    return "modified"


def build(patch: Patch, states: Mapping[str, State], *, max_file_bytes: int,
          links: Mapping[str, bytes] | None = None, root: str = "",
          root_spellings: Sequence[str] = (), max_total_bytes: int | None = None,
          outside: Callable[[str], bytes | None] | None = None) -> Plan:
    """Compute every final state exactly; refuse what the rules above forbid.

    `states` holds the checkout's state of every path the patch names and of
    each of their ancestors; `links` every symlink of the checkout (path ->
    target), `root` its real absolute path and `root_spellings` other absolute
    paths of it, and `outside` what reads a symlink outside the checkout
    (`links.host_link`), for the final tree.
    `max_total_bytes` bounds the sum of all final contents held at once.
    """
    plan = Plan(patch)
    finals: dict[str, State] = {}
    total = 0
    for path, sections in group(patch):
        old = states[path]
        if old.blocked_by is not None:
            old_for_patch = ABSENT  # nothing is there once the blocking entry goes
        else:
            old_for_patch = old
        content: bytes | None
        if old_for_patch.kind in ("dir", "other"):
            content = None
            cur_mode = None
        else:
            content = old_for_patch.content if old_for_patch.kind != "absent" else None
            cur_mode = old_for_patch.mode
        for s in sections:
            if s.old_mode is not None and cur_mode is not None and s.old_mode != cur_mode:
                raise PatchRefused(
                    f"{s.where}: the checkout has mode {cur_mode:06o} there, the patch "
                    f"expects {s.old_mode:06o}"
                )
            if old_for_patch.kind == "other":
                raise PatchRefused(f"{s.where}: the checkout has a special file there")
            content = apply_section(s, content, max_file_bytes)
            cur_mode = s.new_mode
        new = final_state(cur_mode, content)
        total += len(new.content)
        if max_total_bytes is not None and total > max_total_bytes:
            raise PatchRefused(f"{sections[0].where}: the patch's files add up to more than "
                               f"{max_total_bytes} bytes; apply it in parts")
        if new.kind == "link":
            check_symlink_target(path, new.content, sections[-1].where)
        finals[path] = new
        plan.files.append(FilePlan(path, sections, old, new, _kind(old, new)))

    plan.tree = FinalTree.after(
        links or {}, {p: (st.content if st.kind == "link" else None) for p, st in finals.items()},
        root, root_spellings, outside)
    for f in plan.files:
        if f.new.kind == "link":
            _check_final_target(plan.tree, f)
    for f in plan.files:
        where = f.sections[0].where
        for anc in _ancestors(f.path):
            if anc in finals:
                if f.new.kind == "absent":
                    continue  # deletions happen first, before anything is made at `anc`
                if finals[anc].kind == "link":
                    raise PatchRefused(f"{where}: written through the symlink {anc!r} "
                                       "that the patch creates")
                if finals[anc].kind == "file":
                    raise PatchRefused(f"{where}: below {anc!r}, which the patch makes a file")
                continue  # deleted by the patch: becomes a directory
            st = states[anc]
            if st.kind == "link":
                raise PatchRefused(f"{where}: {anc!r} is a symlink in the checkout; tkbox "
                                   "never writes through a symlink")
            if st.kind in ("file", "other"):
                raise PatchRefused(f"{where}: {anc!r} is a file in the checkout")
        if f.old.kind == "dir" and f.new.kind != "absent":
            deleted = {p.path for p in plan.files if p.new.kind == "absent"}
            left = sorted(f.old.below - deleted)
            if left:
                raise PatchRefused(f"{where}: replaces a directory that still holds "
                                   f"{left[0]!r}, which the patch does not delete")
    return plan


def _check_final_target(tree: FinalTree, f: FilePlan) -> None:
    """A link the patch makes must lead inside the checkout, and not into `.git`,
    once every other link (the checkout's, and the patch's own) is followed."""
    where = f.sections[-1].where
    shown = f.new.content[:200].decode("utf-8", "backslashreplace")
    dest = tree.resolve(f.path)
    if dest == OUTSIDE:
        raise PatchRefused(f"{where}: symlink {f.path!r} -> {shown!r} refused: through the "
                           "symlinks of the final tree it leads outside the checkout")
    if dest == LOOP:
        return  # the kernel refuses to follow it (ELOOP): it leads nowhere
    if any(is_dotgit(part) for part in dest.split("/") if part):
        raise PatchRefused(f"{where}: symlink {f.path!r} -> {shown!r} refused: through the "
                           "symlinks of the final tree it leads into .git")


def classify(plan: Plan, *, ignored: set[str], sensitive: Callable[[str], str | None],
             allow_sensitive: bool) -> None:
    """Set each file's status: ignored files set apart, sensitive ones held back.

    A file the checkout's git ignores is never written (`git status` would not show it):
    it is build output, a cache, a log, the things a person does not commit. It is set
    apart, listed and not written, without failing the apply (docs/changes.md).
    """
    for f in plan.files:
        if f.path in ignored:
            f.status, f.reason = "set apart", "ignored by the checkout's git (git status " \
                "would not show it): not written"
            continue
        if allow_sensitive:
            continue
        why = sensitive(f.path)
        if why is not None:
            f.status, f.reason = "held back", f"sensitive: {why}"
        elif f.new.kind == "file" and f.new.exec and not (f.old.kind == "file" and f.old.exec):
            f.status, f.reason = "held back", "sensitive: makes the file executable"
    # a change and the changes it depends on go together: a kept file at, below or
    # above a file held back or set apart (folded) is held back with it, naming the
    # first such file; the stopped files are a tree of folded components, so each
    # kept file is checked in steps of its own depth, not against every stopped file
    stopped = [f for f in plan.files if f.status != "apply"]
    tree = _Stopped(len(stopped))
    for i, g in enumerate(stopped):
        tree.add(folded_parts(g.path), i)
    for f in plan.files:
        if f.status != "apply":
            continue
        first = tree.first_related(folded_parts(f.path))
        if first < len(stopped):
            g = stopped[first]
            f.status, f.reason = "held back", f"goes with {g.path!r} ({g.status})"


class _First:
    """The first (lowest index) stopped file that is this path (`here`), and that is
    it or below it (`sub`)."""

    __slots__ = ("here", "sub")

    def __init__(self, none: int) -> None:
        self.here = none
        self.sub = none


class _Stopped:
    """Folded paths of the stopped files as a tree, with `_First` at each node."""

    __slots__ = ("none", "tree")

    def __init__(self, none: int) -> None:
        self.none = none  # an index no file has
        self.tree: Trie[_First] = Trie()

    def _first(self, node: Trie[_First]) -> _First:
        if node.value is None:
            node.value = _First(self.none)
        return node.value

    def add(self, parts: tuple[str, ...], index: int) -> None:
        end = self.tree.add(parts)
        for node in islice(self.tree.walk(parts), 1, None):  # the root is no file's path
            first = self._first(node)
            first.sub = min(first.sub, index)
        first = self._first(end)
        first.here = min(first.here, index)

    def first_related(self, parts: tuple[str, ...]) -> int:
        """The first stopped file that is `parts`, an ancestor of it, or below it."""
        best = self.none
        depth, node = 0, self.tree
        for depth, node in enumerate(self.tree.walk(parts)):
            if depth > 0:
                best = min(best, self._first(node).here)
        if depth == len(parts):
            best = min(best, self._first(node).sub)
        return best
