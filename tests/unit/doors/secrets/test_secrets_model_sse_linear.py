"""Attack: a response without line ends costs the model reader quadratic work.

Every response on a read host streams through `ModelUsage` (the body of a model
host's answer is read for its model and usage). Its server-sent-events reader
reads a chunk's whole lines with one regular expression; searched past the
chunk's last line end, every start position would scan to the end and fail:
8 KiB without a newline took half a second of the daemon's loop, 64 KiB about
thirty. The search must stop at the last line end (the byte-wise path reads
the rest), which is checked here on the calls themselves, not by a clock.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tkbox.doors.secrets import model
from tkbox.doors.secrets.model import ModelUsage


class _Spy:
    def __init__(self, pat: re.Pattern[bytes]) -> None:
        self.pat = pat
        self.calls: list[tuple[bytes, int, int]] = []

    def finditer(self, data: bytes, pos: int = 0, endpos: int | None = None) -> Any:
        end = len(data) if endpos is None else endpos
        self.calls.append((data, pos, end))
        return self.pat.finditer(data, pos, end)


@pytest.mark.parametrize("body", [
    b"x" * 65536,
    b"event: a\ndata: {\"model\": \"m\"}\n\n" + b"x" * 65536,
    b"data: 1\r" + b"y" * 5000 + b"\r\n" + b"z" * 9000,
])
def test_line_search_never_runs_past_the_last_line_end(
        monkeypatch: pytest.MonkeyPatch, body: bytes) -> None:
    spy = _Spy(model._LINES)
    monkeypatch.setattr(model, "_LINES", spy)
    m = ModelUsage()
    m.feed(body)
    m.finish()
    for data, pos, end in spy.calls:
        searched = data[pos:end]
        assert not searched or searched[-1:] in (b"\n", b"\r"), (pos, end, len(data))
        assert b"\n" not in data[end:] and b"\r" not in data[end:]


def test_lines_are_read_the_same_with_or_without_a_tail() -> None:
    events = (b"event: message_start\ndata: {\"type\": \"message_start\", \"message\": "
              b"{\"model\": \"claude-x\", \"usage\": {\"input_tokens\": 5, "
              b"\"output_tokens\": 1}}}\n\n")
    a, b = ModelUsage(), ModelUsage()
    a.feed(events)
    a.finish()
    b.feed(events + b": " + b"x" * 10000)
    b.finish()
    assert a.fields() == b.fields()
