"""Every collaborator of the box manager, real or fake, plays its role's Protocol.

The fakes in `tkbox.daemon.testing` are what the daemon's integration tests and
the SDK's test daemon run on; the real ones are what `tkbox daemon` wires. A fake
that drifts from its role (a method renamed, one missing) fails here, not as an
AttributeError deep in a test of something else.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tkbox.daemon import roles
from tkbox.daemon.box import DoorFactory
from tkbox.daemon.testing import FakeBuild, FakeBuilder, FakeImage, FakeImages, HoldingDoor
from tkbox.doors.network import ApprovalBoard, EgressDoor, OperatorConfig, SystemClock
from tkbox.doors.network.testing import FakeResolver
from tkbox.image.store import ImageStore
from tkbox.record.testing import FakeSigner


def test_the_fakes_play_their_roles(tmp_path: Path) -> None:
    images = FakeImages(tmp_path)
    assert isinstance(images, roles.ImageSource)
    assert isinstance(asyncio.run(images.resolve("any")), roles.ResolvedImage)
    assert isinstance(FakeImage("sha256:" + "0" * 64, tmp_path), roles.ResolvedImage)
    build = FakeBuild(tmp_path / "k", tmp_path / "i")
    assert isinstance(build, roles.GuestBuildInfo)
    assert isinstance(FakeBuilder(build), roles.GuestBuilder)
    assert isinstance(FakeBuilder(build)(), roles.GuestBuildInfo)
    assert isinstance(HoldingDoor(), roles.NetworkDoor)
    assert isinstance(lambda box: HoldingDoor(), DoorFactory)


def test_the_real_collaborators_play_their_roles(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    try:
        assert isinstance(store, roles.ImageSource)
    finally:
        store.close()

    async def doors() -> None:
        signer, clock = FakeSigner(), SystemClock()
        board = ApprovalBoard(signer, clock)
        assert isinstance(board, roles.ApprovalsBoard)
        door = EgressDoor("run-1", signer, [], OperatorConfig(), FakeResolver({}), board, clock,
                          box="b", on_record_lost=lambda exc: None)
        assert isinstance(door, roles.NetworkDoor)
        await door.close()

    asyncio.run(doors())


def test_a_fake_missing_a_method_is_seen() -> None:
    """The check can fail: a door without `resolve_and_check` is no network door."""

    class HalfDoor:
        ca_pem = None

        async def handle(self, stream: object) -> None: ...

        async def close(self) -> None: ...

    assert not isinstance(HalfDoor(), roles.NetworkDoor)
