"""tkbox's log record: one leaf of the signer's Merkle log.

A record is the RFC 8785 canonical JSON of an object with exactly these
members:

| member | value |
| ------ | ----- |
| `v`    | `1` |
| `run`  | the run id (`RUN_ID` below) |
| `seq`  | the record's position in its run, from 0 |
| `prev` | base64 of the previous record's leaf hash, `null` for `seq` 0 |
| `time` | the signer's clock, RFC 3339 UTC with milliseconds |
| `kind` | `tkbox.run.open`, `tkbox.decision`, `tkbox.complete`, `tkbox.run.close`, |
|        | or an event kind (`tkbox.secret.use`, `tkbox.gap`, ...) |
| `body` | an object; what it holds depends on `kind` |

Its leaf hash is RFC 6962's: SHA-256(0x00 || record bytes). `prev` chains the
records of one run from its open record to its close record, so none can be
left out of a bundle, added, or moved unnoticed.
"""

from __future__ import annotations

import binascii
import functools
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from time import time_ns
from typing import Any, NamedTuple

from tkbox.formats import _strict, canonjson
from tkbox.formats.canonjson import MAX_DEPTH, MAX_SAFE_INT
from tkbox.formats.errors import FormatError
from tkbox.formats.merkle import HASH_SIZE, leaf_hash
from tkbox.formats.names import KIND, RUN_ID  # re-exported: what a record's run and kind are

VERSION = 1
MAX_RECORD = 64 * 1024
TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z")

OPEN = "tkbox.run.open"
CLOSE = "tkbox.run.close"
DECISION = "tkbox.decision"
COMPLETE = "tkbox.complete"
ISOLATION = ("same-user", "separate-user", "remote")
FIELDS = frozenset({"v", "run", "seq", "prev", "time", "kind", "body"})


@dataclass(frozen=True)
class Record:
    run: str
    seq: int
    prev: bytes | None  # leaf hash of the previous record of the run
    time: str
    kind: str
    body: dict[str, Any]
    raw: bytes  # the canonical bytes (the leaf)

    @functools.cached_property
    def hash(self) -> bytes:
        """The leaf hash, computed once (the signer needs it three times per record)."""
        return leaf_hash(self.raw)


def now() -> str:
    """The current UTC time in the record's format."""
    ms = time_ns() // 1_000_000
    second, milli = divmod(ms, 1000)
    return _second_text(second) + f"{milli:03d}Z"


@functools.lru_cache(maxsize=2)
def _second_text(second: int) -> str:
    """`YYYY-MM-DDTHH:MM:SS.` of a Unix second (made once per second, not per record)."""
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")


def valid_run_id(run: str) -> bool:
    return RUN_ID.fullmatch(run) is not None


def make(run: str, seq: int, prev: bytes | None, kind: str, body: dict[str, Any],
         time: str | None = None) -> Record:
    """Build a record (the signer's side). Raises FormatError on bad input."""
    obj = {
        "v": VERSION,
        "run": run,
        "seq": seq,
        "prev": None if prev is None else _strict.b64e(prev),
        "time": time or now(),
        "kind": kind,
        "body": body,
    }
    raw = canonjson.dumps(obj)
    if len(raw) > MAX_RECORD:
        raise _fail(f"{len(raw)} bytes, more than {MAX_RECORD}", "record", "record.json")
    return _check(obj, raw, "record")  # the bytes are ours: no need to parse them back


def _fail(what: str, where: str, code: str = "record.schema") -> FormatError:
    return FormatError(code, where, what)


def parse(raw: bytes, where: str = "record", *, ours: bool = False) -> Record:
    """Parse and check one record's bytes.

    `ours=True` (the signer re-reading its own store, whose every leaf hash it
    has just checked) skips re-serializing to prove the bytes canonical.
    """
    if len(raw) > MAX_RECORD:
        raise _fail(f"{len(raw)} bytes, more than {MAX_RECORD}", where, "record.json")
    if ours:
        try:
            return _check(json.loads(raw), raw, where)
        except ValueError:
            raise _fail("not JSON", where, "record.json") from None
    return _check(canonjson.loads(raw, max_size=MAX_RECORD, where=where), raw, where)


