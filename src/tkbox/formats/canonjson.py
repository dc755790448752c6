"""RFC 8785 (JCS) canonical JSON, for the subset tkbox records use.

Values: objects with string keys, arrays, strings, booleans, null, and
integers within I-JSON's exact range (|n| <= 2^53 - 1). Floats are refused:
no record needs one, and refusing them keeps number formatting out of the
trust base. Within that subset the output is byte-identical to RFC 8785
(checked against the `rfc8785` package in the tests):

- object members sorted by the UTF-16 code units of their names (§3.2.3);
- no whitespace; strings escaped as ECMAScript's JSON.stringify does
  (§3.2.2.2): `\\"`, `\\\\`, `\\b \\f \\n \\r \\t`, other controls as
  `\\u00xx` in lowercase hex, everything else as UTF-8;
- integers in plain decimal (§3.2.2.3 for integral values).

`loads` accepts only bytes that `dumps` would produce for the value it
reads: no duplicate names, no whitespace, no escapes that are not needed.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from tkbox.formats.errors import FormatError

MAX_SAFE_INT = (1 << 53) - 1
MAX_DEPTH = 32


class CanonicalJSONError(FormatError):
    pass


def _fail(what: str, where: str = "") -> CanonicalJSONError:
    return CanonicalJSONError("json.canonical", where, what)


# The standard library's encoder for ensure_ascii=False escapes exactly what
# RFC 8785 §3.2.2.2 escapes, the same way: \" \\ \b \f \n \r \t, and other
# controls as \u00xx in lowercase hex. A lone surrogate passes through it and
# is refused when the result is encoded to UTF-8.
_encode_string = json.encoder.encode_basestring


def _string(s: str, out: list[str]) -> None:
    out.append(_encode_string(s))


def _value(v: Any, out: list[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _fail(f"nested deeper than {MAX_DEPTH}")
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, int):
        if not -MAX_SAFE_INT <= v <= MAX_SAFE_INT:
            raise _fail(f"integer {v} is outside the I-JSON range ±(2^53 - 1)")
        out.append(str(int(v)))
    elif isinstance(v, str):
        _string(v, out)
    elif isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise _fail(f"object key {k!r} is not a string")
        out.append("{")
        # RFC 8785 §3.2.3: sort by UTF-16 code units.
        for i, k in enumerate(sorted(v, key=lambda s: s.encode("utf-16-be", "surrogatepass"))):
            if i:
                out.append(",")
            _string(k, out)
            out.append(":")
            _value(v[k], out, depth + 1)
        out.append("}")
    elif isinstance(v, list | tuple):
        out.append("[")
        for i, item in enumerate(v):
            if i:
                out.append(",")
            _value(item, out, depth + 1)
        out.append("]")
    elif isinstance(v, float):
        raise _fail("floats are not used in tkbox records")
    else:
        raise _fail(f"{type(v).__name__} is not a JSON value")


# The fast path: for values `_plain` accepts, the standard library's C encoder
# writes exactly what `_value` writes (same string escaping, see above; integers
# in plain decimal; members sorted by code point, which is the UTF-16 code unit
# order of §3.2.3 for names without characters beyond U+FFFF).
_encode_plain = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True,
                                 check_circular=False, allow_nan=False).encode


def _plain(v: Any, depth: int) -> bool:
    """Only exact dicts, lists, tuples, strs, ints in range, bools and None, object
    names without astral characters, nested at most MAX_DEPTH: anything else (or
    anything wrong) goes the slow way, which encodes it or says what is wrong.

    A container's members that are not containers are checked where they are,
    without a call each (most of a record's values are strings): a call per value
    cost as much as the C encoder's whole run over the record."""
    t = type(v)
    members: Any
    if t is dict:
        for k in v:
            if type(k) is not str or (not k.isascii() and max(k) > "\uffff"):
                return False
        members = v.values()
    elif t is list or t is tuple:
        members = v
    elif t is str or t is bool or v is None:
        return depth <= MAX_DEPTH
    elif t is int:
        return depth <= MAX_DEPTH and -MAX_SAFE_INT <= v <= MAX_SAFE_INT
    else:
        return False
    if depth >= MAX_DEPTH:  # its members would be deeper than MAX_DEPTH
        return depth == MAX_DEPTH and not v
    for x in members:
        tx = type(x)
        if tx is str or tx is bool or x is None:
            continue
        if tx is int:
            if not -MAX_SAFE_INT <= x <= MAX_SAFE_INT:
                return False
        elif not _plain(x, depth + 1):
            return False
    return True


def dumps(value: Any) -> bytes:
    """The RFC 8785 canonical bytes of `value`. Raises CanonicalJSONError."""
    if _plain(value, 0):
        text = encode_plain(value)
    else:
        out: list[str] = []
        _value(value, out, 0)
        text = "".join(out)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise _fail("a string holds a lone UTF-16 surrogate") from None


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise _fail(f"duplicate object member {k[:40]!r}")
        d[k] = v
    return d


def _no_float(s: str) -> Any:
    raise _fail(f"number {s[:40]} is not an integer")


def _no_constant(s: str) -> Any:
    raise _fail(f"{s} is not JSON")


_decode_plain = json.JSONDecoder(parse_float=_no_float, parse_constant=_no_constant).decode


def _safe_int(s: str) -> int:
    n = int(s)
    if not -MAX_SAFE_INT <= n <= MAX_SAFE_INT:
        raise _fail(f"integer {s[:40]} is outside the I-JSON range ±(2^53 - 1)")
    return n


# The decoder of the fastest path: every integer checked as it is read.
_checked = json.JSONDecoder(parse_float=_no_float, parse_constant=_no_constant,
                            parse_int=_safe_int)
_decode_checked = _checked.decode


def _refuse(v: Any) -> Any:
    raise _fail(f"{type(v).__name__} is not a JSON value")


# The same encoder as `_encode_plain`, made once: `JSONEncoder.encode` builds a new
# C encoder on every call, which costs about as much as encoding a small record.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_encode = None if _c_make_encoder is None else _c_make_encoder(
    None, _refuse, _encode_string, None, ":", ",", True, False, False)


