"""The witness's add-checkpoint, sans-IO: every status the C2SP spec names,
and the old-size check with the new-size store as one atomic step."""

from __future__ import annotations

import base64
import threading
from pathlib import Path

import pytest

from tkbox.formats import cosignature, merkle, note
from tkbox.formats import witness as wfmt
from tkbox.signer.witness import Witness


class Log:
    def __init__(self, name: str = "example.test/log") -> None:
        self.signer = note.generate(name)
        self.tree = merkle.Tree()

    def grow(self, n: int) -> None:
        for _ in range(n):
            self.tree.append(merkle.leaf_hash(bytes([self.tree.size % 256])))

    def checkpoint(self, size: int | None = None, root: bytes | None = None) -> bytes:
        size = self.tree.size if size is None else size
        root = self.tree.root(size) if root is None else root
        text = f"{self.signer.name}\n{size}\n{base64.b64encode(root).decode()}\n"
        return note.sign(text, [self.signer])

    def request(self, old: int, size: int | None = None, proof: list[bytes] | None = None,
                root: bytes | None = None) -> bytes:
        size = self.tree.size if size is None else size
        if proof is None:
            proof = self.tree.consistency_proof(old, size) if old else []
        return wfmt.format_add_checkpoint(old, proof, self.checkpoint(size, root))


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Witness, Log]:
    log = Log()
    w = Witness(cosignature.generate("witness.test/w", clock=lambda: 1700000000),
                [log.signer.verifier()], tmp_path / "w.db")
    return w, log


def test_cosigns_and_the_cosignature_verifies(setup: tuple[Witness, Log]) -> None:
    w, log = setup
    log.grow(5)
    a = w.add_checkpoint(log.request(0))
    assert a.status == 200, a.body
    signed = log.checkpoint() + a.body
    n = note.open_note(signed, note.Verifiers([w.signer.verifier()]))
    assert cosignature.timestamp(n.sigs[0]) == 1700000000
    log.grow(7)
    assert w.add_checkpoint(log.request(5)).status == 200


def test_409_with_the_known_size(setup: tuple[Witness, Log]) -> None:
    w, log = setup
    log.grow(4)
    assert w.add_checkpoint(log.request(0)).status == 200
    log.grow(3)
    a = w.add_checkpoint(log.request(0))
    assert (a.status, a.body, a.content_type) == (409, b"4\n", "text/x.tlog.size")
    assert wfmt.parse_size(a.body) == 4
    assert w.add_checkpoint(log.request(4)).status == 200


def test_statuses(setup: tuple[Witness, Log]) -> None:
    w, log = setup
    log.grow(6)
    assert w.add_checkpoint(b"garbage").status == 400
    stranger = Log("example.test/other")
    stranger.grow(2)
    assert w.add_checkpoint(stranger.request(0)).status == 404
    impostor = Log(log.signer.name)  # same origin, another key
    impostor.grow(6)
    assert w.add_checkpoint(impostor.request(0)).status == 403
    assert w.add_checkpoint(log.request(7, size=6, proof=[])).status == 400
    assert w.add_checkpoint(log.request(0)).status == 200
    log.grow(2)
    bad_proof = [bytes(32)] * len(log.tree.consistency_proof(6))
    assert w.add_checkpoint(log.request(6, proof=bad_proof)).status == 422
    assert w.add_checkpoint(log.request(6, size=6, root=bytes(32), proof=[])).status == 422
    assert w.add_checkpoint(log.request(6, size=6, proof=[])).status == 200  # same again


def test_a_rollback_race_has_one_winner(setup: tuple[Witness, Log]) -> None:
    """Two submissions from the same old size at once: only one may be cosigned."""
    w, log = setup
    log.grow(3)
    assert w.add_checkpoint(log.request(0)).status == 200
    log.grow(2)
    req_a = log.request(3)
    log.grow(2)
    req_b = log.request(3)
    results: list[int] = []
    barrier = threading.Barrier(2)

    def go(req: bytes) -> None:
        barrier.wait()
        results.append(w.add_checkpoint(req).status)

    ts = [threading.Thread(target=go, args=(r,)) for r in (req_a, req_b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(results) == [200, 409]
