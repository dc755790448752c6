"""Verify a bundle against a trust file, offline.

Imports nothing of tkbox but `tkbox.formats` (and through it `tkbox.errors`),
so that what a third party runs to check a bundle is small enough to read.

Steps, in order; the first that fails raises `FormatError` with its `code`,
`where` and `what`:

1. the trust file: canonical JSON, one log key, a valid tlog-policy;
2. the bundle's structure: header, run line, count, entries, checkpoint;
3. the checkpoint: a signed note from the trusted log's origin, signed by
   its key; no signature line that the trust file cannot check (so that no
   byte of the bundle goes unchecked); every known cosignature valid;
4. the witness quorum of the policy;
5. every record: canonical, of this run, its sequence number, chained to the
   one before it, at a leaf index after the one before it, included in the
   checkpoint's tree; the first opens the run, the last closes it.

Inclusion is checked for all records at once: the part of the tree above the
bundle's leaves is rebuilt from them (`merkle.Rebuilt`, each node hashed
once; a node beside them is read from the audit path that holds it), its
root must be the checkpoint's, and every record's audit path must be, byte for
byte, the canonical text of the path the rebuilt tree gives. That is exactly
"every proof leads to the signed root", at about two hashes per record and
no per-line work on the paths. Whenever anything differs, each proof is
checked on its own (`merkle.InclusionChecker`) to name the first record that
fails, so a bad bundle is reported as before.

The chain is checked the same way: `_chain_one_by_one` is the rule, record by
record, and names the first fault; `_chain_fast` checks the same of a whole
run column by column (sequence numbers, prev hashes, leaf indexes, the close)
and looks only at decisions and completions one by one, and when anything
differs it leaves the run to `_chain_one_by_one`. Records are read, and audit
paths compared, 4,096 at a time, so that a large bundle is checked in little
more memory than it takes.

Memory, the bundle being hostile: its checkpoint is found without reading the
entries (`bundle.locate`) and checked before them, so a bundle whose signatures
fail is refused holding nothing of size beside it; its layout is then read only
to name a fault of it first (steps 2 before 3), by `bundle.scan(keep=False)`
and `bundle.check`, which keep nothing of an entry once read and copy out no
over-long line. After the signatures, `bundle.scan` keeps the records (decoded)
and the slow path reads one entry at a time (`bundle.entries_of`), never
`bundle.parse` and its copies of the whole.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import gc
import itertools
import operator
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tkbox.formats import (
    FormatError,
    _strict,
    bundle,
    checkpoint,
    cosignature,
    merkle,
    note,
    record,
    workload,
)

ASSURANCES = ("dev", "local", "witnessed")


@dataclass(frozen=True)
class Report:
    """What a verified bundle says. Only ever built for a bundle that verified."""

    run: str
    records: int
    isolation: str
    assurance: str  # dev | local | witnessed
    origin: str
    log_key: str  # name+id of the log key that signed
    tree_size: int
    root_hash: str  # base64
    cosigned_by: tuple[str, ...]
    kinds: dict[str, int] = field(default_factory=dict)
    first_time: str = ""
    last_time: str = ""
    refused: int = 0
    #: who recorded the run, as the signer checked it (isolation `remote` only; see
    #: `formats.workload`); None when the run was opened on the signer's own host
    workload: dict[str, Any] | None = None

    @property
    def workload_line(self) -> str:
        """`github repo OWNER/REPO, workflow W, ref R, commit C, run N`, or ''."""
        return "" if self.workload is None else workload.describe(self.workload)

    def to_json(self) -> dict[str, Any]:
        return {
            "verified": True,
            "run": self.run,
            "records": self.records,
            "isolation": self.isolation,
            "assurance": self.assurance,
            "origin": self.origin,
            "log_key": self.log_key,
            "tree_size": self.tree_size,
            "root_hash": self.root_hash,
            "cosigned_by": list(self.cosigned_by),
            "kinds": dict(self.kinds),
            "first_time": self.first_time,
            "last_time": self.last_time,
            "refused": self.refused,
            "workload": self.workload,
            "secret_uses": self.secret_uses,
            "secret_leaks": self.secret_leaks,
            "model_calls": self.model_calls,
        }

    # The secrets door's records (docs/bundle-format.md), counted for the summary.
    @property
    def secret_uses(self) -> int:
        return self.kinds.get("tkbox.secret.use", 0)

    @property
    def secret_leaks(self) -> int:
        return self.kinds.get("tkbox.secret.leak", 0)

    @property
    def model_calls(self) -> int:
        return self.kinds.get("tkbox.model.call", 0)


def _fail(code: str, where: str, what: str) -> FormatError:
    return FormatError(code, where, what)


def verify_bundle(bundle_bytes: bytes, trust_bytes: bytes) -> Report:
    """Verify `bundle_bytes` against `trust_bytes`; raise FormatError on the first fault."""
    with _no_cycle_collection():
        return _verify(bundle_bytes, trust_bytes)


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector paused while a bundle is read. Reading one makes a
    container per record and per body (bounded by MAX_BUNDLE), none of them in a
    cycle, and the collector would walk every one of them again and again as they
    pile up: it took about 15% of the time at 100,000 records. It runs again
    afterwards as it was (it is process-wide: a thread that turned it off meanwhile
    finds it on again)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _verify(bundle_bytes: bytes, trust_bytes: bytes) -> Report:
    trust = bundle.parse_trust(trust_bytes)
    pol = trust.policy
    log = pol.logs[0]
    # 2. the bundle's structure, 3.-4. its checkpoint: the checkpoint first, found without
    # reading the entries, so that a bundle whose signatures fail is refused in memory
    # bounded whatever its size. Its layout is then read without keeping anything, only
    # to name a fault of it first, as the steps' order says.
    at = bundle.locate(bundle_bytes)
    signed = bundle.check(bundle_bytes) if at is None else at.checkpoint  # (check raises)
    try:
        cp, cosigned = _check_checkpoint(signed, trust)
    except FormatError:
        if bundle.scan(bundle_bytes, keep=False, at=at) is None:
            bundle.check(bundle_bytes)
        raise
    if not cosigned:
        assurance = "dev"
    elif pol.quorum != "none" and pol.satisfied(set(cosigned) & trust.independent):
        assurance = "witnessed"
    else:
        assurance = "local"

    # 5. the records: each in the signed log, then the run's chain. (The checkpoint
    # signed says nothing of the entries yet: anyone may put a real checkpoint after
    # entries of their own. So these too are read without copies of the bundle.)
    fast = bundle.scan(bundle_bytes, at=at)
    leaves = [] if fast is None else [merkle.leaf_hash(raw) for raw in fast.extras]
    if fast is not None and _included(fast, leaves, cp.size, cp.root):
        run, indexes, extras = fast.run, fast.indexes, fast.extras
    else:
        fast, leaves = None, []  # (its records are read again, an entry at a time)
        bundle.check(bundle_bytes)  # names the fault, if it is in the layout
        run, indexes, extras, leaves = _check_each_proof(bundle_bytes, cp.size, cp.root)
    # Every record read (any record's fault comes before any fault of the chain), a
    # slice at a time, keeping only what the checks below read (`record.Link`).
    chain: list[record.Link] = []
    for lo in range(0, len(extras), _RECORDS_AT_ONCE):
        chain += record.read_links(extras[lo : lo + _RECORDS_AT_ONCE], first=lo)
    tally = _chain_fast(run, chain, indexes, leaves) or _chain_one_by_one(run, chain, indexes,
                                                                           leaves)
    return Report(
        workload=(_workload(extras[0]) or {}) if chain[0].fact == "remote" else None,
        run=run,
        records=len(chain),
        isolation=str(chain[0].fact),
        assurance=assurance,
        origin=cp.origin,
        log_key=note.key_tag(log.name, log.key_id),
        tree_size=cp.size,
        root_hash=base64.b64encode(cp.root).decode(),
        cosigned_by=tuple(cosigned),
        kinds=dict(Counter(c.kind for c in chain)),
        first_time=chain[0].time,
        last_time=chain[-1].time,
        refused=tally.refused,
    )


def _workload(first: bytes) -> dict[str, Any] | None:
    """The open record's `workload` (the record was checked above: it parses)."""
    w = record.parse(first).body.get("workload")
    return w if isinstance(w, dict) else None


