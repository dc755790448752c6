"""`tkbox signer init --system`: the signer as its own user, under systemd.

What it sets up (as root):

- a system group `tkbox` (the daemon's user joins it to reach the socket) and
  a system user `tkbox-signer` with no shell and no login;
- `/var/lib/tkbox-signer` (0700, the signer's): key, log, policy, trust file;
- `/etc/systemd/system/tkbox-signer.service`: the signer runs as
  `tkbox-signer:tkbox`, its socket `/run/tkbox-signer/signer.sock` is 0660 in
  a 0750 directory, and the sandboxing options keep it from the rest of the
  host (no new privileges, read-only system, no home directories, ...);
- then `systemctl enable --now`, when systemd is running.

No other process of the daemon's user can then read the key or the log:
they belong to another uid. Runs record `isolation: separate-user`.

`apply(plan, root=…)` writes under another root without creating users or
touching systemd (for packaging and tests); `dry_run` only says what it
would do.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tkbox.errors import HostError, UserError
from tkbox.signer import config as config_mod

UNIT_NAME = "tkbox-signer.service"


@dataclass(frozen=True)
class Plan:
    user: str = "tkbox-signer"
    group: str = "tkbox"
    home: Path = Path("/var/lib/tkbox-signer")
    socket: Path = Path("/run/tkbox-signer/signer.sock")
    unit: Path = Path("/etc/systemd/system") / UNIT_NAME
    python: str = sys.executable
    origin: str | None = None

    def unit_text(self) -> str:
        return f"""\
# {UNIT_NAME}: written by `tkbox signer init --system`.
[Unit]
Description=tkbox signer: decides and signs every crossing
After=network-online.target

[Service]
Type=simple
User={self.user}
Group={self.group}
ExecStart={self.python} -m tkbox.signer.cli signer serve --home {self.home} --socket {self.socket}
Restart=on-failure
RestartSec=1
UMask=0117
RuntimeDirectory={self.socket.parent.name}
RuntimeDirectoryMode=0750
StateDirectory={self.home.name}
StateDirectoryMode=0700
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
ReadWritePaths={self.home}
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictNamespaces=yes
RestrictSUIDSGID=yes
LockPersonality=yes
CapabilityBoundingSet=
SystemCallArchitectures=native

[Install]
WantedBy=multi-user.target
"""


def plan(user: str = "tkbox-signer", group: str = "tkbox", origin: str | None = None) -> Plan:
    for name in (user, group):
        if not name or not all(c.isalnum() or c in "-_" for c in name) or name[0] == "-":
            raise UserError(f"{name!r} is not a valid user or group name")
    return Plan(user=user, group=group, origin=origin)


def _exists(kind: str, name: str) -> bool:
    try:
        (pwd.getpwnam if kind == "user" else grp.getgrnam)(name)
        return True
    except KeyError:
        return False


def _run(cmd: list[str]) -> None:
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise HostError(f"{cmd[0]} is not installed; create the user and group by hand") from None
    except subprocess.CalledProcessError as exc:
        raise HostError(f"{' '.join(cmd)} failed: {exc.stderr.strip()}") from None


def apply(p: Plan, root: Path = Path("/"), dry_run: bool = False) -> Iterator[str]:
    """Set the signer up; yields one line per step for a person."""
    real = root == Path("/")
    if real and not dry_run and os.geteuid() != 0:
        raise UserError("--system sets up a user and a systemd unit: run it as root "
                        "(or use --dry-run to see what it would do)")
    home = root / p.home.relative_to("/")
    unit = root / p.unit.relative_to("/")
    verb = "would" if dry_run else "will"
    if Path(p.python).parts[1:2] in (("root",), ("home",)):
        yield (f"warning: the unit runs {p.python}, under a home directory the signer's user "
               "cannot read (ProtectHome=yes); install tkbox system-wide (e.g. in /opt/tkbox)")

    if not real:
        yield (f"under --root {root}: not creating the user {p.user} and group {p.group}, "
               "not touching systemd; do that on the target host")
    elif not _exists("group", p.group):
        yield f"{verb} create the system group {p.group}"
        if not dry_run:
            _run(["groupadd", "--system", p.group])
    if real and not _exists("user", p.user):
        yield f"{verb} create the system user {p.user} (no login, home {p.home})"
        if not dry_run:
            _run(["useradd", "--system", "--gid", p.group, "--home-dir", str(p.home),
                  "--no-create-home", "--shell", "/usr/sbin/nologin", p.user])
    yield f"{verb} create {home} (0700, {p.user}): key, log, policy, trust file"
    if not dry_run:
        cfg = config_mod.init(home, origin=p.origin, mode="system")
        if real:
            uid, gid = pwd.getpwnam(p.user).pw_uid, grp.getgrnam(p.group).gr_gid
            for path in [home, *home.rglob("*")]:
                os.chown(path, uid, gid)
        yield f"  verifier key: {cfg.signer().verifier().vkey()}"
    yield f"{verb} write {unit}"
    if not dry_run:
        unit.parent.mkdir(parents=True, exist_ok=True)
        unit.write_text(p.unit_text())
        unit.chmod(0o644)
    systemd = real and Path("/run/systemd/system").is_dir() and shutil.which("systemctl")
    if systemd:
        yield f"{verb} run systemctl daemon-reload; systemctl enable --now {UNIT_NAME}"
        if not dry_run:
            _run(["systemctl", "daemon-reload"])
            _run(["systemctl", "enable", "--now", UNIT_NAME])
    else:
        yield f"systemd is not running here: start it later with systemctl enable --now {UNIT_NAME}"
    yield (f"next: add the daemon's user to the group {p.group} (usermod -aG {p.group} USER), "
           f"and give the daemon TKBOX_SIGNER_SOCKET={p.socket}")
