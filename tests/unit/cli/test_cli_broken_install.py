"""A verb whose package cannot be imported (a broken install) says so, and how to mend
it, in one line with exit 3; it is never "No such command"."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tkbox.cli import main as cli_main
from tkbox.errors import HostError


def loader(missing: str) -> Any:
    def load(name: str) -> Any:
        if name == missing:
            raise ModuleNotFoundError(f"No module named '{missing}'", name="cedarpy")
        return importlib.import_module(name)
    return load


@pytest.mark.parametrize("missing, argv, verb", [
    ("tkbox.signer.cli", ["signer", "status"], "signer"),
    ("tkbox.signer.cli", ["witness", "serve", "--listen", "x"], "witness"),
    ("tkbox.image.cli", ["image", "ls"], "image"),
    ("tkbox.verify.cli", ["verify", "b.tkb", "--trust", "t.json"], "verify"),
])
def test_a_verb_that_cannot_be_imported_says_why(missing: str, argv: list[str],
                                                 verb: str) -> None:
    app = typer.Typer()

    @app.command()
    def version() -> None:  # a second command, so the app is a group as the real one is
        pass

    cli_main._mount_optional(app, loader(missing))
    r = CliRunner().invoke(app, argv)
    assert isinstance(r.exception, HostError), r.output
    msg = str(r.exception)
    assert msg.startswith(f"tkbox {verb} cannot run: cedarpy cannot be imported")
    assert "reinstall tkbox" in msg and "\n" not in msg
    assert "No such command" not in r.output


def test_a_whole_install_mounts_every_verb() -> None:
    app = typer.Typer()

    @app.command()
    def version() -> None:
        pass

    cli_main._mount_optional(app)
    names = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert {"image", "signer", "witness", "verify"} <= names