def _check_checkpoint(signed: bytes, trust: bundle.Trust) -> tuple[checkpoint.Checkpoint,
                                                                   list[str]]:
    """Steps 3 and 4: the checkpoint, signed by the trusted log, carrying no signature
    the trust file cannot check, cosigned to the policy's quorum. Returns it and the
    names of the witnesses that cosigned it."""
    pol = trust.policy
    log = pol.logs[0]
    # 3. the checkpoint and its signatures
    text, sigs = note.split(signed)
    cp = checkpoint.parse(text)
    if cp.origin != log.name:
        raise _fail("checkpoint.origin", "checkpoint line 1",
                    f"the checkpoint is from the log {cp.origin!r}; the trust file trusts "
                    f"{log.name!r}: this is not the trust file of this bundle's signer")
    known = note.Verifiers([log, *pol.witness_verifiers()])
    names = {(w.name, w.key_id): n for n, w in pol.witnesses.items()}
    first_sig_line = text.count("\n") + 2
    seen: set[tuple[str, int]] = set()
    for i, sig in enumerate(sigs):
        where = f"checkpoint line {first_sig_line + i}"
        tag = note.key_tag(sig.name, sig.key_id)
        if (sig.name, sig.key_id) in seen:
            raise _fail("checkpoint.duplicate", where,
                        f"a second signature by {_strict.show(tag, 120)}")
        seen.add((sig.name, sig.key_id))
        if not known.knows(sig.name, sig.key_id):
            if sig.name == log.name:
                raise _fail("checkpoint.wrong-key", where,
                            f"signed by the log key {tag}, but the trust file trusts "
                            f"{note.key_tag(log.name, log.key_id)}: the wrong trust file, "
                            "or a signer that changed its key")
            raise _fail("checkpoint.unknown-signature", where,
                        f"a signature by {_strict.show(tag, 120)}, which the trust file "
                        "does not name; "
                        "a bundle carries only signatures its trust file can check")
    try:
        opened = note.open_note(signed, known)
    except FormatError as exc:
        raise _fail("checkpoint.signature", "checkpoint", exc.what) from None
    signed_by_log = any((s.name, s.key_id) == (log.name, log.key_id) for s in opened.sigs)
    if not signed_by_log:
        raise _fail("checkpoint.unsigned", "checkpoint",
                    f"no signature by the log key {note.key_tag(log.name, log.key_id)}")
    cosigned = sorted(names[(s.name, s.key_id)] for s in opened.sigs
                      if (s.name, s.key_id) in names)
    for s in opened.sigs:
        if (s.name, s.key_id) in names and cosignature.timestamp(s) == 0:
            raise _fail("checkpoint.signature", "checkpoint",
                        f"the cosignature by {s.name} has timestamp 0")

    if not pol.satisfied(cosigned):
        have = ", ".join(cosigned) or "no witness"
        raise _fail("checkpoint.quorum", "checkpoint",
                    f"cosigned by {have}; the trust file's policy needs quorum "
                    f"{_describe(pol, pol.quorum)}")
    return cp, cosigned


