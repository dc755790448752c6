"""Images from a root filesystem tarball (`tkbox image import`, and `tkbox image build`).

The tarball (plain, gzip or zstd; from `docker export`, mmdebstrap, …) is
copied into the store decompressed, as one layer blob, hashed as it is
copied. tkbox then writes a one-layer OCI config and manifest for it
(`oci.synthesize`, with a fixed creation time so the same tarball always
gives the same manifest digest), stored like a pulled image's.

The tarball came from the person, not from a registry: what is wrong with it
is a `UserError`.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from pathlib import Path
from typing import BinaryIO

import zstandard

from tkbox.errors import RegistryError, UserError
from tkbox.image import oci
from tkbox.image._fs import TempArea, host_error, publish, temp_file
from tkbox.image.blobs import BlobStore
from tkbox.image.disks import Disks
from tkbox.image.flatten import MAX_UNCOMPRESSED
from tkbox.image.progress import ProgressEvent, ProgressSink

_COPY = 1024 * 1024
# What a tarball may decompress to: the image's uncompressed bound (flatten), applied as
# it is copied. The copy came before flattening, with no bound: a 3 MB zstd file of zeros
# wrote 4 GiB into the store in 15 s, and would have gone on until the disk was full.
MAX_TARBALL = MAX_UNCOMPRESSED


def import_layer(path: Path, config: oci.ImageConfig, blobs: BlobStore, disks: Disks,
                 tmp: TempArea, sink: ProgressSink) -> str:
    """Store `path` as a one-layer image with `config` and make its disk; its manifest
    digest. The caller holds the store lock (`gc.writing`) and names the image."""
    layer_digest, layer_size = _ingest(path, blobs, tmp, sink)
    cfg_bytes, manifest_bytes = oci.synthesize(layer_digest, layer_size, config,
                                               created="1970-01-01T00:00:00Z")
    blobs.put_bytes(cfg_bytes)
    digest = blobs.put_bytes(manifest_bytes)
    try:
        disks.ensure(digest, sink)
    except RegistryError as e:
        # The tarball came from the person, not a registry: say so.
        raise UserError(f"{path} cannot be imported: {e}") from None
    return digest


def _ingest(path: Path, blobs: BlobStore, area: TempArea,
            sink: ProgressSink) -> tuple[str, int]:
    """Copy the tarball into the store, decompressed, as a blob; (digest, size)."""
    try:
        with open(path, "rb") as raw, temp_file(area, "import") as (tmp, f):
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
                size += len(chunk)
                if size > MAX_TARBALL:
                    raise UserError(f"{path} decompresses to more than {MAX_TARBALL} bytes, "
                                    "the most an image may hold; nothing was imported")
                sha.update(chunk)
                f.write(chunk)
                sink.emit(ProgressEvent("blob", digest=f"import:{path.name}", size=total,
                                        done=min(raw.tell(), total), state="progress"))
            digest = "sha256:" + sha.hexdigest()
            if not blobs.has_blob(digest):
                f.flush()
                os.fsync(f.fileno())
                f.close()
                publish(tmp, blobs.blob_path(digest))
            sink.emit(ProgressEvent("blob", digest=f"import:{path.name}", size=total,
                                    done=total, state="done"))
            return digest, size
    except (EOFError, zlib.error, zstandard.ZstdError, gzip.BadGzipFile) as e:
        raise UserError(f"{path} is not a readable tarball ({e})") from None
    except OSError as e:
        raise host_error(e, f"importing {path}") from None
