"""The signer as a network service: a real `tkbox signer serve --listen` over TLS on
loopback, real client certificates, and workload tokens from a real OIDC issuer on
loopback (GitHub's claim names).

Who may record, and what each refusal leaves behind: every refused connection or
token gets one line, and nothing is recorded (the signer's log is the same size
after as before).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from remote_kit import Issuer, Pki
from signer_proc import SignerProc, free_port

from tkbox._clock import FakeClock
from tkbox.errors import SignerUnavailable
from tkbox.record.remote import FileToken, RemoteSignerClient
from tkbox.verify import verify_bundle
from tkbox.verify.cli import render

pytestmark = pytest.mark.integration


class Remote:
    def __init__(self, tmp: Path) -> None:
        self.pki = Pki(tmp / "pki")
        self.other = Pki(tmp / "other", "other-ca")
        self.issuer = Issuer()
        self.cert, self.key = self.pki.issue("signer", server=True)
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.tmp = tmp
        self.proc = SignerProc()

    def start(self) -> None:
        self.proc.start(serve_args=(
            "--listen", f"127.0.0.1:{self.port}", "--tls-cert", str(self.cert),
            "--tls-key", str(self.key), "--client-ca", str(self.pki.ca_path),
            "--oidc-issuer", self.issuer.url, "--oidc-audience", self.issuer.audience))
        deadline = time.monotonic() + 10
        while "listening on https" not in self.proc.read_log():
            assert time.monotonic() < deadline, self.proc.read_log()
            time.sleep(0.05)

    def token_client(self, token: str, **kw: Any) -> RemoteSignerClient:
        f = self.tmp / f"token-{time.monotonic_ns()}"
        f.write_text(token)
        return RemoteSignerClient(self.url, ca=self.pki.ca_path, token=FileToken(f),
                                  timeout=5.0, **kw)

    def cert_client(self, cn: str, pki: Pki | None = None, **kw: Any) -> RemoteSignerClient:
        cert, key = (pki or self.pki).issue(cn, server=False)
        return RemoteSignerClient(self.url, ca=self.pki.ca_path, cert=cert, key=key,
                                  timeout=5.0, **kw)

    def size(self) -> int:
        async def go() -> int:
            c = self.proc.client()
            try:
                return int((await c.status())["size"])
            finally:
                await c.aclose()

        return asyncio.run(go())


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[Remote]:
    r = Remote(tmp_path)
    try:
        r.start()
        yield r
    finally:
        r.proc.cleanup()
        r.issuer.close()


async def _one_run(c: RemoteSignerClient, run: str) -> Any:
    try:
        await c.open_run(run, {"image": "sha256:00"})
        v = await c.decide(run, "Bash", {"command": "make test"}, {"cwd": "/workspace"})
        assert v.allowed
        await c.complete(run, v.decision_id, {"exit": 0})
        await c.close_run(run)
        return await c.export(run)
    finally:
        await c.aclose()


def test_a_github_job_records_over_tls_and_its_bundle_names_the_workload(
        remote: Remote) -> None:
    token = remote.issuer.mint()
    e = asyncio.run(_one_run(remote.token_client(token), "gh-1"))
    rep = verify_bundle(e.bundle, e.trust)
    assert rep.isolation == "remote"
    text = render(rep)
    assert ("Workload: github repo octo-org/octo-repo, workflow agent, ref refs/heads/main, "
            "commit 0123456789abcdef0123456789abcdef01234567, run 4242") in text
    assert "isolation: remote" in text
    assert rep.workload is not None and rep.workload["runner_environment"] == "self-hosted"
    # `tkbox report` says who recorded it at the top of the page, before anything else.
    from tkbox.report.html import render_html
    from tkbox.report.timeline import build_report

    page = render_html(build_report(e.bundle, e.trust))
    top = page.index('id="workload"')
    assert top < page.index("<main>")
    assert "Workload: github repo octo-org/octo-repo, workflow agent" in page[top:]
    # The token itself is never recorded: only the claims the signer checked.
    records = b"".join(base64.b64decode(line[6:]) for line in e.bundle.splitlines()
                       if line.startswith(b"extra "))
    assert b'"kind":"github"' in records
    for part in token.split("."):
        assert part.encode() not in records


def test_a_daemon_with_a_client_certificate_records_over_tls(remote: Remote) -> None:
    e = asyncio.run(_one_run(remote.cert_client("daemon-a"), "cert-1"))
    rep = verify_bundle(e.bundle, e.trust)
    assert rep.isolation == "remote"
    assert rep.workload_line.startswith("client certificate CN=daemon-a (sha256 ")
    st = remote.proc.cli("signer", "status").stdout
    assert f"network:   {remote.url} (0 daemons connected)" in st


def test_two_daemons_one_signer_one_log(remote: Remote) -> None:
    async def go() -> None:
        a, b = remote.cert_client("host-a"), remote.token_client(remote.issuer.mint())
        try:
            await asyncio.gather(a.open_run("a-1", {}), b.open_run("b-1", {}))
            for i in range(20):
                await asyncio.gather(a.event("a-1", "tkbox.note", {"i": i}),
                                     b.event("b-1", "tkbox.note", {"i": i}))
            # Neither may write to the other's run.
            for c, other in ((a, "b-1"), (b, "a-1")):
                with pytest.raises(SignerUnavailable, match="belongs to another workload"):
                    await c.event(other, "tkbox.note", {"x": 1})
            await asyncio.gather(a.close_run("a-1"), b.close_run("b-1"))
            ea, eb = await asyncio.gather(a.export("a-1"), b.export("b-1"))
            ra, rb = verify_bundle(ea.bundle, ea.trust), verify_bundle(eb.bundle, eb.trust)
            assert ra.records == rb.records == 22
            assert ra.origin == rb.origin and ra.log_key == rb.log_key  # one log
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(go())


def _refused(remote: Remote, client: RemoteSignerClient, match: str) -> str:
    before = remote.size()

    async def go() -> str:
        try:
            await client.open_run(f"refused-{time.monotonic_ns()}", {})
        except SignerUnavailable as exc:
            return str(exc)
        finally:
            await client.aclose()
        raise AssertionError("the signer took it")

    why = asyncio.run(go())
    assert "\n" not in why
    assert match in why, why
    assert remote.size() == before, "a refused connection recorded something"
    return why


def test_a_token_for_another_audience_is_refused(remote: Remote) -> None:
    _refused(remote, remote.token_client(remote.issuer.mint(aud="someone-else")),
             "for another audience")


def test_an_expired_token_is_refused(remote: Remote) -> None:
    now = int(time.time())
    _refused(remote, remote.token_client(remote.issuer.mint(iat=now - 900, exp=now - 300)),
             "expired")


def test_a_not_yet_valid_token_is_refused(remote: Remote) -> None:
    now = int(time.time())
    _refused(remote, remote.token_client(remote.issuer.mint(iat=now, nbf=now + 600,
                                                            exp=now + 900)),
             "not valid yet")


def test_a_forged_token_is_refused(remote: Remote) -> None:
    from joserfc.jwk import RSAKey

    forger = RSAKey.generate_key(2048, parameters={"kid": "k1"})  # same kid, other key
    token = remote.issuer.mint(key=forger)
    why = _refused(remote, remote.token_client(token), "signature does not verify")
    assert token not in why and token[-20:] not in remote.proc.read_log()


def test_a_replayed_token_cannot_open_a_second_run(remote: Remote) -> None:
    token = remote.issuer.mint()
    asyncio.run(_one_run(remote.token_client(token), "first"))
    _refused(remote, remote.token_client(token), "opened run first already")


def test_a_token_of_another_repository_cannot_write_to_a_run(remote: Remote) -> None:
    async def go() -> None:
        a = remote.token_client(remote.issuer.mint())
        b = remote.token_client(remote.issuer.mint(repository="evil/repo", run_id="1"))
        try:
            await a.open_run("mine", {})
            with pytest.raises(SignerUnavailable, match="belongs to another workload"):
                await b.decide("mine", "Bash", {"command": "true"}, {})
            with pytest.raises(SignerUnavailable, match="belongs to another workload"):
                await b.close_run("mine")
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(go())


def test_a_daemon_on_the_signers_own_socket_cannot_write_into_a_remote_run(
        remote: Remote) -> None:
    """The remote run's records say which workload made them: no local peer adds to it."""
    async def go() -> None:
        a = remote.token_client(remote.issuer.mint())
        local = remote.proc.client(timeout=5.0)
        try:
            await a.open_run("theirs", {})
            with pytest.raises(SignerUnavailable, match="belongs to a remote workload"):
                await local.event("theirs", "tkbox.note", {"forged": True})
            with pytest.raises(SignerUnavailable, match="belongs to a remote workload"):
                await local.close_run("theirs")
        finally:
            await a.aclose()
            await local.aclose()

    asyncio.run(go())


