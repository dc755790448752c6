"""A large malformed bundle, built to make the verifier hold copies of it.

The attack (found by a review as an attacker): before any signature was
checked, the verifier held about three times a malformed bundle's size (the
entries cut out, decoded to text and split into lines; a long line copied,
decoded and cut again). Now the checkpoint is found without reading the
entries and checked first, a layout is checked without keeping what it reads,
and no line longer than any a bundle may hold is copied out. Each test holds
the peak (tracemalloc, deterministic) below a bound and the error to what it
was.
"""

from __future__ import annotations

import base64
import sys
import tracemalloc
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "formats"))

from tkb_kit import Kit  # noqa: E402

from tkbox.formats import FormatError, bundle, record  # noqa: E402
from tkbox.verify import verify_bundle  # noqa: E402

MIB = 1 << 20
FIXED = 4 * MIB  # what the verifier may hold besides the bundle, before any signature


@pytest.fixture(scope="module")
def big() -> tuple[Kit, bytes, bytes]:
    """A run of 3,000 records of about 1 KB each (a bundle of about 6 MiB), its trust file."""
    kit = Kit()
    kit.append("r", record.OPEN, {"facts": {"image": "sha256:00"}, "isolation": "same-user"})
    for i in range(3000):
        kit.append("r", "tkbox.secret.use", {"name": "T", "host": f"h{i}", "pad": "p" * 900})
    kit.append("r", record.CLOSE, {})
    return kit, kit.bundle("r"), kit.trust()


