"""Fixtures for end-to-end tests: a real signer, a real daemon, real VMs (QEMU).

Layered: `stack` (signer + daemon in a private TKBOX_HOME that shares the
image and guest caches built by scripts/setup.sh) → `box` (a booted box with
a workspace) → tests. Every command goes through the real `tkbox` CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TKBOX = [sys.executable, "-m", "tkbox.cli"]
REAL_HOME = Path(os.environ.get("TKBOX_HOME") or
                 Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share") / "tkbox")


def qemu_missing() -> str | None:
    if not shutil.which("qemu-system-x86_64"):
        return "qemu-system-x86_64 is not installed (run scripts/setup.sh)"
    if not (REAL_HOME / "images").is_dir():
        return "no image store: run scripts/setup.sh to build tkbox/default"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = qemu_missing()
    if why and os.environ.get("CI"):
        raise pytest.UsageError(f"e2e tests cannot run in CI: {why}")
    for item in items:
        if "tests/e2e" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
            if why:
                item.add_marker(pytest.mark.skip(reason=why))


@dataclass
class Stack:
    home: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def tk(self, *args: str, input: bytes | None = None, check: bool = True,
           timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([*TKBOX, *args], env=self.env, input=input, capture_output=True,
                           timeout=timeout, cwd=cwd)
        res = subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(errors="replace"),
                                          p.stderr.decode(errors="replace"))
        if check and res.returncode != 0:
            raise AssertionError(f"tkbox {' '.join(args)} exited {res.returncode}:\n"
                                 f"{res.stdout}\n{res.stderr}\n--- daemon log tail ---\n"
                                 f"{self.log_tail('daemon')}")
        return res

    def tkjson(self, *args: str, **kw: object) -> object:
        return json.loads(self.tk(*args, "--json", **kw).stdout)  # type: ignore[arg-type]

    def log_tail(self, name: str, n: int = 4000) -> str:
        p = self.logs.get(name)
        return p.read_text(errors="replace")[-n:] if p and p.exists() else ""

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = self.home / f"{name}.log"
        self.logs[name] = log
        with open(log, "ab") as f:
            proc = subprocess.Popen([*TKBOX, *args], env=self.env, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def wait_socket(self, path: Path, proc: subprocess.Popen[bytes], what: str) -> None:
        deadline = time.monotonic() + 60
        while not path.exists():
            if proc.poll() is not None:
                raise AssertionError(f"{what} exited {proc.returncode}: {self.log_tail(what)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not start: {self.log_tail(what)}")
            time.sleep(0.1)

    def start_signer(self) -> None:
        self.tk("signer", "init", "--dev", check=False)
        proc = self.start("signer", "signer", "serve")
        self.wait_socket(self.home / "run" / "signer.sock", proc, "signer")
        # A killed signer leaves its socket file behind: wait for a real answer.
        deadline = time.monotonic() + 60
        while self.tk("signer", "status", check=False).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"signer did not answer: {self.log_tail('signer')}")
            time.sleep(0.2)

    def start_daemon(self, *extra: str) -> subprocess.Popen[bytes]:
        proc = self.start("daemon", "daemon", *extra)
        self.wait_socket(self.home / "run" / "daemon.sock", proc, "daemon")
        # A killed daemon leaves its socket file behind: wait for a real answer.
        deadline = time.monotonic() + 60
        while self.tk("ls", check=False).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"daemon did not answer: {self.log_tail('daemon')}")
            time.sleep(0.2)
        return proc

    def stop(self, name: str, timeout: float = 120) -> int | None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return proc.returncode if proc else None
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()


def make_home(root: Path) -> Path:
    home = root / "tkbox-home"
    home.mkdir(mode=0o700)
    # the agents' tool disks too: fetched ahead of time (scripts/test.sh), so a test's
    # daemon finds them and asks no registry
    for shared in ("images", "guest", "tools"):
        if (REAL_HOME / shared).is_dir():
            (home / shared).symlink_to(REAL_HOME / shared)
    return home


def stack_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TKBOX_")}
    env["TKBOX_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A signer and a daemon wired to it, shared by the tests of a session."""
    home = make_home(tmp_path_factory.mktemp("e2e"))
    s = Stack(home, stack_env(home))
    s.start_signer()
    s.start_daemon()
    yield s
    s.stop("daemon")
    s.stop("signer")


_counter = [0]


def fresh_name(prefix: str = "t") -> str:
    _counter[0] += 1
    return f"{prefix}{os.getpid() % 10000}-{_counter[0]}"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A checkout with code, a binary, a script, a symlink, and credential files."""
    ws = tmp_path / "checkout"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("print('hello')\n")
    (ws / "README.md").write_text("readme\n")
    (ws / "old.txt").write_text("to be deleted\n")
    (ws / "data.bin").write_bytes(bytes(range(256)))
    (ws / "run.sh").write_text("#!/bin/sh\necho run\n")
    (ws / "link").symlink_to("README.md")
    (ws / ".env").write_text("TOKEN=do-not-copy\n")
    (ws / "server.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    (ws / ".ssh").mkdir()
    (ws / ".ssh" / "id_ed25519").write_text("key\n")
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    (ws / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\nexit 1\n")
    subprocess.run(["git", "-C", str(ws), "remote", "add", "origin",
                    "https://user:hunter2@git.invalid/repo.git"], check=True)
    return ws


@dataclass
class Box:
    stack: Stack
    name: str
    workspace: Path

    def sh(self, script: str, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
        return self.stack.tk("exec", self.name, "--", "sh", "-c", script, check=check, **kw)  # type: ignore[arg-type]


@pytest.fixture
def box(stack: Stack, workspace: Path) -> Iterator[Box]:
    """A booted box of tkbox/default with `workspace` copied in; removed afterwards."""
    name = fresh_name("box")
    stack.tk("run", "--name", name, "--workspace", str(workspace), "--image", "tkbox/default")
    yield Box(stack, name, workspace)
    stack.tk("rm", "--force", name, check=False)


@pytest.fixture
def own_stack(tmp_path: Path) -> Iterator[Stack]:
    """A signer and daemon of this test's own, for tests that stop or kill them."""
    home = make_home(tmp_path)
    s = Stack(home, stack_env(home))
    s.start_signer()
    s.start_daemon()
    yield s
    for name in list(s.procs):
        s.stop(name)


def export_verified(s: Stack, name: str, tmp: Path) -> list[dict[str, Any]]:
    """Export `name`'s run, check that `tkbox verify` says VERIFIED, and return its
    records (kind and body) as the bundle holds them, for tests to read."""
    from tkbox.formats import bundle, record

    out = tmp / f"{name}.tkb"
    s.tk("export", name, "-o", str(out))
    v = s.tk("verify", str(out), "--trust", str(tmp / f"{name}.trust.json"))
    assert "Integrity: VERIFIED." in v.stdout, v.stdout
    recs = [record.parse(e.extra) for e in bundle.parse(out.read_bytes()).entries
            if e.extra is not None]
    return [{"kind": r.kind, "seq": r.seq, "body": r.body} for r in recs]


def bundle_records(s: Stack, bundle: str) -> list[dict[str, Any]]:
    """A job's bundle's records, whole as signed, after `tkbox verify` said it verifies
    (with the trust file written beside it)."""
    trust = bundle.removesuffix(".tkb") + ".trust.json"
    v = s.tk("verify", bundle, "--trust", trust)
    assert "Integrity: VERIFIED." in v.stdout, v.stdout + v.stderr
    from tkbox.formats.bundle import parse

    return [json.loads(e.extra or b"{}") for e in parse(Path(bundle).read_bytes()).entries]
