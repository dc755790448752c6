"""docs/bundle-format.md's example verifies as written (the doc is the format)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tkbox.formats import FormatError
from tkbox.verify import verify_bundle

DOC = Path(__file__).resolve().parents[3] / "docs" / "bundle-format.md"


def _block(tag: str) -> bytes:
    m = re.search(rf"```{tag}\n(.*?)```", DOC.read_text(), re.S)
    assert m, f"no ```{tag} block in {DOC}"
    return m.group(1).encode()


def test_the_documented_example_verifies() -> None:
    report = verify_bundle(_block("tkb"), _block("trust"))
    assert (report.run, report.records, report.assurance, report.refused) == ("demo", 3, "local",
                                                                              1)


def test_the_documented_example_breaks_at_any_byte() -> None:
    data, trust = _block("tkb"), _block("trust")
    for i in range(0, len(data), 3):
        with pytest.raises(FormatError):
            verify_bundle(data[:i] + bytes([data[i] ^ 0x04]) + data[i + 1 :], trust)