@dataclass
class _Tally:
    """The decisions of a run, as its records are checked in order."""

    decisions: dict[int, bool] = field(default_factory=dict)  # seq -> allowed
    completed: set[int] = field(default_factory=set)
    refused: int = 0

    def body(self, j: int, seq: int, kind: str, fact: Any) -> None:
        """What a verifier can check of record j's body: a decision states its action
        and allowed; a completion names a decision earlier in the run, allowed,
        completed once."""
        where = f"record {j}"
        if kind == record.DECISION:
            if fact is None:
                raise _fail("record.schema", where, "a decision states its action and allowed")
            self.decisions[seq] = fact
            self.refused += fact is False
        elif kind == record.COMPLETE:
            if fact is None or fact not in self.decisions:
                raise _fail("record.reference", where,
                            "completes a decision that is not earlier in this run")
            if not self.decisions[fact]:
                raise _fail("record.reference", where,
                            f"completes decision {fact}, which was refused")
            if fact in self.completed:
                raise _fail("record.reference", where,
                            f"completes decision {fact} a second time")
            self.completed.add(fact)


def _chain_one_by_one(run: str, chain: list[record.Link], indexes: list[int],
                      leaves: list[bytes]) -> _Tally:
    """The run's records in order: each of this run, the next of its sequence, chained
    to the one before, at a later leaf index, none after the close, the last the close;
    each body checked as it comes (`_Tally.body`). The first fault is raised, named."""
    tally = _Tally()
    prev: record.Link | None = None
    prev_index = -1
    for j, (index, rec) in enumerate(zip(indexes, chain, strict=True)):
        rec_run, seq, rec_prev, kind, _, fact = rec
        if rec_run != run:
            raise _fail("record.run", f"record {j}",
                        f"belongs to run {rec_run!r}, not to this bundle's run {run!r}")
        if prev is not None and seq == prev.seq:
            raise _fail("record.duplicate", f"record {j}",
                        f"record {seq} of the run appears twice")
        if seq != j:
            if any(later.seq == j for later in chain[j + 1 :]) or seq < j:
                raise _fail("record.order", f"record {j}",
                            f"has sequence number {seq}: the records are out of order")
            raise _fail("record.missing", f"record {j}",
                        f"has sequence number {seq}: record {j} of the run is missing")
        if prev is not None and rec_prev != leaves[j - 1]:
            raise _fail("record.chain", f"record {j}",
                        "its prev hash is not the hash of the record before it")
        if index <= prev_index:
            raise _fail("record.order", f"record {j}",
                        f"leaf index {index} is not after the previous record's "
                        f"{prev_index}")
        if prev is not None and prev.kind == record.CLOSE:
            raise _fail("record.after-close", f"record {j}",
                        "a record after the run's close record")
        tally.body(j, seq, kind, fact)
        prev, prev_index = rec, index
    assert prev is not None
    if prev.kind != record.CLOSE:
        raise _fail("record.close", f"record {len(chain) - 1}",
                    f"the run is not closed: its last record is {prev.kind}, so records "
                    "after it may have been cut off")
    return tally


