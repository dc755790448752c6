"""What `tkbox apply` did, per file: for a table, and for `--json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

Status = Literal["applied", "held back", "refused", "would apply", "set apart"]

_STYLE: dict[Status, str] = {
    "applied": "green", "would apply": "cyan", "held back": "yellow", "refused": "red",
    "set apart": "dim",
}


@dataclass(frozen=True)
class FileResult:
    path: str
    kind: str  # added, modified, deleted, mode, symlink
    status: Status
    reason: str = ""
    mode: str | None = None  # the new git mode; None for a deletion
    sha256: str | None = None  # of the new content; None for a deletion

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "status": self.status,
                "reason": self.reason, "mode": self.mode, "sha256": self.sha256}


@dataclass(frozen=True)
class ApplyReport:
    checkout: str
    patch_sha256: str
    dry_run: bool
    allow_sensitive: bool
    files: tuple[FileResult, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: the sections of the files applied (or, in a dry run, that would be), byte for
    #: byte: what git applied to its copy and agreed with; not in `to_json`
    patch: bytes = field(default=b"", repr=False)

    def count(self, status: Status) -> int:
        return sum(1 for f in self.files if f.status == status)

    def to_json(self) -> dict[str, Any]:
        return {
            "checkout": self.checkout,
            "patch_sha256": self.patch_sha256,
            "dry_run": self.dry_run,
            "allow_sensitive": self.allow_sensitive,
            "files": [f.to_json() for f in self.files],
            "counts": {s: self.count(s) for s in _STYLE},
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        parts = [f"{self.count(s)} {s}" for s in _STYLE if self.count(s)]
        return ", ".join(parts) if parts else "the patch changes nothing"

    def render(self, console: Console) -> None:
        render_report(self, console)


def render_report(report: ApplyReport, console: Console) -> None:
    """A table of every file, then one summary line (no typer needed)."""
    if report.allow_sensitive:
        console.print(Text("--allow-sensitive: sensitive files are NOT held back",
                           style="bold red"))
    if report.files:
        table = Table(show_header=True, header_style="bold")
        table.add_column("status")
        table.add_column("kind")
        table.add_column("path", overflow="fold")
        table.add_column("why")
        for f in report.files:
            # Text(), never markup: a path is hostile and must not style the table
            table.add_row(Text(f.status, style=_STYLE[f.status]), Text(f.kind), Text(f.path),
                          Text(f.reason))
        console.print(table)
    for note in report.notes:
        console.print(Text(note, style="dim"))
    console.print(Text(report.summary()))
    if report.count("held back"):
        console.print(Text("Held-back changes were not written; read them, then run again "
                           "with --allow-sensitive to apply them.", style="yellow"))
