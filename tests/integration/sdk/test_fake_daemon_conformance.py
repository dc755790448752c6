"""`tkbox.sdk.testing.FakeDaemon` answers as the real API does, for what it fakes.

One script of SDK calls runs against the real daemon API (`SdkDaemon`: the real
`BoxManager` and API, fake VMs) and against the fake given the same patch; what the
SDK returns (states, output, the files `apply` decides, every refusal's type and
words) must be the same, and every field the fake puts in a box is one the real API
sends. A fake that drifts from the daemon fails here, not in a user's test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sdk_daemon import PATCH, SdkDaemon

from tkbox.errors import TkboxError
from tkbox.sdk import Client, ExecResult
from tkbox.sdk.testing import FakeDaemon


def as_the_test_guest(argv: list[str]) -> ExecResult:
    """What `SdkDaemon`'s guest does with a command: its argv on stdout, a line on
    stderr, exit 0 (the fake is given the same command, so the API is what differs)."""
    return ExecResult(0, stdout=" ".join(argv).encode() + b"\n", stderr=b"to stderr\n")


def script(c: Client, ws: Path, out: Path) -> tuple[list[Any], set[str]]:
    seen: list[Any] = []
    keys: set[str] = set()

    def note(fn: Any) -> Any:
        try:
            value = fn()
        except TkboxError as exc:
            seen.append((type(exc).__name__, str(exc)))
            return None
        seen.append(value)
        return value

    box = c.run(workspace=ws, name="same")
    keys |= set(box.info.raw)
    seen.append(box.info.state)
    note(lambda: c.run(workspace=ws, name="same"))
    note(lambda: c.box("nope"))
    note(lambda: box.patch())
    note(lambda: box.rm())
    r = box.exec(["echo", "hi"])
    seen.append((r.status, r.stdout, r.stderr, r.command))
    stopped = box.stop()
    keys |= set(stopped.raw)
    seen.append(stopped.state)
    note(lambda: box.exec(["true"]))
    seen.append(box.patch() == PATCH)
    applied = box.apply(dry_run=True, with_patch=True)
    seen.append([(f.path, f.kind, f.status) for f in applied.files])
    seen.append(applied.patch == PATCH)
    seen.append(sorted(applied.raw) == sorted({"checkout", "patch_sha256", "dry_run",
                                                "allow_sensitive", "files", "counts",
                                                "notes"} & set(applied.raw)))
    box.export(out / "same.tkb")
    seen.append(box.refresh().state)
    note(lambda: box.export(out / "again.tkb"))
    seen.append(c.approvals())
    box.rm()
    seen.append([b.name for b in c.boxes()])
    return seen, keys


def test_the_fake_daemon_answers_as_the_real_api(daemon: SdkDaemon, ws: Path,
                                                 tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "fake").mkdir()
    with Client(daemon.socket) as c:
        real, real_keys = script(c, ws, tmp_path / "real")
    with Client(transport=FakeDaemon(patch=PATCH, commands=as_the_test_guest).transport()) as c:
        fake, fake_keys = script(c, ws, tmp_path / "fake")
    assert fake == real
    assert fake_keys <= real_keys, fake_keys - real_keys
    assert any(isinstance(s, tuple) and s[0] == "UserError" for s in real)  # refusals ran