def _peak(data: bytes, trust: bytes) -> tuple[int, FormatError]:
    """The verifier's peak of traced memory above what it started with, and its error."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with pytest.raises(FormatError) as exc:
            verify_bundle(data, trust)
        return tracemalloc.get_traced_memory()[1] - base, exc.value
    finally:
        tracemalloc.stop()


def _entries_then(kit: Kit, data: bytes, tail: bytes) -> bytes:
    """`data` up to its checkpoint, the record count one more, and `tail` after it."""
    body = data[: data.index(b"\n\n") + 1]
    return body.replace(b"records 3002\n", b"records 3003\n", 1) + tail


def test_a_large_bundle_under_a_checkpoint_of_another_key_is_refused_in_fixed_memory(
        big: tuple[Kit, bytes, bytes]) -> None:
    """Valid entries under another log's checkpoint: refused at the signature, the
    entries never decoded or kept."""
    kit, data, trust = big
    forged = bundle.build("r", kit.entries("r"), Kit().checkpoint()).encode()
    assert len(forged) > 5 * MIB
    peak, err = _peak(forged, trust)
    assert err.code == "checkpoint.wrong-key"
    assert peak < MIB, f"{peak / MIB:.1f} MiB held to refuse a {len(forged) / MIB:.1f} MiB bundle"


def test_a_large_bundle_with_a_bad_layout_and_a_bad_signature_is_refused_in_fixed_memory(
        big: tuple[Kit, bytes, bytes]) -> None:
    """Its layout's fault is named first (step 2 comes before the signatures), by a
    reading that keeps nothing of the entries."""
    kit, data, trust = big
    bad = _entries_then(kit, data, b"\n" + Kit().checkpoint())
    peak, err = _peak(bad, trust)
    assert (err.code, err.what) == ("bundle.count", "the bundle says 3003 records but holds 3002")
    assert peak < FIXED


def test_a_real_checkpoint_after_hostile_entries_is_refused_in_less_than_the_bundles_size(
        big: tuple[Kit, bytes, bytes]) -> None:
    """A signed checkpoint is public: anyone can put one after entries of their own. Its
    signature verifies, so the entries are read, still without copies of the bundle."""
    kit, data, trust = big
    bad = _entries_then(kit, data, b"\n" + kit.checkpoint())
    peak, err = _peak(bad, trust)
    assert err.code == "bundle.count"
    assert peak < len(bad), f"{peak / len(bad):.2f} times the bundle's size"


def _long_line_bundle(kit: Kit, line: bytes, where: str) -> bytes:
    head = b"tkbox-bundle/v1\nrun r\nrecords 2\n"
    entry = b"c2sp.org/tlog-proof@v1\nextra AAAA\nindex 0\n"
    if where == "magic":
        return line + b"\n" + head[16:] + entry + b"\n" + kit.checkpoint()
    if where == "extra":
        entry = b"c2sp.org/tlog-proof@v1\nextra " + line + b"\nindex 0\n"
        return head + entry + b"\n" + kit.checkpoint()
    return head + entry + line + b"\n\n" + kit.checkpoint()  # an audit-path line


LONG = 6 * MIB


@pytest.mark.parametrize(("where", "line", "code", "what"), [
    ("magic", b"x" * LONG, "bundle.magic",
     f"not a tkbox bundle: expected 'tkbox-bundle/v1', found {'x' * 40!r}…"),
    ("magic", b"x" * LONG + b"\xff", "bundle.malformed", f"not UTF-8 at byte {LONG}"),
    ("extra", b"A" * LONG, "bundle.malformed",
     "record 0: the extra data is larger than 65536 bytes"),
    ("path", b"QUFB" * (LONG // 4), "bundle.malformed",
     f"record 0: expected 32 bytes, base64 holds {LONG // 4 * 3}"),
    ("path", b"QUFB" * (LONG // 4) + b"QQ==", "bundle.malformed",
     f"record 0: expected 32 bytes, base64 holds {LONG // 4 * 3 + 1}"),
    ("path", b"QUFB" * (LONG // 4) + b"QR==", "bundle.malformed",
     f"record 0: {'QUFB' * 10!r}… is not canonical base64"),
    ("path", b"QUFB" * (LONG // 4) + b"Q!==", "bundle.malformed",
     f"record 0: {'QUFB' * 10!r}… is not valid base64"),
    ("path", b"QUFB" * (MIB // 4) + b"QQ==" + b"QUFB" * (MIB // 4), "bundle.malformed",
     f"record 0: {'QUFB' * 10!r}… is not valid base64"),
    ("path", b"QUFB" * (LONG // 4) + "é".encode(), "bundle.malformed",
     "record 0: base64 holds a non-ASCII character"),
], ids=["magic", "magic-utf8", "extra", "path-length", "path-padded", "path-canonical",
        "path-invalid", "path-inner-padding", "path-non-ascii"])
def test_a_huge_line_is_refused_in_fixed_memory_with_the_error_of_the_whole_line(
        big: tuple[Kit, bytes, bytes], where: str, line: bytes, code: str, what: str) -> None:
    """A line of megabytes is checked a chunk at a time, never copied out whole, and
    refused as the whole line would be (the messages are those of `_strict` on it)."""
    kit, _, trust = big
    data = _long_line_bundle(kit, line, where)
    peak, err = _peak(data, trust)
    assert (err.code, err.what) == (code, what)
    assert peak < FIXED, f"{peak / MIB:.1f} MiB held for a {len(line) / MIB:.1f} MiB line"


def test_the_line_checks_agree_with_the_strict_parsers_on_short_lines() -> None:
    """The chunked checks give, on any line, what the whole-line parsers give."""
    from tkbox.formats import _strict

    for text in [b"QUFB", b"QQ==", b"QR==", b"Q!==", b"QUFBQQ", b"=QUF", "é".encode(),
                 base64.b64encode(b"x" * 32), b"QUFB" * 3 + b"QQ==QUFB"]:
        try:
            _strict.b64(text.decode(), "c", "w", length=32)
        except FormatError as exc:
            want = exc.what
        else:
            want = "ok"
        got = _strict.b64_span(text, 0, len(text), text.decode(), "c", "w", length=32).what
        assert got == want or (want == "ok" and got == "expected 32 bytes, base64 holds 32")
