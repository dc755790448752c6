"""A real Tracekit (`tracekit-ai` 1.4.2) signer process, configured by tkbox's `init_dev`."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tkbox.record.tracekit import TracekitSignerClient
from tkbox.record.tracekit_setup import Setup, init_dev, tracekit_command


def have_tracekit() -> bool:
    try:
        import tracekit  # noqa: F401
    except ImportError:
        return False
    return True


class TracekitProc:
    """`tracekit signer serve --config` on a config that tkbox's init_dev wrote."""

    def __init__(self, witnesses: list[dict[str, str]] | None = None) -> None:
        # A short path: a Unix socket path is at most 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="tktk-"))
        self.setup: Setup = init_dev(self.root / "tk", witnesses=witnesses)
        self.proc: subprocess.Popen[bytes] | None = None
        self.http_port = 0

    def env(self) -> dict[str, str]:
        env = {**os.environ, "TRACEKIT_RUNTIME_DIR": str(self.root / "rt"),
               "XDG_DATA_HOME": str(self.root / "xdg"), "HOME": str(self.root)}
        env.pop("TRACEKIT_SIGNER", None)
        return env

    def start(self, timeout: float = 60.0) -> None:
        assert self.proc is None
        (self.root / "rt").mkdir(mode=0o700, exist_ok=True)
        if hasattr(self, "log"):
            self.log.close()
        self.log = open(self.root / "signer.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*tracekit_command(), "signer", "serve", "--config", str(self.setup.config)],
            env=self.env(), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Tracekit signer exited: {self.read_log()}")
            m = re.search(r"serving on 127\.0\.0\.1:(\d+)", self.read_log())
            if m and self.setup.socket.exists():
                self.http_port = int(m.group(1))
                return
            time.sleep(0.05)
        raise RuntimeError(f"the Tracekit signer did not start: {self.read_log()}")

    def read_log(self) -> str:
        try:
            return (self.root / "signer.log").read_text(errors="replace")
        except OSError:
            return ""

    def client(self, **kw: Any) -> TracekitSignerClient:
        return TracekitSignerClient.from_setup(self.setup)

    def operator(self, verb: str, run: str,
                 reason: str = "look") -> subprocess.CompletedProcess[str]:
        """`tracekit signer incidents VERB RUN` as the operator (token:http)."""
        env = {**self.env(), "TRACEKIT_SIGNER_TOKEN_FILE": str(self.setup.operator_token)}
        return subprocess.run(
            [*tracekit_command(), "signer", "incidents", verb, run, "--reason", reason,
             "--signer", f"http://127.0.0.1:{self.http_port}"],
            env=env, capture_output=True, text=True, timeout=60, check=True)

    def operator_call(self, method: str, run: str, reason: str = "look") -> dict[str, Any]:
        """The same operator call in this process (no interpreter start): for timing."""
        import uuid

        from tracekit.sdk.client import Client

        c = Client(f"http://127.0.0.1:{self.http_port}",
                   token_file=str(self.setup.operator_token))
        try:
            return dict(c.call(method, {"request_id": uuid.uuid4().hex, "run_id": run,
                                        "reason": reason}))
        finally:
            c.close()

    def tracekit(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*tracekit_command(), *args], env=self.env(), capture_output=True,
                              text=True, timeout=120, check=False)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        if hasattr(self, "log"):
            self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)



def bundle_events(bundle: bytes) -> list[dict[str, Any]]:
    """The records of a Tracekit v2 bundle's run, in order (`event` of each line)."""
    import io
    import json
    import zipfile

    with zipfile.ZipFile(io.BytesIO(bundle)) as z:
        names = [n for n in z.namelist() if n.startswith("runs/") and n.endswith(".jsonl")]
        assert len(names) == 1, names
        lines = z.read(names[0]).decode().splitlines()
    events = [json.loads(ln)["event"] for ln in lines if ln.strip()]
    return sorted(events, key=lambda e: e["run_seq"])
