"""The agent RPC on port 1024: its closed set of messages, shared by host and guest.

One connection per request. The host sends a request frame, then (for some
ops) more frames; the guest answers with event frames. Every frame is a
msgpack map (`tkbox.protocol.framing`) whose `op` (host) or `ev` key names the
message; the other keys are its fields.

| op | host sends after the request | guest answers |
| --- | --- | --- |
| `exec` | `stdin` chunks, `stdin_eof`, `signal`, `resize` | `started`, `out` chunks, `exit` |
| `read` | - | `data` chunks, `end` (size) |
| `write` | `data` chunks, `end` | `ok` (size) |
| `diff` | `ignored` | `paths`…, `paths_end`, `apart`…, `data`… `mark`…, `end` (stats) |
| `shutdown` | - | `ok`, then the VM powers off |
| `ping` | - | `ok` (uptime) |

`diff` (docs/changes.md, "What the patch carries"): with `ask_ignored`, the guest
first sends the changed paths (`paths`: NUL-separated, at most `MAX_ASKED` paths
and `MAX_ASKED_BYTES` in all) and waits for `ignored` (`bits`: one bit per path
asked, bit `i % 8` of byte `i // 8`, set when the checkout's git ignores it). Each
`apart` frame is a change the patch leaves out (path, change, size, sha256, why);
a `mark` follows each file's last `data` frame, so the host can keep every whole
file of a patch that is cut off.

Any op may be answered with `error` (`message`).

Each message is a frozen dataclass below; `wire()` gives its map, and the
`parse_*` functions turn a decoded map into one, checking every key, every
field's type and every bound once, so nothing past them sees a raw map:

- `parse_event(op, msg)` (the host, reading the guest: hostile) raises
  `GuestError` with a one-line reason that names keys and at most 40 printable
  characters of what the guest sent, whatever `msg` is;
- `parse_request(msg)` and `parse_input(op, msg)` (the guest, reading the host)
  raise `RequestError`; the agent answers it with `error`.

Used by the guest agent: standard library and `tkbox.errors` only (the agent
imports it at boot; `tkbox.guest.diff` is imported only for a `diff`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from tkbox.errors import GuestError, TkboxError

CHUNK = 256 * 1024  # payload bytes per data frame (well under the 1 MiB frame limit)
MAX_PATCH = 256 * 1024 * 1024  # the largest patch the guest will compute
#: a file larger than this is set apart, never in a patch (the changes door's own
#: per-file limit, `tkbox.doors.changes.patch.Limits.max_file_bytes`)
MAX_PATCH_FILE = 64 * 1024 * 1024
MAX_ASKED = 200_000  # changed paths the guest asks the host about (ignored or not)
MAX_ASKED_BYTES = 16 * 1024 * 1024
MAX_APART = 1000  # set-apart changes listed one by one (the rest counted)
MAX_FILE = 64 * 1024 * 1024  # read/write RPC limit
MAX_TEXT = 4096  # characters of a guest's message (error, exit error, a set-apart field)
MAX_PATH = 4096  # bytes of a path, either way
MAX_ARGS = 4096  # arguments of one command (the host's frames allow 4,096 array entries)
MAX_STATS = 64  # entries of a patch's statistics the host keeps

OPS = frozenset({"exec", "read", "write", "diff", "shutdown", "ping"})

#: why a change is set apart (an `apart` event's `why`; `tkbox.guest.diff` decides)
WHY_IGNORED = "ignored"  # the checkout's git ignores the path
WHY_FILE = "file-too-large"  # larger than the per-file limit
WHY_TOTAL = "patch-too-large"  # the patch's limit was reached: the largest left out
WHY = (WHY_IGNORED, WHY_FILE, WHY_TOTAL)
CHANGES = ("added", "modified", "deleted")  # an `apart` event's `change`


class RequestError(TkboxError):
    """The host sent the agent a frame that is not one of the RPC's requests (the
    guest's side of a parse; the agent answers it with `error`)."""


def guest_text(v: Any, limit: int = MAX_TEXT) -> str:
    """A guest-supplied string made safe to show and record: bounded, one line,
    no control characters (a hostile guest must not write to the user's terminal)."""
    if not isinstance(v, str):
        return ""
    return "".join(c if c.isprintable() else " " for c in v[:limit])


# ---- field checks: each returns the value (normalised) or raises _Bad -----------


class _Bad(Exception):
    """A field's value is not what its message allows (turned into the side's error)."""


_REQUIRED: Any = object()
Check = Callable[[Any], Any]


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad
    return v


def _int(lo: int, hi: int) -> Check:
    """An integer (never a bool) with lo <= v <= hi."""
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _Bad
        return v
    return check


