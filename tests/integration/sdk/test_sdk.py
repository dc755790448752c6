"""The SDK against the real daemon API on a Unix socket (fake VMs, real BoxManager)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sdk_daemon import SdkDaemon

import tkbox
from tkbox.errors import HostError, UserError
from tkbox.sdk import AsyncClient, Chunk, Client, ExecResult


def test_a_whole_job_through_the_sync_client(daemon: SdkDaemon, ws: Path, tmp_path: Path):
    with tkbox.Client(daemon.socket) as c:
        box = c.run(name="job-1", image="tkbox/default", workspace=ws, allow=["pypi"],
                    env={"CI": "1"})
        assert box.info.state == "running" and box.info.run_id.startswith("job-1-")
        s = box.exec_stream(["pytest", "-x"])
        chunks = list(s)
        assert [c.fd for c in chunks] == [1, 2]
        assert chunks[0].text == "pytest -x\n"
        assert s.result is not None and s.result.status == 0 and s.result.ok
        r = box.exec(["false"])
        assert (r.status, r.stdout, r.stderr) == (3, b"false\n", b"to stderr\n")
        assert not r.ok
        assert [b.name for b in c.boxes()] == ["job-1"]
        info = box.stop()
        assert info.state == "stopped" and info.raw["patch"]["bytes"] == len(box.patch())
        dry = box.apply(dry_run=True)
        assert dry.dry_run and [f.path for f in dry.files] == ["hello.txt"]
        assert not (ws / "hello.txt").exists()
        out = c.export(box, tmp_path / "job.tkb")
        assert out.bundle.read_bytes() and out.trust.name == "job.trust.json"
        assert c.box("job-1").info.state == "exported"
    kinds = [r["kind"] for r in daemon.signer.records]
    assert "tkbox.box.stop" in kinds


def test_the_async_client_runs_the_same_job(daemon: SdkDaemon, ws: Path, tmp_path: Path):
    async def main() -> None:
        async with tkbox.AsyncClient(daemon.socket) as c:
            box = await c.run(name="job-a", workspace=ws)
            items = [i async for i in box.exec_stream(["echo", "hi"])]
            assert isinstance(items[0], Chunk) and items[0].text == "echo hi\n"
            assert isinstance(items[-1], ExecResult) and items[-1].status == 0
            assert (await box.exec(["false"])).status == 3
            await box.stop()
            assert (await box.apply()).files[0].path == "hello.txt"
            assert (await box.patch()).startswith(b"diff --git")
            out = await c.export(box, tmp_path / "a.tkb")
            assert out.bundle.exists()
            assert (await c.box("job-a")).info.state == "exported"

    asyncio.run(main())


def test_errors_are_the_cli_error_tree(daemon: SdkDaemon, ws: Path):
    with Client(daemon.socket) as c:
        with pytest.raises(UserError, match="no box named 'nope'"):
            c.box("nope")
        box = c.run(name="dup", workspace=ws)
        with pytest.raises(UserError, match="exists already"):
            c.run(name="dup", workspace=ws)
        with pytest.raises(UserError, match="cannot apply box dup: it is running"):
            box.apply()
        with pytest.raises(UserError, match="list of arguments"):
            box.exec("ls -l")  # type: ignore[arg-type]
        with pytest.raises(UserError, match="never the value itself"):
            c.run(name="s", workspace=ws, secrets={"KEY": "sk-live-123"})


def test_no_daemon_is_a_one_line_host_error(tmp_path: Path):
    with Client(tmp_path / "none.sock") as c, pytest.raises(HostError) as e:
        c.boxes()
    assert "not running" in str(e.value) and "tkbox daemon" in str(e.value)
    assert "\n" not in str(e.value)

    async def main() -> None:
        async with AsyncClient(tmp_path / "none.sock") as c:
            await c.info()

    with pytest.raises(HostError, match="not running"):
        asyncio.run(main())
