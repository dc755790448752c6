"""The host's side of the agent RPC (port 1024). Every guest byte is hostile.

Each answer frame is checked against the closed set of events its op may
produce (`SCHEMAS`): every key named, every type and size bounded, an unknown
key refused; anything else is a `GuestError` naming the box, and the
connection is dropped. Frames are decoded with `GUEST_FRAMES` limits and paid
for from the box's work budget before the next read. A guest that stops
answering hits a timeout, never a hang of the daemon; the diff at stop also
has an overall deadline, so a guest trickling its patch cannot hold `stop`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from tkbox._tasks import cancel_and_wait
from tkbox.errors import GuestError
from tkbox.guest import rpc
from tkbox.guest.diff import CHANGES, WHY
from tkbox.protocol.framing import GUEST_FRAMES, FramedStream, FrameError
from tkbox.protocol.ports import PORT_RPC, PortError, Ports, TransportClosed
from tkbox.protocol.streams import StreamClosed
from tkbox.vm.errors import VMEnded

NextFrame = Callable[[int], Awaitable[dict[str, Any]]]
#: seconds a file copied out of the box (`read_file`, `tkbox cp`) may take in all
READ_DEADLINE = 600.0

OutputSink = Callable[[int, bytes], Awaitable[None]]
#: what a running command is sent: a signal number, or `{"op": "stdin", "data"}` /
#: `{"op": "resize", "rows", "cols"}` for a terminal
ExecInput = int | dict[str, Any]


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**64


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _text(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= 4096


def _bin(v: Any) -> bool:
    return isinstance(v, bytes)


def _map(v: Any) -> bool:
    return isinstance(v, dict)


#: op -> event -> (required keys, optional keys), each key with its type check.
#: `error` (`message`) may answer any op. Nothing else is accepted.
Schema = dict[str, tuple[dict[str, Callable[[Any], bool]], dict[str, Callable[[Any], bool]]]]
_ERROR: Schema = {"error": ({}, {"message": _text})}
SCHEMAS: dict[str, Schema] = {
    "ping": {"ok": ({}, {"uptime": _num}), **_ERROR},
    "exec": {"started": ({}, {"pid": _int}),
             "out": ({"fd": _int, "data": _bin}, {}),
             "exit": ({"status": _int}, {"signal": _int, "error": _text}), **_ERROR},
    "diff": {"paths": ({"data": _bin}, {}), "paths_end": ({"count": _int}, {}),
             "apart": ({"path": _bin, "change": _text, "size": _int, "sha256": _text,
                        "why": _text}, {}),
             "data": ({"data": _bin}, {}), "mark": ({}, {}), "end": ({}, {"stats": _map}),
             **_ERROR},
    "shutdown": {"ok": ({}, {}), **_ERROR},
    "read": {"data": ({"data": _bin}, {}), "end": ({"size": _int}, {}), **_ERROR},
    "write": {"ok": ({"size": _int}, {}), **_ERROR},
}


_FRAME_NAMES = {"out": "output frame", "data": "patch frame", "exit": "exit status"}


def check_answer(op: str, msg: dict[str, Any]) -> str | None:
    """Why `msg` is not a valid answer to `op` (None if it is). Names keys, never values."""
    raw = msg.get("ev")
    ev = raw if isinstance(raw, str) else ""
    schema = SCHEMAS[op].get(ev)
    if schema is None:
        return f"an unexpected event {guest_text(raw, 40)!r} in answer to {op}"
    required, optional = schema
    for key, value in msg.items():
        if key == "ev":
            continue
        test = required.get(key) or optional.get(key)
        if test is None:
            return f"an unknown key {guest_text(key, 40)!r} in a {ev} answer to {op}"
        if not test(value):
            return f"a malformed {_FRAME_NAMES.get(ev, ev + ' answer')} ({key!r}) to {op}"
    missing = sorted(k for k in required if k not in msg)
    if missing:
        return f"a {ev} answer to {op} without {', '.join(missing)}"
    return None


@dataclass(frozen=True)
class ExecResult:
    status: int
    signal: int
    error: str = ""


def guest_text(v: Any, limit: int = 4096) -> str:
    """A guest-supplied string made safe to show and record: bounded, one line,
    no control characters (a hostile guest must not write to the user's terminal)."""
    if not isinstance(v, str):
        return ""
    return "".join(c if c.isprintable() else " " for c in v[:limit])


def seconds(v: Any) -> float | None:
    """A guest-supplied duration, if it is a finite number of seconds below a day."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if 0 <= v < 86400 else None  # NaN and inf fail the comparison


_SHA256 = re.compile(r"[0-9a-f]{64}")
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



def safe_stats(v: Any) -> dict[str, int | str]:
    """Patch statistics from the guest: at most 64 string keys, int or short str values."""
    out: dict[str, int | str] = {}
    if not isinstance(v, dict):
        return out
    for k, val in list(v.items())[:64]:
        if not isinstance(k, str) or len(k) > 64:
            continue
        if isinstance(val, bool) or not isinstance(val, (int, str)):
            continue
        if isinstance(val, int) and not 0 <= val < 2**53:
            continue
        out[guest_text(k, 64)] = val if isinstance(val, int) else guest_text(val, 256)
    return out


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

    async def _recv(self, fs: FramedStream, timeout: float | None,
                    op: str = "") -> dict[str, Any]:
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
        if op:
            why = check_answer(op, msg)
            if why is not None:
                raise self._bad(why)
        ev = msg.get("ev")
        if ev == "error":
            text = guest_text(msg.get("message"), 300)
            raise GuestError(f"box {self.box}: guest agent error: {text}")
        return msg

    async def ping(self, timeout: float = 10.0) -> float:
        fs = await self._open()
        try:
            await fs.send({"op": "ping"})
            msg = await self._recv(fs, timeout, "ping")
            if msg.get("ev") != "ok":
                raise self._bad("an unexpected answer to ping")
            return seconds(msg.get("uptime")) or 0.0
        finally:
            await fs.aclose()

    async def exec(self, argv: list[str], *, cwd: str, env: dict[str, str], stdin: bytes | None,
                   output: OutputSink, signals: asyncio.Queue[ExecInput],
                   tty: dict[str, int] | None = None) -> ExecResult:
        """Run one command. `signals` carries signal numbers and, for a terminal (`tty`:
        its rows and cols), `{"op": "stdin", "data"}` and `{"op": "resize", ...}` too."""
        fs = await self._open()
        sender: asyncio.Task[None] | None = None
        try:
            req: dict[str, Any] = {"op": "exec", "argv": argv, "cwd": cwd, "env": env,
                                   "stdin": stdin is not None or tty is not None}
            if tty is not None:
                req["tty"] = {"rows": tty["rows"], "cols": tty["cols"]}
            await fs.send(req)
            first = await self._recv(fs, self.timeout, "exec")
            if first.get("ev") == "exit":
                return self._exit(first)
            if first.get("ev") != "started":
                raise self._bad("an unexpected first answer to exec")

            async def send_side() -> None:
                if stdin is not None:
                    for i in range(0, len(stdin), rpc.CHUNK):
                        await fs.send({"op": "stdin", "data": stdin[i:i + rpc.CHUNK]})
                    await fs.send({"op": "stdin_eof"})
                while True:
                    item = await signals.get()
                    await fs.send(item if isinstance(item, dict) else {"op": "signal",
                                                                       "sig": item})

            # Owned by this call: cancelled and awaited in `finally`, whatever ends it.
            sender = asyncio.get_running_loop().create_task(send_side(),
                                                            name=f"box {self.box}: exec input")
            while True:
                msg = await self._recv(fs, None, "exec")
                ev = msg.get("ev")
                if ev == "out":
                    fd, data = msg.get("fd"), msg.get("data")
                    if fd not in (1, 2) or not isinstance(data, bytes):
                        raise self._bad("a malformed output frame")
                    await output(fd, data)
                elif ev == "exit":
                    return self._exit(msg)
                else:
                    raise self._bad(f"an unexpected event {str(ev)[:40]!r} during exec")
        finally:
            try:
                if sender is not None:
                    await cancel_and_wait(sender)
            finally:
                await fs.aclose()

    def _exit(self, msg: dict[str, Any]) -> ExecResult:
        status, sig = msg.get("status"), msg.get("signal", 0)
        if not isinstance(status, int) or not 0 <= status <= 255 or not isinstance(sig, int):
            raise self._bad("a malformed exit status")
        return ExecResult(status, sig, guest_text(msg.get("error"), 500))

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
            await fs.send({"op": "diff", "kill": kill, "ask_ignored": ignored is not None})
            if ignored is not None:
                paths = await self._changed_paths(next_frame)
                valid = [p for p in paths if _checkable(p)]
                hits = await ignored(valid) if valid else set()
                bits = bytearray((len(paths) + 7) // 8)
                for i, p in enumerate(paths):
                    if p in hits:
                        bits[i >> 3] |= 1 << (i & 7)
                await fs.send({"ev": "ignored", "bits": bytes(bits)})
            while True:
                msg = await next_frame(progress.bytes)
                ev = msg.get("ev")
                if ev == "data":
                    data = msg["data"]
                    if progress.bytes + len(data) > max_bytes:
                        raise GuestError(f"box {self.box}: the patch exceeds {max_bytes} bytes")
                    sink.write(data)
                    progress.bytes += len(data)
                elif ev == "mark":
                    progress.marked = progress.bytes
                elif ev == "apart" and progress.bytes == 0:
                    if len(progress.set_apart) >= rpc.MAX_APART:
                        raise self._bad(f"more than {rpc.MAX_APART} set-apart entries")
                    progress.set_apart.append(self._apart(msg))
                elif ev == "end":
                    if progress.marked != progress.bytes:
                        raise self._bad("a patch that ends inside a file")
                    progress.stats = safe_stats(msg.get("stats"))
                    progress.done = True
                    return
                else:
                    raise self._bad(f"an unexpected {guest_text(ev, 20)} frame in its patch")
        finally:
            await fs.aclose()

    async def _changed_paths(self, next_frame: NextFrame) -> list[bytes]:
        """The guest's `paths` frames up to `paths_end`, within `rpc.MAX_ASKED` paths and
        `rpc.MAX_ASKED_BYTES`."""
        paths: list[bytes] = []
        size = 0
        while True:
            msg = await next_frame(0)
            ev = msg.get("ev")
            if ev == "paths_end":
                if msg["count"] != len(paths):
                    raise self._bad("a count of changed paths that is not the paths' count")
                return paths
            if ev != "paths":
                raise self._bad(f"a {guest_text(ev, 20)} frame before its changed paths ended")
            data = msg["data"]
            size += len(data)
            if not data.endswith(b"\x00") or size > rpc.MAX_ASKED_BYTES:
                raise self._bad("a malformed or oversized list of changed paths")
            paths.extend(data[:-1].split(b"\x00"))
            if len(paths) > rpc.MAX_ASKED:
                raise self._bad(f"more than {rpc.MAX_ASKED} changed paths to ask about")

    def _apart(self, msg: dict[str, Any]) -> SetApart:
        path, change, size, digest, why = (msg["path"], msg["change"], msg["size"],
                                           msg["sha256"], msg["why"])
        if not 0 < len(path) <= 4096 or change not in CHANGES or why not in WHY \
                or not 0 <= size < 2**63 or not (digest == "" or _SHA256.fullmatch(digest)):
            raise self._bad("a malformed set-apart entry")
        return SetApart(shown_path(path), change, size, digest, why)

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
            await fs.send({"op": "read", "path": path})
            _, size = await self._data_into(
                sink, next_frame, max_bytes, "read", "file",
                f"box {self.box}: {path} is larger than {max_bytes} bytes; nothing was copied")
            return size
        finally:
            await fs.aclose()

    def _paced(self, fs: FramedStream, op: str, timeout: float, deadline: float | None,
               late: Callable[[int], GuestError]) -> NextFrame:
        """A reader of `fs`'s frames for `_data_into`: each within `timeout`, all before
        `deadline` (a `loop.time()`; None: no overall bound), else `late(bytes so far)`."""
        loop = asyncio.get_running_loop()

        async def next_frame(total: int) -> dict[str, Any]:
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

    async def _data_into(self, sink: BinaryIO, next_frame: NextFrame, max_bytes: int, op: str,
                         what: str, too_big: str) -> tuple[dict[str, Any], int]:
        """The guest's `data` frames into `sink`, at most `max_bytes` in all, until its
        `end` frame: that frame and the bytes written. `next_frame(bytes so far)` reads
        one frame."""
        total = 0
        while True:
            msg = await next_frame(total)
            ev = msg.get("ev")
            if ev == "end":
                return msg, total
            if ev != "data":
                raise self._bad(f"an unexpected event during {op}")
            data = msg.get("data")
            if not isinstance(data, bytes):
                raise self._bad(f"a malformed {what} frame")
            total += len(data)
            if total > max_bytes:
                raise GuestError(too_big)
            sink.write(data)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644,
                         timeout: float = 120.0) -> None:
        """Write one file into the box (parents made); the guest acknowledges its size."""
        fs = await self._open()
        try:
            await fs.send({"op": "write", "path": path, "mode": mode & 0o777})
            for i in range(0, len(data), rpc.CHUNK):
                await fs.send({"ev": "data", "data": data[i:i + rpc.CHUNK]})
            await fs.send({"ev": "end"})
            msg = await self._recv(fs, timeout, "write")
            if msg.get("ev") != "ok" or msg.get("size") != len(data):
                raise self._bad("a wrong acknowledgement of a write")
        finally:
            await fs.aclose()

    async def shutdown(self, timeout: float = 10.0) -> None:
        fs = await self._open(reserved=True)
        try:
            await fs.send({"op": "shutdown"})
            await self._recv(fs, timeout, "shutdown")
        finally:
            await fs.aclose()
