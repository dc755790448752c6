"""The signer's wire protocol, sans-IO (both the signer and its clients use it).

It lives in `formats`, below both `tkbox.signer` (the process) and
`tkbox.record` (the daemon's client), so neither imports the other to speak
it: the signer shares no code with the daemon beyond the formats.

A frame is a 4-byte big-endian length N (1 <= N <= MAX_FRAME), then N bytes
of RFC 8785 canonical JSON holding one object.

Requests (client to signer) carry `id` (a non-negative integer, echoed in
the answer) and `op`, and are parsed at the edge, once, by `parse_request`
into one of a closed set of typed classes (as Firecracker parses an API
request into a `VmmAction`); clients build the same classes and send
`.encode()`, so both ends share one definition:

| op, class              | arguments                              | result |
| ---------------------- | -------------------------------------- | ------ |
| ping `Ping`            |                                        | `{key, origin, vkey, ...}` |
| open `Open`            | `run`, `facts`                         | `{seq}` |
| decide `Decide`        | `run`, `action`, `resource`, `context` | `{allowed, reason, decision}` |
| complete `Complete`    | `run`, `decision`, `outcome`           | `{seq}` |
| event `Event`          | `run`, `kind`, `body`                  | `{seq}` |
| close `Close`          | `run`                                  | `{seq}` |
| export `Export`        | `run`                                  | `{trust, parts, size}`, parts |
| hold `Hold`            | `run`, `reason` ("" when absent)       | `{seq}` |
| release `Release`      | `run`, `reason` ("" when absent)       | `{seq}` |
| quarantine `Quarantine`| `run`, `reason` ("" when absent)       | `{seq}` |
| status `Status`        |                                        | `{size, runs, ...}` |
| subscribe `Subscribe`  |                                        | `{}`, then pushes |
| auth `Auth`            | `token` (network listener only)        | `{workload, time_ms}` |

What `parse_request` checks, the same for every request: an object with an
`id` (0..2^53-1) and a known `op`, exactly that op's fields and no others,
each of its type and within its bound: `run` a run id (`names.RUN_ID`),
`facts`/`resource`/`context`/`outcome`/`body` objects, `action` 1-128
printable characters, `decision` at most 160 characters, `kind` a record kind
(`names.KIND`, at most 128 characters), `reason` at most 1000 characters,
`token` at most 64 KiB. Anything else raises `BadSignerRequest` (its `id`
when one was readable, so the answer can echo it; its message one line that
quotes at most a few dozen characters of what the peer sent).

Answers: `{id, ok: true, result}` (`Ok`) or `{id, ok: false, error, kind}`,
where `kind` is `refused` (`Refused`: a request the signer will not take: the
run is closed, the request is malformed, ...) or `failed` (`Failed`: the
signer could not do it); an export's bundle follows its answer as
`{id, part, data}` frames (`Part`). Pushes: `{push: "hold"|"release"|
"quarantine", run, reason}` (`Pushed`). `parse_answer` reads what the signer
sends back (`BadSignerAnswer` for anything else).

Every answer is sent only after what it reports is durable in the log.

Errors:

    WireError            the peer broke the framing (or an encode that cannot be one)
    ├── BadSignerRequest a frame that is not one of the requests (`.id`: its id or None)
    └── BadSignerAnswer  a frame from the signer that is neither an answer nor a push
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from tkbox.errors import RemoteError
from tkbox.formats import canonjson
from tkbox.formats.errors import FormatError
from tkbox.formats.names import KIND, RUN_ID  # re-exported: the bounds of a request

MAX_FRAME = 1 << 20
MAX_ID = canonjson.MAX_SAFE_INT
MAX_ACTION = 128
MAX_DECISION = 160
MAX_KIND = 128
MAX_REASON = 1000
MAX_TOKEN = 64 * 1024
_QUOTE = 40  # characters of a peer's value an error message may quote


class WireError(RemoteError):
    """The peer broke the framing or sent something that is not a frame (or we were
    asked to encode something that cannot be one)."""


class BadSignerRequest(WireError):
    """A frame that is not one of the signer's requests. `id` is the request's id when
    it was readable (the refusal echoes it), else None."""

    def __init__(self, message: str, id: int | None = None) -> None:
        super().__init__(message)
        self.id = id


class BadSignerAnswer(WireError):
    """A frame from the signer that is neither an answer nor a push. `id` as BadSignerRequest's."""

    def __init__(self, message: str, id: int | None = None) -> None:
        super().__init__(message)
        self.id = id


