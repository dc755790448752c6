"""Write an export to disk: `NAME.tkb` and `NAME.trust.json`, each atomically.

Each file is written to a temporary file in the same directory, flushed to
disk, then renamed over its name (and the directory synced), so a reader
sees either no file or the whole file.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from tkbox.errors import HostError
from tkbox.record.client import Export


def trust_path_for(bundle_path: Path) -> Path:
    """`demo.tkb` -> `demo.trust.json` (any other name gets `.trust.json` added)."""
    name = bundle_path.name
    stem = name[: -len(".tkb")] if name.endswith(".tkb") and len(name) > 4 else name
    return bundle_path.with_name(stem + ".trust.json")


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise HostError(f"cannot write {path}: {exc.strerror or exc}") from None


def write_export(export: Export, bundle_path: str | Path) -> tuple[Path, Path]:
    """Write the bundle and its trust file; returns (bundle path, trust path)."""
    bundle_path = Path(bundle_path)
    trust_path = trust_path_for(bundle_path)
    write_atomic(bundle_path, export.bundle)
    write_atomic(trust_path, export.trust)
    return bundle_path, trust_path
