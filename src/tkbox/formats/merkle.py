"""RFC 6962 / RFC 9162 Merkle trees: hashing, proofs, and their verification.

Leaves and nodes (RFC 6962 §2.1, RFC 9162 §2.1.1):

    leaf hash  = SHA-256(0x00 || leaf bytes)
    node hash  = SHA-256(0x01 || left || right)
    MTH({})    = SHA-256("")
    MTH(D[n])  = node(MTH(D[0:k]), MTH(D[k:n])), k the largest power of two < n

`Tree` keeps, for every level, the hashes of the perfect subtrees completed so
far, so a root at any size, an inclusion proof or a consistency proof costs
O(log n) hashes. The `verify_*` functions follow RFC 9162 §2.1.3.2 and
§2.1.4.2 step by step; the subtree variants follow the Merkle Tree
Certificates draft (a subtree `[start, end)` is valid when `start` is a
multiple of the smallest power of two >= `end - start`). All of them raise
`FormatError` (code `merkle.*`) and never anything else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

from tkbox.formats.errors import FormatError

HASH_SIZE = 32
#: RFC 6962 §2.1: the hash of the empty tree is the hash of the empty string.
EMPTY_ROOT = hashlib.sha256(b"").digest()
#: An audit path in a tree of at most 2^64 leaves has at most 64 hashes.
MAX_PROOF = 64


def leaf_hash(data: bytes) -> bytes:
    # RFC 6962 §2.1: SHA-256(0x00 || d)
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    # RFC 6962 §2.1: SHA-256(0x01 || left || right)
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


class Tree:
    """An append-only Merkle tree of leaf hashes.

    `_levels[l]` holds, 32 bytes each, the hashes of the perfect subtrees
    `[i * 2^l, (i + 1) * 2^l)` completed so far (level 0: the leaf hashes).
    """

    def __init__(self, leaf_hashes: Iterable[bytes] = ()) -> None:
        self._levels: list[bytearray] = [bytearray()]
        for h in leaf_hashes:
            self.append(h)

    @property
    def size(self) -> int:
        return len(self._levels[0]) // HASH_SIZE

    def append(self, h: bytes) -> int:
        """Append a leaf hash; returns its index."""
        if len(h) != HASH_SIZE:
            raise ValueError("a leaf hash is 32 bytes")
        index = self.size
        self._levels[0] += h
        level, i = 0, index
        while i & 1:
            level_bytes = self._levels[level]
            left = bytes(level_bytes[(i - 1) * HASH_SIZE : i * HASH_SIZE])
            right = bytes(level_bytes[i * HASH_SIZE : (i + 1) * HASH_SIZE])
            level += 1
            if len(self._levels) == level:
                self._levels.append(bytearray())
            self._levels[level] += node_hash(left, right)
            i >>= 1
        return index

    def leaf(self, index: int) -> bytes:
        return bytes(self._levels[0][index * HASH_SIZE : (index + 1) * HASH_SIZE])

    def _perfect(self, level: int, i: int) -> bytes:
        return bytes(self._levels[level][i * HASH_SIZE : (i + 1) * HASH_SIZE])

    def _mth(self, a: int, b: int) -> bytes:
        """MTH(D[a:b]) for a < b where a is a multiple of a power of two >= b - a."""
        n = b - a
        if n & (n - 1) == 0 and a % n == 0:
            return self._perfect(n.bit_length() - 1, a // n)
        k = _split(n)
        return node_hash(self._mth(a, a + k), self._mth(a + k, b))

    def root(self, size: int | None = None) -> bytes:
        size = self.size if size is None else size
        self._check_size(size)
        return EMPTY_ROOT if size == 0 else self._mth(0, size)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """RFC 6962 §2.1.1 PATH(index, D[size]): the leaf's sibling first."""
        size = self.size if size is None else size
        self._check_size(size)
        if not 0 <= index < size:
            raise ValueError(f"leaf {index} is not in a tree of size {size}")
        return self._path(index, 0, size)

    def _path(self, m: int, a: int, b: int) -> list[bytes]:
        n = b - a
        if n == 1:
            return []
        k = _split(n)
        if m < k:
            return [*self._path(m, a, a + k), self._mth(a + k, b)]
        return [*self._path(m - k, a + k, b), self._mth(a, a + k)]

    def consistency_proof(self, old: int, new: int | None = None) -> list[bytes]:
        """RFC 6962 §2.1.2 PROOF(old, D[new]); empty when old is 0 or old == new."""
        new = self.size if new is None else new
        self._check_size(new)
        if not 0 <= old <= new:
            raise ValueError(f"no consistency proof from {old} to {new}")
        if old == 0 or old == new:
            return []
        return self._subproof(old, 0, new, True)

    def _subproof(self, m: int, a: int, b: int, complete: bool) -> list[bytes]:
        n = b - a
        if m == n:
            return [] if complete else [self._mth(a, b)]
        k = _split(n)
        if m <= k:
            return [*self._subproof(m, a, a + k, complete), self._mth(a + k, b)]
        return [*self._subproof(m - k, a + k, b, False), self._mth(a, a + k)]

    def _check_size(self, size: int) -> None:
        if not 0 <= size <= self.size:
            raise ValueError(f"the tree has {self.size} leaves, not {size}")