def _chain_fast(run: str, chain: list[record.Link], indexes: list[int],
                leaves: list[bytes]) -> _Tally | None:
    """`_chain_one_by_one`'s checks of the sequence and the chain, column by column
    (each a loop in C), then only the decisions and completions one by one; None
    if any of them differs, and then `_chain_one_by_one` names the first fault."""
    n = len(chain)
    runs, seqs, prevs, kinds, _, facts = zip(*chain, strict=True)
    if runs.count(run) != n or seqs != tuple(range(n)) or prevs[1:] != tuple(leaves[:-1]) \
            or not all(map(operator.lt, indexes, indexes[1:])) \
            or (kinds.index(record.CLOSE) if record.CLOSE in kinds else -1) != n - 1:
        return None
    tally = _Tally()
    checked = {record.DECISION, record.COMPLETE}.__contains__
    for j in itertools.compress(range(n), map(checked, kinds)):
        tally.body(j, j, kinds[j], facts[j])  # (the sequence number is j: checked above)
    return tally


_RECORDS_AT_ONCE = 4096  # records read at once; only the `record.Link` of each is kept


def _b64_line(h: bytes) -> bytes:
    return binascii.b2a_base64(h)  # canonical base64 and its LF: a path line


def _included(fast: bundle.Scanned, leaves: list[bytes], size: int, root: bytes) -> bool:
    """Every record of `fast` is in the tree of `size` with `root`, by its audit
    path, checked all at once (see the module docstring); False if anything
    differs, and then `_check_each_proof` says what."""
    if size > 1 << 63:  # a path longer than bundle.MAX_PATH: let the parser refuse it
        return False
    data, spans, indexes = fast.data, fast.paths, fast.indexes

    def outside(level: int, j: int) -> bytes:
        # The hash at `level` in record j's path: a node beside every leaf the bundle holds.
        start, end = spans[j]
        k = start + merkle.path_position(indexes[j], size, level) * 45
        line = data[k : k + 45] if k + 45 <= end else b""
        raw = binascii.a2b_base64(line) if len(line) == 45 and line[44] == 10 else b""
        if len(raw) != merkle.HASH_SIZE:
            raise _Differs
        return raw

    try:
        tree = merkle.Rebuilt(size, indexes, leaves, outside)
    except (_Differs, FormatError, binascii.Error):
        return False
    if tree.root != root:
        return False
    # Each path byte for byte, where it lies in the bundle, a slice of records at a
    # time: neither the bundle's paths nor all of the rebuilt ones are copied out.
    starts = data.startswith
    for lo in range(0, len(spans), _PATHS_AT_ONCE):
        built = tree.paths(_b64_line, lo, lo + _PATHS_AT_ONCE)
        if not all(len(p) == end - start and starts(p, start)
                   for p, (start, end) in zip(built, spans[lo : lo + _PATHS_AT_ONCE],
                                               strict=True)):
            return False
    return True


