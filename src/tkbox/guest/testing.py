"""The guest agent's fakes, for tests of the host above the RPC (users' and ours).

- `FakeGuest` speaks the agent RPC (`tkbox.guest.rpc`) over any `ByteStream`, as
  the real agent's serve loop does (`tkbox.guest.serve.Agent.handle_rpc`), with
  no VM, no disks and no processes: its files are a dict, its commands are
  Python functions (`Program`; `cat`, `echo`, `true` and `false` are built in),
  its workspace patch is computed from its checkout (`lower`) and the files
  under `/workspace` with the real agent's section writer. The conformance
  suite (`tests/conformance/test_guest_rpc.py`) runs the same cases against it
  and the real serve loop.
- `MemoryPorts` is the host's `Ports` onto a guest in the same process: each
  `connect` is a memory stream pair whose other end the guest's handler serves.
- `answer_diff` answers one `diff` request with a given patch, as the real
  agent does: the changed paths asked about when the host asks, then the
  set-apart entries, the patch, a `mark` after it, and `end`. A fake guest that
  only has a patch to give calls it; one that attacks the host writes its own
  frames.

    guest = FakeGuest(lower={"a.txt": b"a\\n"})
    client = GuestClient(MemoryPorts(guest.handle_rpc), "box")
    await client.write_file("/workspace/a.txt", b"b\\n")
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tkbox._tasks import TaskOwner
from tkbox.guest import rpc
from tkbox.guest.diff import PatchStats, section
from tkbox.guest.rpc import WHY_IGNORED
from tkbox.protocol.framing import FramedStream, FrameError
from tkbox.protocol.ports import PORT_RPC, Handler, PortError, Ports
from tkbox.protocol.streams import ByteStream, StreamClosed, memory_stream_pair

__all__ = ["FakeGuest", "FakeProcess", "MemoryPorts", "Program", "answer_diff",
           "patch_paths"]

_HEADER = re.compile(rb"^diff --git a/(\S+) b/", re.M)
WORKSPACE = "/workspace/"


def patch_paths(patch: bytes) -> list[bytes]:
    """The (unquoted) paths a patch's `diff --git` headers name, once each, sorted."""
    return sorted(set(_HEADER.findall(patch)))


async def _ask(fs: FramedStream, paths: list[bytes]) -> set[bytes]:
    """Send `paths` as the changed paths, and read which the host says are ignored."""
    if paths:
        await fs.send(rpc.Paths(b"\x00".join(paths) + b"\x00").wire())
    await fs.send(rpc.PathsEnd(len(paths)).wire())
    answer = await fs.receive()
    if answer is None:
        return set()
    match rpc.parse_input("diff", answer):
        case rpc.Ignored(bits=bits) if len(bits) == (len(paths) + 7) // 8:
            return {p for i, p in enumerate(paths) if bits[i >> 3] & (1 << (i & 7))}
    raise rpc.RequestError("the host's answer about ignored paths is malformed")


async def answer_diff(fs: FramedStream, req: rpc.Diff | dict[str, Any], patch: bytes, *,
                      stats: Mapping[str, int | str] | None = None,
                      apart: Sequence[rpc.Apart | dict[str, Any]] = ()) -> set[bytes]:
    """Answer one `diff` request with `patch` (one whole unit); the paths the host said
    its checkout ignores (empty when it did not ask)."""
    diff = req if isinstance(req, rpc.Diff) else rpc.parse_request(req)
    if not isinstance(diff, rpc.Diff):
        raise rpc.RequestError(f"answer_diff answers a diff request, not {diff.NAME}")
    ignored = await _ask(fs, patch_paths(patch)) if diff.ask_ignored else set()
    for a in apart:
        await fs.send((a if isinstance(a, rpc.Apart) else rpc.Apart(**a)).wire())
    for i in range(0, len(patch), rpc.CHUNK):
        await fs.send(rpc.Data(patch[i:i + rpc.CHUNK]).wire())
    if patch:
        await fs.send(rpc.Mark().wire())
    await fs.send(rpc.PatchEnd(dict(stats or {})).wire())
    return ignored


# ---- a fake agent ---------------------------------------------------------------


