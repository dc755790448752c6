"""The Tracekit backend is optional: tkbox without `tracekit-ai` installed
still imports, and the daemon loads Tracekit only when told `--signer tracekit`."""

from __future__ import annotations

import json
import subprocess
import sys


def _modules(stmt: str) -> set[str]:
    code = f"{stmt}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_the_backend_module_loads_tracekit_only_when_a_client_is_made() -> None:
    mods = _modules("import tkbox.record.tracekit")
    assert not {m for m in mods if m == "tracekit" or m.startswith("tracekit.")}


def test_the_daemon_loads_the_tracekit_backend_only_when_asked() -> None:
    mods = _modules("import tkbox.daemon.server, tkbox.cli.main, tkbox.cli.doctor")
    assert "tkbox.record.tracekit" not in mods
    assert not {m for m in mods if m == "tracekit" or m.startswith("tracekit.")}