def encode_plain(value: Any) -> str:
    """The C encoder of the fast paths: byte-identical to RFC 8785 for the values
    `_plain` accepts (and for any value the C decoder made from ASCII text)."""
    if _c_encode is None:
        return _encode_plain(value)
    return "".join(_c_encode(value, 0))


_unchecked = json.JSONDecoder(parse_float=_no_float, parse_constant=_no_constant)


def scanner(*, check_ints: bool = True) -> Any:
    """`scan(text, 0) -> (value, end)`: one JSON value read by the C scanner,
    floats and constants refused and integers checked within ±(2^53 - 1)
    (CanonicalJSONError); StopIteration or ValueError if there is no JSON
    value at 0; `end` says where it stopped. For callers that check canonical
    form themselves (`record.read_links`). `check_ints=False` leaves integers
    unchecked: only for text known to hold no run of 16 digits."""
    return (_checked if check_ints else _unchecked).scan_once  # type: ignore[attr-defined]


def loads(data: bytes, *, max_size: int = 1 << 20, where: str = "") -> Any:
    """Parse canonical JSON; anything not canonical raises CanonicalJSONError."""
    if len(data) > max_size:
        raise _fail(f"{len(data)} bytes, more than the {max_size} allowed", where)
    # Fast path: parse with the C decoder alone and check that the value prints
    # back as exactly these bytes. A duplicate member collapses and so cannot
    # print back the same; any difference goes the slow way, which says what it is.
    with contextlib.suppress(ValueError, RecursionError, CanonicalJSONError):
        if data.isascii() and data.count(b"{") + data.count(b"[") <= MAX_DEPTH:
            # What `_plain` would check, known from the bytes: the decoder makes only
            # exact dicts, lists, strs, ints (each checked in range as read), bools and
            # None; ASCII holds no character beyond U+FFFF; fewer than MAX_DEPTH
            # brackets cannot nest deeper. So the C encoder alone says if it prints back.
            text = data.decode("ascii")
            value = _decode_checked(text)
            if encode_plain(value) == text:
                return value
        else:
            value = _decode_plain(data.decode("utf-8"))
            if dumps(value) == data:
                return value
    try:
        text = data.decode("utf-8")
        value = json.loads(
            text, object_pairs_hook=_pairs, parse_float=_no_float, parse_constant=_no_constant
        )
    except CanonicalJSONError as exc:
        raise exc.at(where) if where else exc from None
    except UnicodeDecodeError as exc:
        raise _fail(f"not UTF-8 at byte {exc.start}", where) from None
    except RecursionError:
        raise _fail("nested too deeply", where) from None
    except json.JSONDecodeError as exc:
        raise _fail(f"not JSON: {exc.msg} at byte {exc.pos}", where) from None
    except ValueError as exc:  # e.g. an integer too long to convert
        raise _fail(f"not JSON: {exc}", where) from None
    try:
        again = dumps(value)
    except CanonicalJSONError as exc:
        raise exc.at(where) if where else exc from None
    if again != data:
        at = next((i for i, (a, b) in enumerate(zip(again, data, strict=False)) if a != b),
                  min(len(again), len(data)))
        raise _fail(f"not in RFC 8785 canonical form (first difference at byte {at})", where)
    return value
