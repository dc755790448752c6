"""`tkbox daemon --signer` takes tkbox or tracekit[:SOCKET] and nothing else."""

from __future__ import annotations

import subprocess
import sys


def test_an_unknown_signer_backend_is_a_one_line_error() -> None:
    p = subprocess.run([sys.executable, "-m", "tkbox.cli", "daemon", "--signer", "sigstore"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--signer 'sigstore'" in lines[0] and "tracekit" in lines[0]