def encode(obj: dict[str, Any]) -> bytes:
    try:
        body = canonjson.dumps(obj)
    except FormatError as exc:
        raise WireError(f"cannot encode: {exc.what}") from None
    if len(body) > MAX_FRAME:
        raise WireError(f"a frame of {len(body)} bytes is larger than {MAX_FRAME}")
    return struct.pack(">I", len(body)) + body


class Decoder:
    """Feed bytes, take whole frames out. Bounded: never buffers more than one frame."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) >= 4:
            (n,) = struct.unpack(">I", self._buf[:4])
            if n == 0 or n > self._max:
                raise WireError(f"a frame length of {n} (1..{self._max} allowed)")

    def next(self) -> dict[str, Any] | None:
        if len(self._buf) < 4:
            return None
        (n,) = struct.unpack(">I", self._buf[:4])
        if n == 0 or n > self._max:
            raise WireError(f"a frame length of {n} (1..{self._max} allowed)")
        if len(self._buf) < 4 + n:
            return None
        body = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        try:
            obj = canonjson.loads(body, max_size=self._max)
        except FormatError as exc:
            raise WireError(f"a frame that is not canonical JSON: {exc.what}") from None
        if not isinstance(obj, dict):
            raise WireError("a frame that is not a JSON object")
        return obj

    @property
    def buffered(self) -> int:
        return len(self._buf)


# --- requests ------------------------------------------------------------------


class _Request:
    """What every request shares: its wire form from its fields, in one place."""

    __slots__ = ()
    OP: ClassVar[str]
    #: the fields after `id`, in order, as they are named on the wire
    FIELDS: ClassVar[tuple[str, ...]] = ()
    id: int

    def to_wire(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"id": self.id, "op": self.OP}
        for name in self.FIELDS:
            obj[name] = getattr(self, name)
        return obj

    def encode(self) -> bytes:
        return encode(self.to_wire())


@dataclass(frozen=True, slots=True)
class Ping(_Request):
    OP: ClassVar[str] = "ping"
    id: int


@dataclass(frozen=True, slots=True)
class Status(_Request):
    OP: ClassVar[str] = "status"
    id: int


@dataclass(frozen=True, slots=True)
class Subscribe(_Request):
    OP: ClassVar[str] = "subscribe"
    id: int


@dataclass(frozen=True, slots=True)
class Auth(_Request):
    OP: ClassVar[str] = "auth"
    FIELDS: ClassVar[tuple[str, ...]] = ("token",)
    id: int
    token: str


@dataclass(frozen=True, slots=True)
class Open(_Request):
    OP: ClassVar[str] = "open"
    FIELDS: ClassVar[tuple[str, ...]] = ("run", "facts")
    id: int
    run: str
    facts: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Decide(_Request):
    OP: ClassVar[str] = "decide"
    FIELDS: ClassVar[tuple[str, ...]] = ("run", "action", "resource", "context")
    id: int
    run: str
    action: str
    resource: dict[str, Any]
    context: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Complete(_Request):
    OP: ClassVar[str] = "complete"
    FIELDS: ClassVar[tuple[str, ...]] = ("run", "decision", "outcome")
    id: int
    run: str
    decision: str
    outcome: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Event(_Request):
    OP: ClassVar[str] = "event"
    FIELDS: ClassVar[tuple[str, ...]] = ("run", "kind", "body")
    id: int
    run: str
    kind: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Close(_Request):
    OP: ClassVar[str] = "close"
    FIELDS: ClassVar[tuple[str, ...]] = ("run",)
    id: int
    run: str


@dataclass(frozen=True, slots=True)
class Export(_Request):
    OP: ClassVar[str] = "export"
    FIELDS: ClassVar[tuple[str, ...]] = ("run",)
    id: int
    run: str


@dataclass(frozen=True, slots=True)
class Hold(_Request):
    OP: ClassVar[str] = "hold"
    FIELDS: ClassVar[tuple[str, ...]] = ("run", "reason")
    id: int
    run: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Release(_Request):
    OP: ClassVar[str] = "release"
    FIELDS: ClassVar[tuple[str, ...]] = ("run", "reason")
    id: int
    run: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Quarantine(_Request):
    OP: ClassVar[str] = "quarantine"
    FIELDS: ClassVar[tuple[str, ...]] = ("run", "reason")
    id: int
    run: str
    reason: str = ""


Request = (Ping | Status | Subscribe | Auth | Open | Decide | Complete | Event | Close
           | Export | Hold | Release | Quarantine)
#: the requests that name a run the signer already has
RunRequest = Decide | Complete | Event | Close | Export
#: the operator's requests (the signer's own user only)
AdminRequest = Hold | Release | Quarantine

_CLASSES: tuple[type[Request], ...] = (Ping, Status, Subscribe, Auth, Open, Decide, Complete,
                                       Event, Close, Export, Hold, Release, Quarantine)
OPS = frozenset(c.OP for c in _CLASSES)
_KNOWN = ", ".join(sorted(OPS))


def _quote(value: Any) -> str:
    """A peer's value in a message: its repr, cut to a few dozen characters."""
    text = repr(value) if isinstance(value, (str, int)) else type(value).__name__
    return text if len(text) <= _QUOTE else text[: _QUOTE - 3] + "..."


