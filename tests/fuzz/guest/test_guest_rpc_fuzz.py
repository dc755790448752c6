"""Fuzz: the agent RPC's typed parsers, both ways (`tkbox.guest.rpc`).

Promises:

- the host's parse of a guest answer, `parse_event(op, msg)`, whatever `msg` is
  (any msgpack value: maps of real event names with fields of any type, maps with
  unknown or non-string keys, lists, scalars), returns one of the events `op` may
  produce or raises `GuestError`, never any other exception; the error's message
  is one printable line of at most 200 characters, whatever the guest sent;
- the same from raw bytes: a frame body is refused by the frame decoder with
  `FrameError` or decodes to a map that `parse_event` takes as above;
- the guest's parse of the host's frames (`parse_request`, `parse_input`) returns
  a request or follow-up frame, or raises `RequestError`, never anything else;
- every message built from the classes parses back to itself from its wire map
  (so the strictness refuses nothing either side sends).
"""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.errors import GuestError
from tkbox.guest import rpc
from tkbox.guest.diff import CHANGES, WHY
from tkbox.protocol.framing import GUEST_FRAMES, HOST_FRAMES, FrameError, decode_body

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
ints = st.integers(-(2**63), 2**64 - 1)  # what msgpack can carry

OPS = sorted(rpc.OPS)
NAMES = sorted({n for a in rpc.ANSWERS.values() for n in a} | set(rpc.REQUESTS)
               | {"stdin", "stdin_eof", "signal", "resize", "ignored", "", "EXIT", "okk"})
KEYS = sorted({f.key for cls in [*rpc.REQUESTS.values(),
                                 *(c for a in rpc.ANSWERS.values() for c in a.values()),
                                 *(c for i in rpc.INPUTS.values() for c in i.values())]
               for f in cls.FIELDS} | {"smuggled", "EV"})

scalars = st.one_of(st.none(), st.booleans(), ints,
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=60),
                    st.binary(max_size=60))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.text(max_size=8), ints), inner, max_size=4)),
    max_leaves=12)
edge = st.sampled_from([0, 1, 2, 3, 64, 65, 127, 255, 256, 1000, 1001, -1, 2**63, "",
                        "/", "/a", "a" * 5000, b"", b"\x00", "0" * 64, "added", "ignored",
                        [], ["x"], {}, {"rows": 1, "cols": 1}, 1.5, float("nan")])


@st.composite
def shaped(draw: st.DrawFn, kind: str) -> dict[Any, Any]:
    """A map shaped like a message: a real name mostly, real keys, values of any type."""
    msg: dict[Any, Any] = {kind: draw(st.one_of(st.sampled_from(NAMES), values))}
    for k in draw(st.lists(st.sampled_from(KEYS), max_size=6, unique=True)):
        msg[k] = draw(st.one_of(values, edge))
    if draw(st.booleans()):
        msg[draw(st.one_of(st.text(max_size=5), ints))] = draw(values)
    return msg


anything = st.one_of(values, shaped("ev"), shaped("op"))


def one_bounded_line(text: str) -> bool:
    return len(text) <= 200 and text.isprintable()


@FUZZ
@given(st.sampled_from(OPS), anything)
def test_a_guest_answer_is_an_event_of_its_op_or_one_guest_error(op: str, msg: Any) -> None:
    try:
        ev = rpc.parse_event(op, msg)
    except GuestError as exc:
        assert one_bounded_line(str(exc)), str(exc)
        return
    assert type(ev) in rpc.ANSWERS[op].values()


@FUZZ
@given(st.sampled_from(OPS), st.one_of(st.binary(max_size=300),
                                       shaped("ev").map(lambda m: msgpack.packb(
                                           m, use_bin_type=True, strict_types=False))))
def test_guest_bytes_are_a_frame_error_or_a_parsed_answer(op: str, body: bytes) -> None:
    try:
        msg = decode_body(body, GUEST_FRAMES)
    except FrameError:
        return
    try:
        ev = rpc.parse_event(op, msg)
    except GuestError as exc:
        assert one_bounded_line(str(exc)), str(exc)
        return
    assert isinstance(ev, rpc.Event)


