from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sdk_daemon import SdkDaemon, checkout  # noqa: E402

from tkbox.daemon.testing import FAKE_DIGEST, FakeImage  # noqa: E402
from tkbox.image import tools  # noqa: E402
from tkbox.image.testing import (  # noqa: E402
    NpmRegistry,
    ScratchCA,  # noqa: E402
    package_tgz,
)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[SdkDaemon]:
    d = SdkDaemon(tmp_path).start()
    yield d
    d.stop()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return checkout(tmp_path)


# ---- a daemon whose boxes get the named agents' tool disks ---------------------------


class DebianImages:
    """Every reference resolves to one real root disk that holds glibc's loader (as
    Debian's usrmerge lays it out): what choosing an agent's build reads."""

    def __init__(self, root: Path) -> None:
        entries = [("usr", "d", ""), ("usr/lib64", "d", ""),
                   ("usr/lib64/ld-linux-x86-64.so.2", "f", ""), ("lib64", "l", "usr/lib64")]
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for path, kind, target in entries:
                info = tarfile.TarInfo(path)
                if kind == "d":
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                elif kind == "l":
                    info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info, io.BytesIO(b"") if kind == "f" else None)
        self.rootfs = root / "debian.sqfs"
        subprocess.run(["tar2sqfs", "-q", "-f", str(self.rootfs)], input=buf.getvalue(),
                       check=True)

    async def resolve(self, ref: str) -> FakeImage:
        return FakeImage(FAKE_DIGEST, self.rootfs)


def _program(path: str) -> bytes:
    return Path(shutil.which(path) or path).read_bytes()


@pytest.fixture
def agent_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SdkDaemon]:
    """The API with fake VMs, whose tool disks are fetched for real from an npm registry
    stand-in on loopback serving stand-ins of the agents' packages (real ELF programs:
    a dynamic one for the glibc builds, a static one for Codex), at the versions tkbox
    defaults to (their pins set aside: these are not the registry's bytes)."""
    monkeypatch.setenv("TKBOX_HOME", str(tmp_path / "home"))
    dynamic, static = _program("true"), _program("/sbin/ldconfig")
    with NpmRegistry(ScratchCA.create(tmp_path / "tls")) as reg:
        for k, v in reg.env().items():
            monkeypatch.setenv(k, v)
        for tool in tools.TOOLS.values():
            for key in list(tool.pinned):
                monkeypatch.delitem(tool.pinned, key)
            for part in tool.parts:
                for key in list(part.pinned):
                    monkeypatch.delitem(part.pinned, key)
        cc, cx, gm = (tools.TOOLS[n] for n in ("claude-code", "codex", "gemini"))
        reg.add(cc.packages["glibc"], cc.version, package_tgz(
            {"claude": dynamic}, executable=("claude",)))
        reg.add(cx.packages["static"], cx.npm_version.format(version=cx.version), package_tgz(
            {cx.bins["codex"]: static, cx.bins["rg"]: static}))
        reg.add(gm.packages["glibc"], gm.version, package_tgz(
            {"bundle/gemini.js": b"#!/usr/bin/env node\n", "package.json": b"{}"}))
        node = gm.parts[0]
        reg.add(node.packages["glibc"], node.version, package_tgz({"bin/node": dynamic}))
        d = SdkDaemon(tmp_path, images=DebianImages(tmp_path),  # type: ignore[arg-type]
                      tools=tools.StoreTools()).start()
        d.registry = reg  # type: ignore[attr-defined]
        yield d
        d.stop()
