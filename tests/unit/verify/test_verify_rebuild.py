"""The verifier's one-pass inclusion check: the tree above a bundle's leaves rebuilt once.

`verify_bundle` no longer walks one audit path per record: it rebuilds the
part of the tree above the bundle's leaves (`merkle.Rebuilt`), compares the
root with the signed one and every path with the rebuilt one, byte for byte.
These tests hold it to exactly what checking each proof on its own decided:
the same paths and root as `merkle.Tree` for any tree size and any set of
leaves, the same records as `record.parse`, the same layout as
`bundle.parse`, and every tampering of a large bundle caught, with the record
named.
"""

from __future__ import annotations

import base64
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parents[1] / "formats"))
from tkb_kit import Kit  # noqa: E402

from tkbox.formats import FormatError, bundle, merkle, record  # noqa: E402
from tkbox.verify import verify_bundle  # noqa: E402


def _leaf(i: int) -> bytes:
    return merkle.leaf_hash(b"leaf %d" % i)


def _b64_path(hashes: list[bytes]) -> bytes:
    return b"".join(base64.b64encode(h) + b"\n" for h in hashes)


@given(size=st.integers(1, 300), data=st.data())
def test_rebuilt_paths_and_root_are_those_of_the_tree(size: int, data: st.DataObject) -> None:
    """For any size and any subset of leaves, every rebuilt path is RFC 6962's
    PATH(i, D[size]) and the root is MTH(D[size]); nodes beside the subset come
    from the paths held (`outside`), read at `path_position`."""
    tree = merkle.Tree(_leaf(i) for i in range(size))
    chosen = sorted(data.draw(st.sets(st.integers(0, size - 1), min_size=1)))
    proofs = {i: tree.inclusion_proof(i, size) for i in chosen}
    asked: list[tuple[int, int]] = []

    def outside(level: int, j: int) -> bytes:
        i = chosen[j]
        asked.append((level, i))
        return proofs[i][merkle.path_position(i, size, level)]

    rebuilt = merkle.Rebuilt(size, chosen, [_leaf(i) for i in chosen], outside)
    assert rebuilt.root == tree.root()
    expected = [_b64_path(proofs[i]) for i in chosen]
    assert rebuilt.paths(lambda h: base64.b64encode(h) + b"\n") == expected
    lo = data.draw(st.integers(0, len(chosen)))
    hi = data.draw(st.integers(lo, len(chosen)))
    assert rebuilt.paths(lambda h: base64.b64encode(h) + b"\n", lo, hi) == expected[lo:hi]
    if len(chosen) == size:
        assert asked == [], "with every leaf held, nothing is read from a path"


@given(size=st.integers(1, 1 << 70), data=st.data())
def test_path_position_counts_the_levels_that_have_a_hash(size: int,
                                                          data: st.DataObject) -> None:
    """`path_position`'s bit count is its definition, level by level: at level l the
    leaf's ancestor has a sibling unless it is even and the last node of its level."""
    index = data.draw(st.integers(0, size - 1))
    level = data.draw(st.integers(0, 72))
    last = size - 1
    want = sum(1 for lv in range(level)
               if (index >> lv) & 1 or (index >> lv) != (last >> lv))
    assert merkle.path_position(index, size, level) == want


def test_rebuilding_hashes_each_node_once_not_a_path_per_leaf() -> None:
    """20,000 consecutive leaves of a 50,000-leaf tree: about one node hash per
    leaf above the leaves, where a proof per leaf would climb 16 levels each."""
    size = 50_000
    chosen = list(range(10_000, 30_000))
    tree = merkle.Tree(_leaf(i) for i in range(size))
    calls = 0
    real = merkle.node_hash

    def counting(left: bytes, right: bytes) -> bytes:
        nonlocal calls
        calls += 1
        return real(left, right)

    merkle.node_hash = counting
    try:
        rebuilt = merkle.Rebuilt(
            size, chosen, [tree.leaf(i) for i in chosen],
            lambda lv, j: tree.inclusion_proof(chosen[j], size)[
                merkle.path_position(chosen[j], size, lv)])
    finally:
        merkle.node_hash = real
    assert rebuilt.root == tree.root()
    assert calls < 1.1 * len(chosen)


def test_rebuild_refuses_leaves_out_of_order_or_beyond_the_tree() -> None:
    for indexes in ([1, 1], [2, 1], [0, 5]):  # a duplicate, a reordering, beyond size 5
        with pytest.raises(FormatError):
            merkle.Rebuilt(5, indexes, [_leaf(0)] * 2, lambda lv, j: _leaf(0))