class Link(NamedTuple):
    """A record as the checks of its run read it (`tkbox.verify`): its place in the
    run, and the one fact of its body they check (`fact`), the body itself left
    behind (a large bundle's bodies would be most of the memory checking it takes)."""

    run: str
    seq: int
    prev: bytes | None
    kind: str
    time: str
    fact: Any


def fact(kind: str, body: dict[str, Any]) -> Any:
    """What a body states for the checks of its run: a decision's `allowed` (None if
    it does not state its action and allowed), the decision a completion names (None
    if that is not an integer), an open record's isolation; None for any other kind.
    (`body` is what the canonical reader made: exact dicts, strs, ints and bools, so
    `type(x) is int` is an integer that is not a bool.)"""
    if kind == DECISION:
        allowed = body.get("allowed")
        if (allowed is True or allowed is False) and type(body.get("action")) is str:
            return allowed
    elif kind == COMPLETE:
        d = body.get("decision")
        if type(d) is int:
            return d
    elif kind == OPEN:
        return body["isolation"]  # one of ISOLATION: `_check` made sure
    return None


def link(rec: Record) -> Link:
    return Link(rec.run, rec.seq, rec.prev, rec.kind, rec.time, fact(rec.kind, rec.body))


def read_links(raws: list[bytes], where: str = "record", first: int = 0) -> list[Link]:
    """`link(parse(raw))` of each of `raws` (a bundle's records), with what they share
    done once, and no `Record` made (which costs about as much as reading the record).

    Same acceptance as `parse`. The members of a canonical record come in one
    order (sorted: body, kind, prev, run, seq, time, v), and all but the body
    are strings or integers of fixed shapes that need no escapes, so a record
    takes the quick way when it is ASCII with few brackets and reads as
    `{"body":` + a JSON object that the C encoder prints back byte for byte
    (see `canonjson.loads`) + the rest of the members exactly as `_LAYOUT`
    spells them. Anything else goes through `parse`, which says what is wrong
    with `where` and the record's number, counted from `first` (or reads it, if
    it is valid after all). Records of one run share one run id and few kinds:
    each link holds the same string as the others, not a copy.
    """
    # Integers beyond I-JSON's range have 16 digits or more: in a record without such a
    # run of digits, the scanner need not check each integer it reads. (Looked for in
    # each record: in the records joined, the copies cost more than the calls saved.)
    as_zero, sixteen = _DIGITS_AS_ZERO, b"0" * 16
    encode = canonjson.encode_plain
    layout = _LAYOUT.fullmatch
    runs: dict[str, str] = {}  # run ids and kinds already found valid
    kinds: dict[str, str] = {}
    out: list[Link] = []
    append = out.append
    a2b = binascii.a2b_base64
    new = tuple.__new__  # a NamedTuple's own __new__ is a Python call, once per record
    for j, raw in enumerate(raws):
        try:
            if len(raw) > MAX_RECORD or not raw.isascii() or \
                    raw.count(b"{") + raw.count(b"[") > MAX_DEPTH or \
                    not raw.startswith(b'{"body":{'):
                raise ValueError
            text = raw.decode("ascii")
            scan = _scan_once if raw.translate(as_zero).find(sixteen) >= 0 else _scan_unchecked
            body, end = scan(text, 8)
            m = layout(text, end)
            if m is None or type(body) is not dict or encode(body) != text[8:end]:
                raise ValueError
            kind, prev, run, digits, time = m.groups()
            if run not in runs:
                if not valid_run_id(run):
                    raise ValueError
                runs[run] = run
            run = runs[run]
            if kind not in kinds:
                if KIND.fullmatch(kind) is None:
                    raise ValueError
                kinds[kind] = kind
            kind = kinds[kind]
            seq = int(digits)
            if seq > MAX_SAFE_INT:
                raise ValueError
            if seq == 0:
                if prev is not None or kind != OPEN or body.get("isolation") not in ISOLATION:
                    raise ValueError
                prev_hash = None
            else:  # canonical base64 of 32 bytes: the last letter's two spare bits are 0
                if prev is None or kind == OPEN or prev[42] not in _B64_LAST:
                    raise ValueError
                prev_hash = a2b(prev)
        except (ValueError, StopIteration, RecursionError, TypeError, FormatError):
            append(link(parse(raw, f"{where} {first + j}")))  # raises, naming the fault
            continue                                          # (or agrees)
        append(new(Link, (run, seq, prev_hash, kind, time, fact(kind, body))))
    return out


