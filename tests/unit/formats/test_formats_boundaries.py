"""The trust boundaries, as imports: the verifier is small enough to read, and the
signer shares no code with the daemon or the doors it judges.

Each check runs the import in a fresh interpreter and looks only at the modules that
the import itself added to `sys.modules`: whatever the interpreter loaded before it
(a `sitecustomize`, a `.pth` hook, the site machinery) is the machine's, not ours,
and must neither fail nor pass these tests.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import tkbox
import tkbox.signer


def _added_by(stmt: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules that executing `stmt` loads, beyond what was loaded before it."""
    code = ("import sys, json\nbefore = set(sys.modules)\n"
            f"{stmt}\n"
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    return set(json.loads(out.stdout))


STDLIB = set(sys.stdlib_module_names)


def _third_party(mods: set[str]) -> set[str]:
    """Top-level distributions among `mods`: not ours, not the standard library."""
    tops = {m.split(".")[0] for m in mods}
    return {t for t in tops if t not in STDLIB and t != "tkbox" and not t.startswith("_")}


def test_the_verifier_imports_only_the_formats() -> None:
    mods = _added_by("from tkbox.verify import verify_bundle")
    ours = {m for m in mods if m.startswith("tkbox")}
    allowed = {"tkbox", "tkbox.errors", "tkbox.verify", "tkbox.verify.core"}
    assert {m for m in ours if not m.startswith("tkbox.formats")} == allowed
    assert _third_party(mods) <= {"cryptography", "cffi"}


SIGNER_FORBIDS = ("tkbox.daemon", "tkbox.doors", "tkbox.vm", "tkbox.guest", "tkbox.image",
                  "tkbox.record")


def _signer_modules(mods: set[str]) -> set[str]:
    return {m for m in mods if m == "tkbox" or m.startswith("tkbox.")}


def test_the_signer_imports_neither_the_daemon_nor_the_doors() -> None:
    """The signer judges the daemon, so it shares none of its code: not the doors, not the
    VMs, and not `tkbox.record` (the daemon's client of the signer, fakes included). What
    both sides need (the wire format, the atomic write) lives below both."""
    mods = _added_by("import tkbox.signer.server, tkbox.signer.cli, tkbox.signer.witness")
    assert not {m for m in _signer_modules(mods) if m.startswith(SIGNER_FORBIDS)}


def _imports_in(path: Path) -> set[str]:
    """Every module `path` names in an import, at any depth: in a function, under
    `if TYPE_CHECKING:`, anywhere (an import that only runs later is still a dependency)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_no_signer_module_names_daemon_code_even_in_a_function() -> None:
    """Function-level and TYPE_CHECKING imports count too: what `tkbox signer status|hold|
    trust` load only when they run stays on the signer's side of the boundary."""
    signer = Path(tkbox.signer.__file__).parent
    bad = {f"{py.name}: {m}" for py in sorted(signer.rglob("*.py"))
           for m in _imports_in(py) if m.startswith(SIGNER_FORBIDS)}
    assert not bad


def _is_test_helper(module: str) -> bool:
    return module.rsplit(".", 1)[-1] == "testing"


def test_no_production_module_imports_a_test_fake() -> None:
    """Test fakes (`record.testing.FakeSigner`, which keeps every record in memory; the
    network, image and other `testing` modules) never run in production: only tests and
    other `testing` modules import them, at any depth. `--unrecorded` has its own
    explicit unsafe signer (`record.unrecorded`) for that reason."""
    package = Path(tkbox.__file__).parent
    bad = set()
    for py in sorted(package.rglob("*.py")):
        if py.stem == "testing":
            continue
        for m in _imports_in(py):
            if _is_test_helper(m) and m.startswith("tkbox."):
                bad.add(f"{py.relative_to(package)}: {m}")
    assert not bad


def test_a_signer_import_of_the_record_client_is_caught() -> None:
    """The check can fail: the signer's side importing the daemon's client is seen."""
    mods = _added_by("import tkbox.signer.server\nimport tkbox.record.unix")
    assert {m for m in _signer_modules(mods) if m.startswith(SIGNER_FORBIDS)}


def test_a_sitecustomize_is_not_charged_to_the_verifier(tmp_path: Path) -> None:
    """A machine whose sitecustomize loads a third-party package (as some CI images and
    distributions do) still passes: only what the verifier's import adds is counted."""
    (tmp_path / "sitecustomize.py").write_text("import yaml, hypothesis, email.parser\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    ran = subprocess.run([sys.executable, "-c", "import sys; print('yaml' in sys.modules)"],
                         capture_output=True, text=True, check=True, env=env).stdout.strip()
    assert ran == "True"  # the sitecustomize did run first, as on such a machine
    mods = _added_by("from tkbox.verify import verify_bundle", env)
    assert not {m for m in mods if m.split(".")[0] in {"yaml", "hypothesis"}}
    assert _third_party(mods) <= {"cryptography", "cffi"}


def test_a_forbidden_import_is_caught() -> None:
    """The check can fail: an import of the daemon from the verifier's side is seen."""
    mods = _added_by("from tkbox.verify import verify_bundle\nimport tkbox.daemon.lifecycle")
    ours = {m for m in mods if m.startswith("tkbox")}
    assert "tkbox.daemon.lifecycle" in ours