def _big(records: int, others: int = 1) -> tuple[Kit, bytes, bytes]:
    """A run of `records` records interleaved with `others` other runs' records."""
    k = Kit(witnesses=1)
    k.append("r", record.OPEN, {"facts": {}, "isolation": "same-user"})
    for o in range(others):
        k.append(f"o{o}", record.OPEN, {"facts": {}, "isolation": "same-user"})
    for i in range(records - 2):
        k.append("r", "tkbox.model.call", {"host": "api.example", "status": 200, "bytes": i})
        for o in range(others if i % 3 == 0 else 0):
            k.append(f"o{o}", "tkbox.gap", {"i": i})
    k.append("r", record.CLOSE, {})
    return k, k.bundle("r"), k.trust()


@pytest.fixture(scope="module")
def big() -> tuple[Kit, bytes, bytes]:
    return _big(3000)


def _code(data: bytes, trust: bytes) -> FormatError:
    with pytest.raises(FormatError) as exc:
        verify_bundle(data, trust)
    return exc.value


def test_a_large_interleaved_bundle_verifies(big: tuple[Kit, bytes, bytes]) -> None:
    _, data, trust = big
    r = verify_bundle(data, trust)
    assert r.records == 3000 and r.kinds["tkbox.model.call"] == 2998


def test_a_bundle_holding_every_leaf_of_the_log_verifies() -> None:
    """The signer served one run only: the bundle holds the whole tree."""
    k = Kit()
    k.run("only", decisions=40)
    assert k.index["only"] == list(range(k.tree.size))
    assert verify_bundle(k.bundle("only"), k.trust()).records == k.tree.size


def test_a_forged_leaf_with_its_chain_recomputed_is_caught_by_the_rebuilt_root(
        big: tuple[Kit, bytes, bytes]) -> None:
    """Attack: replace record 1500 of a large bundle with a forged one (a status the
    origin never sent), recompute the forged record's successor's prev so the run's
    chain still holds, and keep every audit path. The chain checks pass; the leaf is
    not in the signed tree, so the rebuilt root differs and the record is named."""
    k, _, trust = big
    entries = k.entries("r")
    forged = list(entries)
    i, raw, path = entries[1500]
    rec = record.parse(raw)
    fake = record.make(rec.run, rec.seq, rec.prev, rec.kind, {**rec.body, "status": 500},
                       time=rec.time)
    nxt_i, nxt_raw, nxt_path = entries[1501]
    nxt = record.parse(nxt_raw)
    relinked = record.make(nxt.run, nxt.seq, fake.hash, nxt.kind, nxt.body, time=nxt.time)
    forged[1500] = (i, fake.raw, path)
    forged[1501] = (nxt_i, relinked.raw, nxt_path)
    err = _code(k.bundle("r", entries=forged), trust)
    assert err.code == "record.inclusion" and "record 1500" in err.where


def test_a_changed_audit_path_line_is_caught_and_named(big: tuple[Kit, bytes, bytes]) -> None:
    """Attack: a valid-looking but wrong hash in one record's audit path (every
    byte of the bundle must be checked, not only those the root depends on)."""
    k, _, trust = big
    entries = list(k.entries("r"))
    for j, pos in ((0, 0), (1777, 3), (2999, -1)):
        i, raw, path = entries[j]
        bad = list(path)
        bad[pos] = merkle.leaf_hash(b"not a node of this tree")
        tampered = entries[:j] + [(i, raw, bad)] + entries[j + 1 :]
        err = _code(k.bundle("r", entries=tampered), trust)
        assert err.code == "record.inclusion" and f"record {j}" in err.where


def test_a_path_with_an_extra_or_missing_line_is_caught(big: tuple[Kit, bytes, bytes]) -> None:
    k, _, trust = big
    entries = list(k.entries("r"))
    i, raw, path = entries[42]
    for bad in (path[:-1], [*path, path[-1]]):
        tampered = entries[:42] + [(i, raw, bad)] + entries[43:]
        assert _code(k.bundle("r", entries=tampered), trust).code in (
            "record.inclusion", "bundle.malformed")


