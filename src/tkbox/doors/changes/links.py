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
  `MAX_FOLLOW` of them (Linux's `MAXSYMLINKS` is 40). The result is a path
  inside the checkout, `OUTSIDE` (an absolute target elsewhere, or `..` above
  the root) or `LOOP`.
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
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

MAX_FOLLOW = 40
MAX_ALIASES = 4096
MAX_ALIAS_CHARS = 1 << 20  # characters of all the names of one path together
OUTSIDE = "\x00outside"
LOOP = "\x00loop"


@dataclass(frozen=True)
class Aliases:
    names: tuple[str, ...]  # `path` first, then every other name of it
    truncated: bool


def _join(a: str, b: str) -> str:
    return b if not a else (a if not b else f"{a}/{b}")


class FinalTree:
    """The symlinks of the final tree: {checkout-relative path: target bytes}.

    `root` is the checkout's absolute path, so that an absolute target that
    points inside the checkout is followed like a relative one.
    """

    def __init__(self, links: Mapping[str, bytes], root: str = "") -> None:
        self.links = dict(links)
        self.root = root.rstrip("/")
        self._resolved: dict[str, str] = {}
        self._by_target: dict[str, list[str]] | None = None
        self._targets: _Targets | None = None

    @classmethod
    def after(cls, checkout_links: Mapping[str, bytes], changed: Mapping[str, bytes | None],
              root: str = "") -> FinalTree:
        """The checkout's links with the patch's changes: path -> new target, None if not a link."""
        links = {p: t for p, t in checkout_links.items() if p not in changed}
        links.update({p: t for p, t in changed.items() if t is not None})
        return cls(links, root)

    def _target_parts(self, target: bytes) -> list[str] | None:
        text = os.fsdecode(target)
        if text.startswith("/"):
            if not self.root or not (text == self.root or text.startswith(self.root + "/")):
                return None
            text = text[len(self.root) :].lstrip("/")
            return text.split("/") if text else []
        return text.split("/")

    def resolve(self, path: str) -> str:
        """Where `path` leads in the final tree: a relative path, OUTSIDE or LOOP."""
        cached = self._resolved.get(path)
        if cached is not None:
            return cached
        stack: list[str] = []
        pending = [p for p in path.split("/")]
        pending.reverse()
        follows = 0
        while pending:
            c = pending.pop()
            if c in ("", "."):
                continue
            if c == "..":
                if not stack:
                    return self._keep(path, OUTSIDE)
                stack.pop()
                continue
            stack.append(c)
            target = self.links.get("/".join(stack))
            if target is None:
                continue
            follows += 1
            if follows > MAX_FOLLOW:
                return self._keep(path, LOOP)
            stack.pop()
            parts = self._target_parts(target)
            if parts is None:
                return self._keep(path, OUTSIDE)
            if target.startswith(b"/"):
                stack.clear()
            pending.extend(reversed(parts))
        return self._keep(path, "/".join(stack))

    def _keep(self, path: str, result: str) -> str:
        self._resolved[path] = result
        return result

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

    def _target_tree(self) -> _Targets:
        """`by_target` as a tree of components: {component: subtree}, links leading here."""
        if self._targets is None:
            root = _Targets()
            for target, links in self.by_target().items():
                node = root
                for c in target.split("/") if target else ():
                    node = node.below.setdefault(c, _Targets())
                node.links = links
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
            found = [(0, targets.links)] if targets.links else []
            node = targets
            for i, c in enumerate(parts):
                nxt = node.below.get(c)
                if nxt is None:
                    break
                node = nxt
                if node.links:
                    found.append((i + 1, node.links))
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


class _Targets:
    __slots__ = ("below", "links")

    def __init__(self) -> None:
        self.below: dict[str, _Targets] = {}
        self.links: list[str] = []
