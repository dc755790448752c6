"""C2SP signed-note against Go's sumdb/note vectors and the C2SP examples.

The vectors (tests/testdata/c2sp/, see SOURCES.md) run on every test run:
a Python note that differs from Go's by one byte would break every witness and
every verifier that is not ours.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tkbox.formats import note
from tkbox.formats.note import NoteError, Signature

C2SP = Path(__file__).resolve().parents[2] / "testdata" / "c2sp"
GO = json.loads((C2SP / "go-note-vectors.json").read_text())
EXAMPLES = {e["id"]: e for e in json.loads((C2SP / "examples.json").read_text())["examples"]}
KEYS = GO["keys"]


def _verifier(who: str) -> note.Verifier:
    return note.parse_vkey(KEYS[f"{who}_vkey"])


def test_go_new_verifier_vectors() -> None:
    for case in GO["new_verifier"]:
        if case["ok"]:
            v = note.parse_vkey(case["vkey"])
            assert (v.name, f"{v.key_id:08x}") == ("PeterNeumann", "c74f20a3")
        else:
            with pytest.raises(NoteError):
                note.parse_vkey(case["vkey"])


def test_go_new_signer_vectors() -> None:
    for case in GO["new_signer"]:
        s = note.parse_skey(case["skey"])
        assert s.public_key.hex() == KEYS["peter"]["ed25519_public_key_hex"]
        assert s.skey() == case["skey"]
        assert s.verifier().vkey() == KEYS["peter_vkey"]


@pytest.mark.parametrize("field", ["peter_vkey", "peter_skey"])
def test_go_every_proper_substring_and_every_incremented_byte_fails(field: str) -> None:
    key = KEYS[field]
    parse = note.parse_vkey if field.endswith("vkey") else note.parse_skey
    parse(key)
    raw = key.encode()
    for i in range(len(raw)):
        for j in range(i, len(raw) + 1):
            if (i, j) == (0, len(raw)):
                continue
            with pytest.raises(NoteError):
                parse(raw[i:j].decode())
        bumped = bytearray(raw)
        bumped[i] += 1
        with pytest.raises(NoteError):
            parse(bumped.decode())


def _existing(sigs: list[dict[str, str]]) -> tuple[Signature, ...]:
    return tuple(Signature.from_b64(s["name"], int(s["key_hash_hex"], 16), s["base64"])
                 for s in sigs)


def test_go_sign_vectors() -> None:
    peter = note.parse_skey(KEYS["peter_skey"])
    for case in GO["sign"]:
        signers: list[note.Signer] = []
        for s in case.get("signers", []):
            if s == "peter_skey":
                signers.append(peter)
            else:  # "<peter key with Name() = 'bad name'>"
                bad = note.parse_skey(KEYS["peter_skey"])
                bad.name = "bad name"
                signers.append(bad)
        n = note.Note(case["note_text"], _existing(case.get("existing_sigs", [])))
        if case["ok"]:
            assert note.sign(n, signers).decode() == case["expected"], case["case"]
        else:
            with pytest.raises(NoteError) as exc:
                note.sign(n, signers)
            assert exc.value.what.startswith(case["error"]), case["case"]


def test_go_verifier_list_lookup() -> None:
    by = {"peter": _verifier("peter"), "enoch": _verifier("enoch")}
    for case in GO["verifier_list_lookup"]:
        vs = note.Verifiers([by[n] for n in case["verifiers"]])
        kid = int(case["key_hash_hex"], 16)
        if case["ok"]:
            assert vs.lookup(case["name"], kid) is by[case["result"]]
        else:
            with pytest.raises(NoteError) as exc:
                vs.lookup(case["name"], kid)
            assert exc.value.what == case["error"]


def _sigs(n: tuple[Signature, ...]) -> list[tuple[str, str, str]]:
    return [(s.name, f"{s.key_id:08x}", s.b64) for s in n]


def _want(sigs: list[dict[str, str]]) -> list[tuple[str, str, str]]:
    return [(s["name"], s["key_hash_hex"], s["base64"]) for s in sigs]


def test_go_open_vectors() -> None:
    by = {"peter": _verifier("peter"), "enoch": _verifier("enoch")}
    for case in GO["open"]:
        vs = note.Verifiers([by[n] for n in case["verifiers"]])
        msg = case["msg"].encode()
        if case["ok"]:
            n = note.open_note(msg, vs)
            assert n.text == case["text"]
            assert _sigs(n.sigs) == _want(case["sigs"]), case["case"]
            assert _sigs(n.unverified) == _want(case["unverified_sigs"]), case["case"]
        else:
            with pytest.raises(NoteError) as exc:
                note.open_note(msg, vs)
            assert exc.value.what.startswith(case["error"]), case["case"]


def test_go_open_malformed() -> None:
    vs = note.Verifiers([_verifier("peter")])
    for case in GO["open_malformed"]["msgs"]:
        if "msg" in case:
            msg = case["msg"].encode()
        else:
            msg = bytes.fromhex(case["prefix_byte_hex"]) + case["msg_after_ff_byte"].encode()
        with pytest.raises(NoteError) as exc:
            note.open_note(msg, vs)
        assert exc.value.code == "note.malformed", case["why"]
        assert exc.value.what.startswith("malformed note"), case["why"]


class _AlwaysPeter(note.Verifiers):
    def lookup(self, name: str, kid: int) -> note.Verifier:
        return _verifier("peter")


def test_go_open_mismatched_verifier() -> None:
    for case in GO["open_mismatched_verifier"]:
        with pytest.raises(NoteError) as exc:
            note.open_note(case["msg"].encode(), _AlwaysPeter())
        assert exc.value.what == case["error"]


def test_sign_verify_roundtrip() -> None:
    signer = note.generate("example.com/roundtrip")
    msg = note.sign(GO["sign_verify_roundtrip_message"] + "\n", [signer])
    n = note.open_note(msg, note.Verifiers([signer.verifier()]))
    assert n.text == "hi\n"
    assert note.parse_vkey(signer.verifier().vkey()).key_id == signer.key_id
    assert note.parse_skey(signer.skey()).public_key == signer.public_key


def test_c2sp_vkey_verifies_note() -> None:
    ex = EXAMPLES["signed-note/vkey-verifies-note"]
    v = note.parse_vkey(ex["input"]["vkey"])
    assert f"{v.key_id:08x}" == ex["expected"]["vkey_key_id_hex"]
    assert v.public_key.hex() == ex["expected"]["ed25519_public_key_hex"]
    n = note.open_note(ex["input"]["note"].encode(), note.Verifiers([v]))
    assert n.text == ex["expected"]["text"]
    want = [s["signature_hex"] for s in ex["expected"]["signatures"]]
    assert [s.raw.hex() for s in n.sigs] == want


def test_c2sp_intro_note_splits_on_the_last_blank_line() -> None:
    ex = EXAMPLES["signed-note/intro-note"]
    text, sigs = note.split(ex["input"]["note"].encode())
    assert text == ex["expected"]["text"]
    assert "\n\n" in text  # the text itself holds a blank line
    want = ex["expected"]["signatures"][0]
    assert (sigs[0].name, f"{sigs[0].key_id:08x}", sigs[0].raw.hex()) == (
        want["key_name"], want["key_id_hex"], want["signature_hex"])
    with pytest.raises(NoteError) as exc:
        note.open_note(ex["input"]["note"].encode(), note.Verifiers())
    assert exc.value.code == "note.unverified"


def test_non_canonical_base64_is_refused() -> None:
    """Go accepts base64 whose unused low bits are set; we accept one form only."""
    ex = EXAMPLES["signed-note/vkey-verifies-note"]
    msg = ex["input"]["note"]
    sig = msg.rsplit(" ", 1)[1].rstrip("\n")
    assert sig.endswith("M=")  # 68 bytes: the last character carries 4 bits + 2 zero bits
    bad = msg.replace(sig, sig[:-2] + "N=")
    with pytest.raises(NoteError) as exc:
        note.open_note(bad.encode(), note.Verifiers([note.parse_vkey(ex["input"]["vkey"])]))
    assert exc.value.code == "note.malformed"
