"""Build `tkbox/claude-code` once, as an install step (`scripts/test.sh` runs it).

The Claude Code image is made the way `tkbox agent claude-code` makes it on first
use (`tkbox.agents.image.ensure_image`): a Debian base with nodejs, then the npm
package installed *in a box*, through the door, with the `npm` preset. Doing it
here keeps the package download out of the tests, which talk to loopback only,
and out of their time limits (it takes minutes under software emulation).

A private signer and daemon run for the build, in a scratch `TKBOX_HOME` that
shares this user's image store and guest build, and are stopped afterwards.
Where the host's npm registry sits on an address that is not public (an
internal mirror), the door would refuse it like any such address: this build,
and only this build, permits those addresses and trusts the CAs the host added
locally (`/usr/local/share/ca-certificates`), as an operator would
(docs/network.md: `--egress-permit`, `--ca-cert`).

    .venv/bin/python scripts/build_agent_image.py
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TKBOX = [sys.executable, "-m", "tkbox.cli"]


def registry_permits() -> list[str]:
    from tkbox.doors.network.presets import npm_hosts

    args: list[str] = []
    for entry in npm_hosts():
        host = entry.split(":")[0]
        try:
            infos = socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
        except OSError:
            continue
        for info in infos:
            addr = ipaddress.ip_address(info[4][0])
            if not addr.is_global:
                args += ["--egress-permit", f"{addr}/{addr.max_prefixlen}"]
    for pem in sorted(Path("/usr/local/share/ca-certificates").glob("*.crt")):
        args += ["--ca-cert", str(pem)]
    return args


def wait_for(what: str, ok: object, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while not ok():  # type: ignore[operator]
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"build_agent_image: the {what} did not start:\n"
                     f"{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.2)


def main() -> int:
    from tkbox import paths

    real = paths.home()
    if subprocess.run([*TKBOX, "image", "inspect", "tkbox/claude-code"],
                      capture_output=True).returncode == 0:
        print("build_agent_image: tkbox/claude-code is built already")
        return 0
    home = Path(tempfile.mkdtemp(prefix="tkbox-agent-image-"))
    home.chmod(0o700)
    for shared in ("images", "guest"):
        (real / shared).mkdir(parents=True, exist_ok=True, mode=0o700)
        (home / shared).symlink_to(real / shared)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TKBOX_")}
    env["TKBOX_HOME"] = str(home)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        subprocess.run([*TKBOX, "signer", "init", "--dev"], env=env, check=True,
                       capture_output=True)
        for name, args in (("signer", ["signer", "serve"]),
                           ("daemon", ["daemon", "--approval-wait", "1",
                                       *registry_permits()])):
            log = home / f"{name}.log"
            with open(log, "wb") as f:
                proc = subprocess.Popen([*TKBOX, *args], env=env, stdout=f,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(proc)
            sock = home / "run" / f"{name}.sock"
            if name == "signer":
                wait_for(name, sock.exists, proc, log)
            else:
                wait_for(name, lambda: subprocess.run(
                    [*TKBOX, "ls"], env=env, capture_output=True).returncode == 0, proc, log)
        os.environ["TKBOX_HOME"] = str(home)
        from tkbox.agents.image import ensure_image
        from tkbox.sdk import Client

        with Client(home / "run" / "daemon.sock", timeout=None) as client:
            ensure_image(client, log=lambda m: print(f"build_agent_image: {m}", flush=True))
        print("build_agent_image: tkbox/claude-code is built")
        return 0
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