def root_of(leaf_hashes: Iterable[bytes]) -> bytes:
    return Tree(leaf_hashes).root()


# --- verification ----------------------------------------------------------


def _fail(what: str, code: str = "merkle.proof") -> FormatError:
    return FormatError(code, "", what)


def _check_hashes(proof: Sequence[bytes], *named: tuple[str, bytes]) -> None:
    if len(proof) > MAX_PROOF:
        raise _fail(f"a proof has at most {MAX_PROOF} hashes, this one {len(proof)}")
    for i, h in enumerate(proof):
        if len(h) != HASH_SIZE:
            raise _fail(f"proof hash {i} is {len(h)} bytes, not {HASH_SIZE}")
    for name, h in named:
        if len(h) != HASH_SIZE:
            raise _fail(f"the {name} is {len(h)} bytes, not {HASH_SIZE}")


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """RFC 9162 §2.1.3.2: the root an inclusion proof leads to."""
    _check_hashes(proof, ("leaf hash", leaf))
    if not 0 <= index < size:
        raise _fail(f"leaf index {index} is not below the tree size {size}", "merkle.index")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise _fail("the inclusion proof is too long")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)  # RFC 9162: HASH(0x01 || p || r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)  # RFC 9162: HASH(0x01 || r || p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise _fail("the inclusion proof is too short")
    return r


def verify_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes
) -> None:
    _check_hashes((), ("root hash", root))
    if root_from_inclusion(index, size, leaf, proof) != root:
        raise _fail(f"the inclusion proof of leaf {index} does not lead to the root of size {size}")


