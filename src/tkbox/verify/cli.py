"""`tkbox verify BUNDLE --trust TRUST [--json]`: the offline verifier's command.

Mounted by the main CLI as `app.command("verify")(verify_command)`.
Exit status 0 when the bundle verifies; otherwise the `BundleError` exit
status (4), or 2 when a file cannot be read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from tkbox._exit import exit_with
from tkbox.errors import UserError
from tkbox.formats import FormatError
from tkbox.formats.bundle import MAX_TRUST
from tkbox.verify.core import Report, verify_bundle

MAX_READ = 512 << 20

ASSURANCE_TEXT = {
    "dev": "no witness cosigned: this rests on the signer's key alone",
    "local": "cosigned by witnesses the signer's operator runs",
    "witnessed": "cosigned by a quorum of independent witnesses",
}


def read_input(path: Path, what: str, limit: int) -> bytes:
    """A bundle or trust file, read up to its limit (a larger one is never held
    whole). UserError with a one-line reason if it cannot be read or is too large.

    A buffer as large as the file says it is (not as the limit) is allocated: a
    small file is read in little memory, and a file that grows while it is read is
    read on to the limit."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(min(size, limit) + 1)
            if len(data) <= limit and len(data) > size:  # it grew (or is not a file)
                data += f.read(limit + 1 - len(data))
    except OSError as exc:
        raise UserError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise UserError(f"the {what} {path} is larger than {limit} bytes")
    return data


def _read(path: Path, what: str, limit: int) -> bytes:
    try:
        return read_input(path, what, limit)
    except UserError as exc:
        exit_with(exc)  # 2


def render(report: Report) -> str:
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(report.kinds.items()))
    lines = [
        "Integrity: VERIFIED.",
        f"Run: {report.run}",
        f"Records: {report.records} ({kinds})",
        f"Refused decisions: {report.refused}",
        f"Secrets: {report.secret_uses} uses, {report.secret_leaks} leaks blocked; "
        f"model calls: {report.model_calls}",
        f"isolation: {report.isolation}",
        *([f"Workload: {report.workload_line}"] if report.workload is not None else []),
        f"Assurance: {report.assurance} ({ASSURANCE_TEXT[report.assurance]}"
        + (f": {', '.join(report.cosigned_by)}" if report.cosigned_by else "") + ")",
        f"Signer: {report.log_key}",
        f"Checkpoint: size {report.tree_size}, root {report.root_hash}",
        f"Time: {report.first_time} to {report.last_time}",
    ]
    return "\n".join(lines)


def verify_command(
    bundle: Annotated[Path, typer.Argument(help="the .tkb bundle", show_default=False)],
    trust: Annotated[Path, typer.Option("--trust", help="the .trust.json trust file",
                                        show_default=False)],
    json_out: Annotated[bool, typer.Option("--json", help="output for programs")] = False,
) -> None:
    """Verify a bundle offline: every record signed, chained, and witnessed as the
    trust file requires."""
    bundle_bytes = _read(bundle, "bundle", MAX_READ)
    trust_bytes = _read(trust, "trust file", MAX_TRUST)
    try:
        report = verify_bundle(bundle_bytes, trust_bytes)
    except FormatError as exc:
        if json_out:
            typer.echo(json.dumps({"verified": False, "code": exc.code, "where": exc.where,
                                   "error": exc.what}, sort_keys=True))
        else:
            typer.echo("Integrity: FAILED.")
            typer.echo(f"{exc.where}: {exc.what}" if exc.where else exc.what)
            typer.echo(f"({exc.code}; nothing in this bundle can be relied on)")
        raise typer.Exit(exc.exit_code) from None
    if json_out:
        typer.echo(json.dumps(report.to_json(), sort_keys=True))
    else:
        typer.echo(render(report))


def main() -> None:  # pragma: no cover - `python -m tkbox.verify.cli`
    typer.run(verify_command)


if __name__ == "__main__":  # pragma: no cover
    main()
