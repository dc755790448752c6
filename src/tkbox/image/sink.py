"""What an image source needs of the store it fills: the blob-sink interface.

A source (`registry.RegistryClient`, `layout.Layout`) reads manifests and blobs
from somewhere and puts them into a sink, verified; it knows nothing else of
the store (names, disks, garbage collection). So the sources and the store
depend on this small module and not on each other:

```
store (facade) ─▶ blobs.BlobStore ─ implements ─▶ sink.BlobSink ◀─ uses ─ registry, layout
```

A pull needs four things of its sink:

- `has_blob` / `blob_path`: is the blob there already (then it is not fetched);
- `blob_lock`: the lock whoever makes a blob holds, so that two processes
  pulling the same layer fetch it once (the second finds it made);
- `blob_writer`: a writer that bounds, hashes and verifies the bytes as they
  come, and publishes them atomically only if they match the digest;
  `put_bytes` does the same for a document already in memory;
- progress, which is its own interface (`progress.ProgressSink`), passed next
  to the sink: what a person sees is not the store's business.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from tkbox.image._fs import Lock


class BlobWrite(Protocol):
    """One blob being written: bounded by its size, hashed, verified on commit."""

    @property
    def written(self) -> int:
        """Bytes written so far (for progress)."""
        ...

    def write(self, chunk: bytes) -> None:
        """Add bytes; `RegistryError` past the descriptor's size."""
        ...

    def reset(self) -> None:
        """Start again from byte 0 (a retried transfer)."""
        ...

    def commit(self) -> Path:
        """Verify size and digest, publish atomically; `RegistryError` if they differ."""
        ...


class BlobSink(Protocol):
    """Where verified blobs go. `tkbox.image.blobs.BlobStore` is the one implementation."""

    def blob_path(self, digest: str) -> Path:
        """Where the blob `digest` is (or will be) once published."""
        ...

    def has_blob(self, digest: str) -> bool:
        ...

    def blob_lock(self, digest: str) -> Lock:
        """The lock to hold while making blob `digest` (not yet acquired)."""
        ...

    def blob_writer(self, digest: str, size: int | None) -> AbstractContextManager[BlobWrite]:
        """A writer for blob `digest`; what is not committed is removed on exit."""
        ...

    def put_bytes(self, data: bytes, digest: str | None = None) -> str:
        """Store a document held in memory, verified against `digest` if given."""
        ...
