"""One conformance suite for every SignerClient: FakeSigner, the real
UnixSignerClient talking to a real `tkbox signer serve` process, and the real
RemoteSignerClient talking to the same over TLS (`--listen`, mutual TLS).

What the daemon relies on: every call durable on return, a run used once,
nothing added to a closed run, a decision id that completes its decision,
SignerUnavailable when the signer is gone, and holds pushed within a second.

The third implementation, TracekitSignerClient in front of a real Tracekit
1.4.2 signer (tests/integration/tracekit/tracekit_proc.py), runs the same
tests; docs/tracekit.md says where its semantics differ.

The fourth, UnrecordedSigner (`--unrecorded`, unsafe), keeps nothing, so some
properties cannot hold for it. Its harness names each one in `CANNOT` with the
reason, and the test asserts what it does instead (never a silent skip): a
property missing from that table must hold for it like for every other.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from remote_kit import Pki
from signer_proc import SignerProc, free_port

sys.path.insert(0, str(Path(__file__).parents[1] / "tracekit"))
from tracekit_proc import TracekitProc, have_tracekit  # noqa: E402

from tkbox.errors import SignerUnavailable, UserError
from tkbox.record.client import Push, SignerClient
from tkbox.record.remote import RemoteSignerClient
from tkbox.record.testing import FakeSigner
from tkbox.record.unrecorded import REASON, UnrecordedSigner

pytestmark = pytest.mark.integration


class Harness:
    client: SignerClient
    make_unavailable: Callable[[], None]
    hold: Callable[[str], None]
    #: property -> why it cannot hold for this implementation (see UnrecordedHarness)
    cannot: dict[str, str] = {}


def cannot(h: Harness, prop: str) -> str | None:
    """Why `prop` cannot hold for `h`'s signer, or None: it must hold."""
    return h.cannot.get(prop)


class FakeHarness(Harness):
    def __init__(self) -> None:
        fake = FakeSigner()
        self.client = fake
        self.make_unavailable = lambda: setattr(fake, "available", False)
        self.hold = lambda run: fake.push(Push("hold", run, "look"))


class UnrecordedHarness(Harness):
    """`tkbox daemon --unrecorded`: UNSAFE, allows and keeps nothing."""

    cannot = {
        "isolation": "no signer process runs, so there is no isolation to state: it says "
                     "'none', which the daemon reports as `--unrecorded`",
        "export": "it keeps no record, so there is no bundle: export is refused with a "
                  "UserError that names --unrecorded",
        "unknown_run": "an unrecorded daemon opens no run, so a door's question about a run "
                       "it never saw must be allowed (the daemon's own rules already ran)",
        "unavailable": "it is the daemon's own object, not a process that can go away: "
                       "every call keeps answering",
        "push": "no signer, no operator: nothing can hold a run, so nothing is pushed",
    }

    def __init__(self) -> None:
        self.client = UnrecordedSigner()
        self.make_unavailable = lambda: None
        self.hold = lambda run: None


class RealHarness(Harness):
    def __init__(self, proc: SignerProc) -> None:
        self.proc = proc
        self.client = proc.client(timeout=5.0)
        self.make_unavailable = proc.kill
        self.hold = lambda run: proc.cli("signer", "hold", run, "--reason", "look")


class RemoteHarness(Harness):
    """`RemoteSignerClient` over TLS (mutual TLS, a client certificate from the CA the
    signer pins) to a real `tkbox signer serve --listen` on loopback."""

    def __init__(self, proc: SignerProc, pki: Pki, port: int) -> None:
        self.proc = proc
        cert, key = pki.issue("conformance", server=False)
        self.client = RemoteSignerClient(f"https://127.0.0.1:{port}", ca=pki.ca_path,
                                         cert=cert, key=key, timeout=5.0, connect_timeout=1.0)
        self.make_unavailable = proc.kill
        self.hold = lambda run: proc.cli("signer", "hold", run, "--reason", "look")


class TracekitHarness(Harness):
    def __init__(self, proc: TracekitProc) -> None:
        self.proc = proc
        self.client = proc.client()
        self.make_unavailable = proc.kill
        self.hold = lambda run: proc.operator("hold", run, "look")


