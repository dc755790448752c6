"""The image store: content-addressed blobs, root disks, and the names that point at them.

```
$TKBOX_HOME/images/
  blobs/sha256/<hex>          manifests, configs, layers; each verified before it lands
  disks/sha256/<hex>.sqfs     root disks, by manifest digest
  refs.json                   name -> manifest digest (pulled tags, imported/built names)
  locks/                      flock files: one per blob and disk being made, refs, store
  tmp/<owner>/                temporaries of one live ImageStore (swept when it is gone)
```

Rules that make it safe with several processes and crashes:

- an entry appears only by rename of a complete, verified, fsynced temporary
  (`_fs.publish`): a crash or a full disk leaves at most a temporary, which the
  next store sweeps;
- whoever makes a blob or a disk holds its lock; a second process waiting on
  the lock finds the entry made and uses it;
- every writer holds the store lock shared; `prune` takes it exclusively, so it
  never removes a blob that a pull is about to name.

Every image has a manifest digest: a pulled image has the registry's; an
image imported from a tarball (or built) gets a one-layer OCI manifest that
tkbox writes (`oci.synthesize`), stored like a pulled one.

`ImageStore` is a thin facade over the store's parts, one module each, which
the daemon, the CLI, the SDK and the tests use through this one API:

| module       | part                                                        |
| ------------ | ----------------------------------------------------------- |
| `blobs`      | `BlobStore`: content-addressed blobs (the sources' `sink.BlobSink`) |
| `names`      | `Names`: `refs.json`, finding an image by reference         |
| `disks`      | `Disks`: root disks, made once from the blobs               |
| `pull`       | filling the store from a registry or an OCI layout          |
| `tarball`    | filling it from a root filesystem tarball                   |
| `gc`         | the store lock, forgetting names, pruning                   |

Dependencies point one way: `store` → `pull`, `tarball`, `gc` → `names`,
`disks` → `blobs`; the sources (`registry`, `layout`) see only `sink`.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tkbox import paths
from tkbox.errors import TkboxError, UserError
from tkbox.image import gc, oci, tarball
from tkbox.image import pull as pulling
from tkbox.image._fs import Lock, TempArea, host_error, temp_file
from tkbox.image.blobs import BlobStore, BlobWriter
from tkbox.image.disks import Disks
from tkbox.image.layout import open_layout
from tkbox.image.mirrors import Registries
from tkbox.image.names import Entry, Names
from tkbox.image.progress import NullProgress, ProgressEvent, ProgressSink
from tkbox.image.reference import (
    DigestRef,
    LayoutRef,
    RegistryRef,
    parse_local_tag,
    parse_reference,
)

DEFAULT_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
DEFAULT_TAG = "tkbox/default"

__all__ = ["DEFAULT_ENV", "DEFAULT_TAG", "BlobWriter", "Image", "ImageStore"]


@dataclass(frozen=True, slots=True)
class Image:
    """A ready root disk and what the image says about running it."""

    ref: str  # the name it was found under ("docker.io/library/python:3.12-slim")
    digest: str  # the manifest digest: what a box records
    rootfs: Path  # the squashfs root disk
    config: oci.ImageConfig
    size: int  # bytes of the root disk
    layers: tuple[str, ...] = ()
    index_digest: str | None = None  # the index / manifest list it was chosen from
    source: str = "pull"  # pull | import | build | oci
    #: a pulled image: the endpoint that answered its reference (a mirror or the registry
    #: itself) and the digest it answered (`names`); a run records it
    pulled_from: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "digest": self.digest,
            "index_digest": self.index_digest,
            "rootfs": str(self.rootfs),
            "size": self.size,
            "source": self.source,
            "layers": list(self.layers),
            "config": self.config.to_json(),
            "pulled_from": self.pulled_from,
        }


class ImageStore:
    def __init__(self, root: Path | None = None, *, ca_bundle: Path | None = None,
                 transport: Any = None, registries: Registries | None = None,
                 sleep: Any = None) -> None:
        self.root = Path(root) if root is not None else paths.images()
        self.ca_bundle = ca_bundle
        #: where each registry is asked: its mirrors, then itself (`mirrors`)
        self.registries = registries or Registries()
        self.transport = transport  # an httpx transport, for tests
        self.sleep = sleep  # the registry client's backoff, for tests
        try:
            paths.private_dir(self.root)
            for sub in ("blobs/sha256", "disks/sha256", "locks"):
                (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
            self._tmp = TempArea(self.root / "tmp")
        except OSError as e:
            raise host_error(e, f"opening the image store {self.root}") from None
        self.blobs = BlobStore(self.root, self._tmp)
        self.disks = Disks(self.root, self._tmp, self.blobs)
        self.names = Names(self.root, self._tmp, self.blobs)

    # --- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        self._tmp.close()

    def __enter__(self) -> ImageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- blobs and disks (the store is also a sink.BlobSink) ----------------------------

    def blob_path(self, digest: str) -> Path:
        return self.blobs.blob_path(digest)

    def disk_path(self, digest: str) -> Path:
        return self.disks.disk_path(digest)

    def has_blob(self, digest: str) -> bool:
        return self.blobs.has_blob(digest)

    def blob_lock(self, digest: str) -> Lock:
        return self.blobs.blob_lock(digest)

    def read_blob(self, digest: str, limit: int) -> bytes:
        return self.blobs.read_blob(digest, limit)

    def blob_writer(self, digest: str,
                    size: int | None) -> contextlib.AbstractContextManager[BlobWriter]:
        return self.blobs.blob_writer(digest, size)

    def put_bytes(self, data: bytes, digest: str | None = None) -> str:
        return self.blobs.put_bytes(data, digest)

    def writing(self) -> contextlib.AbstractContextManager[None]:
        """Hold the store lock shared (prune waits for us)."""
        return gc.writing(self.root)

    def _manifest(self, digest: str) -> oci.Manifest:
        return self.blobs.manifest(digest)

    def _find(self, ref: str) -> tuple[str, Entry] | None:
        """(key, entry) of a stored image named `ref`, without any network."""
        return self.names.find(ref)

    def _image(self, ref: str, digest: str, *, source: str = "pull",
               index_digest: str | None = None,
               pulled_from: dict[str, Any] | None = None) -> Image:
        manifest = self.blobs.manifest(digest)
        disk = self.disks.disk_path(digest)
        size = disk.stat().st_size if disk.exists() else 0
        return Image(ref, digest, disk, self.blobs.config(manifest), size,
                     tuple(d.digest for d in manifest.layers), index_digest, source,
                     pulled_from)

    def _entry_image(self, key: str, entry: Entry) -> Image:
        return self._image(key, entry["digest"], source=entry.get("source", "pull"),
                           index_digest=entry.get("index_digest"),
                           pulled_from=entry.get("pulled_from"))

    def _ready(self, image: Image, sink: ProgressSink) -> Image:
        sink.emit(ProgressEvent("ready", ref=image.ref, digest=image.digest, size=image.size,
                                extra={"rootfs": str(image.rootfs)}))
        return image

    # --- local sources: tarballs and the default build ---------------------------------

    def import_tar(self, path: Path, tag: str, *, progress: ProgressSink | None = None,
                   source: str = "import", config: oci.ImageConfig | None = None) -> Image:
        """Import a root filesystem tarball (plain, gzip or zstd) as a one-layer image."""
        key = parse_local_tag(tag)
        sink = progress or NullProgress()
        path = Path(path)
        if not path.is_file():
            raise UserError(f"{path} is not a file; give a root filesystem tarball "
                            "(e.g. from `docker export` or mmdebstrap)")
        with self.writing():
            cfg = config or oci.ImageConfig(env=DEFAULT_ENV, cmd=("/bin/sh",))
            digest = tarball.import_layer(path, cfg, self.blobs, self.disks, self._tmp, sink)
            self.names.set(key, digest, source)
        return self._ready(self._image(key, digest, source=source), sink)

    def build_default(self, tag: str = DEFAULT_TAG, *,
                      progress: ProgressSink | None = None) -> Image:
        """Build Debian with python3, pip, venv, curl, git and CA certificates (mmdebstrap)."""
        from tkbox.image.build import build_rootfs

        sink = progress or NullProgress()
        with temp_file(self._tmp, "rootfs.tar") as (tmp, f):
            f.close()
            tmp.unlink()
            build_rootfs(tmp, log=lambda m: sink.emit(ProgressEvent("note", message=m)))
            return self.import_tar(
                tmp, tag, progress=sink, source="build",
                config=oci.ImageConfig(env=DEFAULT_ENV, cmd=("/bin/bash",)))

    # --- lookups and pulls --------------------------------------------------------------

    def _stored_image(self, key: str, entry: Entry, sink: ProgressSink,
                      cancel: threading.Event | None = None) -> Image:
        self.disks.ensure(entry["digest"], sink, cancel)  # rebuilt if a person removed it
        return self._entry_image(key, entry)

    async def resolve(self, ref: str, *, progress: ProgressSink | None = None) -> Image:
        """A ready root disk for `ref`: from the store if there, else pulled or read."""
        sink = progress or NullProgress()
        parsed = parse_reference(ref)
        found = self.names.find(ref)
        if found is not None:
            key, entry = found
            image = await pulling.in_thread(lambda c: self._stored_image(key, entry, sink, c))
            return self._ready(image, sink)
        if isinstance(parsed, DigestRef):
            raise UserError(f"no image with digest {parsed.digest} in the store; name it "
                            "with its repository (NAME@sha256:...) to pull it")
        if isinstance(parsed, LayoutRef):
            return await self._from_layout(parsed, sink)
        if not parsed.explicit_registry and parsed.short.split("/")[0] == "tkbox":
            hint = "run `tkbox image build`" if parsed.short == DEFAULT_TAG else \
                f"import it with `tkbox image import ROOTFS.tar --tag {parsed.short}`"
            raise UserError(f"no local image {parsed.local_key}; {hint}")
        return await self.pull(ref, progress=sink)

    async def pull(self, ref: str, *, progress: ProgressSink | None = None) -> Image:
        """Fetch `ref` from its registry (a tag is asked again), verify, cache, flatten."""
        sink = progress or NullProgress()
        parsed = parse_reference(ref)
        if isinstance(parsed, LayoutRef):
            return await self._from_layout(parsed, sink)
        if not isinstance(parsed, RegistryRef):
            raise UserError(f"{ref} names no registry to pull from")
        key, digest, index_digest, pulled_from = await pulling.pull(
            parsed, self.root, self.blobs, self.disks, self.names, sink,
            ca_bundle=self.ca_bundle, transport=self.transport, registries=self.registries,
            sleep=self.sleep)
        return self._ready(self._image(key, digest, index_digest=index_digest,
                                       pulled_from=pulled_from), sink)

    async def _from_layout(self, ref: LayoutRef, sink: ProgressSink) -> Image:
        def work(cancel: threading.Event) -> Image:
            with self.writing(), open_layout(ref) as layout:
                key, digest, index_digest = pulling.copy_layout(
                    ref, layout, self.blobs, self.disks, sink, cancel)
                return self._image(key, digest, source="oci", index_digest=index_digest)

        return self._ready(await pulling.in_thread(work), sink)

    # --- listing and removal ------------------------------------------------------------

    def ls(self) -> list[Image]:
        out = []
        for key, entry in sorted(self.names.read().items()):
            try:
                out.append(self._entry_image(key, entry))
            except TkboxError:
                continue  # a damaged entry is listed by inspect, not here
        return out

    def inspect(self, ref: str) -> Image:
        found = self.names.find(ref)
        if found is None:
            raise UserError(f"no image {ref!r} in the store; see `tkbox image ls`")
        key, entry = found
        return self._entry_image(key, entry)

    def rm(self, ref: str) -> list[str]:
        """Forget the name(s) `ref` resolves to; drop the root disk if nothing else names it."""
        return gc.forget(ref, self.names, self.disks)

    def prune(self) -> dict[str, int]:
        """Remove every blob and disk no name reaches, and leftovers of dead processes."""
        return gc.prune(self.root, self.names, self.blobs, self.disks, self._tmp)