def test_scan_reads_what_parse_reads(big: tuple[Kit, bytes, bytes]) -> None:
    _, data, _ = big
    fast, slow = bundle.scan(data), bundle.parse(data)
    assert fast is not None
    assert fast.run == slow.run and fast.checkpoint == slow.checkpoint
    assert fast.indexes == [e.index for e in slow.entries]
    assert fast.extras == [e.extra for e in slow.entries]
    assert [data[start:end] for start, end in fast.paths] == \
        [_b64_path(list(e.path)) for e in slow.entries]


@pytest.mark.parametrize("change", [
    (b"\nindex 1", b"\nindex 01"),  # leading zero
    (b"records ", b"records 0"),  # a count that is not the count
    (b"extra ", b"extra  "),
    (b"c2sp.org/tlog-proof@v1\n", b"c2sp.org/tlog-proof@v1\r\n"),
    (b"\n\n", b"\n\nc2sp.org/tlog-proof@v1\n"),  # an entry's header in the checkpoint
])
def test_scan_leaves_anything_unusual_to_the_parser(change: tuple[bytes, bytes]) -> None:
    k = Kit()
    k.run("x", decisions=1)
    data = k.bundle("x").replace(*change, 1)
    assert bundle.scan(data) is None
    with pytest.raises(FormatError):
        verify_bundle(data, k.trust())


def test_a_path_line_not_ascii_is_refused_as_the_parser_refuses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`scan` does not look for non-ASCII bytes in a path: the comparison with the
    rebuilt paths must refuse it, for the reason the parser gives."""
    k = Kit()
    k.run("x", decisions=1)
    data = k.bundle("x")
    cut = data.index(b"=\n\n")
    bad = data[: cut - 1] + b"\xe9" + data[cut:]
    with pytest.raises(FormatError) as fast:
        verify_bundle(bad, k.trust())
    monkeypatch.setattr(bundle, "scan", lambda d, **_: None)
    with pytest.raises(FormatError) as slow:
        verify_bundle(bad, k.trust())
    assert (fast.value.code, fast.value.where) == (slow.value.code, slow.value.where)


def _mutations(raw: bytes, rng: random.Random) -> list[bytes]:
    obj = json.loads(raw)
    out = [raw, raw + b" ", b" " + raw, raw.replace(b":", b": ", 1), raw[:-1],
           raw.replace(b'"v":1', b'"v":true'), raw.replace(b'"v":1', b'"v":2'),
           raw.replace(b'"seq":', b'"seq":-'), raw.replace(b'"run":"', b'"run":" '),
           raw.replace(b'"kind":"', b'"kind":"X'), raw.replace(b'Z"', b'"'),
           raw.replace(b'"body":{', b'"body":{"n":9007199254740992,'),
           raw.replace(b'"body":{', b'"body":{"n":9007199254740991,'),
           raw.replace(b'"body":{', b'"body":{"n":1.5,'),
           raw.replace(b'"body":{', b'"body":{"\xc3\xa9":1,'),
           raw.replace(b'"body":{', b'"body":{"\\u00e9":1,'),
           raw.replace(b'"body":{', b'"body":{"a":' + b"[" * 31 + b"1" + b"]" * 31 + b","),
           raw.replace(b'"body":{', b'"body":{"a":' + b"[" * 32 + b"1" + b"]" * 32 + b","),
           raw.replace(b'"body":{', b'"body":{"b":1,"a":2,'),
           raw.replace(b'"seq":', b'"seq":1000000000000000'),
           raw.replace(b'"seq":', b'"seq":0'), raw.replace(b'"seq":', b'"seq": '),
           raw.replace(b',"kind":', b',"a":1,"kind":'), raw.replace(b'"v":1}', b'"v":1,"w":2}'),
           raw.replace(b'"kind":"tkbox.', b'"kind":"tkbox..'),
           raw.replace(b'"kind":"tkbox.', b'"kind":"tkbox\\u002e'),
           raw.replace(b'"run":"', b'"run":"' + b"r" * 128),
           raw.replace(b'"prev":"', b'"prev": "'), raw.replace(b'"body":{', b'"body":{},"body":{'),
           raw.replace(b'{"body":{', b'{"body":[{'),
           raw.replace(b'"time":"2', "\"time\":\"\u0662".encode())]
    if obj.get("prev"):
        p = obj["prev"]
        out += [raw.replace(p.encode(), p[:-2].encode() + b"B="),
                raw.replace(p.encode(), p[:-1].encode()),
                raw.replace(p.encode(), p.encode() + b"AAAA")]
    for _ in range(20):
        i = rng.randrange(len(raw))
        out.append(raw[:i] + bytes([rng.randrange(32, 127)]) + raw[i + 1 :])
    return out


def test_read_links_accepts_and_refuses_exactly_what_parse_does() -> None:
    """The verifier's quick reader may never take a record `parse` refuses (a
    non-canonical or malformed record would then verify), nor read one differently."""
    k = Kit()
    k.run("a", decisions=2)
    rng = random.Random(7)
    for raw in k.raw:
        for m in _mutations(raw, rng):
            try:
                want: record.Link | str = record.link(record.parse(m, "record 0"))
            except FormatError as exc:
                want = exc.code
            try:
                got: record.Link | str = record.read_links([m])[0]
            except FormatError as exc:
                got = exc.code
            assert got == want, m


def test_a_changed_byte_anywhere_gets_the_verdict_of_the_proof_by_proof_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-pass check may not change what a bundle is refused for: for random
    byte changes all over a bundle (records, indexes, paths, checkpoint), the code and
    place of the refusal are those of the proof-by-proof verifier (scan disabled)."""
    _, data, trust = _big(120, others=2)
    rng = random.Random(14)
    cases = [data]
    for _ in range(400):
        i = rng.randrange(len(data))
        cases.append(data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :])

    def verdict(d: bytes) -> str:
        try:
            return f"ok {verify_bundle(d, trust).records}"
        except FormatError as exc:
            return f"{exc.code} @ {exc.where}"

    fast = [verdict(d) for d in cases]
    monkeypatch.setattr(bundle, "scan", lambda d, **_: None)
    slow = [verdict(d) for d in cases]
    assert fast[0] == "ok 120"
    assert fast == slow
    assert sum(v.startswith("ok") for v in fast) == 1


