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
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import gzip
import hashlib
import json
import os
import threading
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import zstandard

from tkbox import paths
from tkbox.errors import HostError, InternalError, RegistryError, TkboxError, UserError
from tkbox.image import oci
from tkbox.image._fs import Lock, TempArea, fsync_dir, host_error, publish, temp_file
from tkbox.image.flatten import Cancelled, Layer, plan_layers, write_flat
from tkbox.image.progress import NullProgress, ProgressEvent, ProgressSink
from tkbox.image.reference import (
    DigestRef,
    LayoutRef,
    RegistryRef,
    parse_local_tag,
    parse_reference,
)
from tkbox.image.squashfs import pack

_COPY = 1024 * 1024
T = TypeVar("T")
DEFAULT_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
DEFAULT_TAG = "tkbox/default"


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
        }


class BlobWriter:
    """Streams one blob into the store: bounded, hashed, verified, then published."""

    def __init__(self, store: ImageStore, digest: str, size: int | None,
                 f: BinaryIO, tmp: Path) -> None:
        self.store = store
        self.digest = digest
        self.size = size
        self._f = f
        self._tmp = tmp
        self._sha = hashlib.sha256()
        self.written = 0

    def write(self, chunk: bytes) -> None:
        self.written += len(chunk)
        if self.size is not None and self.written > self.size:
            raise RegistryError(
                f"blob {self.digest} is larger than the {self.size} bytes its descriptor says"
            )
        self._sha.update(chunk)
        try:
            self._f.write(chunk)
        except OSError as e:
            raise host_error(e, f"writing blob {self.digest}") from None

    def reset(self) -> None:
        """Start again from byte 0 (a retried transfer)."""
        self._f.seek(0)
        self._f.truncate()
        self._sha = hashlib.sha256()
        self.written = 0

    def commit(self) -> Path:
        if self.size is not None and self.written != self.size:
            raise RegistryError(
                f"blob {self.digest} ended after {self.written} of {self.size} bytes"
            )
        got = "sha256:" + self._sha.hexdigest()
        if got != self.digest:
            raise RegistryError(
                f"blob {self.digest} failed verification (its content hashes to {got}); "
                "nothing was cached. The registry or something between is corrupting it"
            )
        final = self.store.blob_path(self.digest)
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            publish(self._tmp, final)
        except OSError as e:
            raise host_error(e, f"storing blob {self.digest}") from None
        return final


