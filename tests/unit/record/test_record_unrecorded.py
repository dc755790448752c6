"""`UnrecordedSigner` (`--unrecorded`): unsafe, says so, keeps nothing, stays bounded.

Its behaviour as a SignerClient is checked by the signer conformance suite
(tests/integration/signer/test_signer_conformance.py); these are what it adds.
"""

from __future__ import annotations

import asyncio

import pytest

from tkbox.errors import SignerRefused, SignerUnavailable, UserError
from tkbox.record.client import SignerClient
from tkbox.record.unrecorded import MAX_RUNS, REASON, UnrecordedSigner


def test_it_says_unrecorded_wherever_it_answers() -> None:
    async def go() -> None:
        s: SignerClient = UnrecordedSigner()
        who = await s.ping()
        assert who["key"] == "unrecorded" and who["unrecorded"] is True
        v = await s.decide("r", "Connect", {"host": "example.org", "port": 443}, {})
        assert v.allowed and "--unrecorded" in v.reason and v.reason == REASON
        with pytest.raises(UserError, match="--unrecorded"):
            await s.export("r")

    asyncio.run(go())


def test_a_long_running_unrecorded_daemon_does_not_grow() -> None:
    """Memory exhaustion: `--unrecorded` holds no records, and only a bounded number of run
    ids, so a daemon left running for days (or a flood of runs) cannot grow by it. The
    oldest forgotten run is treated as never seen."""
    async def go() -> None:
        s = UnrecordedSigner(max_runs=8)
        for i in range(1000):
            await s.open_run(f"r{i}", {"big": "x" * 1000})
            await s.event(f"r{i}", "tkbox.model.call", {"body": "y" * 1000})
            await s.close_run(f"r{i}")
        assert len(s._runs) == 8
        assert sum(len(k) for k in s._runs) < 100  # run ids only: no facts, no bodies
        with pytest.raises(SignerRefused):
            await s.event("r999", "tkbox.gap", {})  # recent: still known closed
        await s.event("r0", "tkbox.gap", {})  # long forgotten: as if never seen
        assert MAX_RUNS >= 1024  # the default leaves room for every box of a busy host

    asyncio.run(go())


def test_a_closed_run_refuses_like_the_real_signer() -> None:
    """Nothing is added after a close, and a run id is opened once, with the same error
    type as the real signer's (a SignerRefused is a SignerUnavailable: fail closed)."""
    async def go() -> None:
        s = UnrecordedSigner()
        await s.open_run("a", {})
        await s.close_run("a")
        for call in (s.decide("a", "Bash", {"command": "ls"}, {}), s.complete("a", "x", {}),
                     s.event("a", "tkbox.gap", {}), s.open_run("a", {})):
            with pytest.raises(SignerRefused) as info:
                await call
            assert isinstance(info.value, SignerUnavailable)

    asyncio.run(go())
