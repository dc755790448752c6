"""RFC 6962 Merkle hashing against the transparency-dev probes, and our own trees.

The probes in tests/testdata/merkle/ (transparency-dev/merkle, Apache-2.0)
run on every test run; each says whether it must verify (`wantErr`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from pathlib import Path

import pytest

from tkbox.formats import FormatError, merkle

TESTDATA = Path(__file__).resolve().parents[2] / "testdata" / "merkle"


def _probes(kind: str) -> list[Path]:
    files = sorted((TESTDATA / kind).rglob("*.json"))
    assert files, f"no probes under {TESTDATA / kind}"
    return files


def _b(s: str | None) -> bytes:
    return base64.b64decode(s) if s else b""


def _proof(p: list[str] | None) -> list[bytes]:
    return [_b(h) for h in (p or [])]


def _id(p: Path) -> str:
    return str(p.relative_to(TESTDATA))


def _run(check, want_err: bool) -> None:
    if want_err:
        with pytest.raises(FormatError):
            check()
    else:
        check()


@pytest.mark.parametrize("path", _probes("inclusion"), ids=_id)
def test_inclusion_probe(path: Path) -> None:
    d = json.loads(path.read_text())
    _run(
        lambda: merkle.verify_inclusion(
            d["leafIdx"], d["treeSize"], _b(d["leafHash"]), _proof(d["proof"]), _b(d["root"])
        ),
        d["wantErr"],
    )


@pytest.mark.parametrize("path", _probes("consistency"), ids=_id)
def test_consistency_probe(path: Path) -> None:
    d = json.loads(path.read_text())
    _run(
        lambda: merkle.verify_consistency(
            d["size1"], d["size2"], _proof(d["proof"]), _b(d["root1"]), _b(d["root2"])
        ),
        d["wantErr"],
    )


@pytest.mark.parametrize("path", _probes("subtreeinclusion"), ids=_id)
def test_subtree_inclusion_probe(path: Path) -> None:
    d = json.loads(path.read_text())
    _run(
        lambda: merkle.verify_subtree_inclusion(
            d["leafIdx"], d["start"], d["end"], _b(d["leafHash"]), _proof(d["proof"]),
            _b(d["root"]),
        ),
        d["wantErr"],
    )


@pytest.mark.parametrize("path", _probes("subtreeconsistency"), ids=_id)
def test_subtree_consistency_probe(path: Path) -> None:
    d = json.loads(path.read_text())
    _run(
        lambda: merkle.verify_subtree_consistency(
            d["start"], d["end"], d["size"], _proof(d["proof"]), _b(d["root1"]), _b(d["root2"])
        ),
        d["wantErr"],
    )


def _reference_mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 §2.1 MTH, written the slow way, to check Tree against."""
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return merkle.leaf_hash(leaves[0])
    k = 1 << ((n - 1).bit_length() - 1)
    return merkle.node_hash(_reference_mth(leaves[:k]), _reference_mth(leaves[k:]))


def test_rfc6962_empty_root_and_known_leaf() -> None:
    assert merkle.EMPTY_ROOT.hex() == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    # The probes' leaf hash is RFC 6962's hash of the empty leaf.
    assert base64.b64encode(merkle.leaf_hash(b"")).decode() == (
        "bjQLnP+zepicpUTmu3gKLHiQHT+zNzh2hRGjBhevoB0="
    )


def test_tree_roots_and_proofs_verify_at_every_size() -> None:
    leaves = [f"leaf {i}".encode() for i in range(70)]
    tree = merkle.Tree()
    for i, leaf in enumerate(leaves):
        assert tree.append(merkle.leaf_hash(leaf)) == i
    for size in range(0, 71):
        assert tree.root(size) == _reference_mth(leaves[:size])
    for size in range(1, 71):
        root = tree.root(size)
        for index in range(size):
            proof = tree.inclusion_proof(index, size)
            merkle.verify_inclusion(index, size, tree.leaf(index), proof, root)
        for old in range(1, size + 1):
            merkle.verify_consistency(
                old, size, tree.consistency_proof(old, size), tree.root(old), root
            )


