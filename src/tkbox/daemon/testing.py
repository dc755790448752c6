"""Fakes of the box manager's collaborators, for tests above them (and for users).

Each one satisfies its role's Protocol in `tkbox.daemon.roles`: each names its
Protocol as a base, so mypy checks it here, and `tests/unit/daemon/test_roles.py`
checks them at run time. A test that uses them runs the same `BoxManager` the
daemon runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tkbox.daemon.roles import GuestBuilder, ImageRunConfig, ImageSource, NetworkDoor
from tkbox.doors.network import Explanation
from tkbox.errors import UserError
from tkbox.protocol.streams import ByteStream

FAKE_DIGEST = "sha256:" + "0" * 64


@dataclass(frozen=True)
class FakeImage:
    """An image whose root disk is an empty file; no run config (root, no Env)."""

    digest: str
    rootfs: Path
    config: ImageRunConfig | None = None
    pulled_from: Mapping[str, Any] | None = None


class FakeImages(ImageSource):
    """Every reference resolves to the same empty root disk under `root`."""

    def __init__(self, root: Path) -> None:
        self.rootfs = root / "root.sqfs"
        self.rootfs.write_bytes(b"")

    async def resolve(self, ref: str) -> FakeImage:
        return FakeImage(FAKE_DIGEST, self.rootfs)


@dataclass(frozen=True)
class FakeBuild:
    """A guest build whose kernel and initramfs need not exist (the fake launcher
    boots neither)."""

    kernel: Path
    initramfs: Path
    kernel_version: str = "fake"
    digest: str = "f" * 64


class FakeBuilder(GuestBuilder):
    """The guest builder: always the same `FakeBuild`."""

    def __init__(self, build: FakeBuild) -> None:
        self.build = build

    def __call__(self) -> FakeBuild:
        return self.build


class HoldingDoor(NetworkDoor):
    """A network door that keeps every stream the guest opens, even after close: the
    worst case for the host's own streams."""

    ca_pem: str | None = None

    async def handle(self, stream: ByteStream) -> None:
        await asyncio.Event().wait()

    async def close(self) -> None:
        return None

    async def resolve_and_check(self, host: str, port: int) -> Explanation:
        raise UserError("this door decides nothing: it only holds streams")
