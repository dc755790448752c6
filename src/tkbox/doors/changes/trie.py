"""A tree of path components: the door's one look-up of a path in a set of paths (pure).

The door asks of a set of paths whether a path is in it, below one of its
members, or above one, and a path can be thousands of components deep (a
name made through symlinks). Hashing every leading slice of it would cost
its depth squared; a `Trie` answers in one step a component, and stops where
the set goes no deeper. The components are the caller's: folded
(`paths.folded_parts`, `paths.fold_ntfs`) where a filesystem may compare
names so, as spelled where the kernel compares bytes (`links`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")


class Trie(Generic[V]):
    """One node: the nodes `below` it by component, and its `value` (None: none)."""

    __slots__ = ("below", "value")

    def __init__(self) -> None:
        self.below: dict[str, Trie[V]] = {}
        self.value: V | None = None

    def add(self, parts: Iterable[str]) -> Trie[V]:
        """The node at `parts` below this one, made with those on the way if missing."""
        node = self
        for c in parts:
            nxt = node.below.get(c)
            if nxt is None:
                nxt = node.below[c] = Trie()
            node = nxt
        return node

    def find(self, parts: Iterable[str]) -> Trie[V] | None:
        """The node at `parts` below this one, None if the tree does not go there."""
        node = self
        for c in parts:
            nxt = node.below.get(c)
            if nxt is None:
                return None
            node = nxt
        return node

    def walk(self, parts: Iterable[str]) -> Iterator[Trie[V]]:
        """This node, then the node at each leading slice of `parts`, as far as the
        tree goes. A component is taken from `parts` only where the tree goes
        deeper, so a caller that folds them as it goes folds no more than that."""
        node = self
        yield node
        it = iter(parts)
        while node.below:
            c = next(it, None)
            if c is None:
                return
            nxt = node.below.get(c)
            if nxt is None:
                return
            node = nxt
            yield node
