from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tracekit_proc import TracekitProc, have_tracekit  # noqa: E402


@pytest.fixture
def tk() -> Iterator[TracekitProc]:
    if not have_tracekit():
        pytest.skip("tracekit-ai is not installed (pip install -e '.[test]')")
    p = TracekitProc()
    try:
        p.start()
        yield p
    finally:
        p.cleanup()