def test_a_client_certificate_from_another_ca_is_refused(remote: Remote) -> None:
    # Refused in the handshake (TLS 1.3: the client learns it at its first read).
    _refused(remote, remote.cert_client("intruder", pki=remote.other), "this daemon's")


def test_a_signer_whose_certificate_is_not_pinned_is_refused(remote: Remote) -> None:
    cert, key = remote.pki.issue("d", server=False)
    c = RemoteSignerClient(remote.url, ca=remote.other.ca_path, cert=cert, key=key, timeout=5.0)
    _refused(remote, c, "is not the one --signer-ca vouches for")


def test_a_connection_that_proves_nothing_may_only_ping(remote: Remote) -> None:
    """Without a certificate or a token, a TLS connection gets no run opened."""
    import ssl

    from tkbox.formats import wire

    async def go() -> list[dict[str, Any]]:
        ctx = ssl.create_default_context(cafile=str(remote.pki.ca_path))
        r, w = await asyncio.open_connection("127.0.0.1", remote.port, ssl=ctx)
        try:
            w.write(wire.encode({"id": 1, "op": "ping"}) + wire.encode(
                {"id": 2, "op": "open", "run": "x", "facts": {}}) + wire.encode(
                {"id": 3, "op": "hold", "run": "x", "reason": ""}))
            d, out = wire.Decoder(), []
            while len(out) < 3:
                d.feed(await r.read(65536))
                while (f := d.next()) is not None:
                    out.append(f)
            return sorted(out, key=lambda f: f["id"])
        finally:
            w.close()
            try:
                await asyncio.wait_for(w.wait_closed(), 2)
            except (TimeoutError, OSError, ssl.SSLError):
                w.transport.abort()

    before = remote.size()
    out = asyncio.run(go())
    assert out[0]["ok"] is True and out[0]["result"]["isolation"] == "remote"
    assert out[1]["ok"] is False and "authenticate first" in out[1]["error"]
    assert out[2]["ok"] is False
    assert remote.size() == before


