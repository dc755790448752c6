"""The agent RPC's messages (`tkbox.guest.rpc`): the closed set both ends share.

The wire is what it was before the messages were classes: each message's map is
pinned here, key for key and byte for byte, to the dict the host and the agent
used to write by hand. A guest's malformed answer is one `GuestError` whose
message names keys and quotes at most 40 printable characters of the guest's.
"""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from tkbox.errors import GuestError
from tkbox.guest import rpc

ALL = {*rpc.REQUESTS.values(), *(c for a in rpc.ANSWERS.values() for c in a.values()),
       *(c for i in rpc.INPUTS.values() for c in i.values()), rpc.Ready}


def packed(m: dict[str, object]) -> bytes:
    return msgpack.packb(m, use_bin_type=True)


@pytest.mark.parametrize("cls", sorted(ALL, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_each_message_is_a_frozen_slotted_dataclass_whose_fields_are_its_keys(cls: type) -> None:
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    assert cls.__dictoffset__ == 0  # slotted all the way up: no instance __dict__
    assert [f.name for f in dataclasses.fields(cls)] == [f.key for f in cls.FIELDS]


def test_every_op_has_a_request_and_its_answers() -> None:
    assert set(rpc.REQUESTS) == set(rpc.ANSWERS) == rpc.OPS
    assert all(a["error"] is rpc.Error for a in rpc.ANSWERS.values())


@pytest.mark.parametrize("msg, legacy", [
    # the host's requests and frames, as guest_client wrote them
    (rpc.Ping(), {"op": "ping"}),
    (rpc.Exec(("sh", "-c", "x"), "/workspace", {"A": "1"}, False),
     {"op": "exec", "argv": ["sh", "-c", "x"], "cwd": "/workspace", "env": {"A": "1"},
      "stdin": False}),
    (rpc.Exec(("bash",), "/w", {}, True, (24, 80)),
     {"op": "exec", "argv": ["bash"], "cwd": "/w", "env": {}, "stdin": True,
      "tty": {"rows": 24, "cols": 80}}),
    (rpc.Stdin(b"in"), {"op": "stdin", "data": b"in"}),
    (rpc.StdinEof(), {"op": "stdin_eof"}),
    (rpc.Signal(15), {"op": "signal", "sig": 15}),
    (rpc.Resize(30, 100), {"op": "resize", "rows": 30, "cols": 100}),
    (rpc.Diff(kill=True, ask_ignored=False), {"op": "diff", "kill": True, "ask_ignored": False}),
    (rpc.Ignored(b"\x01"), {"ev": "ignored", "bits": b"\x01"}),
    (rpc.Read("/a"), {"op": "read", "path": "/a"}),
    (rpc.Write("/a", 0o600), {"op": "write", "path": "/a", "mode": 0o600}),
    (rpc.Data(b"d"), {"ev": "data", "data": b"d"}),
    (rpc.End(), {"ev": "end"}),
    (rpc.Shutdown(), {"op": "shutdown"}),
    # the agent's answers, as agent.py wrote them
    (rpc.Pong(1.5), {"ev": "ok", "uptime": 1.5}),
    (rpc.Started(7), {"ev": "started", "pid": 7}),
    (rpc.Out(2, b"e"), {"ev": "out", "fd": 2, "data": b"e"}),
    (rpc.Exit(3, 0), {"ev": "exit", "status": 3, "signal": 0}),
    (rpc.Exit(127, 0, "cannot start 'x': gone"),
     {"ev": "exit", "status": 127, "signal": 0, "error": "cannot start 'x': gone"}),
    (rpc.FileEnd(9), {"ev": "end", "size": 9}),
    (rpc.Written(9), {"ev": "ok", "size": 9}),
    (rpc.Paths(b"a\x00"), {"ev": "paths", "data": b"a\x00"}),
    (rpc.PathsEnd(1), {"ev": "paths_end", "count": 1}),
    (rpc.Apart(b"big", "added", 5, "", "file"),
     {"ev": "apart", "path": b"big", "change": "added", "size": 5, "sha256": "", "why": "file"}),
    (rpc.Mark(), {"ev": "mark"}),
    (rpc.PatchEnd({"added": 1}), {"ev": "end", "stats": {"added": 1}}),
    (rpc.Done(), {"ev": "ok"}),
    (rpc.Error("no"), {"ev": "error", "message": "no"}),
    (rpc.Ready(0.5), {"ev": "ready", "uptime": 0.5}),
])
def test_the_wire_is_unchanged(msg: rpc.Message, legacy: dict[str, object]) -> None:
    assert packed(msg.wire()) == packed(legacy)


@pytest.mark.parametrize("op, msg, why", [
    ("exec", {"ev": "out", "fd": 3, "data": b"x"}, "a malformed output frame ('fd') to exec"),
    ("exec", {"ev": "exit", "status": 256}, "a malformed exit status ('status') to exec"),
    ("exec", {"ev": "started", "pid": -1}, "a malformed started answer ('pid') to exec"),
    ("diff", {"ev": "apart", "path": b"p", "change": "renamed", "size": 1, "sha256": "",
              "why": "file"}, "a malformed set-apart entry ('change') to diff"),
    ("diff", {"ev": "apart", "path": b"p", "change": "added", "size": 1, "sha256": "ABC",
              "why": "file"}, "a malformed set-apart entry ('sha256') to diff"),
    ("diff", {"ev": "end", "stats": [1]}, "a malformed end answer ('stats') to diff"),
    ("diff", {"ev": "paths_end", "count": rpc.MAX_ASKED + 1},
     "a malformed paths_end answer ('count') to diff"),
    ("write", {"ev": "ok"}, "a ok answer to write without size"),
    ("read", ["ev", "data"], "an answer to read that is not a map"),
    ("ping", {"ev": b"ok"}, "an unexpected event '' in answer to ping"),
])
def test_a_malformed_answer_is_one_guest_error_naming_what_is_wrong(op: str, msg: object,
                                                                    why: str) -> None:
    with pytest.raises(GuestError) as caught:
        rpc.parse_event(op, msg)
    assert str(caught.value) == why


def test_a_hostile_answers_error_message_quotes_a_bounded_printable_line() -> None:
    """Attack: terminal escapes and megabytes in an event's name and in a key, to reach
    the user's terminal or the record through the host's error."""
    for msg in ({"ev": "\x1b]0;pwned\x07" + "E" * 1_000_000},
                {"ev": "out", "fd": 1, "data": b"", "\x1b[2J" + "K" * 1_000_000: 1}):
        with pytest.raises(GuestError) as caught:
            rpc.parse_event("exec", msg)
        text = str(caught.value)
        assert len(text) < 120 and text.isprintable() and "\x1b" not in text, text


def test_the_hosts_frames_are_parsed_by_the_guest_as_strictly() -> None:
    with pytest.raises(rpc.RequestError, match="unknown op 'frob'"):
        rpc.parse_request({"op": "frob"})
    with pytest.raises(rpc.RequestError, match=r"a malformed exec frame \('env'\)"):
        rpc.parse_request({"op": "exec", "argv": ["x"], "env": {"A": b"c"}})
    with pytest.raises(rpc.RequestError, match=r"a malformed exec frame \('tty'\)"):
        rpc.parse_request({"op": "exec", "argv": ["x"], "tty": {"rows": 0, "cols": 80}})
    with pytest.raises(rpc.RequestError, match="an unexpected frame during write"):
        rpc.parse_input("write", {"op": "stdin", "data": b""})
    assert rpc.parse_request({"op": "exec", "argv": ["x"]}) == rpc.Exec(("x",))
    assert rpc.parse_input("write", {"ev": "end"}) == rpc.End()


def test_out_of_range_uptimes_are_kept_as_unknown_not_refused() -> None:
    """A box up for longer than the host believes, or a clock gone wrong, is no attack:
    the uptime is dropped, the answer stands."""
    assert rpc.parse_event("ping", {"ev": "ok", "uptime": float("nan")}) == rpc.Pong(None)
    assert rpc.parse_event("ping", {"ev": "ok", "uptime": -1}) == rpc.Pong(None)
    assert rpc.parse_event("ping", {"ev": "ok", "uptime": 90000}) == rpc.Pong(90000.0)
