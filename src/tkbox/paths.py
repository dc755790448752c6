"""Where tkbox keeps things on the host.

`TKBOX_HOME` (default `$XDG_DATA_HOME/tkbox`, else `~/.local/share/tkbox`)
holds state that survives restarts: boxes, images, the guest build, the
signer's store (`signer/`), the witness's (`witness/`). Sockets live in
`TKBOX_RUNTIME` (default `$TKBOX_HOME/run`), a 0700 directory.

Every directory tkbox creates for itself is created 0700.
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    env = os.environ.get("TKBOX_HOME")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "tkbox"


def runtime() -> Path:
    env = os.environ.get("TKBOX_RUNTIME")
    return Path(env) if env else home() / "run"


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) as 0700 and check it is ours and private."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.lstat()
    if st.st_uid != os.getuid():
        from tkbox.errors import HostError

        raise HostError(f"{path} belongs to another user; remove it or set TKBOX_HOME")
    if st.st_mode & 0o077:
        path.chmod(0o700)
    return path


#: longest VM directory that leaves room for "/qmp.sock" etc. in a sun_path (108 bytes)
MAX_VM_DIR = 80


def vms(home_dir: Path | None = None) -> Path:
    """Where each VM's private directory (and its sockets) lives.

    `$TKBOX_HOME/run/vms` when that is short enough for Unix socket paths,
    else `/tmp/tkbox-<uid>/vms` (still 0700, still ours).
    """
    base = (home_dir or home()) / "run" / "vms"
    if len(str(base)) + 40 <= MAX_VM_DIR:
        return base
    return Path(f"/tmp/tkbox-{os.getuid()}") / "vms"


def daemon_socket() -> Path:
    return runtime() / "daemon.sock"


def signer_home() -> Path:
    return home() / "signer"


def signer_socket() -> Path:
    env = os.environ.get("TKBOX_SIGNER_SOCKET")
    return Path(env) if env else runtime() / "signer.sock"


def images() -> Path:
    return home() / "images"


def boxes() -> Path:
    return home() / "boxes"


def guest_build() -> Path:
    return home() / "guest"
