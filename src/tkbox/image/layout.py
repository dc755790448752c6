"""OCI image layouts (`oci:DIR[:TAG]`) and archives of them (`oci-archive:FILE[:TAG]`).

image-spec `image-layout.md`: an `oci-layout` file (`imageLayoutVersion`
1.0.0), an `index.json` (an OCI index), and `blobs/<alg>/<hex>`. A TAG picks
the index entry whose `org.opencontainers.image.ref.name` annotation equals
it; without one, the index must hold exactly one entry. An entry that is an
index itself is resolved to linux/amd64.

The layout is a local file someone gave us, so it is read like a registry:
every document bounded and parsed strictly, every blob verified as it is
copied into the store. An archive is read in place (a seekable tar, plain or
gzip), member by member, never extracted.
"""

from __future__ import annotations

import os
import re
import stat
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from tkbox.errors import RegistryError, UserError
from tkbox.image import oci
from tkbox.image.flatten import BoundedTarInfo
from tkbox.image.progress import ProgressEvent, ProgressSink
from tkbox.image.reference import LayoutRef
from tkbox.image.sink import BlobSink

REF_NAME = "org.opencontainers.image.ref.name"
_CHUNK = 1024 * 1024
# Members of an OCI archive read: an image of 500 layers needs a few more; an index of
# 1,000 images a few thousand more. Only the members a layout uses are kept in memory.
MAX_ARCHIVE_MEMBERS = 100_000
_WANTED = re.compile(r"oci-layout|index\.json|blobs/sha256/[0-9a-f]{64}")


class Layout:
    """A source of an OCI layout's files by relative name."""

    def __init__(self, where: str) -> None:
        self.where = where

    def open(self, name: str) -> IO[bytes]:  # pragma: no cover - abstract
        raise NotImplementedError

    def read(self, name: str, limit: int) -> bytes:
        with self.open(name) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise RegistryError(f"{self.where}: {name} is larger than {limit} bytes")
        return data

    def _blob_name(self, digest: str) -> str:
        return f"blobs/sha256/{oci.hex_of(digest)}"

    def read_document(self, digest: str) -> bytes:
        data = self.read(self._blob_name(digest), oci.MAX_MANIFEST)
        if oci.sha256_digest(data) != digest:
            raise RegistryError(f"{self.where}: blob {digest} does not match its digest")
        return data

    def resolve_manifest(
        self, tag: str | None, store: BlobSink
    ) -> tuple[str, str | None, oci.Manifest]:
        marker = oci.parse_json(self.read("oci-layout", 4096), f"{self.where}: oci-layout", 4096)
        if marker.get("imageLayoutVersion") != "1.0.0":
            raise RegistryError(f"{self.where}: unsupported imageLayoutVersion")
        index = oci.parse_document(self.read("index.json", oci.MAX_MANIFEST), oci.OCI_INDEX,
                                   f"{self.where}: index.json")
        if not isinstance(index, oci.Index):
            raise RegistryError(f"{self.where}: index.json is not an index")
        if tag is not None:
            entries = [d for d in index.manifests if d.annotation(REF_NAME) == tag]
            if not entries:
                names = sorted({d.annotation(REF_NAME) or "" for d in index.manifests} - {""})
                raise UserError(f"{self.where} has no image tagged {tag!r} "
                                f"(it has: {', '.join(map(repr, names[:20])) or 'no tags'})")
        else:
            entries = list(index.manifests)
            if len(entries) != 1:
                raise UserError(f"{self.where} holds {len(entries)} images; add :TAG")
        entry = entries[0]
        index_digest: str | None = None
        body = self.read_document(entry.digest)
        doc = oci.parse_document(body, entry.media_type, f"{self.where}: {entry.digest}")
        if isinstance(doc, oci.Index):
            store.put_bytes(body, entry.digest)
            index_digest = entry.digest
            chosen = oci.select_platform(doc)
            body = self.read_document(chosen.digest)
            doc = oci.parse_document(body, chosen.media_type, f"{self.where}: {chosen.digest}")
            if isinstance(doc, oci.Index):
                raise RegistryError(f"{self.where}: an index inside an index; not supported")
        digest = store.put_bytes(body)
        return digest, index_digest, doc

    def copy_blob(self, desc: oci.Descriptor, store: BlobSink, sink: ProgressSink) -> None:
        if store.has_blob(desc.digest):
            sink.emit(ProgressEvent("blob", digest=desc.digest, size=desc.size,
                                    done=desc.size, state="cached"))
            return
        sink.emit(ProgressEvent("blob", digest=desc.digest, size=desc.size, state="start"))
        with self.open(self._blob_name(desc.digest)) as src, \
                store.blob_writer(desc.digest, desc.size) as w:
            while chunk := src.read(_CHUNK):
                w.write(chunk)
                sink.emit(ProgressEvent("blob", digest=desc.digest, size=desc.size,
                                        done=w.written, state="progress"))
            w.commit()
        sink.emit(ProgressEvent("blob", digest=desc.digest, size=desc.size, done=desc.size,
                                state="done"))


class DirLayout(Layout):
    def __init__(self, root: Path) -> None:
        super().__init__(f"oci:{root}")
        self.root = root

    def open(self, name: str) -> IO[bytes]:
        """`name`, which must be a regular file: opened without blocking, so a FIFO (which
        held the open for ever) or a device is refused instead of read."""
        try:
            fd = os.open(self.root / name,
                         os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise UserError(f"{self.where}: {name} is missing; is this an OCI layout?") from None
        except OSError as e:
            raise UserError(f"{self.where}: cannot read {name}: {e.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UserError(f"{self.where}: {name} is not a regular file")
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise


class ArchiveLayout(Layout):
    def __init__(self, tf: tarfile.TarFile, where: str) -> None:
        super().__init__(where)
        self.tf = tf
        self.members: dict[str, tarfile.TarInfo] = {}
        # Not getmembers(): it keeps every header, and a gzip of a few hundred KB holds
        # hundreds of thousands of them (200,000 took 72 MiB). Read one at a time,
        # bounded, keeping only the members a layout is made of.
        count = 0
        while (m := tf.next()) is not None:
            tf.members = []  # type: ignore[attr-defined]  # keep no header we do not use
            count += 1
            if count > MAX_ARCHIVE_MEMBERS:
                raise RegistryError(f"{where} has more than {MAX_ARCHIVE_MEMBERS} members; "
                                    "an OCI archive holds one per blob")
            name = m.name
            while name.startswith("./"):
                name = name[2:]
            if _WANTED.fullmatch(name):
                self.members[name] = m

    def open(self, name: str) -> IO[bytes]:
        m = self.members.get(name)
        if m is None or not m.isfile():
            raise UserError(f"{self.where}: {name} is missing; is this an OCI archive?")
        f = self.tf.extractfile(m)
        assert f is not None
        return f


@contextmanager
def open_layout(ref: LayoutRef) -> Iterator[Layout]:
    if not ref.archive:
        if not ref.path.is_dir():
            raise UserError(f"{ref}: {ref.path} is not a directory")
        yield DirLayout(ref.path)
        return
    if not ref.path.is_file():
        raise UserError(f"{ref}: {ref.path} is not a file")
    try:
        tf = tarfile.open(ref.path, "r:*", tarinfo=BoundedTarInfo)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise UserError(f"{ref}: not a readable tar archive ({e})") from None
    try:
        try:
            layout = ArchiveLayout(tf, str(ref))
        except (tarfile.TarError, EOFError, OSError) as e:
            raise UserError(f"{ref}: not a readable tar archive ({e})") from None
        yield layout
    finally:
        tf.close()
