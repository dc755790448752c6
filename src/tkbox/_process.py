"""What the host processes tkbox runs ask of the kernel for themselves (Linux `prctl`).

- `pdeathsig()`: for a VMM's `preexec_fn`, so that it cannot outlive the daemon.
- `tool_env()`: the environment of a tool run on what a registry, an image or a
  checkout supplies (tar2sqfs, rdsquashfs, mkfs.ext4): PATH and nothing more,
  as QEMU's is empty and git's built from nothing, so that the values in the
  daemon's environment are not in a process that parses hostile bytes.
- `not_dumpable()`: for the daemon and the signer, which hold what a box must
  never get (the secrets door's real values, in the daemon's environment; the
  signer's key). A process that is not dumpable cannot be attached to or read
  (`/proc/PID/environ`, `/proc/PID/mem`, ptrace) by other processes of the
  same user that lack CAP_SYS_PTRACE, such as a VMM a guest has exploited, and
  leaves no core dump. ssh-agent does the same for the keys it holds.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
from collections.abc import Callable

log = logging.getLogger("tkbox")

PR_SET_PDEATHSIG = 1
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4


def _prctl() -> Callable[..., int] | None:
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return fn


def pdeathsig() -> Callable[[], None] | None:
    """A `preexec_fn` that has the child killed when its parent ends; resolved
    here, before fork, so that the child only calls it (no dlopen after fork)."""
    prctl = _prctl()
    if prctl is None:
        return None

    def set_pdeathsig() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return set_pdeathsig


def tool_env() -> dict[str, str]:
    """PATH (the caller's) and the C locale: all a tool on hostile bytes is given."""
    return {"PATH": os.environ.get("PATH") or os.defpath, "LC_ALL": "C"}


def not_dumpable(what: str) -> None:
    """Make this process not dumpable (see the module docstring); says so if it cannot."""
    prctl = _prctl()
    if prctl is None or prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("%s: cannot make this process undumpable; other processes of this "
                    "user can read its memory", what)


def undumpable() -> bool:
    """Whether this process is not dumpable (what status reports say of the daemon
    and the signer)."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0