@given(base=st.integers(0, 6), cut=st.integers(0, 400), ins=st.binary(max_size=8),
       drop=st.integers(0, 3))
def test_fuzz_read_links_is_parse_on_edited_records(base: int, cut: int, ins: bytes,
                                                    drop: int) -> None:
    """Garbage spliced anywhere into a real record: read_links' verdict (the record's
    link, or the error code) is parse's, and it raises nothing but FormatError."""
    raw = _SAMPLE_RAWS[base % len(_SAMPLE_RAWS)]
    i = cut % (len(raw) + 1)
    m = raw[:i] + ins + raw[i + drop :]
    try:
        want: record.Link | str = record.link(record.parse(m, "record 0"))
    except FormatError as exc:
        want = exc.code
    try:
        got: record.Link | str = record.read_links([m])[0]
    except FormatError as exc:
        got = exc.code
    assert got == want


def _sample_raws() -> list[bytes]:
    k = Kit()
    k.run("s", decisions=2)
    return k.raw


_SAMPLE_RAWS = _sample_raws()


@pytest.mark.parametrize("collector_on", [True, False])
def test_verifying_leaves_the_cycle_collector_as_it_found_it(
        big: tuple[Kit, bytes, bytes], collector_on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verifier pauses Python's cycle collector while it reads (process-wide): after a
    bundle that verifies and after one that does not, it is on again exactly if it was."""
    import gc

    _, data, trust = big
    was = gc.isenabled()
    try:
        (gc.enable if collector_on else gc.disable)()
        seen: list[bool] = []
        real_scan = bundle.scan

        def scan(b: bytes, **kw: Any) -> bundle.Scanned | None:
            seen.append(gc.isenabled())
            return real_scan(b, **kw)

        monkeypatch.setattr(bundle, "scan", scan)
        verify_bundle(data, trust)
        assert gc.isenabled() is collector_on
        bad = data[: len(data) // 2]  # cut: not a bundle that verifies
        with pytest.raises(FormatError):
            verify_bundle(bad, trust)
        assert gc.isenabled() is collector_on
        assert seen and not any(seen)  # paused while it read
    finally:
        (gc.enable if was else gc.disable)()


def test_checked_a_slice_at_a_time_the_verdicts_are_the_same(
        monkeypatch: pytest.MonkeyPatch, big: tuple[Kit, bytes, bytes]) -> None:
    """The verifier parses records and compares rebuilt paths a slice at a time
    (4,096 records); with slices of a few records, a bundle verifies to the same
    report, and a fault past the first slices is the same fault, the same record
    named: a changed path line, a signed record that is not canonical, a decision
    that does not state its action."""
    from tkbox.verify import core

    k, data, trust = big
    whole = verify_bundle(data, trust)
    monkeypatch.setattr(core, "_RECORDS_AT_ONCE", 7)
    monkeypatch.setattr(core, "_PATHS_AT_ONCE", 5)
    assert verify_bundle(data, trust) == whole

    entries = list(k.entries("r"))
    i, raw, path = entries[1777]
    bad = [*path[:2], merkle.leaf_hash(b"not a node"), *path[3:]]
    err = _code(k.bundle("r", entries=[*entries[:1777], (i, raw, bad), *entries[1778:]]), trust)
    assert err.code == "record.inclusion" and "record 1777" in err.where

    for loose in (True, False):
        small = Kit()
        small.append("s", record.OPEN, {"facts": {}, "isolation": "same-user"})
        for n in range(25):
            small.append("s", "tkbox.model.call", {"n": n})
        if loose:  # record 26: signed into the log, but not canonical JSON
            seq, prev = small.chains["s"]
            raw = record.make("s", seq, prev, "tkbox.model.call", {"n": 25},
                              time="2026-01-02T03:04:05.678Z").raw
            raw = raw.replace(b'{"body":', b'{"body": ')
            small.chains["s"] = (seq + 1, merkle.leaf_hash(raw))
            small.raw.append(raw)
            small.index["s"].append(small.tree.size)
            small.tree.append(merkle.leaf_hash(raw))
        else:
            small.append("s", "tkbox.model.call", {"n": 25})
        small.append("s", record.DECISION, {"allowed": True})  # record 27: no action
        small.append("s", record.CLOSE, {})
        err = _code(small.bundle("s"), small.trust())
        if loose:  # every record is read before the chain and the bodies are checked
            assert err.code == "json.canonical" and "record 26" in err.where, err
        else:
            assert err.code == "record.schema" and "record 27" in err.where, err


_KINDS = (record.OPEN, record.DECISION, record.COMPLETE, "tkbox.model.call", record.CLOSE)


@given(st.data())
def test_the_chain_checked_column_by_column_is_the_chain_checked_one_by_one(
        data: st.DataObject) -> None:
    """`_chain_fast` takes a run's records exactly when `_chain_one_by_one` does, with
    the same tally, and otherwise leaves the naming of the fault to it (or raises the
    same fault): over runs with records moved, repeated, dropped, from another run,
    chained wrongly, after the close, with bodies that do not say what they must."""
    from tkbox.verify import core

    n = data.draw(st.integers(2, 12))
    leaves = [_leaf(i) for i in range(n)]
    chain = [record.Link("r", 0, None, record.OPEN, "t", "same-user")]
    for j in range(1, n - 1):
        kind = data.draw(st.sampled_from(_KINDS[1:4]))
        fact = {record.DECISION: data.draw(st.sampled_from([True, False, None])),
                record.COMPLETE: data.draw(st.sampled_from([None, *range(j)]))}.get(kind)
        chain.append(record.Link("r", j, leaves[j - 1], kind, "t", fact))
    chain.append(record.Link("r", n - 1, leaves[n - 2], record.CLOSE, "t", None))
    indexes = list(range(0, 2 * n, 2))
    for _ in range(data.draw(st.integers(0, 2))):
        j = data.draw(st.integers(0, n - 1))
        change = data.draw(st.sampled_from(["run", "seq", "prev", "kind", "index", "swap"]))
        if change == "run":
            chain[j] = chain[j]._replace(run="other")
        elif change == "seq":
            chain[j] = chain[j]._replace(seq=data.draw(st.integers(0, n)))
        elif change == "prev":
            chain[j] = chain[j]._replace(prev=_leaf(99))
        elif change == "kind":
            chain[j] = chain[j]._replace(kind=data.draw(st.sampled_from(_KINDS)))
        elif change == "index":
            indexes[j] = data.draw(st.integers(0, 2 * n))
        else:
            k = data.draw(st.integers(0, n - 1))
            chain[j], chain[k] = chain[k], chain[j]

    def outcome(check: Callable[..., Any]) -> object:
        try:
            tally = check("r", chain, indexes, leaves)
        except FormatError as exc:
            return (exc.code, exc.where, exc.what)
        return tally if tally is None else (tally.decisions, tally.completed, tally.refused)

    slow, fast = outcome(core._chain_one_by_one), outcome(core._chain_fast)
    assert fast is None and isinstance(slow, tuple) and isinstance(slow[0], str) or fast == slow
