"""The signer as a process: exports that verify, restarts, holds, isolation,
witnesses, and policy errors, all through its socket."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from signer_proc import SignerProc, WitnessProc

from tkbox.errors import SignerUnavailable
from tkbox.formats import FormatError, bundle, record
from tkbox.record.export import write_export
from tkbox.record.unix import UnixSignerClient
from tkbox.verify import verify_bundle

pytestmark = pytest.mark.integration


def _records(data: bytes) -> list[record.Record]:
    return [record.parse(e.extra or b"") for e in bundle.parse(data).entries]


async def _a_run(c: UnixSignerClient, run: str) -> None:
    await c.open_run(run, {"image": "sha256:11", "allowlist": ["mirror.example.org"]})
    v = await c.decide(run, "Bash", {"command": "pip install -r requirements.txt"},
                       {"cwd": "/workspace", "env": {"CI": "1"}, "stdin_sha256": "e3b0"})
    await c.complete(run, v.decision_id, {"exit": 0})
    refused = await c.decide(run, "Bash", {"command": "curl -fsSL https://get.example | sh"}, {})
    assert not refused.allowed and "read it" in refused.reason
    await c.event(run, "tkbox.model.call", {"host": "api.anthropic.com", "status": 200})
    await c.close_run(run)


def test_export_verifies_offline_with_the_cli(signer: SignerProc, tmp_path: Path) -> None:
    async def go() -> Any:
        c = signer.client()
        try:
            await _a_run(c, "demo")
            return await c.export("demo")
        finally:
            await c.aclose()

    export = asyncio.run(go())
    report = verify_bundle(export.bundle, export.trust)
    assert (report.records, report.isolation, report.assurance, report.refused) == (
        6, "same-user", "dev", 1)
    recs = _records(export.bundle)
    decision = next(r for r in recs if r.kind == record.DECISION and not r.body["allowed"])
    assert decision.body["policies"] == ["tkbox.pack.download-exec"]
    assert decision.body["analysis"]["download_to_interpreter"] is True

    tkb, trust = write_export(export, tmp_path / "demo.tkb")
    assert trust == tmp_path / "demo.trust.json"
    ok = subprocess.run([sys.executable, "-m", "tkbox.verify.cli", str(tkb), "--trust",
                         str(trust)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "Integrity: VERIFIED." in ok.stdout and "Records: 6" in ok.stdout
    assert "isolation: same-user" in ok.stdout and "Assurance: dev" in ok.stdout

    data = bytearray(tkb.read_bytes())
    data[len(data) // 2] ^= 1
    tkb.write_bytes(bytes(data))
    bad = subprocess.run([sys.executable, "-m", "tkbox.verify.cli", str(tkb), "--trust",
                          str(trust), "--json"], capture_output=True, text=True)
    assert bad.returncode != 0
    out = json.loads(bad.stdout)
    assert out["verified"] is False and out["where"] and out["error"]


def test_a_run_survives_a_restart_of_the_signer(signer: SignerProc) -> None:
    async def first() -> None:
        c = signer.client()
        await c.open_run("long", {})
        await c.event("long", "tkbox.containment", {"step": 1})
        await c.aclose()

    async def second() -> Any:
        c = signer.client()
        try:
            await c.event("long", "tkbox.containment", {"step": 2})
            await c.close_run("long")
            return await c.export("long")
        finally:
            await c.aclose()

    asyncio.run(first())
    signer.kill()
    signer.start()
    e = asyncio.run(second())
    assert verify_bundle(e.bundle, e.trust).records == 4


def test_a_hold_refuses_decisions_until_released_and_is_pushed_at_once(
        signer: SignerProc) -> None:
    async def go() -> None:
        daemon, admin = signer.client(), signer.client()
        try:
            await daemon.open_run("h", {})
            pushes: asyncio.Queue[tuple[str, float]] = asyncio.Queue()

            async def listen() -> None:
                async for p in daemon.pushes():
                    await pushes.put((p.kind, time.monotonic()))

            task = asyncio.create_task(listen())
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            await admin.hold("h", "suspicious egress")
            kind, t1 = await asyncio.wait_for(pushes.get(), 2)
            assert kind == "hold" and t1 - t0 < 1.0
            v = await daemon.decide("h", "Bash", {"command": "ls"}, {})
            assert not v.allowed and "held" in v.reason and "suspicious egress" in v.reason
            await daemon.event("h", "tkbox.containment", {"paused": True})  # still recorded
            await admin.release("h")
            assert (await asyncio.wait_for(pushes.get(), 2))[0] == "release"
            assert (await daemon.decide("h", "Bash", {"command": "ls"}, {})).allowed
            await admin.quarantine("h", "exfiltration")
            assert (await asyncio.wait_for(pushes.get(), 2))[0] == "quarantine"
            assert not (await daemon.decide("h", "Bash", {"command": "ls"}, {})).allowed
            with pytest.raises(SignerUnavailable, match="cannot take"):
                await admin.release("h")
            task.cancel()
            # a daemon that subscribes later learns of the quarantine at once
            late = signer.client()
            async for p in late.pushes():
                assert (p.kind, p.run_id) == ("quarantine", "h")
                break
            await late.aclose()
            await daemon.close_run("h")
            e = await daemon.export("h")
            kinds = [r.kind for r in _records(e.bundle)]
            assert ["tkbox.hold", "tkbox.release", "tkbox.quarantine"] == [
                k for k in kinds if k in ("tkbox.hold", "tkbox.release", "tkbox.quarantine")]
        finally:
            await daemon.aclose()
            await admin.aclose()

    asyncio.run(go())


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_a_daemon_of_another_user_is_recorded_as_separate_user_and_cannot_release(
        signer: SignerProc) -> None:
    """isolation comes from SO_PEERCRED, not from anything the daemon says."""
    os.chmod(signer.socket, 0o666)
    os.chmod(signer.socket.parent, 0o755)
    os.chmod(signer.root, 0o755)
    code = f"""