def test_a_clock_out_of_range_refuses_the_connection(remote: Remote) -> None:
    clock = FakeClock(wall=time.time() + 3600)  # this host an hour ahead of the signer
    _refused(remote, remote.cert_client("skewed", clock=clock), "clock")


def test_a_signer_that_drops_mid_batch_fails_closed_and_takes_the_gap_when_back(
        remote: Remote) -> None:
    token = remote.issuer.mint()

    async def go() -> None:
        c = remote.token_client(token, connect_timeout=1.0)
        try:
            await c.open_run("drop", {})
            acked: list[int] = []

            async def writer(k: int) -> None:  # 8 in flight until the cut
                for i in range(100_000):
                    try:
                        await c.event("drop", "tkbox.note", {"i": i * 8 + k})
                    except SignerUnavailable:
                        return
                    acked.append(i * 8 + k)

            async def cut() -> None:
                await asyncio.sleep(0.3)
                await asyncio.to_thread(remote.proc.kill)

            await asyncio.wait_for(asyncio.gather(*(writer(k) for k in range(8)), cut()), 30)
            assert acked, "nothing was acknowledged before the cut"
            with pytest.raises(SignerUnavailable, match="does not answer"):
                await c.event("drop", "tkbox.note", {"after": True})
            # The same token continues its own run (a reconnect).
            await asyncio.to_thread(remote.start)
            await c.event("drop", "tkbox.gap", {"reason": "the signer dropped mid-batch"})
            await c.close_run("drop")
            e = await c.export("drop")
            rep = verify_bundle(e.bundle, e.trust)
            assert rep.kinds["tkbox.gap"] == 1
            kept = {json.loads(base64.b64decode(line[6:]))["body"].get("i")
                    for line in e.bundle.splitlines() if line.startswith(b"extra ")}
            assert set(acked) <= kept, "an acknowledged record was lost"
        finally:
            await c.aclose()

    asyncio.run(go())


