"""The C2SP examples (tests/testdata/c2sp/examples.json) through our parsers,
and the rules of each format that the examples do not show."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tkbox.formats import FormatError, checkpoint, cosignature, note, proof, tlogpolicy
from tkbox.formats import witness as wfmt

C2SP = Path(__file__).resolve().parents[2] / "testdata" / "c2sp"
EXAMPLES = {e["id"]: e for e in json.loads((C2SP / "examples.json").read_text())["examples"]}


def _sigs(sigs: list[note.Signature]) -> list[tuple[str, str, str]]:
    return [(s.name, f"{s.key_id:08x}", s.raw.hex()) for s in sigs]


def _want(sigs: list[dict[str, str]]) -> list[tuple[str, str, str]]:
    return [(s["key_name"], s["key_id_hex"], s["signature_hex"]) for s in sigs]


def test_checkpoint_example() -> None:
    ex = EXAMPLES["tlog-checkpoint/example"]
    text, sigs = note.split(ex["input"]["checkpoint"].encode())
    assert text == ex["expected"]["note_text"]
    cp = checkpoint.parse(text)
    assert (cp.origin, cp.size, cp.root.hex(), list(cp.extensions)) == (
        ex["expected"]["origin"], ex["expected"]["tree_size"], ex["expected"]["root_hash_hex"],
        ex["expected"]["extension_lines"])
    assert cp.text() == text
    assert _sigs(sigs) == _want(ex["expected"]["signatures"])


@pytest.mark.parametrize("text", [
    "origin\n020852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",  # leading zero
    "origin\n-1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
    "origin\n+1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
    "origin\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2J=\n",  # non-canonical base64
    "origin\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jx\n",  # short hash
    "origin\n1\n",
    "origin\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n\n",  # empty extension line
    "\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
    "origin\n0\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",  # size 0, not the empty root
    "origin\n9223372036854775808\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
    "origin\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=",
])
def test_non_canonical_checkpoints_are_refused(text: str) -> None:
    with pytest.raises(FormatError):
        checkpoint.parse(text)


def test_cosignature_example_decodes() -> None:
    ex = EXAMPLES["tlog-cosignature/checkpoint-with-cosignature"]
    _, sigs = note.split(ex["input"]["note"].encode())
    assert _sigs(sigs) == _want(ex["expected"]["signatures"])
    cos = sigs[1]
    assert cosignature.timestamp(cos) == ex["expected"]["cosignature"]["timestamp"]
    assert cos.raw[8:].hex() == ex["expected"]["cosignature"]["ed25519_signature_hex"]


def test_cosignature_v1_message_is_byte_exact() -> None:
    ex = EXAMPLES["tlog-cosignature/v1-signed-message"]
    msg = cosignature.message(ex["input"]["timestamp"],
                              ex["input"]["checkpoint_note_text"].encode())
    assert msg.hex() == ex["expected"]["signed_message_hex"]


def test_cosignature_roundtrip_and_key_id_uses_type_4() -> None:
    w = cosignature.generate("witness.example/w1", clock=lambda: 1679315147)
    text = EXAMPLES["tlog-cosignature/v1-signed-message"]["input"]["checkpoint_note_text"]
    sig = w.sign(text.encode())
    assert len(sig) == cosignature.SIG_SIZE and struct.unpack(">Q", sig[:8])[0] == 1679315147
    v = cosignature.parse_vkey(w.verifier().vkey())
    assert v.verify(text.encode(), sig)
    assert not v.verify((text + "x\n").encode(), sig)
    assert v.key_id == note.key_id(w.name, b"\x04" + w.public_key)
    assert v.key_id != note.key_id(w.name, b"\x01" + w.public_key)
    assert cosignature.parse_skey(w.skey()).public_key == w.public_key
    # a timestamp above 2^63 - 1 is not a valid cosignature
    forged = struct.pack(">Q", 1 << 63) + sig[8:]
    assert not v.verify(text.encode(), forged)


def test_witness_request_example_parses() -> None:
    ex = EXAMPLES["tlog-witness/add-checkpoint-request"]
    req = wfmt.parse_add_checkpoint(ex["input"]["body"].encode())
    assert req.old == ex["expected"]["old_size"]
    assert [h.hex() for h in req.proof] == ex["expected"]["consistency_proof_hex"]
    assert req.checkpoint.decode() == ex["expected"]["checkpoint"]
    assert wfmt.format_add_checkpoint(req.old, list(req.proof), req.checkpoint) == \
        ex["input"]["body"].encode()


def test_witness_response_example_parses() -> None:
    ex = EXAMPLES["tlog-witness/add-checkpoint-response"]
    sigs = wfmt.parse_cosignatures(ex["input"]["body"].encode())
    want = [(s["key_name"], s["key_id_hex"], s["signature_hex"])
            for s in ex["expected"]["signature_lines"]]
    assert _sigs(sigs) == want


@pytest.mark.parametrize("body", [
    b"old 01\n\ncp", b"old 1\nnot base64\n\ncp", b"new 1\n\ncp", b"old 1\n", b"",
    b"old 1\n" + b"PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=\n" * 64 + b"\ncp",
])
def test_bad_witness_requests_are_refused(body: bytes) -> None:
    with pytest.raises(FormatError):
        wfmt.parse_add_checkpoint(body)


def test_409_size_body() -> None:
    assert wfmt.parse_size(b"20852014\n") == 20852014
    for bad in (b"1", b"01\n", b"1\n2\n", b"x\n"):
        with pytest.raises(FormatError):
            wfmt.parse_size(bad)


def test_tlog_proof_example_structure() -> None:
    """The example elides its signatures with […], so only the proof part is read."""
    ex = EXAMPLES["tlog-proof/example"]
    p = proof.parse(ex["input"]["proof_file"].encode())
    assert p.entry.index == ex["expected"]["index"]
    assert p.entry.extra is not None and p.entry.extra.hex() == ex["expected"]["extra_hex"]
    assert [h.hex() for h in p.entry.path] == ex["expected"]["inclusion_proof_hex"]
    assert p.checkpoint.decode().startswith(ex["expected"]["checkpoint_note_text"])


def _vkeys(n: int) -> list[str]:
    return [cosignature.generate(f"w{i}.example").verifier().vkey() for i in range(n)]


def test_policy_example_with_real_keys() -> None:
    ex = EXAMPLES["tlog-policy/example-two-level-quorum"]
    text = ex["input"]["policy"]
    with pytest.raises(FormatError):
        tlogpolicy.parse(text.encode())  # the placeholders are not keys
    log = note.generate("example.com/log").verifier().vkey()
    keys = iter(_vkeys(6))
    lines = []
    for line in text.split("\n"):
        if line.startswith("log "):
            line = f"log {log}"
        elif line.startswith("witness "):
            line = line.replace("<vkey>", next(keys))
        lines.append(line)
    pol = tlogpolicy.parse("\n".join(lines).encode())
    assert sorted(pol.witnesses) == ex["expected"]["witnesses"]
    for name, g in ex["expected"]["groups"].items():
        assert (pol.groups[name].threshold, list(pol.groups[name].members)) == (
            g["threshold"], g["members"])
    assert pol.quorum == ex["expected"]["quorum"]
    assert pol.satisfied({"X1", "X3", "Y2"})
    assert not pol.satisfied({"X1", "Y2"})
    assert not pol.satisfied({"X1", "X2", "X3"})
    assert tlogpolicy.parse(pol.text().encode()).text() == pol.text()


def test_policy_rules() -> None:
    a, b = _vkeys(2)
    log = note.generate("example.com/log").verifier().vkey()
    ok = (f"log {log}\nwitness A {a}\n  witness\tB {b} https://b.example/\n# c\n\n"
          "group G any A B\nquorum G\n")
    assert tlogpolicy.parse(ok.encode()).quorum == "G"
    bad = [
        f"witness A {a}\n",  # no quorum
        f"witness A {a}\nquorum A\nquorum A\n",  # two quorums
        f"witness A {a}\nwitness B {a}\nquorum A\n",  # same key twice
        f"witness A {a}\nwitness A {b}\nquorum A\n",  # same name twice
        "group G any A\nquorum G\n",  # member not defined above
        f"quorum G\nwitness A {a}\ngroup G any A\n",  # quorum before its group
        f"witness A {a}\ngroup G 2 A\nquorum G\n",  # k > n
        f"witness A {a}\ngroup G 0 A\nquorum G\n",
        f"witness A {a}\ngroup G any A A\nquorum G\n",  # a member twice
        f"witness A {a}\ngroup G any none\nquorum G\n",
        f"witness A {log}\nquorum A\n",  # a log key as a witness
        f"log {a}\nquorum none\n",  # a witness key as a log
        f"witness A {a}\nquorum A\nfrobnicate\n",
        f"witness A {a}\x01\nquorum A\n",
        f"witness A {a}\nquorum A",  # no final newline
    ]
    for text in bad:
        with pytest.raises(FormatError):
            tlogpolicy.parse(text.encode())
