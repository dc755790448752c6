"""`tkbox image ...`: pull, import, build, ls, inspect, rm, prune. Works without a daemon.

Human output by default; `--json` prints one JSON document (and, for long work,
one JSON progress event per line before it). Errors are one line on stderr and
a non-zero exit status (the `TkboxError`'s `exit_code`), said by `tkbox._exit.exit_with`.

`pull` runs here, in the CLI's process, into the store the daemon shares. It goes
where the daemon's own pulls go: with no `--registry-*` flag it takes the running
daemon's registry settings (`daemon_registries`, plugged in by `tkbox.cli.main`: this
package may not import the SDK); with no daemon either, each registry is asked itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from tkbox._exit import exit_with
from tkbox.errors import TkboxError
from tkbox.image.mirrors import Registries, load, settings_of
from tkbox.image.progress import RichProgress, auto_progress
from tkbox.image.store import DEFAULT_TAG, Image, ImageStore

image_app = typer.Typer(
    name="image", help="Root disks for boxes: pull, import, build, list, remove.",
    no_args_is_help=True, add_completion=False,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
CaOpt = Annotated[
    Path | None,
    typer.Option("--ca-bundle", help="CA certificates to trust for registries "
                 "(default: SSL_CERT_FILE, else the system's)."),
]
MirrorOpt = Annotated[list[str], typer.Option(
    "--registry-mirror", help="REGISTRY=URL: ask this mirror first (repeatable, in order); "
    "any --registry-* flag replaces the running daemon's settings")]
MirrorOnlyOpt = Annotated[bool, typer.Option(
    "--registry-mirror-only", help="never ask a registry that has a mirror")]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--registry-config", help="a containerd hosts directory or Docker's daemon.json")]
T = TypeVar("T")



def _no_daemon() -> Registries | None:
    return None


#: the running daemon's registry settings, loaded; None when no daemon answers
daemon_registries: Callable[[], Registries | None] = _no_daemon


def _run(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except TkboxError as e:
        exit_with(e)
    except KeyboardInterrupt:
        typer.echo("tkbox: interrupted; nothing half-made was kept", err=True)
        raise typer.Exit(130) from None


def _store(ca: Path | None = None, registries: Registries | None = None) -> ImageStore:
    return ImageStore(ca_bundle=ca, registries=registries)


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def _print_image(image: Image, as_json: bool, verb: str) -> None:
    if as_json:
        typer.echo(json.dumps(image.to_json()))
    else:
        via = image.pulled_from
        typer.echo(f"{verb} {image.ref}\n  digest {image.digest}\n  root disk {image.rootfs} "
                   f"({_human_size(image.size)})" + (
                       f"\n  from {via['endpoint']} (a mirror of {via['registry']}, which "
                       f"answered {via['answered']})" if via and via.get("mirror") else ""))


def _with_progress(as_json: bool, work: Callable[[Any], Image]) -> Image:
    sink = auto_progress(json_events=as_json)
    try:
        return work(sink)
    finally:
        if isinstance(sink, RichProgress):
            sink.close()


@image_app.command("pull")
def pull(ref: str, as_json: JsonOpt = False, ca_bundle: CaOpt = None,
         registry_mirror: MirrorOpt = [],  # noqa: B006
         registry_mirror_only: MirrorOnlyOpt = False,
         registry_config: ConfigOpt = None) -> None:
    """Fetch REF from its registry (or an oci:/oci-archive: layout) and build its root disk.

    Registries are asked as the running daemon asks them (its --registry-* settings),
    unless --registry-* flags are given here."""

    def work() -> None:
        settings = settings_of(registry_mirror, registry_mirror_only, registry_config)
        registries = daemon_registries() if settings.empty else load(settings)
        with _store(ca_bundle, registries) as store:
            image = _with_progress(
                as_json, lambda sink: asyncio.run(store.pull(ref, progress=sink)))
            _print_image(image, as_json, "pulled")

    _run(work)


@image_app.command("import")
def import_(
    rootfs: Annotated[Path, typer.Argument(help="A root filesystem tarball (plain, gzip, zstd).")],
    tag: Annotated[str, typer.Option("--tag", help="The local name, e.g. me/tool:v1.")],
    as_json: JsonOpt = False,
) -> None:
    """Import a root filesystem tarball (docker export, mmdebstrap) as a local image."""

    def work() -> None:
        with _store() as store:
            image = _with_progress(as_json, lambda sink: store.import_tar(rootfs, tag,
                                                                          progress=sink))
            _print_image(image, as_json, "imported")

    _run(work)


@image_app.command("build")
def build(
    tag: Annotated[str, typer.Option("--tag", help="The local name.")] = DEFAULT_TAG,
    as_json: JsonOpt = False,
) -> None:
    """Build the default image (Debian, python3, pip, venv, curl, git) with mmdebstrap."""

    def work() -> None:
        with _store() as store:
            image = _with_progress(as_json, lambda sink: store.build_default(tag, progress=sink))
            _print_image(image, as_json, "built")

    _run(work)


@image_app.command("ls")
def ls(as_json: JsonOpt = False) -> None:
    """List the images in the store."""

    def work() -> None:
        with _store() as store:
            images = store.ls()
        if as_json:
            typer.echo(json.dumps([i.to_json() for i in images]))
            return
        if not images:
            typer.echo("no images; try `tkbox image build` or `tkbox image pull REF`")
            return
        width = max(len(i.ref) for i in images)
        for i in images:
            typer.echo(f"{i.ref:<{width}}  {i.digest[:19]}  {_human_size(i.size):>9}  "
                       f"{i.source}")

    _run(work)


@image_app.command("inspect")
def inspect(ref: str, as_json: JsonOpt = False) -> None:
    """Show one image: digest, root disk, layers, config."""

    def work() -> None:
        with _store() as store:
            image = store.inspect(ref)
        if as_json:
            typer.echo(json.dumps(image.to_json()))
        else:
            typer.echo(json.dumps(image.to_json(), indent=2))

    _run(work)


@image_app.command("rm")
def rm(ref: str, as_json: JsonOpt = False) -> None:
    """Forget an image's name; its root disk goes if no other name uses it."""

    def work() -> None:
        with _store() as store:
            removed = store.rm(ref)
        typer.echo(json.dumps({"removed": removed}) if as_json else
                   "\n".join(f"removed {r}" for r in removed))

    _run(work)


@image_app.command("prune")
def prune(as_json: JsonOpt = False) -> None:
    """Remove blobs and root disks that no name reaches, and stale temporaries."""

    def work() -> None:
        with _store() as store:
            removed = store.prune()
        if as_json:
            typer.echo(json.dumps(removed))
        else:
            typer.echo(f"removed {removed['blobs']} blobs, {removed['disks']} root disks, "
                       f"{removed['temporaries']} temporaries ({_human_size(removed['bytes'])})")

    _run(work)


if __name__ == "__main__":  # pragma: no cover - `python -m tkbox.image.cli`
    image_app()
