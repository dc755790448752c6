"""The blob-sink interface: the image sources depend on it alone, not on the store.

`registry.RegistryClient` and `layout.Layout` fill a `sink.BlobSink`; the store's
`BlobStore` is one, and so is the in-memory sink below, which shows that what the
interface offers is all a source needs (has, path, lock, verified write, put).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import tkbox.image
from tkbox.errors import RegistryError
from tkbox.image import oci
from tkbox.image._fs import Lock, TempArea
from tkbox.image.blobs import BlobStore
from tkbox.image.layout import DirLayout
from tkbox.image.progress import NullProgress
from tkbox.image.sink import BlobSink, BlobWrite
from tkbox.image.store import ImageStore
from tkbox.image.testing import LayerBuilder


class MemoryWrite:
    def __init__(self, sink: MemorySink, digest: str, size: int | None) -> None:
        self.sink, self.digest, self.size = sink, digest, size
        self.buf = bytearray()

    @property
    def written(self) -> int:
        return len(self.buf)

    def write(self, chunk: bytes) -> None:
        self.buf += chunk
        if self.size is not None and len(self.buf) > self.size:
            raise RegistryError(f"blob {self.digest} is larger than {self.size}")

    def reset(self) -> None:
        self.buf.clear()

    def commit(self) -> Path:
        if "sha256:" + hashlib.sha256(self.buf).hexdigest() != self.digest:
            raise RegistryError(f"blob {self.digest} failed verification")
        self.sink.blobs[self.digest] = bytes(self.buf)
        return self.sink.blob_path(self.digest)


class MemorySink:
    """A BlobSink that is a dict: no files, no store."""

    def __init__(self, lock_dir: Path) -> None:
        self.blobs: dict[str, bytes] = {}
        self.lock_dir = lock_dir

    def blob_path(self, digest: str) -> Path:
        return Path("/memory") / oci.hex_of(digest)

    def has_blob(self, digest: str) -> bool:
        return digest in self.blobs

    def blob_lock(self, digest: str) -> Lock:
        return Lock(self.lock_dir / oci.hex_of(digest))

    @contextlib.contextmanager
    def blob_writer(self, digest: str, size: int | None) -> Iterator[BlobWrite]:
        yield MemoryWrite(self, digest, size)

    def put_bytes(self, data: bytes, digest: str | None = None) -> str:
        d = oci.sha256_digest(data)
        if digest is not None and d != digest:
            raise RegistryError(f"document {digest} failed verification")
        self.blobs[d] = data
        return d


def _layout(root: Path, *, tamper: bool = False) -> tuple[str, str]:
    """An OCI layout directory holding one one-layer image tagged v1: (manifest, layer)."""
    layer = LayerBuilder().file("hello", b"hi\n").tar()
    layer_digest = oci.sha256_digest(layer)
    cfg, manifest = oci.synthesize(layer_digest, len(layer), oci.ImageConfig(),
                                   created="1970-01-01T00:00:00Z")
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    for data in (layer, cfg, manifest):
        (blobs / oci.hex_of(oci.sha256_digest(data))).write_bytes(data)
    if tamper:
        (blobs / oci.hex_of(layer_digest)).write_bytes(layer[:-1] + b"\x01")
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    index = {"schemaVersion": 2, "mediaType": oci.OCI_INDEX, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": oci.sha256_digest(manifest), "size": len(manifest),
        "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}
    (root / "index.json").write_text(json.dumps(index))
    return oci.sha256_digest(manifest), layer_digest


def _copy(layout: DirLayout, sink: BlobSink) -> str:
    digest, _, manifest = layout.resolve_manifest("v1", sink)
    for desc in [manifest.config, *manifest.layers]:
        layout.copy_blob(desc, sink, NullProgress())
    return digest


def test_a_source_fills_any_blob_sink(tmp_path: Path) -> None:
    manifest, layer = _layout(tmp_path / "lay")
    sink = MemorySink(tmp_path)
    assert _copy(DirLayout(tmp_path / "lay"), sink) == manifest
    assert {manifest, layer} <= set(sink.blobs)
    assert all(oci.sha256_digest(v) == k for k, v in sink.blobs.items())


def test_the_store_blobs_are_a_blob_sink_and_verify_what_lands(tmp_path: Path) -> None:
    """A layout blob that does not match its digest never lands in the store."""
    _layout(tmp_path / "bad", tamper=True)
    area = TempArea(tmp_path / "store" / "tmp")
    (tmp_path / "store" / "blobs" / "sha256").mkdir(parents=True)
    (tmp_path / "store" / "locks").mkdir()
    try:
        blobs: BlobSink = BlobStore(tmp_path / "store", area)
        with pytest.raises(RegistryError, match="failed verification"):
            _copy(DirLayout(tmp_path / "bad"), blobs)
        landed = sorted(p.name for p in (tmp_path / "store" / "blobs" / "sha256").iterdir())
        assert all(hashlib.sha256((tmp_path / "store/blobs/sha256" / n).read_bytes())
                   .hexdigest() == n for n in landed)
        assert list(area.dir.iterdir()) == []  # the refused temporary is gone
    finally:
        area.close()


def test_the_store_facade_is_a_blob_sink_too(tmp_path: Path) -> None:
    manifest, _ = _layout(tmp_path / "lay")
    with ImageStore(tmp_path / "images") as store:
        assert _copy(DirLayout(tmp_path / "lay"), store) == manifest
        assert store.has_blob(manifest)


def _image_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module == "tkbox.image":
                found.update(f"tkbox.image.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("tkbox.image.")}


def test_no_module_of_image_imports_another_in_a_cycle() -> None:
    """Every import counts, at any depth (in a function, under TYPE_CHECKING): the
    sources see the sink, never the store, and the store's parts point one way."""
    package = Path(tkbox.image.__file__).parent
    graph = {f"tkbox.image.{p.stem}": _image_imports(p) for p in package.glob("*.py")}
    for source in ("tkbox.image.registry", "tkbox.image.layout"):
        assert "tkbox.image.store" not in graph[source]
        assert "tkbox.image.sink" in graph[source]

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    assert not [m for m in graph if reaches(m, m, set())]