@pytest.fixture(params=["fake", "real", "remote", "tracekit", "unrecorded"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "fake":
        yield FakeHarness()
        return
    if request.param == "unrecorded":
        yield UnrecordedHarness()
        return
    if request.param == "tracekit":
        if not have_tracekit():
            pytest.skip("tracekit-ai is not installed (pip install -e '.[test]')")
        tk = TracekitProc()
        try:
            tk.start()
            yield TracekitHarness(tk)
        finally:
            tk.cleanup()
        return
    proc = SignerProc()
    try:
        if request.param == "remote":
            pki = Pki(tmp_path / "pki")
            cert, key = pki.issue("signer", server=True)
            port = free_port()
            proc.start(serve_args=("--listen", f"127.0.0.1:{port}", "--tls-cert", str(cert),
                                   "--tls-key", str(key), "--client-ca", str(pki.ca_path)))
            yield RemoteHarness(proc, pki, port)
        else:
            proc.start()
            yield RealHarness(proc)
    finally:
        proc.cleanup()


def _run(h: Harness, coro: Callable[[SignerClient], Any]) -> Any:
    async def go() -> Any:
        try:
            return await coro(h.client)
        finally:
            await h.client.aclose()

    return asyncio.run(go())


def test_ping_names_the_signer_and_its_isolation(harness: Harness) -> None:
    async def go(c: SignerClient) -> None:
        info = await c.ping()
        assert info["key"]
        if cannot(harness, "isolation"):
            assert (info["key"], info["isolation"]) == ("unrecorded", "none")
            return
        assert info["isolation"] == "remote" if isinstance(harness, RemoteHarness) else \
            info["isolation"] in ("same-user", "separate-user")

    _run(harness, go)


def test_a_run_from_open_to_export(harness: Harness) -> None:
    async def go(c: SignerClient) -> None:
        await c.open_run("run-1", {"image": "sha256:00", "env": ["HOME"], "limits": {"cpus": 2}})
        v = await c.decide("run-1", "Bash", {"command": "make test"}, {"cwd": "/workspace"})
        assert v.allowed and v.reason and v.decision_id
        v.raise_if_refused()
        await c.complete("run-1", v.decision_id, {"exit": 0})
        await c.event("run-1", "tkbox.secret.use", {"name": "TOKEN", "host": "api.example"})
        w = await c.decide("run-1", "Connect", {"host": "mirror.example.org", "port": 443}, {})
        assert w.allowed
        await c.close_run("run-1")
        if cannot(harness, "export"):
            assert v.reason == w.reason == REASON  # every verdict says it is unrecorded
            with pytest.raises(UserError, match="--unrecorded"):
                await c.export("run-1")
            return
        e = await c.export("run-1")
        assert e.bundle and e.trust

    _run(harness, go)


def test_a_run_id_is_used_once(harness: Harness) -> None:
    async def go(c: SignerClient) -> None:
        await c.open_run("once", {})
        with pytest.raises(SignerUnavailable):
            await c.open_run("once", {})

    _run(harness, go)


def test_nothing_is_added_to_an_unknown_or_closed_run(harness: Harness) -> None:
    async def go(c: SignerClient) -> None:
        if cannot(harness, "unknown_run"):
            await c.event("never-opened", "tkbox.gap", {})
            v = await c.decide("never-opened", "Bash", {"command": "ls"}, {})
            assert v.allowed and v.reason == REASON
        else:
            with pytest.raises(SignerUnavailable):
                await c.event("never-opened", "tkbox.gap", {})
            with pytest.raises(SignerUnavailable):
                await c.decide("never-opened", "Bash", {"command": "ls"}, {})
        await c.open_run("done", {})
        await c.close_run("done")
        with pytest.raises(SignerUnavailable):
            await c.event("done", "tkbox.gap", {})
        with pytest.raises(SignerUnavailable):
            await c.decide("done", "Bash", {"command": "ls"}, {})

    _run(harness, go)


def test_a_signer_that_is_gone_is_unavailable_for_every_call(harness: Harness) -> None:
    async def go(c: SignerClient) -> None:
        await c.open_run("r", {})
        harness.make_unavailable()
        if cannot(harness, "unavailable"):
            assert (await c.ping())["key"]
            assert (await c.decide("r", "Bash", {"command": "ls"}, {})).allowed
            await c.event("r", "tkbox.gap", {})
            await c.complete("r", "r/1", {})
            await c.close_run("r")
            await c.open_run("r2", {})
            return
        for call in (c.ping(), c.decide("r", "Bash", {"command": "ls"}, {}),
                     c.event("r", "tkbox.gap", {}), c.complete("r", "r/1", {}), c.close_run("r"),
                     c.export("r"), c.open_run("r2", {})):
            with pytest.raises(SignerUnavailable):
                await call

    _run(harness, go)


def test_a_hold_is_pushed_within_a_second(harness: Harness) -> None:
    async def go(c: SignerClient) -> None:
        await c.open_run("held", {})
        got: asyncio.Future[tuple[Push, float]] = asyncio.get_running_loop().create_future()

        async def listen() -> None:
            async for p in c.pushes():
                got.set_result((p, time.monotonic()))
                return

        task = asyncio.create_task(listen())
        await asyncio.sleep(0.2)  # subscribed
        if cannot(harness, "push"):
            await asyncio.to_thread(harness.hold, "held")
            await asyncio.sleep(0.2)
            assert not got.done() and not task.done()  # listening, and nothing came
            task.cancel()
            return
        t0 = time.monotonic()
        await asyncio.to_thread(harness.hold, "held")
        push, t1 = await asyncio.wait_for(got, 5)
        assert (push.kind, push.run_id, push.reason) == ("hold", "held", "look")
        assert t1 - t0 < 1.0 + _cli_start_allowance(harness)
        task.cancel()

    _run(harness, go)


def _cli_start_allowance(h: Harness) -> float:
    # The real hold goes through `tkbox signer hold` (a new Python process); the
    # push itself is measured separately in test_signer_process.py.
    return 5.0 if isinstance(h, (RealHarness, RemoteHarness, TracekitHarness)) else 0.0


def test_a_closed_run_stays_closed_for_every_kind_of_record(harness: Harness) -> None:
    """A door that keeps going after its run's close (a completion, a decision) is refused
    by every implementation, the unrecorded one included: code that breaks the run's order
    fails in a debugging session too, not only in production."""
    async def go(c: SignerClient) -> None:
        await c.open_run("closed", {})
        v = await c.decide("closed", "Bash", {"command": "ls"}, {})
        await c.close_run("closed")
        with pytest.raises(SignerUnavailable):
            await c.complete("closed", v.decision_id, {"exit": 0})
        with pytest.raises(SignerUnavailable):
            await c.open_run("closed", {})

    _run(harness, go)
