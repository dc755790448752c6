"""The agent's RPC service (port 1024) and its egress forwarder (127.0.0.1:3128).

`Agent.handle_rpc` reads one request per connection, parses it once into its
`tkbox.guest.rpc` class (`parse_request`; the frames that follow with
`parse_input`), and a `match` over the classes runs the handler; every answer is
built from the event classes. A request that is not one of the RPC's is
answered with `error`; so is a handler's failure, in one bounded line.

What the agent may do to the whole VM (stop every process before a diff or a
shutdown) is `kill_all`, given by its caller: PID 1 kills every process, a test
running this loop on a host passes its own.

Runs in the VM: standard library, `msgpack`, `tkbox.protocol` and `tkbox.guest`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tkbox._tasks import TaskOwner
from tkbox.guest import rpc
from tkbox.guest.boot import COMMANDS_CGROUP, LOWER, ROOT, UPPER, Reaper, run_user
from tkbox.guest.spawn import SPAWN, Command, start, wait_readable, winsize
from tkbox.protocol.framing import FramedStream, FrameError
from tkbox.protocol.ports import PORT_EGRESS, Ports
from tkbox.protocol.streams import ByteStream, StreamClosed


def kill_everything() -> None:
    """PID 1's stop: SIGKILL to every process in the VM but itself."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)