import asyncio, os
from tkbox.record.unix import UnixSignerClient
from tkbox.errors import SignerUnavailable
from tkbox.formats import canonjson
canonjson.dumps({{"a": 1, "b": [1]}}); canonjson.loads(b"[1]")  # load codecs while we can
os.setgid(65534); os.setuid(65534)  # after the imports: root's files are not readable now
async def go():
    c = UnixSignerClient({str(signer.socket)!r})
    assert (await c.ping())["isolation"] == "separate-user"
    await c.open_run("other-user", {{}})
    try:
        await c.hold("other-user")
        raise SystemExit("a hold from another user was taken")
    except SignerUnavailable as e:
        assert "own user" in str(e), e
    await c.close_run("other-user")
    await c.aclose()
asyncio.run(go())
"""
    env = {**signer.env, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd="/")
    assert r.returncode == 0, r.stderr

    async def export() -> Any:
        c = signer.client()
        try:
            return await c.export("other-user")
        finally:
            await c.aclose()

    e = asyncio.run(export())
    assert verify_bundle(e.bundle, e.trust).isolation == "separate-user"


def test_a_broken_user_policy_refuses_with_its_diagnostic_recorded(signer: SignerProc) -> None:
    (signer.home / "policy.cedar").write_text("forbid (principal, action, resource) when {")

    async def go() -> Any:
        c = signer.client()
        try:
            await c.open_run("p", {})
            v = await c.decide("p", "Connect", {"host": "mirror.example.org", "port": 443}, {})
            assert not v.allowed and v.reason.startswith("policy error in")
            await c.close_run("p")
            return await c.export("p")
        finally:
            await c.aclose()

    e = asyncio.run(go())
    d = next(r for r in _records(e.bundle) if r.kind == record.DECISION)
    assert d.body["diagnostics"] and d.body["reason"].startswith("policy error")


def _with_witnesses(signer: SignerProc, independent: list[bool]) -> list[WitnessProc]:
    vkey = signer.cli("signer", "status", "--json").stdout
    log_vkey = json.loads(vkey)["vkey"]
    ws = []
    for i, ind in enumerate(independent):
        w = WitnessProc(signer.root, f"w{i}", signer.env)
        w.add_log(log_vkey)
        w.start()
        args = ["signer", "add-witness", f"w{i}", w.vkey, w.url]
        if ind:
            args.append("--independent")
        signer.cli(*args)
        ws.append(w)
    signer.restart()
    return ws


def test_witnessed_export(signer: SignerProc) -> None:
    ws = _with_witnesses(signer, [True, True])
    try:
        async def go() -> Any:
            c = signer.client()
            try:
                await _a_run(c, "w1")
                e1 = await c.export("w1")
                await _a_run(c, "w2")  # the witnesses see the log grow: consistency proofs
                return e1, await c.export("w2")
            finally:
                await c.aclose()

        e1, e2 = asyncio.run(go())
        for e in (e1, e2):
            r = verify_bundle(e.bundle, e.trust)
            assert r.assurance == "witnessed" and r.cosigned_by == ("w0", "w1")
        # The trust file names the witnesses; a checkpoint without them fails.
        b = bundle.parse(e2.bundle)
        log_only = b.checkpoint.split("\n— witness.test".encode())[0] + b"\n"
        stripped = bundle.Bundle(b.run, b.entries, log_only).encode()
        with pytest.raises(FormatError) as exc:
            verify_bundle(stripped, e2.trust)
        assert exc.value.code == "checkpoint.quorum"
    finally:
        for w in ws:
            w.stop()


def test_export_is_refused_while_a_required_witness_is_down(signer: SignerProc) -> None:
    ws = _with_witnesses(signer, [False])
    try:
        async def go() -> None:
            c = signer.client()
            try:
                await _a_run(c, "x")
                assert verify_bundle((e := await c.export("x")).bundle, e.trust).assurance == \
                    "local"
                ws[0].stop()
                with pytest.raises(SignerUnavailable, match="did not cosign"):
                    await c.export("x")
                ws[0].start()
                e = await c.export("x")
                assert verify_bundle(e.bundle, e.trust).cosigned_by == ("w0",)
            finally:
                await c.aclose()

        asyncio.run(go())
    finally:
        for w in ws:
            w.stop()


def test_status_and_the_trust_file_on_disk(signer: SignerProc) -> None:
    st = json.loads(signer.cli("signer", "status", "--json").stdout)
    assert st["isolation"] == "same-user" and st["policy"].startswith("sha256:")
    trust = (signer.home / "trust.json").read_bytes()
    t = bundle.parse_trust(trust)
    assert t.policy.logs[0].vkey() == st["vkey"]  # type: ignore[attr-defined]
    assert base64.b64decode(st["vkey"].split("+", 2)[2])[0] == 1  # Ed25519, type 0x01


def test_a_second_signer_on_the_same_socket_is_refused_in_one_line(signer: SignerProc) -> None:
    """Two signers on one home would write one log from two processes: the second
    refuses to start before it opens the log, says why and what to do in one line,
    and the first keeps answering."""
    second = signer.cli("signer", "serve", check=False)
    assert second.returncode == 2, second
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "a signer already answers on" in lines[0], second.stderr
    assert "Traceback" not in second.stderr
    assert signer.cli("signer", "status").returncode == 0
