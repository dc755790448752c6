"""Starting a command, and async I/O on raw file descriptors.

Every command starts through `tkbox-spawn` (`spawn.c`, static, built into the
initramfs), by vfork+exec, so the agent's own image is never forked: the helper
joins the commands' cgroup, takes the terminal, chroots, changes user and
directory and execs, in that order, and reports a failed step on an error pipe
(`spawn_error`). `start` does all of it for one `rpc.Exec` and hands back the
running `Command`, or why it could not start. `FdStream` is a `ByteStream` over
a non-blocking descriptor (the virtio-serial port the mux runs on).

Runs in the VM: standard library and `tkbox.protocol`, `tkbox.guest` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
import subprocess
import termios
from collections.abc import Callable
from dataclasses import dataclass

from tkbox.guest import rpc
from tkbox.protocol.streams import ByteStream, StreamClosed


class FdStream(ByteStream):
    """A ByteStream over a non-blocking character device (the virtio-serial port).

    The port carries no EOF, so `send_eof` does nothing (the mux above delimits its
    streams). After `aclose` the fd number is never used again: it may already name
    another file."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._closed = False
        self._waiting: set[asyncio.Future[None]] = set()  # woken by aclose
        os.set_blocking(fd, False)

    async def _wait(self, writer: bool) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        add = loop.add_writer if writer else loop.add_reader
        rm = loop.remove_writer if writer else loop.remove_reader
        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        add(self.fd, ready)
        self._waiting.add(fut)
        try:
            await fut
        finally:
            self._waiting.discard(fut)
            if not self._closed:  # else aclose removed it before closing the fd
                rm(self.fd)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._closed:
            try:
                return os.read(self.fd, max_bytes)
            except BlockingIOError:
                await self._wait(False)
        return b""

    async def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._closed:
                raise StreamClosed("stream is closed")
            try:
                n = os.write(self.fd, view)
                view = view[n:]
            except BlockingIOError:
                await self._wait(True)
            except OSError as exc:
                raise StreamClosed(str(exc)) from None

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.fd)
        loop.remove_writer(self.fd)
        for fut in self._waiting:
            if not fut.done():
                fut.set_result(None)
        with contextlib.suppress(OSError):
            os.close(self.fd)


def winsize(rows: int, cols: int) -> bytes:
    """The TIOCSWINSZ argument (`struct winsize`) for a terminal of rows x cols."""
    return struct.pack("HHHH", rows, cols, 0, 0)


#: <asm-generic/ioctls.h>: _IOR('T', 0x30, unsigned int) and _IOW('T', 0x31, int)
TIOCGPTN, TIOCSPTLCK = 0x80045430, 0x40045431


