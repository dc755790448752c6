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


def _unsafe_ancestor(path: Path) -> str | None:
    """Why an existing directory on the way to ours lets another user swap what is below.

    Each must be a real directory (not a link), owned by us or root, and
    writable by nobody else unless it is sticky (like `/tmp`), where others
    can add entries but not rename or remove ours.
    """
    import stat

    uid = os.getuid()
    for anc in reversed(path.parents):
        try:
            st = anc.lstat()
        except FileNotFoundError:
            return None  # everything below is ours to create
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (0, uid):
                return f"{anc} is a link owned by user {st.st_uid}"
            continue  # a link the system or we made (e.g. /var/run): its target is checked next
        if not stat.S_ISDIR(st.st_mode):
            return f"{anc} is not a directory"
        if st.st_uid not in (0, uid):
            return f"{anc} belongs to user {st.st_uid}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{anc} can be written by other users"
    return None


def private_dir(path: Path) -> Path:
    """Create `path` and every missing parent as 0700; check it is ours and private.

    Refuses (HostError) a path below a directory another user owns or can
    write (sticky directories such as `/tmp` excepted), a link in place of
    our own directory, or our directory opened to others by someone else.
    """
    import stat

    from tkbox.errors import HostError

    path = Path(os.path.abspath(path))
    why = _unsafe_ancestor(path)
    if why is not None:
        raise HostError(f"refusing to keep private files under {path}: {why}; use a directory "
                        "only you can write (set TKBOX_HOME or TKBOX_RUNTIME)")
    missing = [p for p in (*reversed(path.parents), path) if not os.path.lexists(p)]
    for p in missing:
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass  # created meanwhile: checked below like any other
        else:
            p.chmod(0o700)  # the umask may have taken bits away; never leave them added
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        # A link we made (say, to a shared image cache) is ours to follow; one that
        # someone else planted is not. Its target is checked like the directory itself.
        if st.st_uid != os.getuid():
            raise HostError(f"{path} is a link made by user {st.st_uid}; remove it or set "
                            "TKBOX_HOME")
        st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise HostError(f"{path} is not a directory (something else is in its place); "
                        "remove it or set TKBOX_HOME")
    if st.st_uid != os.getuid():
        raise HostError(f"{path} belongs to another user; remove it or set TKBOX_HOME")
    if st.st_mode & 0o077:
        path.chmod(0o700)  # ours: keep it private (DESIGN: every directory tkbox makes is 0700)
    return path


def _private_tmp_base() -> Path:
    """`/tmp/tkbox-<uid>`, refused unless it is our own directory that no one else can write."""
    import stat

    from tkbox.errors import HostError

    base = Path(f"/tmp/tkbox-{os.getuid()}")
    try:
        st = base.lstat()
    except FileNotFoundError:
        return base
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise HostError(f"{base} exists and is not a directory of yours (another user may have "
                        "made it to catch the VMs' sockets); remove it, or set TKBOX_HOME to a "
                        "shorter path so the fallback is not needed")
    if st.st_mode & 0o022:
        raise HostError(f"{base} can be written by other users, so its contents cannot be "
                        f"trusted; remove it (rm -r {base}) and start again")
    if st.st_mode & 0o077:
        base.chmod(0o700)  # ours, and only readable by others (made by an older tkbox)
    return base


#: longest VM directory that leaves room for "/qmp.sock" etc. in a sun_path (108 bytes)
MAX_VM_DIR = 80


def vms(home_dir: Path | None = None) -> Path:
    """Where each VM's private directory (and its sockets) lives.

    `$TKBOX_HOME/run/vms` when that is short enough for Unix socket paths,
    else `/tmp/tkbox-<uid>/vms` (still 0700, still ours): a `/tmp/tkbox-<uid>`
    that is not our own private directory is refused (`HostError`), since
    another user could have made it to watch or swap the VMs' sockets.
    """
    base = (home_dir or home()) / "run" / "vms"
    if len(str(base)) + 40 <= MAX_VM_DIR:
        return base
    return _private_tmp_base() / "vms"


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
