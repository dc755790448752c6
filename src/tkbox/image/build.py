"""Build the default image's root filesystem with `mmdebstrap`.

The mirror is the host's own: its APT sources files are handed to mmdebstrap
as they are (mmdebstrap pastes an existing file into the chroot's sources),
so tkbox names no mirror of its own and works wherever the host's `apt` does.
The suite is the host's `VERSION_CODENAME`.

The build is reproducible: given the same package versions and the same APT
sources, two machines make the same bytes, so `tkbox/default` has the same
digest on both. mmdebstrap is bit-for-bit reproducible when `SOURCE_DATE_EPOCH`
is set (file times clamped, logs and caches removed); tkbox sets it to
`REPRODUCIBLE_EPOCH` unless the environment gives one, and drops the two files
mmdebstrap copies from the host (`/etc/resolv.conf`, `/etc/hostname`): a box has
no DNS, and its agent sets the host name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from tkbox.errors import HostError

DEFAULT_PACKAGES = ("python3", "python3-pip", "python3-venv", "curl", "git", "ca-certificates")
APT_DIR = Path("/etc/apt")
#: file times in the default image (2024-01-01T00:00:00Z), unless SOURCE_DATE_EPOCH is set
REPRODUCIBLE_EPOCH = 1704067200
OS_RELEASE = Path("/etc/os-release")


def host_sources(apt_dir: Path = APT_DIR) -> list[Path]:
    """The host's APT sources files that hold at least one entry, in APT's order."""
    found: list[Path] = []
    main = apt_dir / "sources.list"
    if main.is_file() and _has_entries(main):
        found.append(main)
    d = apt_dir / "sources.list.d"
    if d.is_dir():
        for p in sorted(d.iterdir()):
            if p.suffix in (".list", ".sources") and p.is_file() and _has_entries(p):
                found.append(p)
    return found


def _has_entries(path: Path) -> bool:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(("deb ", "deb-src ", "URIs:", "Types:")):
            return True
    return False


def host_codename(os_release: Path = OS_RELEASE) -> str:
    try:
        for line in os_release.read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "VERSION_CODENAME" and value.strip().strip('"'):
                return value.strip().strip('"')
    except OSError:
        pass
    raise HostError(f"cannot tell this host's release from {os_release}; tkbox image build "
                    "needs a Debian or Ubuntu host")


def mmdebstrap_command(dest: Path, *, packages: tuple[str, ...] = DEFAULT_PACKAGES,
                       sources: list[Path] | None = None, suite: str | None = None) -> list[str]:
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise HostError("mmdebstrap is missing; install it with `apt-get install mmdebstrap`")
    srcs = host_sources() if sources is None else sources
    if not srcs:
        raise HostError("this host has no APT sources (/etc/apt/sources.list*); tkbox image "
                        "build uses the host's own mirror")
    return [
        exe, "--variant=apt", "--format=tar", "--include=" + ",".join(packages),
        "--aptopt=Acquire::Retries \"3\"",
        # host files that would make two machines' images differ (see the docstring)
        '--customize-hook=rm -f "$1/etc/resolv.conf" "$1/etc/hostname"',
        suite or host_codename(), str(dest), *map(str, srcs),
    ]


def build_rootfs(dest: Path, *, log: Callable[[str], None] | None = None,
                 packages: tuple[str, ...] = DEFAULT_PACKAGES) -> None:
    """Write the default image's root filesystem as an uncompressed tar to `dest`."""
    cmd = mmdebstrap_command(dest, packages=packages)
    env = dict(os.environ)
    env.setdefault("SOURCE_DATE_EPOCH", str(REPRODUCIBLE_EPOCH))
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, errors="replace", close_fds=True,
                            env=env)
    assert proc.stderr is not None
    tail: list[str] = []
    for line in proc.stderr:
        line = line.rstrip("\n")
        tail = (tail + [line])[-20:]
        if log is not None and line.startswith("I: "):
            log(line[3:])
    rc = proc.wait()
    if rc != 0:
        last = next((t for t in reversed(tail) if t.startswith("E: ")), tail[-1] if tail else "")
        raise HostError(f"mmdebstrap failed (exit {rc}): {last.strip()[:300]}")
