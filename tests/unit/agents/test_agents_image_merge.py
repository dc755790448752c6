"""`agents.image.merge`: the layer a box installed is read as untrusted, within bounds."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tkbox.agents import image
from tkbox.errors import HostError


def _tar(path: Path, members: list[tuple[str, bytes]], **kw: object) -> Path:
    with tarfile.open(path, "w", **kw) as t:  # type: ignore[call-overload]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def test_the_layer_replaces_the_bases_files_under_usr_local(tmp_path: Path) -> None:
    base = _tar(tmp_path / "base.tar", [("./etc/os-release", b"debian\n"),
                                        ("./usr/local/bin/tool", b"old\n")])
    layer = _tar(tmp_path / "layer.tar", [("usr/local/bin/tool", b"new\n"),
                                          ("usr/local/lib/x.js", b"js\n")])
    image.merge(base, layer, tmp_path / "out.tar")
    with tarfile.open(tmp_path / "out.tar") as t:
        got = {m.name.removeprefix("./"): t.extractfile(m).read()  # type: ignore[union-attr]
               for m in t if m.isfile()}
    assert got == {"etc/os-release": b"debian\n", "usr/local/bin/tool": b"new\n",
                   "usr/local/lib/x.js": b"js\n"}


def test_a_chain_of_extended_headers_is_refused_not_a_recursion(tmp_path: Path) -> None:
    """3,000 GNU long-name headers before one entry: tarfile reads each by calling
    itself for the next, which raised RecursionError out of the build."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as t:
        info = tarfile.TarInfo("usr/local/" + "a" * 200)
        t.addfile(info, io.BytesIO(b""))
    block = raw.getvalue()
    longname = block[:1024]  # the ././@LongLink header and its one data block
    chained = longname * 3000 + block
    layer = tmp_path / "layer.tar"
    layer.write_bytes(chained)
    base = _tar(tmp_path / "base.tar", [("./etc/os-release", b"debian\n")])
    with pytest.raises(HostError, match="extended headers"):
        image.merge(base, layer, tmp_path / "out.tar")


def test_a_layer_of_too_many_files_is_refused_before_they_are_all_held(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image, "MAX_LAYER_MEMBERS", 50)
    layer = _tar(tmp_path / "layer.tar", [(f"usr/local/f{i}", b"") for i in range(51)])
    base = _tar(tmp_path / "base.tar", [("./etc/os-release", b"debian\n")])
    with pytest.raises(HostError, match="more than 50 files"):
        image.merge(base, layer, tmp_path / "out.tar")
    assert not (tmp_path / "out.tar").exists()
