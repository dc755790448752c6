"""The launcher interface: start a VM, pause, resume, kill, wait.

Implementations: `tkbox.vm.qemu` (QEMU microvm, KVM or software emulation),
`tkbox.vm.firecracker` (REST API on a Unix socket, hybrid vsock) and
`tkbox.vm.fake` (for tests above the launcher: it runs the guest agent's RPC
in-process over memory streams).

Each VM process runs in its own private (0700) working directory, with its
own sockets, no inherited file descriptors, and is reaped when it ends.

What the daemon relies on, and `tests/conformance/test_launcher.py` checks
against every implementation:

- `start(spec, before_boot=f)` runs `f(vm.ports)` before the guest can open a
  stream, so the guest's first connection (the boot config, port 1026)
  finds its listener; `start` returns once the VMM runs (not once the guest
  is up). A failed start leaves no process behind and raises a `HostError`.
- `kill()` is idempotent and returns once the VMM has been reaped; `wait()`
  returns the VMM's exit status, however it ended, to every caller, as often
  as asked.
- Once the VM has ended, `ports.connect` raises `TransportClosed` (the VM's
  end, not the guest's fault) and `pause`/`resume` raise `VMEnded`.
- Every task a VM starts is owned by it and has ended once `wait` returns.
- Nothing the guest can make its VMM write grows a host file without bound: the
  VMM's stdout and stderr (where QEMU reports the guest's device errors, one
  line each, as often as the guest makes them) and the guest's console go
  through pipes or sockets into files capped at `LOG_CAP` bytes each
  (`drain_to_file`); the rest is read and dropped, so the VMM never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from tkbox.errors import HostError
from tkbox.protocol.ports import Ports
from tkbox.vm.spec import Disk as Disk
from tkbox.vm.spec import VMSpec as VMSpec

#: Called with the new VM's ports before its guest can open a stream: serve there.
BeforeBoot = Callable[[Ports], None]

#: Bytes kept of each file a VMM's output goes to (its stdout/stderr, the console).
LOG_CAP = 16 << 20
#: What ends a capped file once its output was cut.
DROPPED = b"\n[tkbox: output past this point was dropped]\n"


async def drain_to_file(stream: asyncio.StreamReader | None, path: Path, cap: int) -> None:
    """Copy `stream` into `path` (0600, made anew), keeping at most `cap` bytes and then
    `DROPPED`; the rest is read and dropped until EOF, so the writer never blocks."""
    if stream is None:
        return
    kept = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        while chunk := await stream.read(65536):
            if kept < cap:
                part = chunk[: cap - kept]
                os.write(fd, part)
                kept += len(part)
                if kept >= cap:
                    os.write(fd, DROPPED)
    finally:
        os.close(fd)


#: Characters of a VMM's last words quoted in an error.
MAX_LAST_WORDS = 300


def last_words(path: Path, limit: int = 8192) -> str:
    """The last non-empty line of a VMM's log (what it said as it ended), from its
    start, as one line of printable characters cut at MAX_LAST_WORDS; "" if there is
    none. Only the log's last `limit` bytes are read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return last_line(text)


def last_line(text: str) -> str:
    """`text`'s last non-empty line, printable and cut at MAX_LAST_WORDS ("" if none)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = "".join(c if c.isprintable() else " " for c in lines[-1])
    return " ".join(line.split())[:MAX_LAST_WORDS]


def check_boot_files(spec: VMSpec) -> None:
    """Refuse, before any VMM starts, a spec whose kernel, initramfs or disks are not
    readable regular files (HostError, what to do): a VMM that fails on them later
    would fail after `start` returned, racing the caller."""
    wanted = [(spec.kernel, "guest kernel"), (spec.initramfs, "initramfs"),
              *((disk.path, f"{disk.role} disk") for disk in spec.disks)]
    for path, what in wanted:
        try:
            st = path.stat()
        except OSError as exc:
            raise HostError(f"the {what} {path} is missing ({exc.strerror}); "
                            "run 'tkbox guest build' or recreate the box") from None
        if not stat.S_ISREG(st.st_mode):
            raise HostError(f"the {what} {path} is not a regular file")
        if not os.access(path, os.R_OK):
            raise HostError(f"the {what} {path} is not readable by tkbox's user")


class VM(ABC):
    """A running VM. `ports` reaches the guest agent.

    `start_kind` says how it started ("cold": a full boot; "template": restored
    from a booted template, see `tkbox.vm.template`) and `start_reason` why,
    in words for a person. `isolation` says what holds its VMM beyond the VM
    itself (`tkbox.vm.jail`: "jailed uid 61042, namespaces, cgroup", or what is
    missing and why). `end_reason`, once `wait` has returned, says why the VMM
    ended when the host's kernel ended it at one of its limits ("" otherwise), and
    `end_limit` names that limit ("memory", "pids").
    """

    ports: Ports
    start_kind: str = "cold"
    start_reason: str = ""
    isolation: str = ""
    end_reason: str = ""
    end_limit: str = ""

    @abstractmethod
    async def pause(self) -> None:
        """Stop the guest's vCPUs (VMEnded once the VM has ended)."""

    @abstractmethod
    async def resume(self) -> None:
        """Run the guest's vCPUs again (VMEnded once the VM has ended)."""

    @abstractmethod
    async def kill(self) -> None:
        """End the VM now (idempotent); `wait` returns afterwards."""

    @abstractmethod
    async def wait(self) -> int:
        """Wait until the VMM process has ended and been reaped; its exit status."""

    @property
    @abstractmethod
    def accel(self) -> str:
        """"kvm", "tcg" (software emulation) or "fake"."""


class ManagedVM(VM):
    """A VM of tkbox's launchers: `_ended` resolves with its exit status when it has
    ended, and `wait` then releases what it owned (`_cleanup`) exactly once; a second
    waiter returns only once the first has cleaned up."""

    _ended: asyncio.Future[int]

    def __init__(self) -> None:
        self._closing = asyncio.Lock()
        self._closed = False

    async def wait(self) -> int:
        code = await asyncio.shield(self._ended)
        async with self._closing:
            if not self._closed:
                await self._cleanup()
                self._closed = True
        return code

    @abstractmethod
    async def _cleanup(self) -> None:
        """Release the VM's tasks, ports and sockets, once it has ended."""


class ProcessVM(ManagedVM):
    """A VM that is one VMM process leading its own process group (QEMU, Firecracker)."""

    proc: asyncio.subprocess.Process

    async def kill(self) -> None:
        if self.proc.returncode is None:
            # Not yet reaped, so the group id cannot have been reused.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        await self.wait()


class Launcher(ABC):
    name: str
    #: Which port transport its VMs get ("serial-mux", "vhost-vsock", "hybrid-vsock").
    transport: str = "serial-mux"

    @abstractmethod
    async def start(self, spec: VMSpec, *, before_boot: BeforeBoot | None = None) -> VM:
        """Start the VMM; returns once the process runs (not once the guest is up).

        `before_boot(ports)` runs before the guest can open any stream.
        """

    async def aclose(self) -> None:  # noqa: B027 - a hook: most launchers have nothing to end
        """End the launcher's own background work (not its VMs). Idempotent."""
