from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from signer_proc import SignerProc  # noqa: E402


@pytest.fixture
def signer() -> Iterator[SignerProc]:
    s = SignerProc()
    try:
        s.start()
        yield s
    finally:
        s.cleanup()
