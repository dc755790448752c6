"""Symlinks as they will be once the patch is applied (pure).

A name a tool reads is not always the path the patch writes: with the
checkout's `.vscode -> tools` (or one the patch creates), a patch writing
`tools/tasks.json` changes what VS Code reads as `.vscode/tasks.json`. So
every decision that depends on where a path *is*, and not only on how it is
spelled, is taken on the final tree: the checkout's symlinks, minus those the
patch removes or replaces, plus those it creates (`FinalTree`).

- `resolve(path)` follows every symlink on the way, the last component
  included, as the kernel would (`..` after a symlink goes up from where the
  link led, not lexically), through links the patch itself creates, at most
  `MAX_FOLLOW` of them (Linux's `MAXSYMLINKS` is 40). It walks an absolute
  path, starting at the checkout's real path (`root`, where the kernel
  starts too): a relative target is taken from the link's directory, an
  absolute one from `/`, `.` and empty components are dropped, `..` goes up
  one component (`/..` is `/`), even above the root, and only then is the
  place compared, component by component, with the root: a link is looked
  up only inside it, and a target may leave the checkout and come back in
  (`.vscode -> ../<checkout>/tools` is `tools`). An absolute path that spells
  the checkout another way (`root_spellings`: the path it was given by,
  through a symlinked directory) is the root too. Outside the checkout the
  components are looked up on the host (`HostLinks`, given by the door), as
  the kernel looks them up: a symlink there is followed like one inside, so
  a link through the checkout's parent, a symlinked home or any other link
  outside that leads back in is seen to (without it, as in pure tests, they
  are taken as spelled; below an automount point too, where a lookup would
  mount, and connect to, what the name says). The
  result is a path inside the checkout, `OUTSIDE` or `LOOP`. Without a
  `root`, the checkout is somewhere no path names: whatever climbs above it
  or is absolute is `OUTSIDE`. Each step costs one component, whatever the
  depth: the links' own paths are a tree walked along with the path. The
  steps of all resolutions together are bounded (`MAX_STEPS`): a link's
  target is walked again every time a path goes through it, so a few long
  targets chained 40 deep, reached from many links, would otherwise cost
  hours; past the bound the patch is refused.
- `aliases(path)` is every other name under which the final tree reaches
  `path`: for each link whose resolution is `path` or one of its ancestors,
  the link's own path followed by the rest, repeatedly (a link reached
  through another link). Each link is used at most twice on one chain, which
  is enough for any rule of two components to straddle the seam, and at most
  `MAX_ALIASES` names, of `MAX_ALIAS_CHARS` characters in all, are made
  (a chain of links can make names far longer than the path, and the caller
  checks every name); `truncated` says a bound was hit, and the caller then
  holds the change back rather than guess. The ancestors of a name that some
  link leads to are found by walking a tree of the links' resolutions one
  component at a time, not by joining every leading slice of the name.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from tkbox.doors.changes.errors import PatchRefused
from tkbox.doors.changes.paths import fold_ntfs, folded_parts
from tkbox.doors.changes.trie import Trie

MAX_FOLLOW = 40
MAX_ALIASES = 4096
MAX_ALIAS_CHARS = 1 << 20  # characters of all the names of one path together
# components walked by all resolutions of one final tree together (~0.15 s a million);
# a checkout of 2,000,000 entries, every one a link of a few components, stays below
MAX_STEPS = 50_000_000
MAX_HOST_LOOKUPS = 100_000  # distinct paths outside the checkout looked up (a readlink each)
OUTSIDE = "\x00outside"
LOOP = "\x00loop"
_NOWHERE = "\x00checkout"  # the root when none is given: no path's component is it


@dataclass(frozen=True)
class Aliases:
    names: tuple[str, ...]  # `path` first, then every other name of it
    truncated: bool


def _components(absolute: str) -> list[str]:
    """An absolute path's components, without empty or `.` ones (`/a//./b/` is [a, b])."""
    return [c for c in absolute.split("/") if c not in ("", ".")]


def _apart(a: list[str], b: list[str]) -> bool:
    """Neither path is the other or below it (a spelling below the root is a link's business)."""
    n = min(len(a), len(b))
    return a[:n] != b[:n]


class HostLinks:
    """Reads the host's symlinks outside the checkout (`FinalTree`'s `outside`).

    `self(path)` is the target of the symlink at the absolute `path`; None if it
    is no symlink (or missing, or unreadable: the kernel would not follow it
    either). Never below an automount point (`autofs` in the mount table): a
    name looked up there is mounted, and under `/net` or `/afs` the name is a
    host, so a patch's link target would make the host connect (and ask DNS)
    where the guest chose, a way out the network door never sees. There the
    components are taken as spelled.
    """

    def __init__(self, automounts: Iterable[str] | None = None) -> None:
        if automounts is None:
            automounts = _automounts()
        self.below = tuple(m.rstrip("/") + "/" for m in automounts)

    def __call__(self, path: str) -> bytes | None:
        if path.startswith(self.below):
            return None
        try:
            return os.readlink(os.fsencode(path))
        except OSError:
            return None


