"""The signer's framing: bounded, canonical, refused with WireError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tkbox.formats import wire


def test_roundtrip_in_any_split() -> None:
    frames = [wire.encode({"id": i, "op": "ping", "x": "é" * i}) for i in range(5)]
    data = b"".join(frames)
    for cut in range(1, len(data)):
        d = wire.Decoder()
        got = []
        for piece in (data[:cut], data[cut:]):
            d.feed(piece)
            while (f := d.next()) is not None:
                got.append(f)
        assert [f["id"] for f in got] == list(range(5))


@pytest.mark.parametrize("data", [
    struct.pack(">I", 0), struct.pack(">I", wire.MAX_FRAME + 1),
    struct.pack(">I", 3) + b"[1]", struct.pack(">I", 8) + b'{"a": 1}',
    struct.pack(">I", 4) + b"\xff\xfe{}",
])
def test_bad_frames(data: bytes) -> None:
    d = wire.Decoder()
    with pytest.raises(wire.WireError):
        d.feed(data)
        d.next()


@given(st.binary(max_size=300))
def test_garbage_is_refused_with_wire_error_only(data: bytes) -> None:
    d = wire.Decoder()
    try:
        d.feed(data)
        while d.next() is not None:
            pass
    except wire.WireError:
        pass
    assert d.buffered <= len(data)


def test_floats_cannot_be_sent() -> None:
    with pytest.raises(wire.WireError):
        wire.encode({"id": 1, "x": 0.5})


# --- typed requests, parsed at the edge ------------------------------------------


def test_a_request_built_from_its_class_is_the_bytes_the_client_always_sent() -> None:
    """The wire is unchanged: the classes encode what the dict literals did."""
    req = wire.Decide(7, "r", "Bash", {"command": "ls"}, {"cwd": "/w"})
    assert req.encode() == wire.encode({"id": 7, "op": "decide", "run": "r", "action": "Bash",
                                        "resource": {"command": "ls"},
                                        "context": {"cwd": "/w"}})
    assert wire.Hold(1, "r").encode() == wire.encode({"id": 1, "op": "hold", "run": "r",
                                                      "reason": ""})
    assert wire.Subscribe(0).encode() == wire.encode({"id": 0, "op": "subscribe"})


def test_parse_request_gives_the_class_of_its_op() -> None:
    assert wire.parse_request({"id": 3, "op": "hold", "run": "r"}) == wire.Hold(3, "r", "")
    got = wire.parse_request({"id": 4, "op": "event", "run": "r", "kind": "tkbox.gap",
                              "body": {"n": 1}})
    assert isinstance(got, wire.Event) and got.body == {"n": 1}


@pytest.mark.parametrize(("obj", "rid", "says"), [
    ([1], None, "a request must be a JSON object"),
    ({"op": "ping"}, None, "non-negative integer id"),
    ({"id": True, "op": "ping"}, None, "non-negative integer id"),
    ({"id": 1, "op": "nope"}, 1, "unknown op 'nope'; the signer knows auth, close"),
    ({"id": 2, "op": "ping", "run": "r"}, 2, "ping: no field 'run' (it takes none)"),
    ({"id": 3, "op": "close"}, 3, "close: run is missing"),
    ({"id": 4, "op": "close", "run": 4}, 4, "close: run must be a string"),
    ({"id": 5, "op": "close", "run": "../x"}, 5, "a run id is 1-128 of"),
    ({"id": 6, "op": "open", "run": "r", "facts": []}, 6, "open: facts must be an object"),
    ({"id": 7, "op": "hold", "run": "r", "reason": "y" * 1001}, 7,
     "hold: reason must be a string of 0-1000 characters"),
    ({"id": 8, "op": "decide", "run": "r", "action": "", "resource": {}, "context": {}}, 8,
     "decide: action must be a string of 1-128 printable characters"),
    ({"id": 9, "op": "event", "run": "r", "kind": "Gap", "body": {}}, 9,
     "'Gap' cannot be an event kind"),
])
def test_a_malformed_request_is_one_bad_request_with_its_id(obj: object, rid: int | None,
                                                            says: str) -> None:
    with pytest.raises(wire.BadSignerRequest) as e:
        wire.parse_request(obj)
    assert e.value.id == rid and says in str(e.value)
    assert isinstance(e.value, wire.WireError)


def test_a_bad_request_quotes_a_few_dozen_characters_at_most() -> None:
    with pytest.raises(wire.BadSignerRequest) as e:
        wire.parse_request({"id": 1, "op": "z" * 10_000})
    assert len(str(e.value)) < 250 and "z" * 40 not in str(e.value)


@pytest.mark.parametrize(("frame", "answer"), [
    ({"id": 1, "ok": True, "result": {"seq": 2}}, wire.Ok(1, {"seq": 2})),
    ({"id": 1, "ok": False, "kind": "refused", "error": "no"}, wire.Refused(1, "no")),
    ({"id": 1, "ok": False, "kind": "failed", "error": "x"}, wire.Failed(1, "x")),
    ({"id": 1, "part": 0, "data": "AA=="}, wire.Part(1, 0, "AA==")),
    ({"push": "hold", "run": "r", "reason": "look"}, wire.Pushed("hold", "r", "look")),
])
def test_answers_and_pushes_parse_into_their_classes_and_back(frame: dict[str, object],
                                                              answer: object) -> None:
    got = wire.parse_answer(frame)
    assert got == answer and got.to_wire() == frame


@pytest.mark.parametrize("frame", [{"id": 1, "ok": "yes"}, {"ok": True, "result": {}},
                                   {"push": "drop", "run": "r"}, {"id": 1, "part": "0"}])
def test_an_answer_that_is_none_is_bad_answer(frame: dict[str, object]) -> None:
    with pytest.raises(wire.BadSignerAnswer):
        wire.parse_answer(frame)


def test_a_parsed_request_is_frozen() -> None:
    import dataclasses

    req = wire.parse_request({"id": 1, "op": "close", "run": "r"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.run = "other"  # type: ignore[misc]