def _uptime(v: Any) -> float | None:
    """A number of seconds; kept when it is finite, >= 0 and below ten years, else
    None (NaN and inf fail the comparison)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad
    return float(v) if 0 <= v < 10 * 365 * 86400 else None


def _text(limit: int, allowed: tuple[str, ...] = ()) -> Check:
    def check(v: Any) -> str:
        if not isinstance(v, str) or len(v) > limit or (allowed and v not in allowed):
            raise _Bad
        return v
    return check


def _bin(lo: int = 0, hi: int = 1 << 20) -> Check:
    def check(v: Any) -> bytes:
        if not isinstance(v, bytes) or not lo <= len(v) <= hi:
            raise _Bad
        return v
    return check


def _abs_path(v: Any) -> str:
    if not isinstance(v, str) or not v.startswith("/") or "\0" in v or len(v) > MAX_PATH:
        raise _Bad
    return v


def _argv(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not 0 < len(v) <= MAX_ARGS \
            or not all(isinstance(a, str) for a in v):
        raise _Bad
    return tuple(v)


def _env(v: Any) -> dict[str, str]:
    """Names and values are strings; a name `tkbox-spawn` cannot set (empty, with `=`)
    is the command's start failing (`spawn.spawn_argv`), as it always was."""
    if not isinstance(v, dict) or len(v) > MAX_ARGS or not all(
            isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        raise _Bad
    return dict(v)


def _tty(v: Any) -> tuple[int, int]:
    """A terminal's size `{rows, cols}`, each 1..1000."""
    if not isinstance(v, dict) or set(v) != {"rows", "cols"}:
        raise _Bad
    side = _int(1, 1000)
    return side(v["rows"]), side(v["cols"])


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _sha256(v: Any) -> str:
    if not isinstance(v, str) or not (v == "" or _SHA256.fullmatch(v)):
        raise _Bad
    return v


def _stats(v: Any) -> dict[str, int | str]:
    """Patch statistics: a map; of it, at most `MAX_STATS` string keys (64 characters)
    with an int (0..2**53) or a short string value are kept, each made printable."""
    if not isinstance(v, dict):
        raise _Bad
    out: dict[str, int | str] = {}
    for k, val in list(v.items())[:MAX_STATS]:
        if not isinstance(k, str) or len(k) > 64:
            continue
        if isinstance(val, bool) or not isinstance(val, (int, str)):
            continue
        if isinstance(val, int) and not 0 <= val < 2**53:
            continue
        out[guest_text(k, 64)] = val if isinstance(val, int) else guest_text(val, 256)
    return out


# ---- the messages ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    """One key of a message: its check, its default when absent (`_REQUIRED`: none),
    and how its value goes on the wire (`dump`). A field that is None, or equal to
    `omit`, is left off the wire, as both ends always have."""

    key: str
    check: Check
    default: Any = _REQUIRED
    omit: Any = None
    dump: Callable[[Any], Any] | None = None


class Message:
    """Base of every RPC message: `KIND` (`op` or `ev`) names it `NAME` on the wire."""

    __slots__ = ()
    KIND: ClassVar[str]
    NAME: ClassVar[str]
    NOUN: ClassVar[str] = ""  # how an error names a malformed one ("output frame")
    FIELDS: ClassVar[tuple[Field, ...]] = ()

    def wire(self) -> dict[str, Any]:
        """The frame's map, keys in the order the agent has always sent them."""
        out: dict[str, Any] = {self.KIND: self.NAME}
        for spec in self.FIELDS:
            v = getattr(self, spec.key)
            if v is None or (spec.omit is not None and v == spec.omit):
                continue
            out[spec.key] = v if spec.dump is None else spec.dump(v)
        return out


class Request(Message):
    """What the host asks (`op`), first frame of a connection."""

    __slots__ = ()
    KIND = "op"


class Input(Message):
    """A frame the host sends after its request."""

    __slots__ = ()


class Event(Message):
    """What the guest answers (`ev`)."""

    __slots__ = ()
    KIND = "ev"


# requests


@dataclass(frozen=True, slots=True)
class Exec(Request):
    NAME = "exec"
    FIELDS = (Field("argv", _argv, dump=list), Field("cwd", _text(MAX_PATH), "/workspace"),
              Field("env", _env, {}), Field("stdin", _bool, False),
              Field("tty", _tty, None, dump=lambda t: {"rows": t[0], "cols": t[1]}))
    argv: tuple[str, ...]
    cwd: str = "/workspace"
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: bool = False
    tty: tuple[int, int] | None = None  # (rows, cols): one pty for stdin, stdout, stderr


@dataclass(frozen=True, slots=True)
class Read(Request):
    NAME = "read"
    FIELDS = (Field("path", _abs_path),)
    path: str


@dataclass(frozen=True, slots=True)
class Write(Request):
    NAME = "write"
    FIELDS = (Field("path", _abs_path), Field("mode", _int(0, 0o777), 0o644))
    path: str
    mode: int = 0o644


@dataclass(frozen=True, slots=True)
class Diff(Request):
    NAME = "diff"
    FIELDS = (Field("kill", _bool, False), Field("ask_ignored", _bool, False))
    kill: bool = False
    ask_ignored: bool = False


@dataclass(frozen=True, slots=True)
class Shutdown(Request):
    NAME = "shutdown"


@dataclass(frozen=True, slots=True)
class Ping(Request):
    NAME = "ping"


# what the host sends after its request


@dataclass(frozen=True, slots=True)
class Stdin(Input):
    KIND, NAME = "op", "stdin"
    FIELDS = (Field("data", _bin()),)
    data: bytes


@dataclass(frozen=True, slots=True)
class StdinEof(Input):
    KIND, NAME = "op", "stdin_eof"


@dataclass(frozen=True, slots=True)
class Signal(Input):
    KIND, NAME = "op", "signal"
    FIELDS = (Field("sig", _int(1, 64)),)
    sig: int


@dataclass(frozen=True, slots=True)
class Resize(Input):
    KIND, NAME = "op", "resize"
    FIELDS = (Field("rows", _int(1, 1000)), Field("cols", _int(1, 1000)))
    rows: int
    cols: int


@dataclass(frozen=True, slots=True)
class End(Input):
    """The end of a file the host writes."""

    KIND, NAME = "ev", "end"


@dataclass(frozen=True, slots=True)
class Ignored(Input):
    KIND, NAME = "ev", "ignored"
    FIELDS = (Field("bits", _bin(0, (MAX_ASKED + 7) // 8)),)
    bits: bytes


# the guest's answers


@dataclass(frozen=True, slots=True)
class Data(Event, Input):
    """A chunk of a file or patch (either way: `read`/`diff` answers, `write` input)."""

    NAME, NOUN = "data", "patch frame"
    FIELDS = (Field("data", _bin()),)
    data: bytes


@dataclass(frozen=True, slots=True)
class Started(Event):
    NAME = "started"
    FIELDS = (Field("pid", _int(0, 2**63 - 1), None),)
    pid: int | None = None


@dataclass(frozen=True, slots=True)
class Out(Event):
    NAME, NOUN = "out", "output frame"
    FIELDS = (Field("fd", _int(1, 2)), Field("data", _bin()))
    fd: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Exit(Event):
    NAME, NOUN = "exit", "exit status"
    FIELDS = (Field("status", _int(0, 255)), Field("signal", _int(0, 255), 0, omit=-1),
              Field("error", _text(MAX_TEXT), "", omit=""))
    status: int
    signal: int = 0
    error: str = ""  # why the command never started (its status is then 127)


@dataclass(frozen=True, slots=True)
class Pong(Event):
    NAME = "ok"
    FIELDS = (Field("uptime", _uptime, None),)
    uptime: float | None = None


@dataclass(frozen=True, slots=True)
class Written(Event):
    NAME = "ok"
    FIELDS = (Field("size", _int(0, 2**63 - 1)),)
    size: int


@dataclass(frozen=True, slots=True)
class Done(Event):
    """The guest has stopped every process and synced its disks (`shutdown`)."""

    NAME = "ok"


@dataclass(frozen=True, slots=True)
class FileEnd(Event):
    NAME = "end"
    FIELDS = (Field("size", _int(0, 2**63 - 1)),)
    size: int


@dataclass(frozen=True, slots=True)
class PatchEnd(Event):
    NAME = "end"
    FIELDS = (Field("stats", _stats, None),)
    stats: Mapping[str, int | str] | None = None


@dataclass(frozen=True, slots=True)
class Paths(Event):
    NAME = "paths"
    FIELDS = (Field("data", _bin()),)
    data: bytes  # NUL-terminated paths


@dataclass(frozen=True, slots=True)
class PathsEnd(Event):
    NAME = "paths_end"
    FIELDS = (Field("count", _int(0, MAX_ASKED)),)
    count: int


@dataclass(frozen=True, slots=True)
class Apart(Event):
    """A change the patch does not carry (`tkbox.guest.diff.SetApart`)."""

    NAME, NOUN = "apart", "set-apart entry"
    FIELDS = (Field("path", _bin(1, MAX_PATH)), Field("change", _text(16, CHANGES)),
              Field("size", _int(0, 2**63 - 1)), Field("sha256", _sha256),
              Field("why", _text(64, WHY)))
    path: bytes
    change: str
    size: int
    sha256: str
    why: str


@dataclass(frozen=True, slots=True)
class Mark(Event):
    NAME = "mark"


@dataclass(frozen=True, slots=True)
class Error(Event):
    NAME = "error"
    FIELDS = (Field("message", _text(MAX_TEXT), ""),)
    message: str = ""


@dataclass(frozen=True, slots=True)
class Ready(Event):
    """The boot stream's (port 1026) answer once the guest serves; not an RPC answer."""

    NAME = "ready"
    FIELDS = (Field("uptime", _uptime, None),)
    uptime: float | None = None


#: op -> every event that may answer it, by wire name (`error` answers any op)
ANSWERS: dict[str, dict[str, type[Event]]] = {
    "ping": {"ok": Pong, "error": Error},
    "exec": {"started": Started, "out": Out, "exit": Exit, "error": Error},
    "read": {"data": Data, "end": FileEnd, "error": Error},
    "write": {"ok": Written, "error": Error},
    "diff": {"paths": Paths, "paths_end": PathsEnd, "apart": Apart, "data": Data,
             "mark": Mark, "end": PatchEnd, "error": Error},
    "shutdown": {"ok": Done, "error": Error},
}
REQUESTS: dict[str, type[Request]] = {c.NAME: c for c in (Exec, Read, Write, Diff, Shutdown,
                                                          Ping)}
#: op -> what the host may send after that request, by (kind, name)
INPUTS: dict[str, dict[tuple[str, str], type[Input]]] = {
    "exec": {(c.KIND, c.NAME): c for c in (Stdin, StdinEof, Signal, Resize)},
    "write": {("ev", "data"): Data, ("ev", "end"): End},
    "diff": {("ev", "ignored"): Ignored},
}

M = TypeVar("M", bound=Message)


def _fields(cls: type[M], msg: dict[str, Any], refuse: Callable[[str], Exception],
            where: str) -> M:
    """`cls` built from `msg`'s keys (all but its kind key), each checked; `where`
    ends every reason ("to exec", "from the host")."""
    by_key = {f.key: f for f in cls.FIELDS}
    values: dict[str, Any] = {}
    noun = cls.NOUN or f"{cls.NAME} {'answer' if cls.KIND == 'ev' else 'frame'}"
    for key, value in msg.items():
        if key == cls.KIND:
            continue
        spec = by_key.get(key) if isinstance(key, str) else None
        if spec is None:
            raise refuse(f"an unknown key {guest_text(key, 40)!r} in a {cls.NAME} "
                         f"{'answer' if cls.KIND == 'ev' else 'frame'} {where}")
        try:
            values[key] = spec.check(value)
        except _Bad:
            raise refuse(f"a malformed {noun} ({key!r}) {where}") from None
    missing = [f.key for f in cls.FIELDS if f.default is _REQUIRED and f.key not in msg]
    if missing:
        raise refuse(f"a {cls.NAME} {'answer' if cls.KIND == 'ev' else 'frame'} {where} "
                     f"without {', '.join(missing)}")
    return cls(**values)


def parse_event(op: str, msg: object) -> Event:
    """The guest's answer `msg` to `op` as its message; `GuestError` (one line, no
    unbounded guest bytes) for anything else."""
    answers = ANSWERS[op]
    if not isinstance(msg, dict):
        raise GuestError(f"an answer to {op} that is not a map")
    raw = msg.get("ev")
    cls = answers.get(raw) if isinstance(raw, str) else None
    if cls is None:
        raise GuestError(f"an unexpected event {guest_text(raw, 40)!r} in answer to {op}")
    return _fields(cls, msg, GuestError, f"to {op}")


def parse_request(msg: object) -> Request:
    """The host's first frame as its request; `RequestError` for anything else."""
    if not isinstance(msg, dict):
        raise RequestError("a request that is not a map")
    op = msg.get("op")
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise RequestError(f"unknown op {guest_text(op, 40)!r}" if isinstance(op, str)
                           else "a request without an op")
    return _fields(cls, msg, RequestError, "from the host")


def parse_input(op: str, msg: object) -> Input:
    """A frame the host sent after its `op` request; `RequestError` for anything else."""
    allowed = INPUTS.get(op, {})
    if not isinstance(msg, dict):
        raise RequestError(f"a frame after {op} that is not a map")
    for kind in ("op", "ev"):
        name = msg.get(kind)
        if isinstance(name, str) and (kind, name) in allowed:
            return _fields(allowed[(kind, name)], msg, RequestError, f"during {op}")
    raise RequestError(f"an unexpected frame during {op}")