def test_a_remote_runs_bundle_needs_k_of_n_witnesses(remote: Remote) -> None:
    """Witnesses as their own services (`tkbox witness serve`): the trust file requires
    2 of 3; with one down the export is still cosigned by a quorum (witnessed), and a
    checkpoint carrying one cosignature does not verify."""
    import json

    from signer_proc import WitnessProc

    from tkbox.formats import FormatError, bundle

    p = remote.proc
    vkey = json.loads(p.cli("signer", "status", "--json").stdout)["vkey"]
    ws = []
    try:
        for i in range(3):
            w = WitnessProc(p.root, f"w{i}", p.env)
            w.add_log(vkey)
            w.start()
            p.cli("signer", "add-witness", f"w{i}", w.vkey, w.url, "--independent",
                  *(("--quorum", "2") if i == 2 else ()))
            ws.append(w)
        p.stop()
        remote.start()
        ws[1].stop()
        e = asyncio.run(_one_run(remote.token_client(remote.issuer.mint()), "k-of-n"))
        rep = verify_bundle(e.bundle, e.trust)
        assert (rep.assurance, rep.cosigned_by, rep.isolation) == \
            ("witnessed", ("w0", "w2"), "remote")
        assert "group witnesses 2 w0 w1 w2" in bundle.parse_trust(e.trust).policy.text()
        b = bundle.parse(e.bundle)
        one = b.checkpoint.rsplit(b"\n\xe2\x80\x94 witness.test/w2", 1)[0] + b"\n"
        with pytest.raises(FormatError) as exc:
            verify_bundle(bundle.Bundle(b.run, b.entries, one).encode(), e.trust)
        assert exc.value.code == "checkpoint.quorum"
    finally:
        for w in ws:
            w.stop()


def test_a_signer_that_stops_answering_refuses_the_next_decision(remote: Remote) -> None:
    """SIGSTOP: the connection is up, nothing answers. The decision is refused when
    its timeout ends (nothing is allowed unrecorded), and once the signer answers
    again the client connects anew and goes on."""
    import os
    import signal

    async def go() -> None:
        c = remote.cert_client("hung", connect_timeout=1.0)
        c.timeout = 1.0
        try:
            await c.open_run("hung", {})
            assert remote.proc.proc is not None
            os.kill(remote.proc.proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(SignerUnavailable, match="did not answer decide within 1 s"):
                    await c.decide("hung", "Bash", {"command": "true"}, {})
                with pytest.raises(SignerUnavailable):
                    await c.decide("hung", "Bash", {"command": "true"}, {})
            finally:
                os.kill(remote.proc.proc.pid, signal.SIGCONT)
            c.timeout = 5.0
            v = await c.decide("hung", "Bash", {"command": "true"}, {})
            assert v.allowed
        finally:
            await c.aclose()

    asyncio.run(go())


def test_a_listen_address_in_use_is_one_line_and_no_half_started_signer(
        remote: Remote) -> None:
    """A second signer told to listen where the first does: one line, exit status 2,
    and its socket is not left behind."""
    other = SignerProc()
    try:
        r = other.cli("signer", "serve", "--listen", f"127.0.0.1:{remote.port}",
                      "--tls-cert", str(remote.cert), "--tls-key", str(remote.key),
                      "--client-ca", str(remote.pki.ca_path), check=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2, r.stderr
        assert lines[-1].startswith("tkbox: error: cannot listen on"), r.stderr
        assert "Traceback" not in r.stderr
        assert not other.socket.exists()
    finally:
        other.cleanup()