def _why_text(key: str, limit: int, empty: bool, printable: bool) -> Callable[..., None]:
    def why(v: Any, op: str, rid: int) -> None:
        if type(v) is not str:
            raise BadSignerRequest(f"{op}: {key} must be a string", rid)
        raise BadSignerRequest(f"{op}: {key} must be a string of {0 if empty else 1}-{limit}"
                         f"{' printable' if printable else ''} characters", rid)
    return why


def _why_obj(key: str) -> Callable[..., None]:
    def why(v: Any, op: str, rid: int) -> None:
        raise BadSignerRequest(f"{op}: {key} must be an object", rid)
    return why


def _why_run(v: Any, op: str, rid: int) -> None:
    if type(v) is not str:
        raise BadSignerRequest(f"{op}: run must be a string", rid)
    raise BadSignerRequest("a run id is 1-128 of [A-Za-z0-9._:-], starting with a letter or digit",
                     rid)


def _why_kind(v: Any, op: str, rid: int) -> None:
    if type(v) is not str:
        raise BadSignerRequest(f"{op}: kind must be a string", rid)
    raise BadSignerRequest(f"{_quote(v)} cannot be an event kind (a dotted lowercase name such as "
                     "tkbox.gap, and not one the signer writes itself)", rid)


_REQUIRED = object()
# A field: (its name, its type, a test of a value of that type or None, its default or
# _REQUIRED, and what raises the BadSignerRequest that says why a value is not one). The test
# is the whole check on the way in (the decision path); `why` runs only on a refusal.
_Field = tuple[str, type, Callable[[Any], Any] | None, Any, Callable[..., None]]
_RUN: _Field = ("run", str, RUN_ID.fullmatch, _REQUIRED, _why_run)


def _obj(key: str) -> _Field:
    return (key, dict, None, _REQUIRED, _why_obj(key))


def _text(key: str, limit: int, *, empty: bool = True, printable: bool = False,
          default: Any = _REQUIRED) -> _Field:
    if printable:
        def test(v: str) -> bool:
            return 0 < len(v) <= limit and v.isprintable()
    else:
        def test(v: str) -> bool:
            return (empty or v != "") and len(v) <= limit
    return (key, str, test, default, _why_text(key, limit, empty, printable))


_KIND: _Field = ("kind", str, lambda v: len(v) <= MAX_KIND and KIND.fullmatch(v),
                 _REQUIRED, _why_kind)

#: per op: its class and its fields after `id`
_SPEC: dict[str, tuple[type[Request], tuple[_Field, ...]]] = {
    "ping": (Ping, ()),
    "status": (Status, ()),
    "subscribe": (Subscribe, ()),
    "auth": (Auth, (_text("token", MAX_TOKEN),)),
    "open": (Open, (_RUN, _obj("facts"))),
    "decide": (Decide, (_RUN, _text("action", MAX_ACTION, empty=False, printable=True),
                        _obj("resource"), _obj("context"))),
    "complete": (Complete, (_RUN, _text("decision", MAX_DECISION), _obj("outcome"))),
    "event": (Event, (_RUN, _KIND, _obj("body"))),
    "close": (Close, (_RUN,)),
    "export": (Export, (_RUN,)),
    **{c.OP: (c, (_RUN, _text("reason", MAX_REASON, default="")))
       for c in (Hold, Release, Quarantine)},
}
assert set(_SPEC) == OPS and all(  # one definition: the spec names each class's fields
    tuple(f[0] for f in spec) == cls.FIELDS for cls, spec in _SPEC.values())
