"""The store's content-addressed blobs: `blobs/sha256/<hex>`, each verified before it lands.

Manifests, configs and layers are blobs. A blob appears only by an atomic
rename of a complete temporary whose size and SHA-256 matched what its
descriptor said (`tkbox._fs.publish`); whoever makes one holds its lock
(`locks/blob-<hex>.lock`). `BlobStore` is the `sink.BlobSink` the image
sources fill.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tkbox.errors import HostError, InternalError, RegistryError, UserError
from tkbox.image import oci
from tkbox.image._fs import Lock, TempArea, host_error, publish, temp_file


class BlobWriter:
    """Streams one blob into the store: bounded, hashed, verified, then published."""

    def __init__(self, digest: str, size: int | None, f: BinaryIO, tmp: Path,
                 final: Path) -> None:
        self.digest = digest
        self.size = size
        self._f = f
        self._tmp = tmp
        self._final = final
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
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            publish(self._tmp, self._final)
        except OSError as e:
            raise host_error(e, f"storing blob {self.digest}") from None
        return self._final


class BlobStore:
    """`<root>/blobs/sha256/`: read, write and lock blobs (a `sink.BlobSink`)."""

    def __init__(self, root: Path, tmp: TempArea) -> None:
        self.dir = root / "blobs" / "sha256"
        self._locks = root / "locks"
        self._tmp = tmp

    def blob_path(self, digest: str) -> Path:
        return self.dir / oci.hex_of(digest)

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def blob_lock(self, digest: str) -> Lock:
        return Lock(self._locks / f"blob-{oci.hex_of(digest)}.lock")

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

    @contextlib.contextmanager
    def blob_writer(self, digest: str, size: int | None) -> Iterator[BlobWriter]:
        oci.check_digest(digest)
        with temp_file(self._tmp, "blob") as (tmp, f):
            yield BlobWriter(digest, size, f, tmp, self.blob_path(digest))

    def put_bytes(self, data: bytes, digest: str | None = None) -> str:
        d = oci.sha256_digest(data)
        if digest is not None and d != digest:
            raise RegistryError(f"document {digest} failed verification (hashes to {d})")
        if not self.has_blob(d):
            with self.blob_writer(d, len(data)) as w:
                w.write(data)
                w.commit()
        return d

    # --- documents read back ------------------------------------------------------------

    def manifest(self, digest: str) -> oci.Manifest:
        doc = oci.parse_document(self.read_blob(digest, oci.MAX_MANIFEST))
        if not isinstance(doc, oci.Manifest):
            raise InternalError(f"{digest} in the store is an index, not a manifest")
        return doc

    def config(self, manifest: oci.Manifest) -> oci.ImageConfig:
        return oci.parse_config(self.read_blob(manifest.config.digest, oci.MAX_CONFIG))
