"""The store's root disks: `disks/sha256/<hex>.sqfs`, one per manifest digest, made once.

A root disk is the image's layers flattened (whiteouts and opaque
directories applied, `flatten`) into one squashfs (`squashfs.pack`). It is
made from blobs already verified in the store, under `locks/disk-<hex>.lock`:
a second process that waited on the lock finds the disk made and uses it. A
disk a person removed is made again from the blobs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from tkbox.errors import UserError
from tkbox.image import oci
from tkbox.image._fs import Lock, TempArea, host_error, publish, temp_file
from tkbox.image.blobs import BlobStore
from tkbox.image.flatten import Cancelled, Layer, plan_layers, write_flat
from tkbox.image.progress import ProgressEvent, ProgressSink
from tkbox.image.squashfs import pack


class Disks:
    """`<root>/disks/sha256/`: where root disks are, and making one."""

    def __init__(self, root: Path, tmp: TempArea, blobs: BlobStore) -> None:
        self.dir = root / "disks" / "sha256"
        self._locks = root / "locks"
        self._tmp = tmp
        self._blobs = blobs

    def disk_path(self, digest: str) -> Path:
        return self.dir / f"{oci.hex_of(digest)}.sqfs"

    def lock(self, digest: str) -> Lock:
        return Lock(self._locks / f"disk-{oci.hex_of(digest)}.lock")

    def ensure(self, digest: str, progress: ProgressSink,
               cancel: threading.Event | None = None) -> None:
        """Make the root disk of manifest `digest` from its stored blobs, once."""
        disk = self.disk_path(digest)
        if disk.exists():
            return
        manifest = self._blobs.manifest(digest)
        config = self._blobs.config(manifest)
        oci.check_manifest_against_config(manifest, config)
        layers = []
        for desc, diff_id in zip(manifest.layers, config.diff_ids, strict=True):
            path = self._blobs.blob_path(desc.digest)
            if not path.is_file():
                raise UserError(f"layer {desc.digest} of {digest} is not in the store; "
                                "pull the image again")
            layers.append(Layer(desc.digest, _opener(path), diff_id))
        lock = self.lock(digest)
        # Another process may be making this disk: its lock is an flock, which has no
        # event to wait on, so poll it, stopping at once when the caller is cancelled.
        while not lock.try_acquire():
            if cancel is not None and cancel.wait(0.1):
                raise Cancelled()
            elif cancel is None:
                threading.Event().wait(0.1)
        try:
            if disk.exists():  # made by another process while we waited
                return
            n = len(layers)
            total = 2 * n
            progress.emit(ProgressEvent("flatten", digest=digest, size=total, state="start"))
            plan = plan_layers(
                layers, cancel=cancel,
                on_layer=lambda i: progress.emit(ProgressEvent(
                    "flatten", digest=digest, size=total, done=i + 1, state="layer")),
            )
            with temp_file(self._tmp, "disk") as (tmp, f):
                f.close()
                try:
                    pack(lambda out: write_flat(
                        layers, plan, out, cancel=cancel,
                        on_layer=lambda i: progress.emit(ProgressEvent(
                            "flatten", digest=digest, size=total, done=n + i + 1,
                            state="layer"))),
                        tmp)
                    publish(tmp, disk)
                except OSError as e:
                    raise host_error(e, f"building the root disk of {digest}") from None
            progress.emit(ProgressEvent("flatten", digest=digest, size=total, done=total,
                                        state="done"))
        finally:
            lock.release()


def _opener(path: Path) -> Callable[[], BinaryIO]:
    def open_() -> BinaryIO:
        return open(path, "rb")
    return open_
