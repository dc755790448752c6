"""The trust boundaries, as imports: the verifier is small enough to read, and the
signer shares no code with the daemon or the doors it judges."""

from __future__ import annotations

import json
import subprocess
import sys


def _modules(stmt: str) -> set[str]:
    code = f"{stmt}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


STDLIB = set(sys.stdlib_module_names)


def _third_party(mods: set[str]) -> set[str]:
    return {m.split(".")[0] for m in mods} - STDLIB - {"tkbox", "_cffi_backend"} - {
        m for m in mods if m.startswith("_")}


def test_the_verifier_imports_only_the_formats() -> None:
    mods = _modules("from tkbox.verify import verify_bundle")
    ours = {m for m in mods if m.startswith("tkbox")}
    allowed = {"tkbox", "tkbox.errors", "tkbox.verify", "tkbox.verify.core"}
    assert {m for m in ours if not m.startswith("tkbox.formats")} == allowed
    assert _third_party(mods) <= {"cryptography"}


def test_the_signer_imports_neither_the_daemon_nor_the_doors() -> None:
    mods = _modules("import tkbox.signer.server, tkbox.signer.cli, tkbox.signer.witness")
    assert not {m for m in mods if m.startswith(("tkbox.daemon", "tkbox.doors", "tkbox.vm",
                                                 "tkbox.guest", "tkbox.image"))}
