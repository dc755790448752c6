"""`tkbox.sdk.testing.FakeDaemon`: users' tests drive `tkbox.Client` with no daemon.

The example of docs/sdk.md's "Testing code that uses the SDK" runs here as written,
with no daemon at all (no socket exists under this test's runtime directory).
`tests/integration/sdk/test_fake_daemon_conformance.py` checks the fake against the real API.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tkbox import AsyncClient, Client
from tkbox.errors import UserError
from tkbox.sdk import ExecResult
from tkbox.sdk.testing import PLACEHOLDER_BUNDLE, FakeDaemon

DOC = Path(__file__).resolve().parents[3] / "docs" / "sdk.md"
PATCH = (b"diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n"
         b"+++ b/new.txt\n@@ -0,0 +1 @@\n+x\n"
         b"diff --git a/old.txt b/old.txt\n--- a/old.txt\n+++ b/old.txt\n@@ -1 +1 @@\n-a\n+b\n")


def test_the_docs_example_runs_without_a_daemon(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    section = DOC.read_text().split("## Testing code that uses the SDK", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.S)
    assert example is not None
    monkeypatch.setenv("TKBOX_RUNTIME", str(tmp_path / "no-daemon-here"))
    monkeypatch.chdir(tmp_path)
    exec(compile(example.group(1), "docs/sdk.md testing example", "exec"), {})
    assert capsys.readouterr().out.splitlines() == [
        "(True, ['app.py'])", "('POST', '/v1/boxes/box-1/exec')"]


def test_a_box_goes_through_the_daemons_lifecycle(tmp_path: Path) -> None:
    daemon = FakeDaemon(patch=PATCH)
    with Client(transport=daemon.transport()) as c:
        box = c.run(workspace=tmp_path, name="job")
        assert box.info.state == "running" and [b.name for b in c.boxes()] == ["job"]
        with pytest.raises(UserError, match="a box named 'job' exists already"):
            c.run(workspace=tmp_path, name="job")
        with pytest.raises(UserError, match="box job has no saved patch: it is running"):
            box.patch()
        with pytest.raises(UserError, match="box job is running; stop it first"):
            box.rm()
        assert box.exec(["echo", "hi"]).stdout == b"echo hi\n"
        assert box.stop().state == "stopped" and box.patch() == PATCH
        with pytest.raises(UserError, match="cannot exec in box job: it is stopped"):
            box.exec(["true"])
        applied = box.apply(dry_run=True, with_patch=True)
        assert [(f.path, f.kind, f.status) for f in applied.files] == [
            ("new.txt", "added", "would apply"), ("old.txt", "modified", "would apply")]
        assert applied.patch == PATCH
        exported = box.export(tmp_path / "job.tkb")
        assert exported.bundle.read_bytes() == PLACEHOLDER_BUNDLE
        assert box.refresh().state == "exported"
        with pytest.raises(UserError, match="cannot export box job: it is exported"):
            box.export(tmp_path / "again.tkb")
        box.rm()
        with pytest.raises(UserError, match="no box named 'job'"):
            c.box("job")
    assert daemon.requests[0] == ("POST", "/v1/boxes")


def test_the_async_client_takes_the_same_fake() -> None:
    daemon = FakeDaemon(commands=lambda argv: ExecResult(3, stderr=b"boom\n"))

    async def go() -> ExecResult:
        async with AsyncClient(transport=daemon.transport()) as c:
            box = await c.run()
            return await box.exec(["make"])

    assert asyncio.run(go()) == ExecResult(3, None, None, b"", b"boom\n", "make")
