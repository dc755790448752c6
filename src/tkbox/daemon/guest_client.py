"""The host's side of the agent RPC (port 1024). Every guest byte is hostile.

Each answer frame is parsed once, on arrival, into one of the events its op
may produce (`tkbox.guest.rpc.parse_event`, the closed set both ends share):
every key named, every type and size bounded, an unknown key refused;
anything else, whatever the bytes, is one `GuestError` naming the box, in one
line that quotes no more than 40 printable characters of the guest's, and the
connection is dropped. Past `_recv` the code sees only typed events.
Frames are decoded with `GUEST_FRAMES` limits and paid for from the box's work
budget before the next read. A guest that stops answering hits a timeout,
never a hang of the daemon; the diff at stop also has an overall deadline,
so a guest trickling its patch cannot hold `stop`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from tkbox._tasks import TaskOwner
from tkbox.errors import GuestError
from tkbox.guest import rpc
from tkbox.guest.rpc import guest_text as guest_text  # re-exported for the daemon
from tkbox.protocol.framing import GUEST_FRAMES, FramedStream, FrameError
from tkbox.protocol.ports import PORT_RPC, PortError, Ports, TransportClosed
from tkbox.protocol.streams import StreamClosed
from tkbox.vm.errors import VMEnded

NextFrame = Callable[[int], Awaitable[rpc.Event]]
#: seconds a file copied out of the box (`read_file`, `tkbox cp`) may take in all
READ_DEADLINE = 600.0

OutputSink = Callable[[int, bytes], Awaitable[None]]
#: what a running command is sent: a signal number, or keystrokes and a new size
#: for a terminal
ExecInput = int | rpc.Stdin | rpc.Resize


def check_answer(op: str, msg: dict[str, Any]) -> str | None:
    """Why `msg` is not a valid answer to `op` (None if it is). Names keys, never values."""
    try:
        rpc.parse_event(op, msg)
    except GuestError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class ExecResult:
    status: int
    signal: int
    error: str = ""


def seconds(v: Any) -> float | None:
    """A guest-supplied duration, if it is a finite number of seconds below a day."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if 0 <= v < 86400 else None  # NaN and inf fail the comparison


IgnoredCheck = Callable[[list[bytes]], Awaitable[set[bytes]]]


def shown_path(raw: bytes, limit: int = 1024) -> str:
    """A path from the guest as one printable line: UTF-8 where it is, every other byte
    and every control character escaped (`\\xNN`), cut at `limit` characters."""
    text = raw.decode("utf-8", errors="backslashreplace")
    out = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return out if len(out) <= limit else out[:limit - 1] + "…"


def _checkable(path: bytes) -> bool:
    """A path git may be asked about: relative, normal, inside the checkout, not git's."""
    parts = path.split(b"/")
    return all(p and p not in (b".", b"..") and p.lower() != b".git" for p in parts) \
        and b"\x00" not in path and len(path) <= 4096


@dataclass(frozen=True)
class SetApart:
    """A change the box's patch does not carry (`tkbox.guest.diff`), as the host shows
    it: `path` printable and bounded."""

    path: str
    change: str
    size: int
    sha256: str
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "change": self.change, "size": self.size,
                "sha256": self.sha256, "why": self.why}


@dataclass
class PatchProgress:
    """What a `diff` has delivered, kept true whatever ends it."""

    bytes: int = 0
    marked: int = 0  # bytes that are whole files
    set_apart: list[SetApart] = field(default_factory=list)
    stats: dict[str, int | str] = field(default_factory=dict)
    done: bool = False



