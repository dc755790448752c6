"""Filling the store from a source: a registry (`pull`) or an OCI layout (`copy_layout`).

Both follow the same steps: resolve the reference to one linux/amd64
manifest (the index it was chosen from stored too), fetch the config and then
every layer into the blob sink (verified on the way in; at most three layers
at once from a registry), make the root disk, and name the image. A registry is
asked through its endpoints in order (its mirrors, then itself: `mirrors`), and
the name keeps which one answered the reference and with what digest
(`pulled_from`). Each runs
holding the store lock shared (`gc.writing`), so a prune cannot remove what it
stored before it is named.

The sources only see the `sink.BlobSink`; this module is where their results
meet the store's names and disks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tkbox._threads import run_through
from tkbox.errors import TkboxError
from tkbox.image import gc, oci
from tkbox.image.blobs import BlobStore
from tkbox.image.disks import Disks
from tkbox.image.layout import Layout
from tkbox.image.mirrors import Registries
from tkbox.image.names import Names
from tkbox.image.progress import NullProgress, ProgressEvent, ProgressSink
from tkbox.image.reference import LayoutRef, RegistryRef

T = TypeVar("T")
LAYERS_AT_ONCE = 3


async def pull(parsed: RegistryRef, root: Path, blobs: BlobStore, disks: Disks, names: Names,
               sink: ProgressSink, *, ca_bundle: Path | None, transport: Any,
               registries: Registries | None = None,
               sleep: Any = None) -> tuple[str, str, str | None, dict[str, Any]]:
    """Fetch `parsed` from its registry (or its mirrors), verify, cache, flatten and name it.

    Returns (key, manifest digest, index digest or None, who answered the reference).
    """
    from tkbox.image.registry import RegistryPull  # httpx: only when a pull needs it

    endpoints = (registries or Registries()).endpoints(parsed.registry)
    async with gc.writing_async(root), RegistryPull(
        parsed.registry.lower(), parsed.repository, endpoints, ca_bundle=ca_bundle,
        transport=transport, sleep=sleep,
    ) as client:
        digest, index_digest, manifest = await client.resolve_manifest(parsed.reference, blobs)
        pulled_from = client.provenance()
        sink.emit(ProgressEvent("resolve", ref=str(parsed), digest=digest,
                                extra={"from": pulled_from["endpoint"],
                                       "mirror": pulled_from["mirror"]}))
        await client.fetch_blob(manifest.config, blobs, NullProgress(), limit=oci.MAX_CONFIG)
        config = blobs.config(manifest)
        oci.check_manifest_against_config(manifest, config)
        sem = asyncio.Semaphore(LAYERS_AT_ONCE)

        async def one(desc: oci.Descriptor) -> None:
            async with sem:
                await client.fetch_blob(desc, blobs, sink)

        try:
            async with asyncio.TaskGroup() as tg:
                for desc in dict.fromkeys(manifest.layers):
                    tg.create_task(one(desc))
        except BaseExceptionGroup as group:
            raise first_error(group) from None
        await in_thread(lambda c: disks.ensure(digest, sink, c))
        key = str(parsed)
        names.set(key, digest, "pull", index_digest, pulled_from)
    return key, digest, index_digest, pulled_from


def copy_layout(ref: LayoutRef, layout: Layout, blobs: BlobStore, disks: Disks,
                sink: ProgressSink, cancel: threading.Event) -> tuple[str, str, str | None]:
    """Copy the image `ref` picks from an open layout and make its disk (the caller holds
    the store lock). Returns (key, manifest digest, index digest or None); not named."""
    digest, index_digest, manifest = layout.resolve_manifest(ref.tag, blobs)
    for desc in [manifest.config, *dict.fromkeys(manifest.layers)]:
        layout.copy_blob(desc, blobs, sink)
    disks.ensure(digest, sink, cancel)
    key = f"{'oci-archive' if ref.archive else 'oci'}:{ref.path.resolve()}" + (
        f":{ref.tag}" if ref.tag else "")
    return key, digest, index_digest


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first of our own errors in a task group's failure (else the group itself)."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            inner = first_error(exc)
            if inner is not exc:
                return inner
        elif isinstance(exc, TkboxError):
            return exc
    return group


async def in_thread(fn: Callable[[threading.Event], T]) -> T:
    """Run blocking `fn(cancel_event)` in a thread; cancelling us stops it cleanly.

    On cancellation the event is set, and we wait for the thread to see it and
    end (a thread cannot be killed) before the cancellation goes on: nothing
    is left writing into the store behind the caller's back. The thread's own
    result or error is dropped then; the cancellation is never swallowed.
    """
    def call(*, stop: threading.Event) -> T:
        return fn(stop)

    return await run_through(call, stop=threading.Event())
