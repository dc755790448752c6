"""`tkbox witness serve` cosigns a Tracekit signer's checkpoints (C2SP
tlog-witness), and a bundle exported by tkbox then verifies with `Assurance:
witnessed` under a trust file that requires the witness."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from tracekit_proc import TracekitProc, have_tracekit

from tkbox.record.tracekit_setup import init_dev

sys.path.insert(0, str(Path(__file__).parents[1] / "signer"))
from signer_proc import WitnessProc  # noqa: E402

pytestmark = pytest.mark.integration


def test_a_tkbox_witness_cosigns_tracekit_and_the_trust_file_requires_it(tmp_path: Path) -> None:
    if not have_tracekit():
        pytest.skip("tracekit-ai is not installed (pip install -e '.[test]')")
    tk = TracekitProc()
    witness = WitnessProc(tmp_path, "w1", {**os.environ, "TKBOX_HOME": str(tmp_path / "tkh")})
    try:
        tk.start()  # creates the log key
        tk.stop()
        log_vkey = (tk.setup.home / "data" / "log.vkey").read_text().split()[0]
        witness.add_log(log_vkey)
        witness.start()
        tk.setup = init_dev(tk.setup.home, webhook_port=tk.setup.webhook_port,
                            http_port=tk.setup.http_port,
                            witnesses=[{"url": witness.url, "vkey": witness.vkey,
                                        "class": "customer"}])
        tk.start()
        c = tk.client()

        async def go() -> tuple[bytes, bytes]:
            try:
                await c.open_run("wit", {"image": "sha256:00"})
                v = await c.decide("wit", "Bash", {"command": "make"}, {})
                await c.complete("wit", v.decision_id, {"exit": 0})
                await c.close_run("wit")
                e = await c.export("wit")
                return e.bundle, e.trust
            finally:
                await c.aclose()
        bundle, trust = asyncio.run(go())
        assert b'"witnesses_required": 1' in trust
        (tmp_path / "w.tkb").write_bytes(bundle)
        (tmp_path / "w.trust.json").write_bytes(trust)
        p = tk.tracekit("verify", str(tmp_path / "w.tkb"), "--trust",
                        str(tmp_path / "w.trust.json"))
        assert "Integrity: VERIFIED." in p.stdout, p.stdout + p.stderr
        assert "Assurance: witnessed" in p.stdout, p.stdout
        assert "by witness.test/w1" in p.stdout, p.stdout
    finally:
        witness.stop()
        tk.cleanup()
