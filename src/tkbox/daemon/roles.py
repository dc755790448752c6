"""What the box manager needs of its collaborators, one `Protocol` per role.

The daemon wires real ones (`tkbox.image.store.ImageStore`, the guest build of
`tkbox.image.initramfs`, `tkbox.doors.network.EgressDoor` and `ApprovalBoard`);
tests wire fakes. Both are checked against these: mypy for `src/`, and
`tests/unit/daemon/test_roles.py` for the test fakes (each Protocol is
`runtime_checkable`).

(Named `roles`, not `ports`, because `tkbox.protocol.ports.Ports` is already
the name of the host-guest transport.) The door factory's Protocol takes a
`Box`, so it lives beside `Box` in `tkbox.daemon.box`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tkbox.doors.network import Explanation, PendingApproval, Via
from tkbox.protocol.streams import ByteStream


@runtime_checkable
class ImageRunConfig(Protocol):
    """What an image says about how to run it (of the OCI image config)."""

    @property
    def env(self) -> tuple[str, ...]: ...

    @property
    def user(self) -> str: ...

    @property
    def working_dir(self) -> str: ...


@runtime_checkable
class ResolvedImage(Protocol):
    """An image ready to boot: its manifest digest, its root disk, its run config."""

    @property
    def digest(self) -> str: ...

    @property
    def rootfs(self) -> Path: ...

    @property
    def config(self) -> ImageRunConfig | None: ...

    @property
    def pulled_from(self) -> Mapping[str, Any] | None:
        """A pulled image: the endpoint (mirror or registry) that answered its reference and
        the digest it answered; None for a local image."""


@runtime_checkable
class ImageSource(Protocol):
    """Turns `--image` into a root disk (a UserError for an unknown reference)."""

    async def resolve(self, ref: str) -> ResolvedImage: ...


@runtime_checkable
class ToolSource(Protocol):
    """Turns `--tools NAME[@VERSION][:BUILD]` into a read-only disk of the agent's program
    that `image` can run (`tkbox.image.tools`); a UserError naming the fix if it cannot."""

    async def resolve(self, ref: str, image: ResolvedImage) -> ToolDiskInfo: ...


@runtime_checkable
class ToolDiskInfo(Protocol):
    @property
    def path(self) -> Path: ...

    def facts(self) -> dict[str, Any]: ...


@runtime_checkable
class GuestBuildInfo(Protocol):
    """The guest kernel and initramfs every box boots."""

    @property
    def kernel(self) -> Path: ...

    @property
    def initramfs(self) -> Path: ...

    @property
    def kernel_version(self) -> str: ...

    @property
    def digest(self) -> str: ...


@runtime_checkable
class GuestBuilder(Protocol):
    """Builds the guest, or returns the cached build (blocking: run off the loop)."""

    def __call__(self) -> GuestBuildInfo: ...


@runtime_checkable
class NetworkDoor(Protocol):
    """A box's one route out (port 1025): decides, records and relays each connection."""

    @property
    def ca_pem(self) -> str | None:
        """The box's CA certificate (PEM), when the door reads TLS (secrets, inspect)."""

    async def handle(self, stream: ByteStream) -> None:
        """Serve one proxied connection from the guest; owns and closes `stream`."""

    async def close(self) -> None:
        """Close egress now: refuse new connections, end the open ones."""

    async def resolve_and_check(self, host: str, port: int) -> Explanation:
        """What the door would decide for `host:port`, names resolved (`egress check`)."""


@runtime_checkable
class ApprovalsBoard(Protocol):
    """Connections waiting for a person (`tkbox approvals`, `tkbox approve`)."""

    def list(self) -> list[PendingApproval]: ...

    async def answer(self, box: str, approval_id: int, allow: bool,
                     via: Via = "cli") -> PendingApproval: ...

    async def stop_box(self, box: str) -> None:
        """The box is stopping: each of its pending approvals ends unanswered."""


@runtime_checkable
class StatusReporter(Protocol):
    """A VM that can say what its VMM reports about it (QEMU's `query-status`)."""

    async def status(self) -> str: ...