_PATHS_AT_ONCE = 4096  # rebuilt audit paths held at once (about 3 MB of text)


class _Differs(Exception):
    """The fast inclusion check met something it does not take; the slow one will say."""


def _check_each_proof(bundle_bytes: bytes, size: int, root: bytes
                      ) -> tuple[str, list[int], list[bytes], list[bytes]]:
    """Each record's proof on its own, in order, the entries read one at a time from a
    bundle `bundle.check` accepts: the first that fails is named. Returns the run, and
    each record's leaf index, bytes and leaf hash."""
    # One checker for all the proofs: the nodes they share are hashed once.
    inclusion = merkle.InclusionChecker(size, root)
    run, entries = bundle.entries_of(bundle_bytes)
    indexes: list[int] = []
    extras: list[bytes] = []
    leaves: list[bytes] = []
    for j, entry in enumerate(entries):
        where = f"record {j}"
        raw = entry.extra or b""
        leaf = merkle.leaf_hash(raw)
        if entry.index >= size:
            raise _fail("record.inclusion", where,
                        f"leaf index {entry.index} is beyond the checkpoint's {size} leaves")
        try:
            inclusion.check(entry.index, leaf, entry.path)
        except FormatError as exc:
            raise _fail("record.inclusion", f"{where} (leaf {entry.index})",
                        f"not in the signed log: {exc.what}") from None
        indexes.append(entry.index)
        extras.append(raw)
        leaves.append(leaf)
    return run, indexes, extras, leaves


def _describe(pol: Any, name: str, limit: int = 2000) -> str:
    """The quorum in words: each group spelled once, the groups it names after it by
    name (a group reached by many paths is not written out again on each)."""
    def one(n: str) -> str:
        return f"the witness {n}" if n in pol.witnesses else f"group {n}"

    parts, todo, seen = [], [name], {name}
    while todo:
        n = todo.pop(0)
        if n in pol.witnesses:
            parts.append(f"the witness {n}")
            continue
        g = pol.groups[n]
        spelled = f"{g.threshold} of ({', '.join(one(m) for m in g.members)})"
        parts.append(spelled if n == name else f"{one(n)} is {spelled}")
        for m in g.members:
            if m in pol.groups and m not in seen:
                seen.add(m)
                todo.append(m)
    text = parts[0] + "".join(f"; {p}" for p in parts[1:])
    return text if len(text) <= limit else text[:limit] + "…"