_KEYS = {op: frozenset(("id", "op", *cls.FIELDS)) for op, (cls, _) in _SPEC.items()}
# A request is built through its slots' own setters: a frozen dataclass's __init__ sets
# each field with object.__setattr__, twice the cost on the decision path. Same result:
# every field set once, and the instance frozen after.
_SETTERS = {op: tuple(getattr(cls, f).__set__ for f in ("id", *cls.FIELDS))
            for op, (cls, _) in _SPEC.items()}
_new = object.__new__


def parse_request(obj: Any) -> Request:
    """A decoded frame as one of the requests, every field checked; else BadSignerRequest."""
    if type(obj) is not dict:
        raise BadSignerRequest("a request must be a JSON object")
    rid = obj.get("id")
    if type(rid) is not int or not 0 <= rid <= MAX_ID:
        raise BadSignerRequest("a request needs a non-negative integer id")
    op = obj.get("op")
    spec = _SPEC.get(op) if type(op) is str else None
    if spec is None:
        raise BadSignerRequest(f"unknown op {_quote(op)}; the signer knows {_KNOWN}", rid)
    cls, fields = spec
    op = cls.OP
    keys = _KEYS[op]
    if not obj.keys() <= keys:
        extra = sorted(k for k in obj if k not in keys)
        raise BadSignerRequest(f"{op}: no field {_quote(extra[0])} (it takes "
                         f"{', '.join(cls.FIELDS) or 'none'})", rid)
    req = _new(cls)
    setters = _SETTERS[op]
    setters[0](req, rid)
    i = 1
    for key, typ, test, default, why in fields:
        value = obj.get(key, _REQUIRED)
        if value is _REQUIRED:
            if default is _REQUIRED:
                raise BadSignerRequest(f"{op}: {key} is missing", rid)
            value = default
        elif type(value) is not typ or (test is not None and not test(value)):
            why(value, op, rid)
        setters[i](req, value)
        i += 1
    return req


# --- answers and pushes -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ok:
    id: int
    result: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "ok": True, "result": self.result}


@dataclass(frozen=True, slots=True)
class Refused:
    """A request the signer will not take; `error` one line for a person."""

    id: int
    error: str
    kind: ClassVar[Literal["refused"]] = "refused"

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "ok": False, "kind": "refused", "error": self.error}


@dataclass(frozen=True, slots=True)
class Failed:
    """A request the signer could not carry out (`kind` as it said, "failed" when ours)."""

    id: int
    error: str
    kind: str = "failed"

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "ok": False, "kind": self.kind, "error": self.error}


@dataclass(frozen=True, slots=True)
class Part:
    """One part of an export's bundle (base64), after its `Ok`."""

    id: int
    part: int
    data: str

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "part": self.part, "data": self.data}


@dataclass(frozen=True, slots=True)
class Pushed:
    push: Literal["hold", "release", "quarantine"]
    run: str
    reason: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"push": self.push, "run": self.run, "reason": self.reason}


Answer = Ok | Refused | Failed | Part
_PUSHES: dict[Any, Literal["hold", "release", "quarantine"]] = {
    "hold": "hold", "release": "release", "quarantine": "quarantine"}


def parse_answer(obj: dict[str, Any]) -> Answer | Pushed:
    """A frame from the signer as an answer or a push; else BadSignerAnswer."""
    if "push" in obj:
        kind, run, reason = obj.get("push"), obj.get("run"), obj.get("reason", "")
        push = _PUSHES.get(kind) if type(kind) is str else None
        if push is not None and type(run) is str and type(reason) is str:
            return Pushed(push, run, reason)
        raise BadSignerAnswer("a push that is not a hold, release or quarantine of a run")
    rid = obj.get("id")
    if type(rid) is not int:
        raise BadSignerAnswer("an answer without an integer id")
    if "part" in obj:
        part, data = obj.get("part"), obj.get("data")
        if type(part) is int and type(data) is str:
            return Part(rid, part, data)
        raise BadSignerAnswer("an export part without its number and data", rid)
    result, error = obj.get("result"), obj.get("error")
    if obj.get("ok") is True and type(result) is dict:
        return Ok(rid, result)
    if type(error) is str:
        kind = obj.get("kind")
        if kind == "refused":
            return Refused(rid, error)
        return Failed(rid, error, kind if type(kind) is str else "")
    raise BadSignerAnswer("the signer sent an answer that is neither a result nor an error", rid)

