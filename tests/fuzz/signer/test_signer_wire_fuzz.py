"""Fuzz: the signer's requests are parsed at the edge into typed classes, or refused.

The promise (`tkbox.formats.wire.parse_request` and the frame reader in front
of it): for any JSON value and any bytes, the result is one of the request
classes or `BadSignerRequest` (a `WireError`; the frame reader's own errors are
`WireError` too), never any other exception. A `BadSignerRequest`'s message is one
line and quotes at most a few dozen characters of what the peer sent, however
large. A parsed request re-encodes to canonical bytes that parse back to the
same request, and a request built from the classes goes through the wire
byte for byte. Inputs: arbitrary JSON, requests near the valid ones (a field
dropped, added, or given a value of any type), and arbitrary bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.formats import canonjson, wire

SETTINGS = settings(deadline=None,  # examples: the profile (`make fuzz` runs "long")
                    suppress_health_check=[HealthCheck.too_slow])
MAX_MESSAGE = 400  # the longest refusal: the op list and a quoted value, cut

_keys = st.sampled_from(["id", "op", "run", "facts", "action", "resource", "context",
                         "decision", "outcome", "kind", "body", "reason", "token", "x"])
_scalars = (st.none() | st.booleans() | st.text(max_size=300)
            | st.integers(-canonjson.MAX_SAFE_INT, canonjson.MAX_SAFE_INT))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8) | _keys, inner, max_size=4),
                     max_leaves=20)
_runs = st.from_regex(wire.RUN_ID, fullmatch=True)
_objects = st.dictionaries(st.text(max_size=8), _scalars, max_size=4)
_ids = st.integers(0, wire.MAX_ID)
_kinds = st.from_regex(r"[a-z][a-z0-9_-]{0,8}(\.[a-z][a-z0-9_-]{0,8}){1,3}", fullmatch=True)
_actions = st.text(min_size=1, max_size=wire.MAX_ACTION).filter(str.isprintable)

#: every request class, built from valid fields
requests = st.one_of(
    st.builds(wire.Ping, _ids), st.builds(wire.Status, _ids), st.builds(wire.Subscribe, _ids),
    st.builds(wire.Auth, _ids, st.text(max_size=200)),
    st.builds(wire.Open, _ids, _runs, _objects),
    st.builds(wire.Decide, _ids, _runs, _actions, _objects, _objects),
    st.builds(wire.Complete, _ids, _runs, st.text(max_size=wire.MAX_DECISION), _objects),
    st.builds(wire.Event, _ids, _runs, _kinds, _objects),
    st.builds(wire.Close, _ids, _runs), st.builds(wire.Export, _ids, _runs),
    *(st.builds(c, _ids, _runs, st.text(max_size=wire.MAX_REASON))
      for c in (wire.Hold, wire.Release, wire.Quarantine)))


def _parse(obj: Any) -> wire.Request | wire.BadSignerRequest:
    """parse_request's result, or its BadSignerRequest: any other exception fails the test."""
    try:
        req = wire.parse_request(obj)
    except wire.BadSignerRequest as exc:
        msg = str(exc)
        assert "\n" not in msg and 0 < len(msg) <= MAX_MESSAGE, msg
        rid = obj.get("id") if isinstance(obj, dict) else None
        assert exc.id is None or exc.id == rid
        return exc
    assert isinstance(req, wire.Request)  # type: ignore[misc,arg-type]
    _round_trips(req)
    return req


_TYPES = {"int": int, "str": str, "dict[str, Any]": dict}


def _round_trips(req: wire.Request) -> None:
    for f in dataclasses.fields(req):  # each field of the type the class says
        assert type(getattr(req, f.name)) is _TYPES[str(f.type)], (f.name, f.type)
    data = req.encode()
    assert data[4:] == canonjson.dumps(req.to_wire())
    again = wire.parse_request(canonjson.loads(data[4:]))
    assert again == req and type(again) is type(req)
    assert again.encode() == data


@SETTINGS
@given(_json)
def test_any_json_value_is_a_request_or_bad_request(obj: Any) -> None:
    _parse(obj)


@SETTINGS
@given(st.sampled_from(sorted(wire.OPS)), _ids,
       st.dictionaries(_keys, _json, max_size=6))
def test_any_fields_under_any_op_is_a_request_or_bad_request(op: str, rid: int,
                                                           fields: dict[str, Any]) -> None:
    got = _parse({**fields, "id": rid, "op": op})
    if isinstance(got, wire.BadSignerRequest):
        assert got.id == rid  # the id was readable: the refusal echoes it


@SETTINGS
@given(requests, st.data())
def test_a_valid_request_mutated_is_a_request_or_bad_request(req: wire.Request,
                                                             data: st.DataObject) -> None:
    obj = req.to_wire()
    _round_trips(req)  # built from the classes: through the wire byte for byte
    assert wire.parse_request(obj) == req
    what = data.draw(st.sampled_from(["drop", "set", "add"]))
    key = data.draw(st.sampled_from(sorted(obj)))
    if what == "drop":
        del obj[key]
    elif what == "set":
        obj[key] = data.draw(_json)
    else:
        obj[data.draw(st.text(max_size=10))] = data.draw(_json)
    _parse(obj)


@SETTINGS
@given(st.binary(max_size=3000) | requests.map(lambda r: r.encode()).flatmap(
    lambda b: st.tuples(st.just(b), st.integers(0, len(b)), st.binary(max_size=20)).map(
        lambda t: t[0][: t[1]] + t[2] + t[0][t[1]:])))
def test_any_bytes_through_the_frame_reader_are_requests_or_wire_errors(data: bytes) -> None:
    d = wire.Decoder()
    try:
        d.feed(data)
        while (frame := d.next()) is not None:
            _parse(frame)
    except wire.WireError:
        pass
    assert d.buffered <= 4 + wire.MAX_FRAME


def test_every_request_class_gets_through() -> None:
    """The targets above cannot pass by refusing everything."""
    for req in (wire.Ping(1), wire.Status(2), wire.Subscribe(0), wire.Auth(3, "a.b.c"),
                wire.Open(4, "r", {"a": 1}), wire.Decide(5, "r", "Bash", {"command": "ls"}, {}),
                wire.Complete(6, "r", "r/1", {"exit": 0}), wire.Event(7, "r", "tkbox.gap", {}),
                wire.Close(8, "r"), wire.Export(9, "r"), wire.Hold(10, "r", "look"),
                wire.Release(11, "r"), wire.Quarantine(12, "r", "")):
        _round_trips(req)
        assert wire.parse_request(req.to_wire()) == req


def test_a_large_hostile_value_is_quoted_cut() -> None:
    big = "\u202e" + "x" * 100_000
    for obj in ({"id": 1, "op": big}, {"id": 1, "op": "event", "run": "r", "kind": big,
                                       "body": {}}, {"id": 1, "op": "close", "run": "r", big: 1}):
        got = _parse(obj)
        assert isinstance(got, wire.BadSignerRequest) and got.id == 1
        assert len(str(got)) <= MAX_MESSAGE and "x" * 50 not in str(got)
