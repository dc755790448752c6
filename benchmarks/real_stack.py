"""The real parts for benchmarks: a signer process, and a daemon process wired to it.

Each runs as `tkbox signer serve` / `tkbox daemon` in a private TKBOX_HOME that
shares the image and guest caches of the user's own (so nothing is rebuilt),
exactly as a user runs them. Used by boot.py, egress.py and holds.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

TKBOX = [sys.executable, "-m", "tkbox.cli"]
REAL_HOME = Path(os.environ.get("TKBOX_HOME") or
                 Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share") / "tkbox")


class RealStack:
    def __init__(self, root: Path) -> None:
        self.home = root / "tkbox-home"
        self.home.mkdir(mode=0o700, parents=True)
        for shared in ("images", "guest"):
            if (REAL_HOME / shared).is_dir():
                (self.home / shared).symlink_to(REAL_HOME / shared)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TKBOX_")}
        self.env["TKBOX_HOME"] = str(self.home)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def signer_socket(self) -> Path:
        return self.home / "run" / "signer.sock"

    @property
    def daemon_socket(self) -> Path:
        return self.home / "run" / "daemon.sock"

    def tk(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([*TKBOX, *args], env=self.env, capture_output=True, text=True,
                           timeout=600)
        if check and r.returncode != 0:
            raise SystemExit(f"tkbox {' '.join(args)} failed: {r.stderr.strip()}")
        return r

    def _start(self, name: str, sock: Path, *args: str) -> None:
        log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        self.procs[name] = subprocess.Popen([*TKBOX, *args], env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while not sock.exists():
            if self.procs[name].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start; see {self.home / f'{name}.log'}")
            time.sleep(0.05)

    def start_signer(self) -> None:
        self.tk("signer", "init", "--dev", check=False)
        self._start("signer", self.signer_socket, "signer", "serve")

    def start_daemon(self, *extra: str) -> None:
        self._start("daemon", self.daemon_socket, "daemon", *extra)
        deadline = time.monotonic() + 120
        while self.tk("ls", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise SystemExit("the daemon did not answer")
            time.sleep(0.2)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@contextlib.contextmanager
def real_stack(root: Path, *, daemon: bool = True, daemon_args: tuple[str, ...] = ()
               ) -> Iterator[RealStack]:
    s = RealStack(root)
    old = os.environ.get("TKBOX_HOME")
    try:
        s.start_signer()
        if daemon:
            s.start_daemon(*daemon_args)
        os.environ["TKBOX_HOME"] = str(s.home)  # in-process clients find the same sockets
        yield s
    finally:
        if old is None:
            os.environ.pop("TKBOX_HOME", None)
        else:
            os.environ["TKBOX_HOME"] = old
        s.stop_all()