class Agent:
    """The RPC handlers and the egress forwarder of one booted guest."""

    def __init__(self, ports: Ports, cfg: dict[str, Any], reaper: Reaper, *,
                 helper: str = SPAWN, lower: Path = LOWER, upper: Path = UPPER,
                 kill_all: Callable[[], None] = kill_everything) -> None:
        self.ports = ports
        self.cfg = cfg
        self.reaper = reaper
        self.env = {str(k): str(v) for k, v in cfg.get("env", {}).items()}
        self.root = str(cfg.get("root", ROOT))
        self.user = run_user(cfg)
        procs = COMMANDS_CGROUP / "cgroup.procs"
        self.procs = str(procs) if procs.exists() else ""  # confine_commands ran first
        self.helper, self.lower, self.upper, self.kill_all = helper, lower, upper, kill_all
        self.started = time.monotonic()
        self.shutting_down = asyncio.Event()

    # -- egress forwarder --------------------------------------------------

    async def forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            stream = await self.ports.connect(PORT_EGRESS)
        except Exception:  # noqa: BLE001 - host gone or refusing: close the client
            writer.close()
            return

        async def up() -> None:
            try:
                while data := await reader.read(65536):
                    await stream.send_all(data)
                await stream.send_eof()
            except (StreamClosed, OSError):
                pass

        async def down() -> None:
            try:
                while data := await stream.receive(65536):
                    writer.write(data)
                    await writer.drain()
                if writer.can_write_eof():
                    writer.write_eof()
            except OSError:
                pass

        owner = TaskOwner("egress up")
        try:
            owner.spawn(up())
            await down()
        finally:
            await owner.aclose()  # up ends with down; a cancellation of ours goes on
            await stream.aclose()
            writer.close()

    # -- RPC ------------------------------------------------------------------

    async def handle_rpc(self, stream: ByteStream) -> None:
        fs = FramedStream(stream)
        try:
            msg = await fs.receive()
            if msg is None:
                return
            try:
                req = rpc.parse_request(msg)
            except rpc.RequestError as exc:
                await fs.send(rpc.Error(str(exc)[:rpc.MAX_TEXT]).wire())
                return
            match req:
                case rpc.Ping():
                    await fs.send(rpc.Pong(time.monotonic() - self.started).wire())
                case rpc.Exec():
                    await self.exec(fs, req)
                case rpc.Read(path=path):
                    await self.read(fs, self._path(path))
                case rpc.Write(path=path, mode=mode):
                    await self.write(fs, self._path(path), mode)
                case rpc.Diff(kill=kill, ask_ignored=ask):
                    await self.diff(fs, kill=kill, ask_ignored=ask)
                case rpc.Shutdown():
                    await self.shutdown(fs)
        except (FrameError, StreamClosed, EOFError):
            pass
        except Exception as exc:  # noqa: BLE001 - report, never die
            with contextlib.suppress(Exception):
                await fs.send(rpc.Error(f"{exc.__class__.__name__}: {exc}"[:rpc.MAX_TEXT])
                              .wire())

    async def exec(self, fs: FramedStream, req: rpc.Exec) -> None:
        env = dict(self.env)
        env.update(req.env)
        started = await start(req, env, root=self.root, user=self.user, procs=self.procs,
                              watch=self.reaper.watch, helper=self.helper)
        if isinstance(started, str):
            await fs.send(rpc.Exit(127, 0, started).wire())
            return
        cmd: Command = started
        proc, master = cmd.proc, cmd.master
        await fs.send(rpc.Started(proc.pid).wire())
        loop = asyncio.get_running_loop()
        lock = asyncio.Lock()

        async def pump(fd: int, pipe: Any) -> None:
            raw = pipe if isinstance(pipe, int) else pipe.fileno()
            os.set_blocking(raw, False)
            while True:
                try:
                    data = os.read(raw, rpc.CHUNK)
                except OSError as exc:
                    if not isinstance(exc, BlockingIOError):
                        return  # EIO: the terminal's last user is gone
                    await wait_readable(raw)
                    continue
                if not data:
                    return
                async with lock:
                    await fs.send(rpc.Out(fd, data).wire())

        def kill(sig: int) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)

        async def feed() -> None:
            # stdin frames, signals and (for a terminal) new sizes from the host
            stdin = proc.stdin
            while True:
                msg = await fs.receive()
                if msg is None:
                    kill(signal.SIGKILL)  # the host went away (client gone): stop it
                    return
                try:
                    frame = rpc.parse_input("exec", msg)
                except rpc.RequestError:
                    continue  # not one of exec's frames: nothing to do with it
                match frame:
                    case rpc.Signal(sig=sig):
                        kill(sig)
                    case rpc.Stdin(data=data) if master >= 0:
                        # A terminal: keystrokes (^C, ^D included) go to the pty as they
                        # are; the line discipline turns them into signals and end-of-file.
                        with contextlib.suppress(OSError):
                            await loop.run_in_executor(None, os.write, master, data)
                    case rpc.Resize(rows=rows, cols=cols) if master >= 0:
                        with contextlib.suppress(OSError):
                            fcntl.ioctl(master, termios.TIOCSWINSZ, winsize(rows, cols))
                    case rpc.Stdin(data=data) if stdin is not None:
                        with contextlib.suppress(BrokenPipeError):
                            await loop.run_in_executor(None, stdin.write, data)
                            await loop.run_in_executor(None, stdin.flush)
                    case rpc.StdinEof() if master < 0 and stdin is not None:
                        with contextlib.suppress(OSError):
                            stdin.close()
                        stdin = None

        owner = TaskOwner("exec")  # the pumps and the feeder end with this call
        pumps = ([owner.spawn(pump(1, master))] if master >= 0 else
                 [owner.spawn(pump(1, proc.stdout)), owner.spawn(pump(2, proc.stderr))])
        owner.spawn(feed())
        try:
            status = await cmd.exited
            proc.returncode = os.waitstatus_to_exitcode(status)
            # Give the pipes a moment to drain; a background child may hold them open.
            await asyncio.wait(pumps, timeout=1.0)
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            for p in pumps:
                p.cancel()
            async with lock:
                await fs.send(rpc.Exit(code, sig).wire())
        finally:
            await owner.aclose()
            cmd.close()

    def _path(self, path: str) -> Path:
        """A path of the box's root (`rpc` checked it is absolute, without NUL)."""
        return Path(self.root) / path.lstrip("/")

    async def read(self, fs: FramedStream, path: Path) -> None:
        size = 0
        with open(path, "rb") as f:  # noqa: ASYNC230 - guest-local tmpfs/disk
            while chunk := f.read(rpc.CHUNK):
                size += len(chunk)
                if size > rpc.MAX_FILE:
                    raise ValueError(f"file exceeds {rpc.MAX_FILE} bytes")
                await fs.send(rpc.Data(chunk).wire())
        await fs.send(rpc.FileEnd(size).wire())

    async def write(self, fs: FramedStream, path: Path, mode: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        with open(path, "wb") as f:  # noqa: ASYNC230
            while True:
                msg = await fs.receive()
                if msg is None:
                    raise ValueError("stream ended before the end of the file")
                match rpc.parse_input("write", msg):
                    case rpc.Data(data=data):
                        size += len(data)
                        f.write(data)
                    case rpc.End():
                        break
        os.chmod(path, mode)
        if self.user is not None:
            os.chown(path, self.user[0], self.user[1])  # the box's user may change it
        await fs.send(rpc.Written(size).wire())

    async def diff(self, fs: FramedStream, *, kill: bool, ask_ignored: bool) -> None:
        from tkbox.guest.diff import WorkspaceDiff

        if kill:
            # Stop: no process may change the workspace while it is read.
            self.kill_all()
            await asyncio.sleep(0.05)
            self.reaper.reap()
        os.sync()
        loop = asyncio.get_running_loop()
        # The walk, the comparisons and the hashes read the disks: off the loop, so
        # the transport keeps moving.
        with WorkspaceDiff(self.lower, self.upper, max_bytes=rpc.MAX_PATCH,
                           max_file=rpc.MAX_PATCH_FILE, max_listed=rpc.MAX_APART) as d:
            paths = await loop.run_in_executor(None, d.changes)
            ignored = await _ask_ignored(fs, paths) if ask_ignored else set()
            for a in await loop.run_in_executor(None, d.plan, ignored):
                await fs.send(rpc.Apart(a.path, a.change, a.size, a.sha256, a.why).wire())
            sections = d.sections()
            while (section := await loop.run_in_executor(None, next, sections, None)) \
                    is not None:
                for i in range(0, len(section), rpc.CHUNK):
                    await fs.send(rpc.Data(section[i:i + rpc.CHUNK]).wire())
                await fs.send(rpc.Mark().wire())  # a whole file: a cut here still applies
            await fs.send(rpc.PatchEnd(d.stats.to_dict()).wire())

    async def shutdown(self, fs: FramedStream) -> None:
        self.kill_all()
        os.sync()
        await fs.send(rpc.Done().wire())
        self.shutting_down.set()


async def _ask_ignored(fs: FramedStream, paths: list[bytes]) -> set[bytes]:
    """Which of `paths` the checkout's git ignores: the host decides, with the same
    check `tkbox apply` makes (docs/changes.md). At most `rpc.MAX_ASKED` paths are
    asked about, in frames of NUL-separated paths; the host answers with one bit per
    path asked. Paths past the bound go on as not ignored (apply sets them apart)."""
    asked: list[bytes] = []
    chunk: list[bytes] = []
    size = total = 0
    for p in paths:
        if len(asked) >= rpc.MAX_ASKED or total + len(p) + 1 > rpc.MAX_ASKED_BYTES:
            break
        asked.append(p)
        chunk.append(p)
        size += len(p) + 1
        total += len(p) + 1
        if size >= rpc.CHUNK:
            await fs.send(rpc.Paths(b"\x00".join(chunk) + b"\x00").wire())
            chunk, size = [], 0
    if chunk:
        await fs.send(rpc.Paths(b"\x00".join(chunk) + b"\x00").wire())
    await fs.send(rpc.PathsEnd(len(asked)).wire())
    answer = await fs.receive()
    if answer is None:
        raise ValueError("the host closed the stream before answering about ignored paths")
    match rpc.parse_input("diff", answer):
        case rpc.Ignored(bits=bits) if len(bits) == (len(asked) + 7) // 8:
            return {p for i, p in enumerate(asked) if bits[i >> 3] & (1 << (i & 7))}
    raise ValueError("the host's answer about ignored paths is malformed")