class ImageStore:
    def __init__(self, root: Path | None = None, *, ca_bundle: Path | None = None,
                 transport: Any = None) -> None:
        self.root = Path(root) if root is not None else paths.images()
        self.ca_bundle = ca_bundle
        self.transport = transport  # an httpx transport, for tests
        try:
            paths.private_dir(self.root)
            for sub in ("blobs/sha256", "disks/sha256", "locks"):
                (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
            self._tmp = TempArea(self.root / "tmp")
        except OSError as e:
            raise host_error(e, f"opening the image store {self.root}") from None

    # --- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        self._tmp.close()

    def __enter__(self) -> ImageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- paths ------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / oci.hex_of(digest)

    def disk_path(self, digest: str) -> Path:
        return self.root / "disks" / "sha256" / f"{oci.hex_of(digest)}.sqfs"

    def _lock(self, kind: str, digest: str) -> Lock:
        return Lock(self.root / "locks" / f"{kind}-{oci.hex_of(digest)}.lock")

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def read_blob(self, digest: str, limit: int) -> bytes:
        path = self.blob_path(digest)
        try:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
        except FileNotFoundError:
            raise UserError(f"blob {digest} is not in the image store; pull the image "
                            "again") from None
        except OSError as e:
            raise host_error(e, f"reading blob {digest}") from None
        if len(data) > limit:
            raise RegistryError(f"blob {digest} is larger than {limit} bytes")
        # Verified on the way in; checked again since the store is only a directory.
        if oci.sha256_digest(data) != digest:
            raise HostError(f"the cached blob {digest} is corrupt; run `tkbox image prune` "
                            "and pull again")
        return data

    # --- writing blobs ------------------------------------------------------------------

    @contextlib.contextmanager
    def blob_writer(self, digest: str, size: int | None) -> Iterator[BlobWriter]:
        oci.check_digest(digest)
        with temp_file(self._tmp, "blob") as (tmp, f):
            yield BlobWriter(self, digest, size, f, tmp)

    def put_bytes(self, data: bytes, digest: str | None = None) -> str:
        d = oci.sha256_digest(data)
        if digest is not None and d != digest:
            raise RegistryError(f"document {digest} failed verification (hashes to {d})")
        if not self.has_blob(d):
            with self.blob_writer(d, len(data)) as w:
                w.write(data)
                w.commit()
        return d

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the store lock shared (prune waits for us)."""
        lock = Lock(self.root / "locks" / "store.lock", shared=True)
        lock.acquire(timeout=600)
        try:
            yield
        finally:
            lock.release()

    @contextlib.asynccontextmanager
    async def _writing_async(self) -> AsyncIterator[None]:
        lock = Lock(self.root / "locks" / "store.lock", shared=True)
        while not lock.try_acquire():
            await asyncio.sleep(0.1)
        try:
            yield
        finally:
            lock.release()

    # --- refs -----------------------------------------------------------------------------

    def _refs_path(self) -> Path:
        return self.root / "refs.json"

    def _read_refs(self) -> dict[str, dict[str, Any]]:
        try:
            data = self._refs_path().read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise host_error(e, "reading the image names") from None
        try:
            obj = json.loads(data)
            refs = obj["refs"]
            if obj.get("version") != 1 or not isinstance(refs, dict):
                raise ValueError("bad version")
            for k, v in refs.items():
                oci.check_digest(v["digest"])
                if not isinstance(k, str):
                    raise ValueError("bad key")
        except (ValueError, KeyError, TypeError, RegistryError):
            raise HostError(f"{self._refs_path()} is damaged; move it away and pull or import "
                            "the images again") from None
        return refs

    def _update_refs(self, change: dict[str, dict[str, Any] | None]) -> None:
        with Lock(self.root / "locks" / "refs.lock"):
            refs = self._read_refs()
            for k, v in change.items():
                if v is None:
                    refs.pop(k, None)
                else:
                    refs[k] = v
            body = json.dumps({"version": 1, "refs": refs}, indent=1, sort_keys=True).encode()
            try:
                with temp_file(self._tmp, "refs") as (tmp, f):
                    f.write(body)
                    f.flush()
                    os.fsync(f.fileno())
                    f.close()
                    publish(tmp, self._refs_path())
            except OSError as e:
                raise host_error(e, "saving the image names") from None

    def _set_ref(self, key: str, digest: str, source: str,
                 index_digest: str | None = None) -> None:
        now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        entry: dict[str, Any] = {"digest": digest, "source": source, "updated": now}
        if index_digest:
            entry["index_digest"] = index_digest
        self._update_refs({key: entry})

    # --- images from what is stored -----------------------------------------------------

    def _manifest(self, digest: str) -> oci.Manifest:
        doc = oci.parse_document(self.read_blob(digest, oci.MAX_MANIFEST))
        if not isinstance(doc, oci.Manifest):
            raise InternalError(f"{digest} in the store is an index, not a manifest")
        return doc

    def _config(self, manifest: oci.Manifest) -> oci.ImageConfig:
        return oci.parse_config(self.read_blob(manifest.config.digest, oci.MAX_CONFIG))

    def _image(self, ref: str, digest: str, *, source: str = "pull",
               index_digest: str | None = None) -> Image:
        manifest = self._manifest(digest)
        disk = self.disk_path(digest)
        size = disk.stat().st_size if disk.exists() else 0
        return Image(ref, digest, disk, self._config(manifest), size,
                     tuple(d.digest for d in manifest.layers), index_digest, source)

    def _ensure_disk(self, digest: str, progress: ProgressSink,
                     cancel: threading.Event | None = None) -> None:
        """Make the root disk of manifest `digest` from its stored blobs, once."""
        disk = self.disk_path(digest)
        if disk.exists():
            return
        manifest = self._manifest(digest)
        config = self._config(manifest)
        oci.check_manifest_against_config(manifest, config)
        layers = []
        for desc, diff_id in zip(manifest.layers, config.diff_ids, strict=True):
            path = self.blob_path(desc.digest)
            if not path.is_file():
                raise UserError(f"layer {desc.digest} of {digest} is not in the store; "
                                "pull the image again")
            layers.append(Layer(desc.digest, _opener(path), diff_id))
        lock = self._lock("disk", digest)
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
            layer_digest, layer_size = self._ingest_tar(path, sink)
            cfg = config or oci.ImageConfig(env=DEFAULT_ENV, cmd=("/bin/sh",))
            cfg_bytes, manifest_bytes = oci.synthesize(layer_digest, layer_size, cfg,
                                                       created="1970-01-01T00:00:00Z")
            self.put_bytes(cfg_bytes)
            digest = self.put_bytes(manifest_bytes)
            try:
                self._ensure_disk(digest, sink)
            except RegistryError as e:
                # The tarball came from the person, not a registry: say so.
                raise UserError(f"{path} cannot be imported: {e}") from None
            self._set_ref(key, digest, source)
        image = self._image(key, digest, source=source)
        sink.emit(ProgressEvent("ready", ref=key, digest=digest, size=image.size,
                                extra={"rootfs": str(image.rootfs)}))
        return image

    def _ingest_tar(self, path: Path, sink: ProgressSink) -> tuple[str, int]:
        """Copy the tarball into the store, decompressed, as a blob; (digest, size)."""
        try:
            with open(path, "rb") as raw, temp_file(self._tmp, "import") as (tmp, f):
                magic = raw.read(4)
                raw.seek(0)
                src: BinaryIO
                if magic.startswith(b"\x1f\x8b"):
                    src = gzip.GzipFile(fileobj=raw)  # type: ignore[assignment]
                elif magic == b"\x28\xb5\x2f\xfd":
                    src = zstandard.ZstdDecompressor().stream_reader(
                        raw, read_across_frames=True)
                else:
                    src = raw
                sha = hashlib.sha256()
                size = 0
                total = os.fstat(raw.fileno()).st_size
                sink.emit(ProgressEvent("blob", digest=f"import:{path.name}", size=total,
                                        state="start"))
                while chunk := src.read(_COPY):
                    sha.update(chunk)
                    f.write(chunk)
                    size += len(chunk)
                    sink.emit(ProgressEvent("blob", digest=f"import:{path.name}", size=total,
                                            done=min(raw.tell(), total), state="progress"))
                digest = "sha256:" + sha.hexdigest()
                if not self.has_blob(digest):
                    f.flush()
                    os.fsync(f.fileno())
                    f.close()
                    publish(tmp, self.blob_path(digest))
                sink.emit(ProgressEvent("blob", digest=f"import:{path.name}", size=total,
                                        done=total, state="done"))
                return digest, size
        except (EOFError, zlib.error, zstandard.ZstdError, gzip.BadGzipFile) as e:
            raise UserError(f"{path} is not a readable tarball ({e})") from None
        except OSError as e:
            raise host_error(e, f"importing {path}") from None

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

    # --- lookups ------------------------------------------------------------------------

    def _find(self, ref: str) -> tuple[str, dict[str, Any]] | None:
        """(key, entry) of a stored image named `ref`, without any network."""
        parsed = parse_reference(ref)
        refs = self._read_refs()
        if isinstance(parsed, DigestRef):
            for key, entry in sorted(refs.items()):
                if parsed.digest in (entry["digest"], entry.get("index_digest")):
                    return key, entry
            if self.has_blob(parsed.digest):
                return parsed.digest, {"digest": parsed.digest, "source": "digest"}
            return None
        if isinstance(parsed, LayoutRef):
            return None
        if parsed.local_key is not None and parsed.local_key in refs:
            return parsed.local_key, refs[parsed.local_key]
        key = str(parsed)
        if key in refs:
            return key, refs[key]
        if parsed.digest is not None:
            for k, entry in sorted(refs.items()):
                if k.startswith(parsed.name + ":") or k.startswith(parsed.name + "@"):
                    if parsed.digest in (entry["digest"], entry.get("index_digest")):
                        return k, entry
        return None

    def _stored_image(self, key: str, entry: dict[str, Any], sink: ProgressSink,
                      cancel: threading.Event | None = None) -> Image:
        digest = entry["digest"]
        self._ensure_disk(digest, sink, cancel)  # rebuilt from blobs if a person removed the disk
        return self._image(key, digest, source=entry.get("source", "pull"),
                           index_digest=entry.get("index_digest"))

    async def resolve(self, ref: str, *, progress: ProgressSink | None = None) -> Image:
        """A ready root disk for `ref`: from the store if there, else pulled or read."""
        sink = progress or NullProgress()
        parsed = parse_reference(ref)
        found = self._find(ref)
        if found is not None:
            key, entry = found
            image = await _in_thread(lambda c: self._stored_image(key, entry, sink, c))
            sink.emit(ProgressEvent("ready", ref=image.ref, digest=image.digest,
                                    size=image.size, extra={"rootfs": str(image.rootfs)}))
            return image
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
        from tkbox.image.registry import RegistryClient

        sink = progress or NullProgress()
        parsed = parse_reference(ref)
        if isinstance(parsed, LayoutRef):
            return await self._from_layout(parsed, sink)
        if not isinstance(parsed, RegistryRef):
            raise UserError(f"{ref} names no registry to pull from")
        async with self._writing_async(), RegistryClient(
            parsed.api_host, parsed.repository, ca_bundle=self.ca_bundle,
            transport=self.transport,
        ) as client:
            digest, index_digest, manifest = await client.resolve_manifest(
                parsed.reference, self)
            sink.emit(ProgressEvent("resolve", ref=str(parsed), digest=digest))
            await client.fetch_blob(manifest.config, self, NullProgress(),
                                    limit=oci.MAX_CONFIG)
            config = self._config(manifest)
            oci.check_manifest_against_config(manifest, config)
            sem = asyncio.Semaphore(3)

            async def one(desc: oci.Descriptor) -> None:
                async with sem:
                    await client.fetch_blob(desc, self, sink)

            try:
                async with asyncio.TaskGroup() as tg:
                    for desc in dict.fromkeys(manifest.layers):
                        tg.create_task(one(desc))
            except BaseExceptionGroup as group:
                raise _first_error(group) from None
            await _in_thread(lambda c: self._ensure_disk(digest, sink, c))
            key = str(parsed)
            self._set_ref(key, digest, "pull", index_digest)
        image = self._image(key, digest, index_digest=index_digest)
        sink.emit(ProgressEvent("ready", ref=key, digest=digest, size=image.size,
                                extra={"rootfs": str(image.rootfs)}))
        return image

    async def _from_layout(self, ref: LayoutRef, sink: ProgressSink) -> Image:
        from tkbox.image.layout import open_layout

        def work(cancel: threading.Event) -> Image:
            with self.writing(), open_layout(ref) as layout:
                digest, index_digest, manifest = layout.resolve_manifest(ref.tag, self)
                for desc in [manifest.config, *dict.fromkeys(manifest.layers)]:
                    layout.copy_blob(desc, self, sink)
                self._ensure_disk(digest, sink, cancel)
                key = f"{'oci-archive' if ref.archive else 'oci'}:{ref.path.resolve()}" + (
                    f":{ref.tag}" if ref.tag else "")
                return self._image(key, digest, source="oci", index_digest=index_digest)

        image = await _in_thread(work)
        sink.emit(ProgressEvent("ready", ref=image.ref, digest=image.digest, size=image.size,
                                extra={"rootfs": str(image.rootfs)}))
        return image

    # --- listing and removal ------------------------------------------------------------

    def ls(self) -> list[Image]:
        out = []
        for key, entry in sorted(self._read_refs().items()):
            try:
                out.append(self._image(key, entry["digest"], source=entry.get("source", "pull"),
                                       index_digest=entry.get("index_digest")))
            except TkboxError:
                continue  # a damaged entry is listed by inspect, not here
        return out

    def inspect(self, ref: str) -> Image:
        found = self._find(ref)
        if found is None:
            raise UserError(f"no image {ref!r} in the store; see `tkbox image ls`")
        key, entry = found
        return self._image(key, entry["digest"], source=entry.get("source", "pull"),
                           index_digest=entry.get("index_digest"))

    def rm(self, ref: str) -> list[str]:
        """Forget the name(s) `ref` resolves to; drop the root disk if nothing else names it."""
        found = self._find(ref)
        if found is None:
            raise UserError(f"no image {ref!r} in the store; see `tkbox image ls`")
        key, entry = found
        digest = entry["digest"]
        self._update_refs({key: None})
        if not any(e["digest"] == digest for e in self._read_refs().values()):
            with self._lock("disk", digest):
                self.disk_path(digest).unlink(missing_ok=True)
        return [key]

    def prune(self) -> dict[str, int]:
        """Remove every blob and disk no name reaches, and leftovers of dead processes."""
        lock = Lock(self.root / "locks" / "store.lock")
        if not lock.try_acquire():
            raise UserError("a pull or import is running; try `tkbox image prune` when it ends")
        try:
            keep_blobs: set[str] = set()
            keep_disks: set[str] = set()
            for entry in self._read_refs().values():
                d = entry["digest"]
                keep_disks.add(oci.hex_of(d))
                for x in (d, entry.get("index_digest")):
                    if x:
                        keep_blobs.add(oci.hex_of(x))
                try:
                    m = self._manifest(d)
                except TkboxError:
                    continue
                keep_blobs.add(oci.hex_of(m.config.digest))
                keep_blobs.update(oci.hex_of(x.digest) for x in m.layers)
            removed = {"blobs": 0, "disks": 0, "bytes": 0, "temporaries": 0}
            for p in (self.root / "blobs" / "sha256").iterdir():
                if p.name not in keep_blobs:
                    removed["bytes"] += p.stat().st_size
                    p.unlink()
                    removed["blobs"] += 1
            for p in (self.root / "disks" / "sha256").iterdir():
                if p.name.removesuffix(".sqfs") not in keep_disks:
                    removed["bytes"] += p.stat().st_size
                    p.unlink()
                    removed["disks"] += 1
            removed["temporaries"] = len(self._tmp.sweep())
            for p in (self.root / "locks").glob("*-*.lock"):
                probe = Lock(p)
                if probe.try_acquire():
                    p.unlink(missing_ok=True)
                    probe.release()
            fsync_dir(self.root / "blobs" / "sha256")
            return removed
        except OSError as e:
            raise host_error(e, "pruning the image store") from None
        finally:
            lock.release()


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first of our own errors in a task group's failure (else the group itself)."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            inner = _first_error(exc)
            if inner is not exc:
                return inner
        elif isinstance(exc, TkboxError):
            return exc
    return group


def _opener(path: Path) -> Any:
    def open_() -> BinaryIO:
        return open(path, "rb")
    return open_


async def _in_thread(fn: Callable[[threading.Event], T]) -> T:
    """Run blocking `fn(cancel_event)` in a thread; cancelling us stops it cleanly."""
    cancel = threading.Event()
    task = asyncio.ensure_future(asyncio.to_thread(fn, cancel))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        cancel.set()
        with contextlib.suppress(BaseException):
            await task
        raise