#: A canonical record after its body: the members in their one order, in the
#: characters their shapes allow (KIND and RUN_ID are checked in full once per
#: distinct value), none of which needs an escape in JSON: `seq` a decimal
#: integer, `time` TIME, `prev` null or 44 letters of base64.
_LAYOUT = re.compile(
    r',"kind":"([a-z0-9_.-]+)"'
    r',"prev":(?:null|"([A-Za-z0-9+/]{43}=)")'
    r',"run":"([A-Za-z0-9._:-]+)"'
    r',"seq":(0|[1-9][0-9]{0,15})'
    r',"time":"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z)"'
    r',"v":1\}')
#: The base64 letters whose value's two low bits are 0: the only ones that can end
#: 32 bytes' canonical base64 (43 letters and "=").
_B64_LAST = frozenset("AEIMQUYcgkosw048")


def _check(obj: Any, raw: bytes, where: str) -> Record:
    if not isinstance(obj, dict):
        raise _fail("a record is a JSON object", where)
    if set(obj) != FIELDS:
        missing = sorted(FIELDS - set(obj))
        extra = sorted(set(obj) - FIELDS)
        raise _fail(f"members missing {missing} or unknown {extra}", where)
    if obj["v"] != VERSION or isinstance(obj["v"], bool):
        raise _fail(f"record version {obj['v']!r} is not {VERSION}", where)
    run, seq, prev, time, kind, body = (obj[k] for k in ("run", "seq", "prev", "time", "kind",
                                                          "body"))
    if not isinstance(run, str) or not valid_run_id(run):
        raise _fail("the run id is not 1-128 of [A-Za-z0-9._:-]", where)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise _fail("seq is not a non-negative integer", where)
    if seq == 0:
        if prev is not None:
            raise _fail("the first record of a run has prev null", where, "record.chain")
        prev_hash = None
    else:
        if not isinstance(prev, str):
            raise _fail("prev is not the previous record's hash", where, "record.chain")
        prev_hash = _strict.b64(prev, "record.schema", where, length=HASH_SIZE)
    if not isinstance(time, str) or TIME.fullmatch(time) is None:
        raise _fail("time is not RFC 3339 UTC with milliseconds", where)
    if not isinstance(kind, str) or KIND.fullmatch(kind) is None:
        raise _fail("kind is not a dotted lowercase name", where)
    if not isinstance(body, dict):
        raise _fail("body is not an object", where)
    if (seq == 0) != (kind == OPEN):
        raise _fail(f"a run starts with {OPEN}, and only there", where, "record.open")
    if kind == OPEN and body.get("isolation") not in ISOLATION:
        raise _fail("the open record states isolation same-user, separate-user or remote",
                    where)
    return Record(run, seq, prev_hash, time, kind, body, raw)


#: The C scanner with the checks of `canonjson.loads`' fast path (floats and
#: constants refused, integers within I-JSON's range).
_scan_once = canonjson.scanner()
_scan_unchecked = canonjson.scanner(check_ints=False)
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