class InclusionChecker:
    """Many inclusion proofs into one tree, each node hashed once.

    `check` gives the same verdict as `verify_inclusion` for each leaf. Proofs
    of leaves that are near each other share every node above the point where
    their paths meet; a node that an earlier proof reached (and that proof led
    to the root) is not hashed again: the hash computed so far must equal the
    one remembered for that node, and the rest of the proof must be exactly the
    hashes the earlier proof used from there, so no byte of a proof goes
    unchecked. A node is named by (the number of levels climbed, `fn`): for one
    tree size that pair fixes the leaf range under it (RFC 9162 §2.1.3.2).
    A bundle of a whole run costs about one hash per record instead of
    log2(tree size).
    """

    def __init__(self, size: int, root: bytes) -> None:
        _check_hashes((), ("root hash", root))
        self.size = size
        self.root = root
        # (levels climbed, fn) -> (the node's hash, the proof that reached it, its position)
        self._nodes: dict[tuple[int, int], tuple[bytes, Sequence[bytes], int]] = {}

    def check(self, index: int, leaf: bytes, proof: Sequence[bytes]) -> None:
        if len(leaf) != HASH_SIZE or len(proof) > MAX_PROOF or not 0 <= index < self.size:
            verify_inclusion(index, self.size, leaf, proof, self.root)  # says what is wrong
        nodes = self._nodes
        fn, sn, r, level = index, self.size - 1, leaf, 0
        for k, p in enumerate(proof):
            seen = nodes.get((level, fn))
            if seen is not None:
                h, other, at = seen
                if h == r and tuple(proof[k:]) == tuple(other[at:]):
                    return
                break  # not the node (or path) the tree has: let the full check say why
            if sn == 0 or len(p) != HASH_SIZE:
                break
            nodes[(level, fn)] = (r, proof, k)
            if fn & 1 or fn == sn:
                r = node_hash(p, r)  # RFC 9162: HASH(0x01 || p || r)
                while not fn & 1 and fn != 0:
                    fn, sn, level = fn >> 1, sn >> 1, level + 1
            else:
                r = node_hash(r, p)  # RFC 9162: HASH(0x01 || r || p)
            fn, sn, level = fn >> 1, sn >> 1, level + 1
        else:
            if sn == 0 and r == self.root:
                return
        verify_inclusion(index, self.size, leaf, proof, self.root)
        # Unreachable short of a hash collision: the full check agreed where the
        # shared nodes did not.
        raise _fail(f"the inclusion proof of leaf {index} disagrees with the proofs before it")


def _valid_subtree(start: int, end: int) -> bool:
    # MTC draft: [start, end) is a subtree when start < end and start is a
    # multiple of BIT_CEIL(end - start).
    if not 0 <= start < end:
        return False
    width = 1 << (end - start - 1).bit_length()
    return start % width == 0


def verify_subtree_inclusion(
    index: int, start: int, end: int, leaf: bytes, proof: Sequence[bytes], root: bytes
) -> None:
    """Inclusion of leaf `index` in the subtree `[start, end)` whose hash is `root`."""
    if not _valid_subtree(start, end):
        raise _fail(f"[{start}, {end}) is not a valid subtree", "merkle.subtree")
    if not start <= index < end:
        raise _fail(f"leaf {index} is outside the subtree [{start}, {end})", "merkle.index")
    verify_inclusion(index - start, end - start, leaf, proof, root)


def verify_consistency(
    size1: int, size2: int, proof: Sequence[bytes], root1: bytes, root2: bytes
) -> None:
    """RFC 9162 §2.1.4.2: the tree of `size2` extends the tree of `size1`."""
    if not 0 <= size1 <= size2:
        raise _fail(f"the old size {size1} is larger than the new size {size2}", "merkle.size")
    if size1 == 0:
        # Anything is consistent with the empty tree: a proof from 0 proves
        # nothing, and RFC 9162 defines none.
        raise _fail("there is no consistency proof from the empty tree", "merkle.size")
    if size1 == size2:
        if proof:
            raise _fail("equal sizes need an empty consistency proof")
        if root1 != root2:
            raise _fail(f"two different root hashes for the same size {size1}")
        return
    _check_hashes(proof, ("old root hash", root1), ("new root hash", root2))
    _consistency(0, size1, size2, proof, root1, root2)


def verify_subtree_consistency(
    start: int, end: int, size: int, proof: Sequence[bytes], subtree: bytes, root: bytes
) -> None:
    """The subtree `[start, end)` with hash `subtree` is part of the tree of `size`."""
    if start == end:
        # The empty subtree is part of every tree; its hash is MTH({}).
        if proof:
            raise _fail("an empty subtree needs an empty proof")
        if end > size:
            raise _fail(f"the subtree ends at {end}, after the tree of size {size}", "merkle.size")
        if subtree != EMPTY_ROOT:
            raise _fail("the hash of an empty subtree is SHA-256 of nothing")
        return
    if not _valid_subtree(start, end):
        raise _fail(f"[{start}, {end}) is not a valid subtree", "merkle.subtree")
    if end > size:
        raise _fail(f"the subtree ends at {end}, after the tree of size {size}", "merkle.size")
    if start == 0 and end == size:
        if proof:
            raise _fail("a subtree that is the whole tree needs an empty proof")
        if subtree != root:
            raise _fail("the subtree is the whole tree but its hash is not the root")
        return
    _check_hashes(proof, ("subtree hash", subtree), ("root hash", root))
    _consistency(start, end, size, proof, subtree, root)


