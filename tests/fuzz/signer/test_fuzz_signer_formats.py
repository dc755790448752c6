"""Fuzz: every parser of the record refuses garbage with its own error type.

The promise: for any bytes, `FormatError` (the bundle's parsers, the verifier,
the witness request), `WireError` (the signer's framing), or an answer (the
witness's add-checkpoint, the shell reader) and never any other exception,
never unbounded memory or recursion. Inputs are random bytes and mutations
of valid ones (which reach deeper).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "formats"))

from tkb_kit import Kit  # noqa: E402

from tkbox.formats import (  # noqa: E402
    FormatError,
    bundle,
    canonjson,
    checkpoint,
    cosignature,
    note,
    proof,
    record,
    tlogpolicy,
    wire,
)
from tkbox.formats import witness as wfmt  # noqa: E402
from tkbox.signer.download_exec import analyze  # noqa: E402
from tkbox.signer.witness import Witness  # noqa: E402
from tkbox.verify import verify_bundle  # noqa: E402

KIT = Kit(witnesses=1)
KIT.run("fuzz", decisions=1)
BUNDLE = KIT.bundle("fuzz")
TRUST = KIT.trust()
CHECKPOINT = KIT.checkpoint()
SEEDS = [BUNDLE, TRUST, CHECKPOINT, KIT.raw[0],
         wfmt.format_add_checkpoint(0, [], CHECKPOINT),
         bundle.parse(BUNDLE).tlog_proof(0),
         bundle.parse_trust(TRUST).policy.text().encode()]

SETTINGS = settings(deadline=None,  # examples: the profile (`make fuzz` runs "long")
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def inputs(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=2000))
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.integers(0, 3))
        if op == 0:
            data[i] = draw(st.integers(0, 255))
        elif op == 1:
            del data[i : i + draw(st.integers(1, 40))]
        elif op == 2:
            data[i:i] = draw(st.binary(min_size=1, max_size=40))
        else:
            data[i:i] = data[: draw(st.integers(0, min(200, len(data))))]
    return bytes(data)


def _only_format_errors(fn, data: bytes) -> None:  # type: ignore[no-untyped-def]
    try:
        fn(data)
    except FormatError:
        pass


@SETTINGS
@given(inputs())
def test_verify_bundle(data: bytes) -> None:
    _only_format_errors(lambda d: verify_bundle(d, TRUST), data)
    _only_format_errors(lambda d: verify_bundle(BUNDLE, d), data)


@SETTINGS
@given(inputs())
def test_parsers(data: bytes) -> None:
    _only_format_errors(bundle.parse, data)
    _only_format_errors(bundle.parse_trust, data)
    _only_format_errors(note.split, data)
    _only_format_errors(lambda d: note.open_note(d, note.Verifiers([KIT.signer.verifier()])),
                        data)
    _only_format_errors(proof.parse, data)
    _only_format_errors(tlogpolicy.parse, data)
    _only_format_errors(record.parse, data)
    _only_format_errors(canonjson.loads, data)
    _only_format_errors(wfmt.parse_add_checkpoint, data)
    _only_format_errors(wfmt.parse_cosignatures, data)
    text = data.decode("utf-8", "replace")
    _only_format_errors(lambda _: checkpoint.parse(text), data)
    _only_format_errors(lambda _: note.parse_vkey(text), data)
    _only_format_errors(lambda _: cosignature.parse_vkey(text), data)
    _only_format_errors(lambda _: note.parse_skey(text), data)


_WITNESS_DIR = tempfile.mkdtemp(prefix="tkb-fuzz-")
WITNESS = Witness(cosignature.generate("witness.test/fuzz"), [KIT.signer.verifier()],
                  Path(_WITNESS_DIR) / "w.db")


@SETTINGS
@given(inputs())
def test_witness_answers_anything(data: bytes) -> None:
    a = WITNESS.add_checkpoint(data)
    assert a.status in (200, 400, 403, 404, 409, 422)


@SETTINGS
@given(st.binary(max_size=3000))
def test_wire_decoder(data: bytes) -> None:
    d = wire.Decoder()
    try:
        d.feed(data)
        while d.next() is not None:
            pass
    except wire.WireError:
        pass


_shell_chars = st.sampled_from(list("ab $(){}<>|&;'\"`\\\n\t#=*-") + ["curl", "sh", "<(", "$(",
                                                                      "<<", "EOF", " -c "])


@SETTINGS
@given(st.lists(_shell_chars, max_size=80).map("".join))
def test_shell_reader_never_raises(cmd: str) -> None:
    a = analyze(cmd)
    assert isinstance(a.parsed, bool)


def test_seeds_are_valid() -> None:
    """Each seed is accepted by its own parser, so mutations of it start deep inside
    the format rather than at its first byte."""
    report = verify_bundle(BUNDLE, TRUST)
    assert report.records == len(bundle.parse(BUNDLE).entries) >= 2
    assert bundle.parse_trust(TRUST).policy.text().encode() == SEEDS[6]
    text, sigs = note.split(CHECKPOINT)
    assert checkpoint.parse(text).size >= 2 and sigs
    assert record.parse(KIT.raw[0]).kind == record.OPEN
    assert wfmt.parse_add_checkpoint(SEEDS[4]) is not None
    assert proof.parse(SEEDS[5]) is not None
    assert tlogpolicy.parse(SEEDS[6]) is not None
    fresh = Witness(cosignature.generate("witness.test/seed"), [KIT.signer.verifier()],
                    Path(tempfile.mkdtemp(prefix="tkb-seed-")) / "w.db")
    assert fresh.add_checkpoint(SEEDS[4]).status == 200
