"""Security: every way of altering a bundle is caught, each with its own reason.

A bundle is evidence handed to someone who does not trust us; these tests
stop an attacker (or a broken disk) from changing, dropping, duplicating,
reordering or transplanting records, cutting a bundle short, or passing a
bundle off under the wrong trust file or without its witnesses.
"""

from __future__ import annotations

import pytest
from tkb_kit import Kit

from tkbox.formats import FormatError, bundle, merkle, note, proof
from tkbox.verify import verify_bundle


@pytest.fixture(scope="module")
def kit() -> Kit:
    k = Kit(witnesses=2, independent=("w1",))
    k.run("run-a", decisions=2)
    k.run("run-b", decisions=1)
    return k


def _code(data: bytes, trust: bytes) -> str:
    with pytest.raises(FormatError) as exc:
        verify_bundle(data, trust)
    assert str(exc.value), "an error says what failed"
    return exc.value.code


def test_a_good_bundle_verifies(kit: Kit) -> None:
    r = verify_bundle(kit.bundle("run-a"), kit.trust())
    assert (r.run, r.records, r.isolation) == ("run-a", 7, "same-user")
    assert r.assurance == "local"  # w0 is the operator's own; the quorum needs both
    assert r.cosigned_by == ("w0", "w1")


def test_every_single_byte_change_is_caught() -> None:
    """Change any one byte (each bit position in turn), or delete one: it no longer verifies.

    A small run keeps this under a few seconds; every part of the format is in it
    (header, run and count lines, records, indices, audit paths, the checkpoint's
    text, the log's signature and two witness cosignatures).
    """
    k = Kit(witnesses=2)
    k.run("other")
    k.run("r", decisions=1)
    data, trust = k.bundle("r"), k.trust()
    verify_bundle(data, trust)
    for i in range(len(data)):
        bad = data[:i] + bytes([data[i] ^ (1 << (i % 8))]) + data[i + 1 :]
        with pytest.raises(FormatError):
            verify_bundle(bad, trust)
        if i % 5 == 0:
            with pytest.raises(FormatError):
                verify_bundle(data[:i] + data[i + 1 :], trust)


def test_a_dropped_record_is_caught(kit: Kit) -> None:
    entries = kit.entries("run-a")
    del entries[3]
    assert _code(kit.bundle("run-a", entries), kit.trust()) == "record.missing"


def test_a_duplicated_record_is_caught(kit: Kit) -> None:
    entries = kit.entries("run-a")
    entries.insert(3, entries[2])
    assert _code(kit.bundle("run-a", entries), kit.trust()) == "record.duplicate"


def test_reordered_records_are_caught(kit: Kit) -> None:
    entries = kit.entries("run-a")
    entries[2], entries[3] = entries[3], entries[2]
    assert _code(kit.bundle("run-a", entries), kit.trust()) == "record.order"


def test_a_record_from_another_run_is_caught(kit: Kit) -> None:
    """The foreign record is genuinely in the signed log: only its run gives it away."""
    entries = kit.entries("run-a")
    entries[3] = kit.entries("run-b")[3]
    assert _code(kit.bundle("run-a", entries), kit.trust()) == "record.run"


def test_a_whole_run_relabelled_is_caught(kit: Kit) -> None:
    assert _code(kit.bundle("run-b", bundle_run="run-a"), kit.trust()) == "record.run"


def test_records_cut_off_at_the_end_are_caught(kit: Kit) -> None:
    entries = kit.entries("run-a")[:-2]
    assert _code(kit.bundle("run-a", entries), kit.trust()) == "record.close"


def test_a_truncated_bundle_is_caught(kit: Kit) -> None:
    data = kit.bundle("run-a")
    codes = set()
    for cut in range(0, len(data), 7):
        codes.add(_code(data[:cut], kit.trust()))
    assert "bundle.truncated" in codes
    assert all(c.split(".")[0] in ("bundle", "checkpoint", "note", "record") for c in codes)


def test_the_wrong_trust_file_is_caught(kit: Kit) -> None:
    other = Kit(witnesses=2, origin="example.test/another-log")
    assert _code(kit.bundle("run-a"), other.trust()) == "checkpoint.origin"


def test_a_trust_file_with_another_key_for_the_same_log_is_caught(kit: Kit) -> None:
    impostor = Kit(witnesses=2, origin=kit.signer.name)
    assert _code(kit.bundle("run-a"), impostor.trust()) == "checkpoint.wrong-key"


def test_a_checkpoint_without_the_cosignatures_its_policy_needs_is_caught(kit: Kit) -> None:
    assert _code(kit.bundle("run-a", cosigners=["w1"]), kit.trust()) == "checkpoint.quorum"
    assert _code(kit.bundle("run-a", cosigners=[]), kit.trust()) == "checkpoint.quorum"


def test_a_signature_the_trust_file_cannot_check_is_refused(kit: Kit) -> None:
    """Otherwise the bytes of an unknown signature line would go unchecked."""
    stranger = Kit(witnesses=1).witnesses["w0"]
    cp = kit.checkpoint()
    text = cp[: cp.index(b"\n\n") + 1].decode()
    line = note.sign(text, [stranger]).split(b"\n\n", 1)[1]
    assert _code(kit.bundle("run-a") + line, kit.trust()) == "checkpoint.unknown-signature"


def test_a_forged_record_with_a_recomputed_chain_is_not_in_the_log(kit: Kit) -> None:
    """Rewriting a record (and everything after it) still fails: the log signed other leaves."""
    forger = Kit(witnesses=2)
    forger.run("run-a", decisions=2)
    forged = forger.entries("run-a")
    assert _code(kit.bundle("run-a", forged), kit.trust()) == "record.inclusion"


def test_dev_and_witnessed_assurance() -> None:
    dev = Kit()
    dev.run("r")
    assert verify_bundle(dev.bundle("r"), dev.trust()).assurance == "dev"
    wit = Kit(witnesses=3, independent=("w1", "w2"), quorum=2)
    wit.run("r")
    assert verify_bundle(wit.bundle("r", cosigners=["w1", "w2"]), wit.trust()).assurance == \
        "witnessed"
    assert verify_bundle(wit.bundle("r", cosigners=["w0", "w1"]), wit.trust()).assurance == \
        "local"


def test_each_entry_is_a_standalone_c2sp_tlog_proof(kit: Kit) -> None:
    b = bundle.parse(kit.bundle("run-a"))
    for j in range(len(b.entries)):
        p = proof.parse(b.tlog_proof(j))
        text = p.checkpoint[: p.checkpoint.index(b"\n\n") + 1].decode().split("\n")
        size, root = int(text[1]), __import__("base64").b64decode(text[2])
        assert p.entry.extra is not None
        merkle.verify_inclusion(p.entry.index, size, merkle.leaf_hash(p.entry.extra),
                                p.entry.path, root)


def test_cosignatures_beyond_a_quorum_of_none_are_local_not_dev() -> None:
    k = Kit(witnesses=1, independent=("w0",), quorum=None)
    k.run("r")
    trust = k.trust().replace(b"quorum w0", b"quorum none")
    assert verify_bundle(k.bundle("r"), trust).assurance == "local"
    assert verify_bundle(k.bundle("r", cosigners=[]), trust).assurance == "dev"
