"""The guest build, asked for again (every box's start asks), reuses the slow read of the
agent's imports: the same digest, without running modulefinder; a change to a file the
agent imports reads them again."""

from __future__ import annotations

import modulefinder
import shutil
from pathlib import Path

import pytest

import tkbox
from tkbox.image import initramfs
from tkbox.image.kernel import find_kernel

pytestmark = pytest.mark.integration


def test_the_imports_are_read_once_then_reused_with_the_same_digest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        kernel = find_kernel()
    except tkbox.errors.TkboxError as exc:
        pytest.skip(f"no guest kernel on this host: {exc}")
    first = initramfs.collect(kernel, tmp_path)
    assert list(tmp_path.glob("stdlib-*.json"))

    def no_finder(*a: object, **k: object) -> None:
        raise AssertionError("modulefinder ran although its answer was kept")

    monkeypatch.setattr(modulefinder, "ModuleFinder", no_finder)
    again = initramfs.collect(kernel, tmp_path)
    assert again.digest() == first.digest() and again.files == first.files


def test_a_changed_agent_source_reads_the_imports_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        kernel = find_kernel()
    except tkbox.errors.TkboxError as exc:
        pytest.skip(f"no guest kernel on this host: {exc}")
    pkg = tmp_path / "pkg" / "tkbox"
    shutil.copytree(Path(tkbox.__file__).parent, pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(tkbox, "__file__", str(pkg / "__init__.py"))
    cache = tmp_path / "cache"
    cache.mkdir()
    initramfs.collect(kernel, cache)
    (pkg / "guest" / "rpc.py").write_text((pkg / "guest" / "rpc.py").read_text()
                                          + "\nimport fractions  # noqa\n")
    changed = initramfs.collect(kernel, cache)
    assert any(name.endswith("/fractions.py") for name in changed.files)
    assert len(list(cache.glob("stdlib-*.json"))) == 2
