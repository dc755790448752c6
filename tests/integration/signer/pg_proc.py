"""A real PostgreSQL server for tests: Debian's `postgresql` package (scripts/setup.sh
installs it), its own data directory under a temporary folder, listening on
127.0.0.1 only, run by a user that is not root (the server refuses root).

    pg = PgServer(); pg.start()
    url = pg.database("t1")      # a fresh database: postgresql://tkbox@127.0.0.1:PORT/t1
    pg.restart(); pg.stop(); pg.cleanup()
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from signer_proc import free_port


def bindir() -> Path:
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(d, "initdb").exists():
            return Path(d)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise RuntimeError("PostgreSQL is not installed (Debian's postgresql package): run "
                       "scripts/setup.sh")


class PgServer:
    def __init__(self) -> None:
        self.bin = bindir()
        self.root = Path(tempfile.mkdtemp(prefix="tkpg-"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.sock = self.root / "sock"
        self.port = free_port()
        self.as_user: str | None = None
        if os.geteuid() == 0:
            self.as_user = "nobody"
            pw = pwd.getpwnam(self.as_user)
            for d in (self.data, self.sock):
                d.mkdir(mode=0o700)
                os.chown(d, pw.pw_uid, pw.pw_gid)
            (self.root / "log").touch()
            os.chown(self.root / "log", pw.pw_uid, pw.pw_gid)
        else:
            self.sock.mkdir(mode=0o700)
        self._run("initdb", "-D", str(self.data), "-U", "tkbox", "--auth=trust", "-E", "UTF8",
                  "--no-instructions")
        self.running = False

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin / tool), *args]
        if self.as_user is not None:
            pw = pwd.getpwnam(self.as_user)
            argv = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}",
                    "--clear-groups", *argv]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
               "HOME": str(self.root)}
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                           cwd=self.root)
        if r.returncode != 0:
            raise RuntimeError(f"{tool} failed: {r.stderr.strip() or r.stdout.strip()}"
                               f"\n{self.log_tail()}")
        return r

    def log_tail(self) -> str:
        try:
            return (self.root / "log").read_text()[-2000:]
        except OSError:
            return ""

    def start(self) -> None:
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} "
                f"-c unix_socket_directories={self.sock} -c fsync=on "
                "-c synchronous_commit=on -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", opts,
                  "-w", "-t", "60", "start")
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        if self.running:
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
            self.running = False

    def restart(self) -> None:
        self.stop()
        self.start()

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://tkbox@127.0.0.1:{self.port}/{db}"

    def database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}"')
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def cleanup(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)
