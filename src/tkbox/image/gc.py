"""Garbage collection of the image store: forgetting names, pruning what no name reaches.

The store lock (`locks/store.lock`) is what makes pruning safe beside pulls
in other processes: every writer (a pull, an import, a layout copy) holds it
shared for its whole run (`writing`, `writing_async`); `prune` takes it
exclusively and without waiting, so it never removes a blob that a pull has
stored but not yet named. A prune that finds a writer says so and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from tkbox.errors import TkboxError, UserError
from tkbox.image import oci
from tkbox.image._fs import Lock, TempArea, fsync_dir, host_error
from tkbox.image.blobs import BlobStore
from tkbox.image.disks import Disks
from tkbox.image.names import Names


def _store_lock(root: Path, *, shared: bool) -> Lock:
    return Lock(root / "locks" / "store.lock", shared=shared)


@contextlib.contextmanager
def writing(root: Path) -> Iterator[None]:
    """Hold the store lock shared (prune waits for us)."""
    lock = _store_lock(root, shared=True)
    lock.acquire(timeout=600)
    try:
        yield
    finally:
        lock.release()


@contextlib.asynccontextmanager
async def writing_async(root: Path) -> AsyncIterator[None]:
    """`writing` for the event loop. Only a prune takes the lock exclusively, and it never
    waits, so this waits at most for one prune; an flock has no event, so it polls."""
    lock = _store_lock(root, shared=True)
    while not lock.try_acquire():
        await asyncio.sleep(0.1)
    try:
        yield
    finally:
        lock.release()


def forget(ref: str, names: Names, disks: Disks) -> list[str]:
    """Forget the name `ref` resolves to; drop its root disk if nothing else names it."""
    found = names.find(ref)
    if found is None:
        raise UserError(f"no image {ref!r} in the store; see `tkbox image ls`")
    key, entry = found
    digest = entry["digest"]
    names.update({key: None})
    if not any(e["digest"] == digest for e in names.read().values()):
        with disks.lock(digest):
            disks.disk_path(digest).unlink(missing_ok=True)
    return [key]


def prune(root: Path, names: Names, blobs: BlobStore, disks: Disks,
          tmp: TempArea) -> dict[str, int]:
    """Remove every blob and disk no name reaches, and leftovers of dead processes."""
    lock = _store_lock(root, shared=False)
    if not lock.try_acquire():
        raise UserError("a pull or import is running; try `tkbox image prune` when it ends")
    try:
        keep_blobs: set[str] = set()
        keep_disks: set[str] = set()
        for entry in names.read().values():
            d = entry["digest"]
            keep_disks.add(oci.hex_of(d))
            for x in (d, entry.get("index_digest")):
                if x:
                    keep_blobs.add(oci.hex_of(x))
            try:
                m = blobs.manifest(d)
            except TkboxError:
                continue
            keep_blobs.add(oci.hex_of(m.config.digest))
            keep_blobs.update(oci.hex_of(x.digest) for x in m.layers)
        removed = {"blobs": 0, "disks": 0, "bytes": 0, "temporaries": 0}
        for p in blobs.dir.iterdir():
            if p.name not in keep_blobs:
                removed["bytes"] += p.stat().st_size
                p.unlink()
                removed["blobs"] += 1
        for p in disks.dir.iterdir():
            if p.name.removesuffix(".sqfs") not in keep_disks:
                removed["bytes"] += p.stat().st_size
                p.unlink()
                removed["disks"] += 1
        removed["temporaries"] = len(tmp.sweep())
        for p in (root / "locks").glob("*-*.lock"):
            probe = Lock(p)
            if probe.try_acquire():
                p.unlink(missing_ok=True)
                probe.release()
        fsync_dir(blobs.dir)
        return removed
    except OSError as e:
        raise host_error(e, "pruning the image store") from None
    finally:
        lock.release()