def _consistency(
    start: int, end: int, size: int, proof: Sequence[bytes], first: bytes, second: bytes
) -> None:
    """RFC 9162 §2.1.4.2, generalised from [0, end) to an aligned subtree [start, end).

    Left siblings count towards the old (sub)tree's hash only below its own
    height `k`, since [start, start + 2^k) is the aligned block it lives in;
    with start = 0 that is every left sibling, as in the RFC.
    """
    if not proof:
        raise _fail("the consistency proof is empty")
    width = end - start
    k = (width - 1).bit_length()  # the old (sub)tree's height
    path = list(proof)
    fn, sn, height = end - 1, size - 1, 0
    if width & (width - 1) == 0 or end == size:
        # RFC 9162 step 2: if the old (sub)tree is a node of the new tree (a
        # perfect subtree, or a subtree on the new tree's right edge), the
        # verifier knows its hash already, and the path starts from it.
        path.insert(0, first)
        fn, sn, height = fn >> k, sn >> k, k
    else:
        # Step 4: climb while fn is a right child (this stays below height k).
        while fn & 1:
            fn, sn, height = fn >> 1, sn >> 1, height + 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise _fail("the consistency proof is too long")
        if fn & 1 or fn == sn:
            while not fn & 1 and fn != 0:
                fn, sn, height = fn >> 1, sn >> 1, height + 1
            if height < k:
                fr = node_hash(c, fr)  # RFC 9162: HASH(0x01 || c || fr)
            sr = node_hash(c, sr)  # RFC 9162: HASH(0x01 || c || sr)
        else:
            sr = node_hash(sr, c)  # RFC 9162: HASH(0x01 || sr || c)
        fn, sn, height = fn >> 1, sn >> 1, height + 1
    if sn != 0:
        raise _fail("the consistency proof is too short")
    if fr != first:
        raise _fail(f"the consistency proof does not lead to the old root of size {end}")
    if sr != second:
        raise _fail(f"the consistency proof does not lead to the new root of size {size}")


# --- many leaves of one tree at once ---------------------------------------


def path_position(index: int, size: int, level: int) -> int:
    """How many hashes of leaf `index`'s audit path (RFC 6962 §2.1.1, in a tree of
    `size`) lie below `level`: the position of its level-`level` sibling in it.

    At level l the leaf's ancestor is node x = index >> l; it has a sibling
    (x ^ 1) unless x is even and the last node of its level ((size - 1) >> l),
    in which case it is carried up unhashed and the path has no hash there.
    Below level d, the length of the highest bit in which `index` and the last
    leaf differ, x is never the last node: every level has a hash. From d up, x
    is the last node, and has a sibling exactly where it is odd: where `index`
    has a 1 bit. (The level-by-level count is the test's reference.)
    """
    d = (index ^ (size - 1)).bit_length()
    if level <= d:
        return level
    return d + ((index >> d) & ((1 << (level - d)) - 1)).bit_count()