@dataclass
class FakeProcess:
    """What a `Program` sees of its command: its argv, env and directory, its input,
    and `write(fd, data)` for its output. Signals the host sent are in `signals`."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    _fs: FramedStream
    _input: asyncio.Queue[bytes | None]
    signals: list[int] = field(default_factory=list)

    async def read(self) -> bytes | None:
        """The next chunk of stdin; None at its end (or when the command has none)."""
        return await self._input.get()

    async def read_all(self) -> bytes:
        out = b""
        while (chunk := await self.read()) is not None:
            out += chunk
        return out

    async def write(self, fd: int, data: bytes) -> None:
        for i in range(0, len(data), rpc.CHUNK):
            await self._fs.send(rpc.Out(fd, data[i:i + rpc.CHUNK]).wire())


#: a command of the fake: given its process, its exit status
Program = Callable[[FakeProcess], Awaitable[int]]


async def _cat(p: FakeProcess) -> int:
    while (chunk := await p.read()) is not None:
        await p.write(1, chunk)
    return 0


async def _echo(p: FakeProcess) -> int:
    await p.write(1, " ".join(p.argv[1:]).encode() + b"\n")
    return 0


async def _true(p: FakeProcess) -> int:
    return 0


async def _false(p: FakeProcess) -> int:
    return 1


BUILTINS: dict[str, Program] = {"cat": _cat, "echo": _echo, "true": _true, "false": _false}


class FakeGuest:
    """A guest agent without a VM: serves the RPC on whatever stream it is handed.

    `lower` is the checkout (workspace-relative path -> content); `files` the box's
    files by absolute path, `/workspace/...` starting as the checkout. A write below
    a path that is a file is refused as the real agent's is (`error`). `programs`
    (by argv[0]) add to or replace the built-in commands; an unknown one exits 127
    with the real agent's message. `diff` with `kill` and `shutdown` count in `kills`
    (the real agent stops every process then); `shutdown` sets `shut_down`. Every
    request the host sent is in `requests`.
    """

    def __init__(self, *, lower: Mapping[str, bytes] | None = None,
                 programs: Mapping[str, Program] | None = None) -> None:
        self.lower = dict(lower or {})
        self.files: dict[str, tuple[int, bytes]] = {
            WORKSPACE + k: (0o100644, v) for k, v in self.lower.items()}
        self.programs = {**BUILTINS, **(programs or {})}
        self.requests: list[rpc.Request] = []
        self.kills = 0
        self.shut_down = asyncio.Event()
        self.started = time.monotonic()

    async def handle_rpc(self, stream: ByteStream) -> None:
        """Serve one connection: one request and what follows it."""
        fs = FramedStream(stream)
        try:
            msg = await fs.receive()
            if msg is None:
                return
            try:
                req = rpc.parse_request(msg)
            except rpc.RequestError as exc:
                await fs.send(rpc.Error(str(exc)).wire())
                return
            self.requests.append(req)
            match req:
                case rpc.Ping():
                    await fs.send(rpc.Pong(time.monotonic() - self.started).wire())
                case rpc.Exec():
                    await self._exec(fs, req)
                case rpc.Read(path=path):
                    await self._read(fs, path)
                case rpc.Write(path=path, mode=mode):
                    await self._write(fs, path, mode)
                case rpc.Diff():
                    if req.kill:
                        self.kills += 1
                    await self._diff(fs, req)
                case rpc.Shutdown():
                    self.kills += 1
                    await fs.send(rpc.Done().wire())
                    self.shut_down.set()
        except (FrameError, StreamClosed, EOFError):
            pass
        except (rpc.RequestError, OSError) as exc:
            await fs.send(rpc.Error(f"{exc.__class__.__name__}: {exc}"[:rpc.MAX_TEXT]).wire())
        finally:
            await fs.aclose()

    async def _exec(self, fs: FramedStream, req: rpc.Exec) -> None:
        program = self.programs.get(req.argv[0])
        if program is None:
            await fs.send(rpc.Exit(127, 0, f"cannot start {req.argv[0][:200]!r}: "
                                           "No such file or directory").wire())
            return
        stdin: asyncio.Queue[bytes | None] = asyncio.Queue()
        if not req.stdin and req.tty is None:
            stdin.put_nowait(None)
        proc = FakeProcess(req.argv, dict(req.env), req.cwd, fs, stdin)
        await fs.send(rpc.Started(2).wire())

        async def feed() -> None:
            while (msg := await fs.receive()) is not None:
                match rpc.parse_input("exec", msg):
                    case rpc.Stdin(data=data):
                        stdin.put_nowait(data)
                    case rpc.StdinEof():
                        stdin.put_nowait(None)
                    case rpc.Signal(sig=sig):
                        proc.signals.append(sig)
            stdin.put_nowait(None)

        owner = TaskOwner("fake guest exec")
        try:
            owner.spawn(feed())
            status = await program(proc)
        finally:
            await owner.aclose()
        await fs.send(rpc.Exit(status, 0).wire())

    async def _read(self, fs: FramedStream, path: str) -> None:
        if path not in self.files:
            raise FileNotFoundError(f"[Errno 2] No such file or directory: {path[:200]!r}")
        data = self.files[path][1]
        for i in range(0, len(data), rpc.CHUNK):
            await fs.send(rpc.Data(data[i:i + rpc.CHUNK]).wire())
        await fs.send(rpc.FileEnd(len(data)).wire())

    async def _write(self, fs: FramedStream, path: str, mode: int) -> None:
        parts = path.split("/")
        for i in range(2, len(parts)):
            if "/".join(parts[:i]) in self.files:
                # as the agent's mkdir of the parents finds it
                raise FileExistsError(f"[Errno 17] File exists: {'/'.join(parts[:i])[:200]!r}")
        data = b""
        while True:
            msg = await fs.receive()
            if msg is None:
                raise rpc.RequestError("stream ended before the end of the file")
            match rpc.parse_input("write", msg):
                case rpc.Data(data=chunk):
                    data += chunk
                case rpc.End():
                    break
        self.files[path] = (0o100000 | mode, data)
        await fs.send(rpc.Written(len(data)).wire())

    async def _diff(self, fs: FramedStream, req: rpc.Diff) -> None:
        """The patch from the checkout to the files under `/workspace` now."""
        now = {k[len(WORKSPACE):]: v for k, v in self.files.items() if k.startswith(WORKSPACE)}
        old = {k: (0o100644, v) for k, v in self.lower.items()}
        changed = sorted(p for p in old.keys() | now.keys() if old.get(p) != now.get(p))
        ignored = await _ask(fs, [p.encode() for p in changed]) if req.ask_ignored else set()
        stats = PatchStats()
        for p in changed:
            if p.encode() in ignored:
                entry = now.get(p) or old[p]
                change = "deleted" if p not in now else "added" if p not in old else "modified"
                await fs.send(rpc.Apart(p.encode(), change, len(entry[1]),
                                        _sha256(entry[1]), WHY_IGNORED).wire())
                stats.count_apart(WHY_IGNORED, len(entry[1]))
        for p in changed:
            if p.encode() in ignored:
                continue
            text = section(p.encode(), old.get(p), now.get(p))
            for i in range(0, len(text), rpc.CHUNK):
                await fs.send(rpc.Data(text[i:i + rpc.CHUNK]).wire())
            await fs.send(rpc.Mark().wire())
            if p not in now:
                stats.deleted += 1
            elif p not in old:
                stats.added += 1
            else:
                stats.modified += 1
            stats.bytes += len(text)
        await fs.send(rpc.PatchEnd(stats.to_dict()).wire())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- the host's ports onto a guest in this process ------------------------------


class MemoryPorts(Ports):
    """The host's `Ports` onto a guest served in this process: `connect(1024)` opens a
    memory stream pair and runs `rpc_handler` on its other end (a task owned here,
    ended by `aclose`). Other ports refuse."""

    def __init__(self, rpc_handler: Handler, *, limit: int = 4 << 20) -> None:
        self.handler = rpc_handler
        self.limit = limit
        self.owner = TaskOwner("memory ports")

    async def connect(self, port: int, *, reserved: bool = False) -> ByteStream:
        if port != PORT_RPC:
            raise PortError(f"nothing listens on port {port}")
        host, guest = memory_stream_pair(self.limit)

        async def serve() -> None:
            try:
                await self.handler(guest)
            finally:
                await guest.aclose()

        self.owner.spawn(serve(), f"port {port}")
        return host

    def serve(self, port: int, handler: Handler) -> None:
        raise PortError("the guest opens no streams to the host here")

    async def aclose(self) -> None:
        await self.owner.aclose()

