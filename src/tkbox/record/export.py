"""Write an export to disk: `NAME.tkb` and `NAME.trust.json`, each atomically.

Each file is written with `tkbox._fs.write_atomic` (a temporary file in the
same directory, flushed to disk, renamed over its name, the directory
synced), so a reader sees either no file or the whole file.
"""

from __future__ import annotations

from pathlib import Path

from tkbox._fs import write_atomic
from tkbox.record.client import Export


def trust_path_for(bundle_path: Path) -> Path:
    """`demo.tkb` -> `demo.trust.json` (any other name gets `.trust.json` added)."""
    name = bundle_path.name
    stem = name[: -len(".tkb")] if name.endswith(".tkb") and len(name) > 4 else name
    return bundle_path.with_name(stem + ".trust.json")


def write_export(export: Export, bundle_path: str | Path) -> tuple[Path, Path]:
    """Write the bundle and its trust file; returns (bundle path, trust path)."""
    bundle_path = Path(bundle_path)
    trust_path = trust_path_for(bundle_path)
    write_atomic(bundle_path, export.bundle)
    write_atomic(trust_path, export.trust)
    return bundle_path, trust_path
