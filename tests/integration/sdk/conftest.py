from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sdk_daemon import SdkDaemon, checkout  # noqa: E402


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[SdkDaemon]:
    d = SdkDaemon(tmp_path).start()
    yield d
    d.stop()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return checkout(tmp_path)