class GuestClient:
    def __init__(self, ports: Ports, box: str, *, timeout: float = 30.0) -> None:
        self.ports = ports
        self.box = box
        self.timeout = timeout

    def _bad(self, what: str) -> GuestError:
        return GuestError(f"box {self.box}: the guest sent {what}; the request was dropped")

    async def _open(self, *, reserved: bool = False) -> FramedStream:
        try:
            stream = await self.ports.connect(PORT_RPC, reserved=reserved)
        except TransportClosed as exc:  # the VMM closed its end: the VM ended, no guest fault
            raise VMEnded(f"box {self.box}: its VM has ended ({exc})") from None
        except PortError as exc:
            raise GuestError(f"box {self.box}: cannot reach the guest agent ({exc})") from None
        return FramedStream(stream, limits=GUEST_FRAMES, budget=self.ports.budget)

    async def _recv(self, fs: FramedStream, timeout: float | None, op: str) -> rpc.Event:
        """The guest's next answer to `op`, parsed (`rpc.parse_event`); its `error`
        answer raised as a `GuestError`."""
        try:
            msg = await asyncio.wait_for(fs.receive(), timeout)
        except TimeoutError:
            raise GuestError(f"box {self.box}: the guest agent did not answer within "
                             f"{timeout:.0f}s") from None
        except FrameError as exc:
            raise self._bad(f"a malformed frame ({exc})") from None
        except (StreamClosed, EOFError):
            msg = None
        if msg is None:
            raise GuestError(f"box {self.box}: the guest closed the connection mid-answer")
        try:
            ev = rpc.parse_event(op, msg)
        except GuestError as exc:
            raise self._bad(str(exc)) from None
        if isinstance(ev, rpc.Error):
            raise GuestError(f"box {self.box}: guest agent error: "
                             f"{guest_text(ev.message, 300)}")
        return ev

    async def ping(self, timeout: float = 10.0) -> float:
        fs = await self._open()
        try:
            await fs.send(rpc.Ping().wire())
            match await self._recv(fs, timeout, "ping"):
                case rpc.Pong(uptime=uptime):
                    return seconds(uptime) or 0.0
                case _:
                    raise self._bad("an unexpected answer to ping")
        finally:
            await fs.aclose()

    async def exec(self, argv: list[str], *, cwd: str, env: dict[str, str], stdin: bytes | None,
                   output: OutputSink, signals: asyncio.Queue[ExecInput],
                   tty: dict[str, int] | None = None) -> ExecResult:
        """Run one command. `signals` carries signal numbers and, for a terminal (`tty`:
        its rows and cols), `rpc.Stdin` keystrokes and `rpc.Resize` too."""
        fs = await self._open()
        # Owned by this call: the input sender is cancelled and awaited in `finally`.
        owner = TaskOwner(f"box {self.box}: exec")
        try:
            await fs.send(rpc.Exec(tuple(argv), cwd, env, stdin is not None or tty is not None,
                                   None if tty is None else (tty["rows"], tty["cols"])).wire())
            match await self._recv(fs, self.timeout, "exec"):
                case rpc.Exit() as ended:
                    return self._exit(ended)
                case rpc.Started():
                    pass
                case _:
                    raise self._bad("an unexpected first answer to exec")

            async def send_side() -> None:
                if stdin is not None:
                    for i in range(0, len(stdin), rpc.CHUNK):
                        await fs.send(rpc.Stdin(stdin[i:i + rpc.CHUNK]).wire())
                    await fs.send(rpc.StdinEof().wire())
                while True:
                    item = await signals.get()
                    await fs.send((rpc.Signal(item) if isinstance(item, int) else item).wire())

            owner.spawn(send_side(), "input")
            while True:
                match await self._recv(fs, None, "exec"):
                    case rpc.Out(fd=fd, data=data):
                        await output(fd, data)
                    case rpc.Exit() as ended:
                        return self._exit(ended)
                    case ev:
                        raise self._bad(f"an unexpected event {ev.NAME!r} during exec")
        finally:
            try:
                await owner.aclose()
            finally:
                await fs.aclose()

    def _exit(self, ev: rpc.Exit) -> ExecResult:
        return ExecResult(ev.status, ev.signal, guest_text(ev.error, 500))

    async def diff(self, sink: BinaryIO, progress: PatchProgress, *, kill: bool,
                   ignored: IgnoredCheck | None = None, max_bytes: int = rpc.MAX_PATCH,
                   timeout: float = 300.0, deadline: float | None = None) -> None:
        """Stream the workspace patch into `sink`, bounded by `max_bytes`; `progress`
        says what arrived, and stays true when this raises: `progress.marked` bytes of
        `sink` are whole files (a patch cut there applies).

        `ignored(paths)` says which changed paths the checkout's git ignores (the
        guest then sets them apart); without it the guest asks nothing. `timeout`
        bounds each wait for a frame; `deadline` (a `loop.time()`) bounds the whole
        transfer, so a guest sending one byte a second still ends in time. The stream
        is a reserved one: a guest holding every stream it may open cannot keep the
        host from asking.
        """
        fs = await self._open(reserved=True)
        next_frame = self._paced(fs, "diff", timeout, deadline, lambda total: GuestError(
            f"box {self.box}: the guest did not finish sending its patch in time ({total} "
            "bytes came)"))
        try:
            await fs.send(rpc.Diff(kill=kill, ask_ignored=ignored is not None).wire())
            if ignored is not None:
                paths = await self._changed_paths(next_frame)
                valid = [p for p in paths if _checkable(p)]
                hits = await ignored(valid) if valid else set()
                bits = bytearray((len(paths) + 7) // 8)
                for i, p in enumerate(paths):
                    if p in hits:
                        bits[i >> 3] |= 1 << (i & 7)
                await fs.send(rpc.Ignored(bytes(bits)).wire())
            while True:
                match await next_frame(progress.bytes):
                    case rpc.Data(data=data):
                        if progress.bytes + len(data) > max_bytes:
                            raise GuestError(f"box {self.box}: the patch exceeds "
                                             f"{max_bytes} bytes")
                        sink.write(data)
                        progress.bytes += len(data)
                    case rpc.Mark():
                        progress.marked = progress.bytes
                    case rpc.Apart() as apart if progress.bytes == 0:
                        if len(progress.set_apart) >= rpc.MAX_APART:
                            raise self._bad(f"more than {rpc.MAX_APART} set-apart entries")
                        progress.set_apart.append(SetApart(
                            shown_path(apart.path), apart.change, apart.size, apart.sha256,
                            apart.why))
                    case rpc.PatchEnd(stats=stats):
                        if progress.marked != progress.bytes:
                            raise self._bad("a patch that ends inside a file")
                        progress.stats = dict(stats or {})
                        progress.done = True
                        return
                    case ev:
                        raise self._bad(f"an unexpected {ev.NAME} frame in its patch")
        finally:
            await fs.aclose()

    async def _changed_paths(self, next_frame: NextFrame) -> list[bytes]:
        """The guest's `paths` frames up to `paths_end`, within `rpc.MAX_ASKED` paths and
        `rpc.MAX_ASKED_BYTES`."""
        paths: list[bytes] = []
        size = 0
        while True:
            match await next_frame(0):
                case rpc.PathsEnd(count=count):
                    if count != len(paths):
                        raise self._bad("a count of changed paths that is not the paths' "
                                        "count")
                    return paths
                case rpc.Paths(data=data):
                    size += len(data)
                    if not data.endswith(b"\x00") or size > rpc.MAX_ASKED_BYTES:
                        raise self._bad("a malformed or oversized list of changed paths")
                    paths.extend(data[:-1].split(b"\x00"))
                    if len(paths) > rpc.MAX_ASKED:
                        raise self._bad(f"more than {rpc.MAX_ASKED} changed paths to ask about")
                case ev:
                    raise self._bad(f"a {ev.NAME} frame before its changed paths ended")

    async def read_file(self, path: str, sink: BinaryIO, *, max_bytes: int = rpc.MAX_FILE,
                        timeout: float = 120.0, deadline: float | None = None) -> int:
        """Stream one file of the box into `sink`; bounded by `max_bytes`. Its size.

        `timeout` bounds each wait for a frame, `deadline` (a `loop.time()`; by default
        `READ_DEADLINE` from now) the whole file: a guest sending a byte a frame, each
        inside `timeout`, would otherwise hold `tkbox cp` for ever."""
        loop = asyncio.get_running_loop()
        fs = await self._open()
        next_frame = self._paced(
            fs, "read", timeout, loop.time() + READ_DEADLINE if deadline is None else deadline,
            lambda total: GuestError(f"box {self.box}: the guest did not finish sending "
                                     f"{path[:200]!r} in time ({total} bytes came); nothing "
                                     "was copied"))
        try:
            await fs.send(rpc.Read(path).wire())
            total = 0
            while True:
                match await next_frame(total):
                    case rpc.FileEnd():
                        return total
                    case rpc.Data(data=data):
                        total += len(data)
                        if total > max_bytes:
                            raise GuestError(f"box {self.box}: {path} is larger than "
                                             f"{max_bytes} bytes; nothing was copied")
                        sink.write(data)
                    case _:
                        raise self._bad("an unexpected event during read")
        finally:
            await fs.aclose()

    def _paced(self, fs: FramedStream, op: str, timeout: float, deadline: float | None,
               late: Callable[[int], GuestError]) -> NextFrame:
        """A reader of `fs`'s answers to `op`: each within `timeout`, all before
        `deadline` (a `loop.time()`; None: no overall bound), else `late(bytes so far)`."""
        loop = asyncio.get_running_loop()

        async def next_frame(total: int) -> rpc.Event:
            wait = timeout
            if deadline is not None:
                wait = deadline - loop.time()
                if wait <= 0:
                    raise late(total)
                wait = min(wait, timeout)
            try:
                return await self._recv(fs, wait, op)
            except GuestError:
                if deadline is not None and loop.time() >= deadline:
                    raise late(total) from None
                raise

        return next_frame

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644,
                         timeout: float = 120.0) -> None:
        """Write one file into the box (parents made); the guest acknowledges its size."""
        fs = await self._open()
        try:
            await fs.send(rpc.Write(path, mode & 0o777).wire())
            for i in range(0, len(data), rpc.CHUNK):
                await fs.send(rpc.Data(data[i:i + rpc.CHUNK]).wire())
            await fs.send(rpc.End().wire())
            match await self._recv(fs, timeout, "write"):
                case rpc.Written(size=size) if size == len(data):
                    pass
                case _:
                    raise self._bad("a wrong acknowledgement of a write")
        finally:
            await fs.aclose()

    async def shutdown(self, timeout: float = 10.0) -> None:
        fs = await self._open(reserved=True)
        try:
            await fs.send(rpc.Shutdown().wire())
            await self._recv(fs, timeout, "shutdown")
        finally:
            await fs.aclose()