def _automounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """The mount points of type autofs (proc(5): the field after ` - `)."""
    try:
        with open(mountinfo, "rb") as f:
            lines = f.read(1 << 22).splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        head, sep, tail = line.partition(b" - ")
        fields = head.split()
        if sep and len(fields) >= 5 and tail.split()[:1] == [b"autofs"]:
            out.append(_unescape(fields[4]))
    return out


def _unescape(field: bytes) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes written as \\ooo."""
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field))


host_link = HostLinks(automounts=())  # without the mount table: for tests of the walk


_UNASKED = object()  # `FinalTree._host`: not looked up yet
_PATH_MAX = 4096  # bytes of a path the kernel looks up, its NUL included


def _child(node: Trie[tuple[int, bytes | None | object]],
           c: str) -> Trie[tuple[int, bytes | None | object]]:
    """`node`'s child `c` in `FinalTree._host`, made (not asked yet) where missing."""
    nxt = node.below.get(c)
    if nxt is None:
        nxt = node.below[c] = Trie()
        assert node.value is not None
        nxt.value = (node.value[0] + 1 + len(os.fsencode(c)), _UNASKED)
    return nxt


def _join(a: str, b: str) -> str:
    return b if not a else (a if not b else f"{a}/{b}")


class FinalTree:
    """The symlinks of the final tree: {checkout-relative path: target bytes}.

    `root` is the checkout's real absolute path (no symlink on it), so that a
    target reaching the checkout from outside (absolute, or climbing above it)
    is followed like a relative one; `root_spellings` are other absolute
    paths that name the same directory; `outside` reads a symlink outside the
    checkout (`host_link`), None to take the components there as spelled.
    """

    def __init__(self, links: Mapping[str, bytes], root: str = "",
                 root_spellings: Iterable[str] = (),
                 outside: Callable[[str], bytes | None] | None = None,
                 max_steps: int = MAX_STEPS) -> None:
        self.links = dict(links)
        self.root = root.rstrip("/")
        self._top = _components(self.root) if self.root else [_NOWHERE]
        self._spellings = [c for c in map(_components, root_spellings) if _apart(c, self._top)]
        self._paths: Trie[bytes] = Trie()  # the links' own paths, their targets as values
        for link, target in self.links.items():
            self._paths.add(link.split("/")).value = target
        self._outside = outside
        # `outside`'s answers, by absolute path as a tree walked along with the path
        # (no step joins the whole path): each node's value (its path's length, its
        # answer or _UNASKED)
        self._host: Trie[tuple[int, bytes | None | object]] = Trie()
        self._host.value = (0, None)
        self.lookups = 0  # `outside` calls so far
        self.steps = 0  # components walked by every resolution so far
        self.max_steps = max_steps
        self._resolved: dict[str, str] = {}
        self._by_target: dict[str, list[str]] | None = None
        self._targets: Trie[list[str]] | None = None

    @classmethod
    def after(cls, checkout_links: Mapping[str, bytes], changed: Mapping[str, bytes | None],
              root: str = "", root_spellings: Iterable[str] = (),
              outside: Callable[[str], bytes | None] | None = None) -> FinalTree:
        """The checkout's links with the patch's changes: path -> new target, None if not a link."""
        links = {p: t for p, t in checkout_links.items() if p not in changed}
        links.update({p: t for p, t in changed.items() if t is not None})
        return cls(links, root, root_spellings, outside)

    def resolve(self, path: str) -> str:
        """Where `path` leads in the final tree: a relative path, OUTSIDE or LOOP."""
        cached = self._resolved.get(path)
        if cached is None:
            cached = self._resolved[path] = self._walk(path)
        return cached

    def _walk(self, path: str) -> str:
        """`resolve`, one component a step. Inside the checkout, `nodes` holds the
        node of the links' paths at each component below the root (None where no
        link goes deeper), so no step joins or hashes the whole path; outside the
        checkout it is empty."""
        top = self._top
        at = list(top)  # where the walk is, as absolute components
        nodes: list[Trie[bytes] | None] = [self._paths]
        hosts: list[Trie[tuple[int, bytes | None | object]]] = []  # outside: `_host` at `at`
        pending = path.split("/")
        pending.reverse()
        follows = 0
        steps = self.steps
        while pending:
            c = pending.pop()
            steps += 1
            if c in ("", "."):
                continue
            if c == "..":
                if nodes:
                    at.pop()
                    nodes.pop()
                    if not nodes:  # `..` from the root leaves the checkout
                        hosts = self._host_nodes(at)
                elif at:  # `/..` is `/`
                    at.pop()
                    hosts.pop()
                continue
            if steps > self.max_steps:
                self.steps = steps
                raise PatchRefused(
                    f"resolving the symlinks of the checkout and the patch takes more than "
                    f"{self.max_steps} steps (long targets reached through chains of links); "
                    "nothing was applied")
            at.append(c)
            target: bytes | None
            if nodes:
                node = nodes[-1]
                here = node.below.get(c) if node is not None else None
                nodes.append(here)
                target = None if here is None else here.value
            elif at == top or at in self._spellings:
                at, nodes = list(top), [self._paths]  # back into the checkout
                continue
            else:  # outside: as the host's filesystem has it
                hosts.append(_child(hosts[-1], c))
                target = self._host_link(at, hosts[-1])
            if target is None:
                continue
            follows += 1
            if follows > MAX_FOLLOW:
                self.steps = steps
                return LOOP
            at.pop()
            if nodes:
                nodes.pop()
            else:
                hosts.pop()
            text = os.fsdecode(target)
            if text.startswith("/"):
                at.clear()
                nodes.clear()
                hosts = [self._host]
            pending.extend(reversed(text.split("/")))
        self.steps = steps
        return "/".join(at[len(top) :]) if nodes else OUTSIDE

    def _host_nodes(self, at: list[str]) -> list[Trie[tuple[int, bytes | None | object]]]:
        """`_host`'s nodes from the root to `at` (made where missing). Called as a walk
        leaves the checkout by `..`, so `at` is no longer than the checkout's path."""
        out = [self._host]
        for c in at:
            out.append(_child(out[-1], c))
        return out

    def _host_link(self, at: list[str], node: Trie[tuple[int, bytes | None | object]]
                   ) -> bytes | None:
        """The target of the symlink at absolute components `at` (`node` in `_host`),
        outside the checkout: asked once a path. A path longer than PATH_MAX is none
        (the kernel refuses to look it up) and is not even joined."""
        assert node.value is not None
        length, answer = node.value
        if answer is _UNASKED:
            if self._outside is None or length >= _PATH_MAX:
                answer = None
            else:
                if self.lookups >= MAX_HOST_LOOKUPS:
                    raise PatchRefused(
                        f"the symlinks of the checkout and the patch lead to more than "
                        f"{MAX_HOST_LOOKUPS} places outside the checkout; nothing was applied")
                self.lookups += 1
                answer = self._outside("/" + "/".join(at))
            node.value = (length, answer)
        assert answer is None or isinstance(answer, bytes)
        return answer

    def by_target(self) -> dict[str, list[str]]:
        """{resolved target: the links leading there}, for links that stay inside."""
        if self._by_target is None:
            index: dict[str, list[str]] = {}
            for link in sorted(self.links):
                r = self.resolve(link)
                if r not in (OUTSIDE, LOOP):
                    index.setdefault(r, []).append(link)
            self._by_target = index
        return self._by_target

    def _target_tree(self) -> Trie[list[str]]:
        """`by_target` as a tree of folded components, the links leading there as values."""
        if self._targets is None:
            root: Trie[list[str]] = Trie()
            for target, links in self.by_target().items():
                node = root.add(folded_parts(target) if target else ())
                node.value = [*(node.value or ()), *links]
            self._targets = root
        return self._targets

    def aliases(self, path: str, limit: int = MAX_ALIASES,
                max_chars: int = MAX_ALIAS_CHARS) -> Aliases:
        """`path` and every other name the final tree reaches it by (see the docstring)."""
        targets = self._target_tree()
        seen = {path}
        out = [path]
        chars = len(path)
        queue: deque[tuple[str, dict[str, int]]] = deque([(path, {})])
        while queue:
            name, used = queue.popleft()
            parts = name.split("/")
            # (how many leading components, the links leading to them)
            # folded: on a case-insensitive checkout `TOOLS/x` is `tools/x`, which a
            # link `.vscode -> tools` reaches (elsewhere a name too many is harmless)
            found = [(i, node.value) for i, node in
                     enumerate(targets.walk(fold_ntfs(c) for c in parts)) if node.value]
            for i, links in reversed(found):
                rest = "/".join(parts[i:])
                for link in links:
                    if used.get(link, 0) >= 2:
                        continue
                    alias = _join(link, rest)
                    if alias in seen:
                        continue
                    if len(out) >= limit or chars + len(alias) > max_chars:
                        return Aliases(tuple(out), True)
                    seen.add(alias)
                    out.append(alias)
                    chars += len(alias)
                    queue.append((alias, {**used, link: used.get(link, 0) + 1}))
        return Aliases(tuple(out), False)