class Rebuilt:
    """The part of a tree of `size` above some of its leaves, hashed once.

    `rebuild(size, indexes, leaves, outside)` hashes every node that has one of
    the given leaves below it ("covered"), level by level, from the leaves to
    the root: each node once, however many of the leaves share it. A covered
    node's sibling is either covered too (hashed here) or not, and then its
    hash is `outside(level, j)`: the hash at that level of the audit path the
    caller holds for leaf `indexes[j]`, which lies below the node (when the
    caller holds every leaf of the tree, `outside` is never called).

    The covered nodes of a level are kept in order, as lists: `siblings[l][p]`
    is the hash of the p-th covered node's sibling at level l, or None when it
    has none (the right edge), and `parents[l][p]` is where its parent is among
    the covered nodes of level l + 1. So the audit path of leaf `indexes[j]` is,
    from the bottom, the non-None siblings along the parents from (0, j);
    `paths(encode)` builds each one once, sharing what leaves have in common.
    If the root equals the signed root and each caller's path equals the one
    built here, every path is a valid inclusion proof (RFC 9162 §2.1.3.2 climbs
    through exactly these nodes), at about two hashes per leaf instead of
    log2(size).
    """

    def __init__(self, size: int, indexes: Sequence[int], leaves: Sequence[bytes],
                 outside: Callable[[int, int], bytes]) -> None:
        if size < 1 or len(indexes) != len(leaves) or not indexes:
            raise _fail("rebuild needs at least one leaf and a tree of at least one leaf")
        prev = -1
        for i in indexes:
            if not prev < i < size:
                raise _fail(f"leaf {i} is not after {prev} and below the tree size {size}",
                            "merkle.index")
            prev = i
        self.count = len(indexes)
        self.siblings: list[list[bytes | None]] = []
        self.parents: list[list[int]] = []
        # the covered nodes of this level, in order: node number, hash, and the
        # first j whose leaf is below it
        xs, hs, js = list(indexes), list(leaves), list(range(len(indexes)))
        level, last = 0, size - 1
        while last > 0:
            n = len(xs)
            sib: list[bytes | None] = [None] * n
            parent = [0] * n
            up_xs: list[int] = []
            up_hs: list[bytes] = []
            up_js: list[int] = []
            up_x, up_h, up_j = up_xs.append, up_hs.append, up_js.append
            p = q = 0  # p: this level's node; q: its parent's place in the level above
            while p < n:
                x, h = xs[p], hs[p]
                if not x & 1 and p + 1 < n and xs[p + 1] == x + 1:  # both children covered
                    r = hs[p + 1]
                    sib[p] = r
                    sib[p + 1] = h
                    parent[p] = parent[p + 1] = q
                    up_h(node_hash(h, r))  # RFC 6962: HASH(0x01 || l || r)
                    step = 2
                else:
                    if x == last and not x & 1:
                        up_h(h)  # no right sibling: carried up unhashed
                    else:
                        s = sib[p] = outside(level, js[p])
                        up_h(node_hash(s, h) if x & 1 else node_hash(h, s))
                    parent[p] = q
                    step = 1
                up_x(x >> 1)
                up_j(js[p])
                p += step
                q += 1
            self.siblings.append(sib)
            self.parents.append(parent)
            xs, hs, js, level, last = up_xs, up_hs, up_js, level + 1, last >> 1
        self.root = hs[0]

    def paths(self, encode: Callable[[bytes], bytes], lo: int = 0,
              hi: int | None = None) -> list[bytes]:
        """The audit paths of leaves `indexes[lo:hi]`, each the concatenation of
        `encode(hash)`, bottom first. A caller can take them a slice at a time, so
        that only that slice's paths are held at once."""
        lo, hi, _ = slice(lo, hi).indices(self.count)
        if hi <= lo:
            return []
        if not self.siblings:  # a tree of one leaf: its path is empty
            return [b""] * (hi - lo)
        # the covered nodes of these leaves at each level: a run of places [a, b)
        spans = [(lo, hi)]
        for parent in self.parents[:-1]:
            a, b = spans[-1]
            spans.append((parent[a], parent[b - 1] + 1))
        above, top = [b""], 0  # the paths from the level above up, from its place `top`
        for sib, parent, (a, b) in zip(reversed(self.siblings), reversed(self.parents),
                                       reversed(spans), strict=True):
            here: list[bytes] = []
            add = here.append
            for p in range(a, b):
                s = sib[p]
                rest = above[parent[p] - top]
                add(rest if s is None else encode(s) + rest)
            above, top = here, a
        return above