def test_subtree_consistency_of_every_aligned_subtree() -> None:
    tree = merkle.Tree(merkle.leaf_hash(bytes([i])) for i in range(40))
    checked = 0
    for size in range(1, 41):
        root = tree.root(size)
        for start in range(size):
            for end in range(start + 1, size + 1):
                if not merkle._valid_subtree(start, end) or (start, end) == (0, size):
                    continue
                proof = _subtree_proof(tree, start, end, size)
                sub = tree._mth(start, end)
                merkle.verify_subtree_consistency(start, end, size, proof, sub, root)
                with pytest.raises(FormatError):
                    merkle.verify_subtree_consistency(
                        start, end, size, proof, merkle.leaf_hash(b"x"), root
                    )
                checked += 1
    assert checked > 500


def _subtree_proof(tree: merkle.Tree, start: int, end: int, size: int) -> list[bytes]:
    """A subtree consistency proof by its recursive definition (RFC 6962 SUBPROOF
    generalised: the part of the target inside the node, then the other child)."""

    def sub(s: int, e: int, a: int, b: int, known: bool) -> list[bytes]:
        if (s, e) == (a, b):
            return [] if known else [tree._mth(a, b)]
        k = 1 << ((b - a - 1).bit_length() - 1)
        if e <= a + k:
            return [*sub(s, e, a, a + k, known), tree._mth(a + k, b)]
        if s >= a + k:
            return [*sub(s, e, a + k, b, known), tree._mth(a, a + k)]
        assert s == a  # an aligned subtree that straddles a node starts with it
        return [*sub(a + k, e, a + k, b, False), tree._mth(a, a + k)]

    return sub(start, end, 0, size, True)


def test_single_byte_change_of_any_proof_is_caught() -> None:
    rng = random.Random(7)
    tree = merkle.Tree(merkle.leaf_hash(bytes([i])) for i in range(23))
    root = tree.root()
    for _ in range(200):
        index = rng.randrange(23)
        proof = tree.inclusion_proof(index)
        j = rng.randrange(len(proof))
        bad = bytearray(proof[j])
        bad[rng.randrange(32)] ^= 1 << rng.randrange(8)
        proof[j] = bytes(bad)
        with pytest.raises(FormatError):
            merkle.verify_inclusion(index, 23, tree.leaf(index), proof, root)


@pytest.mark.parametrize("path", _probes("inclusion"), ids=lambda p: p.stem)
def test_inclusion_checker_agrees_with_each_probe(path: Path) -> None:
    """The shared-node checker gives every probe the same verdict as the one-proof check."""
    p = json.loads(path.read_text())
    checker = merkle.InclusionChecker(p["treeSize"], _b(p["root"])) if len(
        _b(p["root"])) == 32 else None
    args = (p["leafIdx"], p["treeSize"], _b(p["leafHash"]), [_b(h) for h in p["proof"] or []])
    try:
        merkle.verify_inclusion(*args, _b(p["root"]))
        alone = True
    except FormatError:
        alone = False
    together = checker is not None
    if checker is not None:
        try:
            checker.check(args[0], args[2], args[3])
        except FormatError:
            together = False
    assert alone == together


def test_inclusion_checker_shares_nodes_and_still_checks_every_byte() -> None:
    """Many proofs into one tree: all verify; a flipped bit in any hash of any proof,
    even one above a node an earlier proof already reached, is caught."""
    rng = random.Random(7)
    for size in (1, 2, 3, 7, 64, 100, 257):
        leaves = [merkle.leaf_hash(bytes([i % 251, i // 251])) for i in range(size)]
        tree = merkle.Tree(leaves)
        root = tree.root()
        first = rng.randrange(size)
        picked = list(range(first, min(size, first + 40)))
        checker = merkle.InclusionChecker(size, root)
        for i in picked:
            checker.check(i, leaves[i], tree.inclusion_proof(i))
        for i in picked[1:]:
            proof = tree.inclusion_proof(i)
            for k in range(len(proof)):
                bad = list(proof)
                bad[k] = bytes([bad[k][0] ^ 1]) + bad[k][1:]
                fresh = merkle.InclusionChecker(size, root)
                fresh.check(picked[0], leaves[picked[0]], tree.inclusion_proof(picked[0]))
                with pytest.raises(FormatError):
                    fresh.check(i, leaves[i], bad)
            with pytest.raises(FormatError):
                checker.check(i, leaves[(i + 1) % size] if size > 1 else b"\0" * 32, proof)
