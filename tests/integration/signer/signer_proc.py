"""Real signer and witness processes for integration tests."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tkbox.errors import SignerUnavailable
from tkbox.record.unix import UnixSignerClient


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tkbox.signer.cli", *args]


class SignerProc:
    """`tkbox signer init --dev` in a private TKBOX_HOME, then `serve` as a child."""

    def __init__(self) -> None:
        # A short path: a Unix socket path is at most 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="tkbs-"))
        self.env = {**os.environ, "TKBOX_HOME": str(self.root / "home"),
                    "TKBOX_RUNTIME": str(self.root / "run")}
        self.env.pop("TKBOX_SIGNER_SOCKET", None)
        self.home = self.root / "home" / "signer"
        self.socket = self.root / "run" / "signer.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.serve_args: tuple[str, ...] = ()  # given to every start (e.g. --store URL)
        self.cli("signer", "init", "--dev")

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(_cli(*args), env=self.env, capture_output=True, text=True,
                              check=check, timeout=60)

    def start(self, timeout: float = 20.0, serve_args: tuple[str, ...] = ()) -> None:
        assert self.proc is None
        self.log = open(self.root / "signer.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(_cli("signer", "serve", *self.serve_args, *serve_args),
                                     env=self.env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the signer exited: {self.read_log()}")
            if self.socket.exists() and asyncio.run(self._answers()):
                return
            time.sleep(0.02)
        raise RuntimeError(f"the signer did not start: {self.read_log()}")

    async def _answers(self) -> bool:
        c = UnixSignerClient(self.socket, timeout=1.0)
        try:
            await c.ping()
            return True
        except SignerUnavailable:
            return False
        finally:
            await c.aclose()

    def kill(self) -> None:
        """SIGKILL: no chance to flush or clean up."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None
            self.log.close()

    def wait_exit(self, timeout: float = 30) -> int:
        """The signer ended by itself (a store it cannot write): its exit status."""
        assert self.proc is not None
        rc = self.proc.wait(timeout=timeout)
        self.proc = None
        self.log.close()
        return rc

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None
            self.log.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self, **kw: Any) -> UnixSignerClient:
        return UnixSignerClient(self.socket, **kw)

    def read_log(self) -> str:
        try:
            return (self.root / "signer.log").read_text()[-4000:]
        except FileNotFoundError:
            return ""

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WitnessProc:
    def __init__(self, root: Path, name: str, env: dict[str, str]) -> None:
        self.home = root / f"witness-{name}"
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        out = subprocess.run(_cli("witness", "init", "--home", str(self.home), "--name",
                                  f"witness.test/{name}"), env=env, capture_output=True,
                             text=True, check=True)
        self.vkey = next(line.split(": ", 1)[1] for line in out.stdout.splitlines()
                         if line.startswith("verifier key:"))
        self.proc: subprocess.Popen[bytes] | None = None

    def add_log(self, vkey: str) -> None:
        subprocess.run(_cli("witness", "add-log", vkey, "--home", str(self.home)), env=self.env,
                       check=True, capture_output=True)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            _cli("witness", "serve", "--home", str(self.home), "--listen",
                 f"127.0.0.1:{self.port}"), env=self.env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the witness did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
