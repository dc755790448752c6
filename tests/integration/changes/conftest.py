"""The two ways a written file takes its name, for the tests that watch or break it.

Where the filesystem has renameat2's flags (ext4, xfs, btrfs, tmpfs: the usual
case), a file is exchanged with the one it replaces, or put where nothing is,
in one call; elsewhere the original is moved aside and the new file linked into
place. `placing` runs a test once each way and lets it hook the call that gives
each file its name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tkbox.doors.changes import fs as fs_mod


class Placing:
    def __init__(self, way: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.way = way
        self.monkeypatch = monkeypatch
        if way == "renameat2":
            assert fs_mod._RENAMEAT2 is not None, "this libc has renameat2"
        else:
            monkeypatch.setattr(fs_mod, "_RENAMEAT2", None)

    def before_each(self, hook: Callable[[], None]) -> None:
        """Call `hook` just before each file takes its name (it may raise)."""
        if self.way == "renameat2":
            real = fs_mod._RENAMEAT2
            assert real is not None

            def rename(*a: Any) -> None:
                hook()
                real(*a)
            self.monkeypatch.setattr(fs_mod, "_RENAMEAT2", rename)
        else:
            real_link = fs_mod.os.link

            def link(*a: Any, **k: Any) -> None:
                hook()
                real_link(*a, **k)
            self.monkeypatch.setattr(fs_mod.os, "link", link)


@pytest.fixture(params=["renameat2", "moved-aside"])
def placing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Placing:
    return Placing(request.param, monkeypatch)


@pytest.fixture(autouse=True)
def _home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's own TKBOX_HOME: the apply's journals are kept there."""
    monkeypatch.setenv("TKBOX_HOME", str(tmp_path_factory.mktemp("home")))