def open_pty(root: str) -> tuple[int, int]:
    """A pty pair from the devpts the box's commands see (`ROOT/dev/pts`).

    `os.openpty()` would open the agent's own `/dev/ptmx`, which has no devpts
    instance behind it here (it is mounted only inside the box's root): ENODEV.
    """
    master = os.open(f"{root}/dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(master, TIOCSPTLCK, struct.pack("i", 0))  # unlock the slave
        (n,) = struct.unpack("I", fcntl.ioctl(master, TIOCGPTN, b"\0" * 4))
        slave = os.open(f"{root}/dev/pts/{n}", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except BaseException:
        os.close(master)
        raise
    return master, slave


SPAWN = "/tkbox/bin/tkbox-spawn"  # built from spawn.c into the initramfs
MAX_SPAWN_ERROR = 96


def spawn_argv(argv: list[str], env: dict[str, str], errfd: int, root: str, cwd: str,
               user: tuple[int, int, list[int]] | None = None, tty: bool = False,
               procs: str = "") -> list[str]:
    """The `tkbox-spawn` command line that starts `argv` (see spawn.c for each step).

    The agent starts it with vfork+exec (no preexec_fn), so its own image is never
    forked; the helper joins the cgroup `procs` names, takes the terminal, chroots,
    changes user and directory, and execs `argv` with `env`, in that order.
    """
    env_list = []
    for k, v in env.items():
        if "=" in k or not k:
            raise ValueError(f"illegal environment variable name {k[:64]!r}")
        env_list.append(f"{k}={v}")
    uid, gid, groups = ("", "", "") if user is None else (
        str(user[0]), str(user[1]), ",".join(str(g) for g in user[2]))
    return [SPAWN, str(errfd), procs, root, cwd, uid, gid, groups, "1" if tty else "0",
            str(len(env_list)), *env_list, "--", *argv]


def spawn_error(argv0: str, report: bytes) -> str | None:
    """What `tkbox-spawn` wrote on its error pipe ("<errno> <step>"), for a person."""
    if not report:
        return None
    errno_s, _, step = report[:MAX_SPAWN_ERROR].decode("ascii", "replace").partition(" ")
    try:
        why = os.strerror(int(errno_s))
    except ValueError:
        why = "failed"
    where = {"exec": "", "chdir": " (entering the working directory)",
             "chroot": " (entering the box's root)", "cgroup": " (joining the commands' cgroup)",
             "tty": " (taking the terminal)"}.get(step, f" ({step})")
    return f"cannot start {argv0!r}: {why}{where}"


async def wait_readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        loop.remove_reader(fd)


async def wait_started(errfd: int) -> bytes:
    """Read `tkbox-spawn`'s error pipe to its end: empty once the command is exec'd."""
    os.set_blocking(errfd, False)
    data = b""
    while len(data) <= MAX_SPAWN_ERROR:
        try:
            chunk = os.read(errfd, MAX_SPAWN_ERROR + 1)
        except BlockingIOError:
            await wait_readable(errfd)
            continue
        if not chunk:
            break
        data += chunk
    return data



@dataclass
class Command:
    """A command `start` started: its process, its terminal's master end (-1 without
    one), and its wait status once the reaper has collected it."""

    proc: subprocess.Popen[bytes]
    master: int
    exited: asyncio.Future[int]

    def close(self) -> None:
        """Close the agent's ends of the command's pipes and terminal."""
        for pipe in (self.proc.stdout, self.proc.stderr, self.proc.stdin):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        if self.master >= 0:
            with contextlib.suppress(OSError):
                os.close(self.master)
            self.master = -1


async def start(req: rpc.Exec, env: dict[str, str], *, root: str,
                user: tuple[int, int, list[int]] | None, procs: str,
                watch: Callable[[int], asyncio.Future[int]],
                helper: str = SPAWN) -> Command | str:
    """Start `req`'s command through `helper` (`tkbox-spawn`); the running command, or
    why it did not start (one line, for `rpc.Exit.error`). `watch(pid)` is the
    reaper's future for its wait status, taken before the first await, so the
    SIGCHLD handler cannot reap it unseen."""
    argv, cwd = list(req.argv), req.cwd or "/workspace"
    name = argv[0][:200]
    master = -1
    errr, errw = os.pipe2(os.O_CLOEXEC)
    try:
        if req.tty is not None:
            # A terminal: one pty for stdin, stdout and stderr, sized as the host's.
            master, slave = open_pty(root)
            fcntl.ioctl(slave, termios.TIOCSWINSZ, winsize(*req.tty))
            try:
                proc = subprocess.Popen(  # noqa: S603 - the host decided this command
                    spawn_argv(argv, env, errw, root, cwd, user, tty=True, procs=procs),
                    executable=helper, env={}, stdin=slave, stdout=slave, stderr=slave,
                    start_new_session=True, close_fds=True, pass_fds=(errw,),
                )
            finally:
                os.close(slave)
        else:
            proc = subprocess.Popen(  # noqa: S603 - the host decided this command
                spawn_argv(argv, env, errw, root, cwd, user, procs=procs),
                executable=helper, env={},
                stdin=subprocess.PIPE if req.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                close_fds=True, pass_fds=(errw,),
            )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        os.close(errr)
        if master >= 0:
            os.close(master)
        return f"cannot start {name!r}: {str(exc)[:300]}"
    finally:
        os.close(errw)
    command = Command(proc, master, watch(proc.pid))
    try:
        failed = spawn_error(name, await wait_started(errr))
    finally:
        os.close(errr)
    if failed is not None:
        # The command never ran (the helper exits 127; the reaper collects it).
        proc.returncode = 127
        command.close()
        return failed
    return command
