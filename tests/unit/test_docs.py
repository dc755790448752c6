"""The docs name only what exists: every module, file and `tkbox` command they mention.

Read from README.md and docs/*.md:

- a dotted name `tkbox.X.Y` in a code span whose `X` is one of tkbox's own modules or
  packages is imported (module) or looked up (attribute); record kinds such as
  `tkbox.gap` are not modules and are left alone;
- a path in a code span under `src/`, `tkbox/`, `tests/`, `benchmarks/`, `scripts/`,
  `action/` or `docs/` exists (globs allowed);
- every `tkbox VERB [SUB]` in a code span or a shell block is a command the CLI has
  (`tkbox image pull`, not `tkbox image fetch`).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
import typer

import tkbox

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = {m.name for m in pkgutil.iter_modules(tkbox.__path__)}

SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^tkbox(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")
PATH = re.compile(r"^(?:src/|tkbox/|tests/|benchmarks/|scripts/|action/|docs/)[\w./*-]+"
                  r"(?:\.(?:py|md|sh|yml|yaml|json|toml|c|cjs)|/)$")
BLOCK = re.compile(r"```(?:sh|bash|shell|console)?\n(.*?)```", re.S)
VERB = re.compile(r"(?:^|&& |; |\| |\$\(|^\$ )tkbox ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", re.M)
#: spans that look like this repository's paths or commands and are not: another
#: project's file, an example path inside a checkout, a message quoted from tkbox
NOT_OURS = {
    "docs/vsock.md",  # Firecracker's, firecracker.md summarises it
    "docs/UIDS-GIDS.md",  # systemd's, vmm.md cites it
    "scripts/pc.sh", "setup.py",  # files of a checkout in changes.md's examples
    "tkbox does", "tkbox uses", "tkbox reads",  # tkbox's own sentences, quoted
}


def spans() -> list[tuple[Path, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        out += [(doc, s.strip()) for s in SPAN.findall(text)]
    return out


def cli_commands() -> dict[str, set[str]]:
    from tkbox.cli.main import _mount_optional, app

    _mount_optional()
    cmd = typer.main.get_command(app)
    return {name: set(getattr(c, "commands", {}) or {})
            for name, c in cmd.commands.items()}  # type: ignore[attr-defined]


def resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_tkbox_module_the_docs_name_exists() -> None:
    missing = sorted({f"{doc.name}: {s}" for doc, s in spans()
                      if DOTTED.match(s) and s.split(".")[1] in TOP and not resolves(s)})
    assert not missing


def test_every_file_the_docs_name_exists() -> None:
    missing = []
    for doc, s in spans():
        if not PATH.match(s) or s in NOT_OURS:
            continue
        rel = s.removeprefix("tkbox/")
        base = ROOT / "src" / "tkbox" if s.startswith("tkbox/") else ROOT
        if not list(base.glob(rel)):
            missing.append(f"{doc.name}: {s}")
    assert not sorted(set(missing))


BARE = re.compile(r"^[\w-]+\.py$")


def test_every_python_file_the_docs_name_by_its_name_alone_exists() -> None:
    """`tasks.py` (a module named by its file alone) is somewhere in the repository."""
    names = {p.name for d in ("src", "tests", "benchmarks", "scripts", "action")
             for p in (ROOT / d).rglob("*.py")}
    missing = sorted({f"{doc.name}: {s}" for doc, s in spans()
                      if BARE.match(s) and s not in names and s not in NOT_OURS})
    assert not missing


def test_every_command_the_docs_name_is_the_clis() -> None:
    commands = cli_commands()
    bad = set()
    for doc in DOCS:
        text = doc.read_text()
        places = [*SPAN.findall(text), *BLOCK.findall(text)]
        for place in places:
            for m in VERB.finditer(place):
                verb, sub = m.group(1), m.group(2)
                if f"tkbox {verb}" in NOT_OURS:
                    continue
                if verb not in commands:
                    bad.add(f"{doc.name}: tkbox {verb}")
                elif commands[verb] and sub is not None and sub not in commands[verb]:
                    bad.add(f"{doc.name}: tkbox {verb} {sub}")
    assert not sorted(bad)


@pytest.mark.parametrize("text, found", [
    ("`tkbox.image.tools`", True), ("`tkbox.image.nonesuch`", False),
    ("`tkbox.gap`", None), ("`tkbox.sdk.BoxInfo`", True), ("`tkbox.sdk.NoSuch`", False),
])
def test_the_module_check_can_fail(text: str, found: bool | None) -> None:
    """The checks above can fail: a name that is gone is caught, a record kind is not a
    module."""
    s = SPAN.findall(text)[0]
    if found is None:
        assert s.split(".")[1] not in TOP
    else:
        assert resolves(s) is found


def test_the_command_check_can_fail() -> None:
    commands = cli_commands()
    assert "fetch" not in commands["image"] and "pull" in commands["image"]
    m = VERB.search(SPAN.findall("run `tkbox image fetch x` first")[0])
    assert m is not None and (m.group(1), m.group(2)) == ("image", "fetch")