@FUZZ
@given(anything)
def test_a_host_request_is_a_request_or_one_request_error(msg: Any) -> None:
    try:
        req = rpc.parse_request(msg)
    except rpc.RequestError as exc:
        assert one_bounded_line(str(exc)), str(exc)
        return
    assert type(req) in rpc.REQUESTS.values()


@FUZZ
@given(st.sampled_from([*OPS, "nope"]), anything)
def test_a_host_follow_up_frame_is_one_of_its_ops_or_one_request_error(op: str,
                                                                       msg: Any) -> None:
    try:
        frame = rpc.parse_input(op, msg)
    except rpc.RequestError as exc:
        assert one_bounded_line(str(exc)), str(exc)
        return
    assert type(frame) in rpc.INPUTS[op].values()


# ---- what either side sends parses back to itself -----------------------------------

small = st.integers(0, 2**31)
data = st.binary(max_size=64)
text = st.text(max_size=40)
events = st.one_of(
    st.builds(rpc.Started, st.one_of(st.none(), small)),
    st.builds(rpc.Out, st.sampled_from([1, 2]), data),
    st.builds(rpc.Exit, st.integers(0, 255), st.integers(0, 64), text),
    st.builds(rpc.Pong, st.floats(0, 1e6)),
    st.builds(rpc.Written, small), st.just(rpc.Done()), st.builds(rpc.FileEnd, small),
    st.builds(rpc.PatchEnd, st.dictionaries(st.text("abcdefgh_", max_size=10), small,
                                            max_size=5)),
    st.builds(rpc.Data, data), st.builds(rpc.Paths, data),
    st.builds(rpc.PathsEnd, st.integers(0, rpc.MAX_ASKED)),
    st.builds(rpc.Apart, st.binary(min_size=1, max_size=30), st.sampled_from(CHANGES), small,
              st.sampled_from(["", "0" * 64]), st.sampled_from(WHY)),
    st.just(rpc.Mark()), st.builds(rpc.Error, text))
requests = st.one_of(
    st.builds(rpc.Exec, st.lists(text, min_size=1, max_size=5).map(tuple),
              st.text(min_size=1, max_size=20),
              st.dictionaries(st.text(min_size=1, max_size=8).filter(
                  lambda k: "=" not in k and "\0" not in k),
                  st.text(max_size=8).filter(lambda v: "\0" not in v), max_size=4),
              st.booleans(), st.one_of(st.none(), st.tuples(st.integers(1, 1000),
                                                            st.integers(1, 1000)))),
    st.builds(rpc.Read, st.text(max_size=30).map(lambda p: "/" + p.replace("\0", ""))),
    st.builds(rpc.Write, st.text(max_size=30).map(lambda p: "/" + p.replace("\0", "")),
              st.integers(0, 0o777)),
    st.builds(rpc.Diff, st.booleans(), st.booleans()), st.just(rpc.Ping()),
    st.just(rpc.Shutdown()))


@FUZZ
@given(events)
def test_every_event_the_agent_builds_parses_back_to_itself(ev: rpc.Event) -> None:
    ops = [op for op, answers in rpc.ANSWERS.items() if answers.get(ev.NAME) is type(ev)]
    wire = decode_body(msgpack.packb(ev.wire(), use_bin_type=True), GUEST_FRAMES)
    assert ops and all(rpc.parse_event(op, wire) == ev for op in ops)


@FUZZ
@given(requests)
def test_every_request_the_host_builds_parses_back_to_itself(req: rpc.Request) -> None:
    wire = decode_body(msgpack.packb(req.wire(), use_bin_type=True), HOST_FRAMES)
    assert rpc.parse_request(wire) == req


def test_a_valid_answer_is_read_as_such() -> None:
    """The targets are not vacuous: the agent's own answers get through, typed."""
    assert rpc.parse_event("exec", {"ev": "out", "fd": 2, "data": b"x"}) == rpc.Out(2, b"x")
    assert rpc.parse_event("read", {"ev": "end", "size": 3}) == rpc.FileEnd(3)
    assert rpc.parse_request({"op": "diff", "kill": True, "ask_ignored": False}) == \
        rpc.Diff(kill=True)
    assert rpc.parse_input("exec", {"op": "signal", "sig": 15}) == rpc.Signal(15)
