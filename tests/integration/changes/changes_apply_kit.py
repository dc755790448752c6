"""What the apply tests share: a real git checkout and the guest's own patch of a
change to it, and `apply_patch` against the in-process fake signer."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "doors" / "changes"))
from changes_trees import Tree, build_upper, make_tree  # noqa: E402

from tkbox.doors.changes import ApplyReport, apply_patch  # noqa: E402
from tkbox.guest.diff import write_patch  # noqa: E402
from tkbox.record.testing import FakeSigner  # noqa: E402

RUN = "run-1"


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                   check=True, capture_output=True)


def setup(tmp: Path, lower: Tree, final: Tree, config: Sequence[tuple[str, str]] = ()
          ) -> tuple[Path, bytes]:
    """A git checkout `co` holding `lower`, and the patch that makes it `final`."""
    co = tmp / "co"
    make_tree(co, lower)
    git(co, "init", "-q")
    for key, value in config:
        git(co, "config", key, value)
    make_tree(tmp / "lower", lower)
    build_upper(tmp / "upper", lower, final)
    out = io.BytesIO()
    write_patch(tmp / "lower", tmp / "upper", out, max_bytes=1 << 24)
    return co, out.getvalue()


def apply(patch: bytes, co: Path, **kw: Any) -> ApplyReport:
    async def go() -> ApplyReport:
        s = FakeSigner()
        await s.open_run(RUN, {})
        return await apply_patch(patch, co, s, RUN, **kw)
    return asyncio.run(go())


def statuses(report: ApplyReport) -> dict[str, str]:
    return {f.path: f.status for f in report.files}
