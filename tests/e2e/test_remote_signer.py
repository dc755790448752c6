"""One remote signer, two daemons, real VMs: the record no runner can rewrite.

The signer host (its own TKBOX_HOME) runs `tkbox signer serve --listen` over TLS on
loopback, taking client certificates from a pinned CA and GitHub-style workload
tokens from an OIDC issuer on loopback (tests/integration/signer/remote_kit.py), and
has its checkpoints cosigned by a witness that runs as its own service
(`tkbox witness serve`), required by the trust file.

- Daemon A (its own state directory) is a GitHub job: the Action's own script
  (`action/run.py`) with `signer-url`, `signer-ca` and `signer-trust` (the
  operator's trust file, pinned in the repository), and the runner's id-token
  endpoint in its environment. No signer runs on its side; its bundle verifies
  against the operator's trust file with `isolation: remote`, the workload, and
  `Assurance: witnessed`.
- Daemon B (another state directory) records by its client certificate, and its
  signer drops mid-run: the running command's completion cannot be kept, so the box
  stops; with the signer back, the loss is in the bundle as `tkbox.gap`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_stack import TKBOX, Stack, export_verified, fresh_name, make_home, stack_env

sys.path.insert(0, str(Path(__file__).parents[1] / "integration" / "signer"))
from remote_kit import Issuer, Pki  # noqa: E402
from signer_proc import WitnessProc, free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class World:
    tmp: Path
    signer: Stack  # the signer host
    issuer: Issuer
    pki: Pki
    url: str
    trust: Path  # the operator's trust file
    witness: WitnessProc

    def start_signer(self) -> None:
        s = self.signer
        seen = s.log_tail("signer", 1 << 20).count("listening on https")
        cert, key = self.pki.root / "signer.pem", self.pki.root / "signer.key"
        proc = s.start("signer", "signer", "serve", "--listen", self.url[len("https://"):],
                       "--tls-cert", str(cert), "--tls-key", str(key),
                       "--client-ca", str(self.pki.ca_path), "--oidc-issuer", self.issuer.url,
                       "--oidc-audience", self.issuer.audience)
        deadline = time.monotonic() + 60
        while s.log_tail("signer", 1 << 20).count("listening on https") <= seen:
            assert proc.poll() is None and time.monotonic() < deadline, s.log_tail("signer")
            time.sleep(0.1)

    def kill_signer(self) -> None:
        proc = self.signer.procs.pop("signer")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("remote")
    pki = Pki(tmp / "pki")
    pki.issue("signer", server=True)
    issuer = Issuer()
    (tmp / "signer-host").mkdir()
    home = make_home(tmp / "signer-host")
    s = Stack(home, stack_env(home))
    s.tk("signer", "init", "--dev")
    from tkbox.formats import bundle

    t = bundle.parse_trust((home / "signer" / "trust.json").read_bytes())
    vkey = t.policy.logs[0].vkey()  # type: ignore[attr-defined]
    w = WitnessProc(tmp, "w0", s.env)
    w.add_log(vkey)
    w.start()
    s.tk("signer", "add-witness", "w0", w.vkey, w.url, "--independent")
    trust = tmp / "repo-pinned.trust.json"  # what the operator commits to the repository
    s.tk("signer", "trust", "-o", str(trust))
    world = World(tmp, s, issuer, pki, f"https://127.0.0.1:{free_port()}", trust, w)
    try:
        world.start_signer()
        yield world
    finally:
        for p in list(s.procs):
            s.stop(p)
        w.stop()
        issuer.close()


def _workspace(tmp: Path) -> Path:
    ws = tmp / f"ws-{fresh_name('w')}"
    ws.mkdir()
    (ws / "README.md").write_text("hello\n")
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    return ws


def test_a_github_job_records_into_the_remote_signer(world: World) -> None:
    """Daemon A: the Action's script, as a job with `permissions: id-token: write`."""
    (world.tmp / "daemon-a").mkdir()
    home = make_home(world.tmp / "daemon-a")
    env = stack_env(home)
    ws = _workspace(world.tmp)
    (ws / "ci").mkdir()
    pinned_ca = ws / "ci" / "signer-ca.pem"
    pinned_ca.write_bytes(world.pki.ca_path.read_bytes())
    pinned_trust = ws / "ci" / "tkbox.trust.json"
    pinned_trust.write_bytes(world.trust.read_bytes())
    temp = world.tmp / "runner-temp"
    temp.mkdir()
    out = world.tmp / "github_output"
    out.write_text("")
    env.update({
        "GITHUB_WORKSPACE": str(ws), "GITHUB_OUTPUT": str(out),
        "GITHUB_STEP_SUMMARY": str(world.tmp / "summary.md"), "RUNNER_TEMP": str(temp),
        "ACTIONS_ID_TOKEN_REQUEST_URL": world.issuer.request_url,
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN": world.issuer.request_token,
        "INPUT_AGENT": "command", "INPUT_PROMPT": "write the answer",
        "INPUT_AGENT_COMMAND": "echo 42 > answer.txt", "INPUT_IMAGE": "tkbox/default",
        "INPUT_APPLY": "false", "INPUT_TIMEOUT": "600", "INPUT_MEMORY": "1024",
        "INPUT_SIGNER_URL": world.url, "INPUT_SIGNER_CA": str(pinned_ca),
        "INPUT_SIGNER_TRUST": str(pinned_trust), "INPUT_SIGNER_AUDIENCE": world.issuer.audience,
    })
    r = subprocess.run([sys.executable, str(ROOT / "action" / "run.py")], env=env,
                       capture_output=True, text=True, timeout=1800, cwd=ws)
    assert r.returncode == 0, r.stdout + r.stderr + (home / "daemon.log").read_text()[-3000:] \
        if (home / "daemon.log").exists() else r.stdout + r.stderr
    o = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert o["trust"] == str(pinned_trust)  # the operator's, not one the job made
    assert not (home / "signer").exists(), "a signer was made on the runner"
    assert world.issuer.requests >= 1  # the daemon asked the runner for its id-token
    v = subprocess.run([*TKBOX, "verify", o["bundle"], "--trust", str(pinned_trust)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr
    assert "Integrity: VERIFIED." in v.stdout
    assert "isolation: remote" in v.stdout
    assert ("Workload: github repo octo-org/octo-repo, workflow agent, ref refs/heads/main, "
            "commit 0123456789abcdef0123456789abcdef01234567, run 4242") in v.stdout
    assert "Assurance: witnessed" in v.stdout and "w0" in v.stdout
    summary = (world.tmp / "summary.md").read_text()
    assert "Workload: github repo octo-org/octo-repo" in summary
    assert Path(o["patch"]).read_text().count("+42") == 1


def test_a_second_daemon_by_certificate_and_a_signer_that_drops_mid_run(world: World) -> None:
    """Daemon B (its own state directory, a client certificate): while a command
    runs, the signer is killed; the command's completion cannot be kept, so the box
    stops; with the signer back the loss is recorded as a gap, and the bundle
    verifies with its workload."""
    cert, key = world.pki.issue("daemon-b", server=False)
    (world.tmp / "daemon-b").mkdir()
    home = make_home(world.tmp / "daemon-b")
    b = Stack(home, stack_env(home))
    b.start_daemon("--signer", world.url, "--signer-ca", str(world.pki.ca_path),
                   "--signer-cert", str(cert), "--signer-key", str(key))
    name = fresh_name("remote")
    try:
        b.tk("run", "--name", name, "--workspace", str(_workspace(world.tmp)))
        assert b.tk("exec", name, "--", "sh", "-c", "echo before").stdout == "before\n"
        with subprocess.Popen([*TKBOX, "exec", name, "--", "sh", "-c",
                               "echo ready; read go; echo after"],
                              env=b.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) as proc:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline() == b"ready\n"
            world.kill_signer()
            proc.stdin.write(b"go\n")
            proc.stdin.close()
            proc.wait(180)
        deadline = time.monotonic() + 60
        while (i := b.tkjson("inspect", name))["state"] != "failed":  # type: ignore[index]
            assert time.monotonic() < deadline, i
            time.sleep(0.3)
        assert "could not be recorded" in str(i["error"]) or "not recorded" in \
            str(i["error"]), i  # type: ignore[index]
        r = b.tk("exec", name, "--", "true", check=False)
        assert r.returncode != 0
        world.start_signer()
        recs = export_verified(b, name, world.tmp)
        gaps = [x["body"] for x in recs if x["kind"] == "tkbox.gap"]
        assert gaps and any("completion" in json.dumps(g) for g in gaps), gaps
        v = b.tk("verify", str(world.tmp / f"{name}.tkb"), "--trust", str(world.trust))
        assert "isolation: remote" in v.stdout
        assert "Workload: client certificate CN=daemon-b" in v.stdout
    finally:
        b.tk("rm", "--force", name, check=False)
        b.stop("daemon")


def test_a_daemon_the_signer_refuses_does_not_start_and_nothing_is_recorded(
        world: World) -> None:
    """`tkbox daemon --signer https://…` with a token for another audience, an expired,
    a not-yet-valid, a replayed or a forged one, or a client certificate from another
    CA: the daemon exits non-zero with one line that says why, and the signer's log
    does not grow."""
    from joserfc.jwk import RSAKey

    now = int(time.time())
    used = world.issuer.mint()
    tok = world.tmp / "used.token"
    tok.write_text(used)
    # The token opens a run once (as a daemon's first box would): then it is spent.
    import asyncio

    from tkbox.record.remote import FileToken, RemoteSignerClient

    async def spend() -> None:
        c = RemoteSignerClient(world.url, ca=world.pki.ca_path, token=FileToken(tok))
        try:
            await c.open_run(fresh_name("spent"), {})
        finally:
            await c.aclose()

    asyncio.run(spend())
    other = Pki(world.tmp / "other-ca", "other-ca")
    bad_cert, bad_key = other.issue("intruder", server=False)
    cases = {
        "another audience": (world.issuer.mint(aud="someone-else"), "another audience"),
        "expired": (world.issuer.mint(iat=now - 900, exp=now - 300), "expired"),
        "not yet valid": (world.issuer.mint(iat=now, nbf=now + 600, exp=now + 900),
                          "not valid yet"),
        "forged": (world.issuer.mint(key=RSAKey.generate_key(2048, parameters={"kid": "k1"})),
                   "signature does not verify"),
    }

    def size() -> int:
        st = world.signer.tk("signer", "status", "--json")
        return int(json.loads(st.stdout)["size"])

    def refused(args: list[str], needle: str) -> None:
        before = size()
        (world.tmp / "refused").mkdir(exist_ok=True)
        home = world.tmp / "refused" / fresh_name("h")
        home.mkdir()
        env = stack_env(home)
        r = subprocess.run([*TKBOX, "daemon", "--signer", world.url, "--signer-ca",
                            str(world.pki.ca_path), *args], env=env, capture_output=True,
                           text=True, timeout=120)
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode != 0 and last.startswith("tkbox: error: "), r.stderr
        assert needle in last, last
        assert "Traceback" not in r.stderr
        assert not (home / "run" / "daemon.sock").exists()
        assert size() == before, "a refused daemon recorded something"

    for name, (token, needle) in cases.items():
        f = world.tmp / f"{name.replace(' ', '-')}.token"
        f.write_text(token)
        refused(["--signer-token", f"file:{f}"], needle)
    # Replayed: the spent token, presented by a daemon whose first box opens a run.
    # (Its connection is taken, as the token still names its own job's runs; the new
    # run is refused, so no VM boots.)
    replay_home = world.tmp / "replay"
    replay_home.mkdir()
    (replay_home / "x").mkdir()
    rh = make_home(replay_home / "x")
    rb = Stack(rh, stack_env(rh))
    rb.start_daemon("--signer", world.url, "--signer-ca", str(world.pki.ca_path),
                    "--signer-token", f"file:{tok}")
    try:
        before = size()
        r = rb.tk("run", "--name", fresh_name("replay"), "--workspace",
                  str(_workspace(world.tmp)), check=False)
        assert r.returncode != 0
        last = r.stderr.strip().splitlines()[-1]
        assert "opened run" in last and "a token opens one run" in last, r.stderr
        assert size() == before
    finally:
        rb.stop("daemon")
    refused(["--signer-cert", str(bad_cert), "--signer-key", str(bad_key)],
            "this daemon's")
