"""A signer in memory, built from tkbox.formats alone, to make bundles for tests.

It does what `tkbox.signer` does (records chained per run, one Merkle log,
a signed checkpoint, witness cosignatures), without processes or storage,
so the formats and the verifier can be tested on their own.
"""

from __future__ import annotations

from tkbox.formats import bundle, cosignature, merkle, note, record, tlogpolicy

T0 = 1_700_000_000


class Kit:
    def __init__(self, witnesses: int = 0, independent: tuple[str, ...] = (),
                 quorum: int | None = None, origin: str = "example.test/tkbox-log") -> None:
        self.signer = note.generate(origin)
        self.witnesses = {f"w{i}": cosignature.generate(f"witness.test/w{i}", clock=lambda: T0)
                          for i in range(witnesses)}
        self.independent = independent
        self.quorum = quorum
        self.tree = merkle.Tree()
        self.raw: list[bytes] = []
        self.chains: dict[str, tuple[int, bytes | None]] = {}
        self.index: dict[str, list[int]] = {}

    def append(self, run: str, kind: str, body: dict) -> int:
        seq, prev = self.chains.get(run, (0, None))
        rec = record.make(run, seq, prev, kind, body, time="2026-01-02T03:04:05.678Z")
        self.chains[run] = (seq + 1, rec.hash)
        self.raw.append(rec.raw)
        self.index.setdefault(run, []).append(self.tree.size)
        return self.tree.append(rec.hash)

    def run(self, run: str, decisions: int = 2) -> None:
        self.append(run, record.OPEN, {"facts": {"image": "sha256:00"}, "isolation": "same-user"})
        for i in range(decisions):
            self.append(run, record.DECISION, {"action": "Bash", "allowed": True,
                                               "reason": "ok", "resource": {"command": f"c{i}"}})
            self.append(run, record.COMPLETE, {"decision": 1 + 2 * i, "outcome": {"exit": 0}})
        self.append(run, "tkbox.secret.use", {"name": "TOKEN", "host": "api.example"})
        self.append(run, record.CLOSE, {})

    def checkpoint(self, cosigners: list[str] | None = None, size: int | None = None) -> bytes:
        size = self.tree.size if size is None else size
        text = f"{self.signer.name}\n{size}\n{merkle_b64(self.tree.root(size))}\n"
        names = list(self.witnesses) if cosigners is None else cosigners
        return note.sign(text, [self.signer, *(self.witnesses[n] for n in names)])

    def entries(self, run: str, size: int | None = None) -> list[tuple[int, bytes, list[bytes]]]:
        size = self.tree.size if size is None else size
        return [(i, self.raw[i], self.tree.inclusion_proof(i, size)) for i in self.index[run]]

    def bundle(self, run: str, entries: list[tuple[int, bytes, list[bytes]]] | None = None,
               cosigners: list[str] | None = None, bundle_run: str | None = None) -> bytes:
        entries = self.entries(run) if entries is None else entries
        return bundle.build(bundle_run or run, entries, self.checkpoint(cosigners)).encode()

    def trust(self) -> bytes:
        ws = {n: (w.verifier(), f"http://127.0.0.1:1/{n}") for n, w in self.witnesses.items()}
        pol = tlogpolicy.build(self.signer.verifier(), ws, self.quorum)
        return bundle.make_trust(pol, self.independent)


def merkle_b64(h: bytes) -> str:
    import base64

    return base64.b64encode(h).decode()
