"""The Action's tests: the composite runner (`action/testing`) and the real daemon API
with fake VMs that tests/integration/sdk uses (`sdk_daemon`)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
for p in (ROOT, ROOT / "tests" / "integration" / "sdk"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
