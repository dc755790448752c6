"""Reading the model name and token usage from a model API's response. Pure, streaming.

Works on the response body as it passes, JSON or server-sent events alike,
without buffering it: a regular expression over a window of the last 512
bytes and the new chunk, looking for these JSON members (Anthropic Messages
and OpenAI Chat Completions/Responses formats):

    "model": "<1-128 chars>"            first one wins (message_start, or the object)
    "input_tokens" | "prompt_tokens": N        last one wins
    "output_tokens" | "completion_tokens": N   last one wins (Anthropic's
                                               message_delta carries the total)
    "cache_creation_input_tokens", "cache_read_input_tokens": N  last one wins

A number counts only once a non-digit follows it, so a number split across
chunks is never read short. Members escaped inside a string (`\\"model\\"`)
do not match. Everything read is bounded: a model name is at most 128
printable characters; counts at most 12 digits.
"""

from __future__ import annotations

import re
from typing import Any

_MEMBER = re.compile(
    rb'"(model|input_tokens|output_tokens|prompt_tokens|completion_tokens|'
    rb'cache_creation_input_tokens|cache_read_input_tokens)"\s{0,8}:\s{0,8}'
    rb'(?:"([\x20-\x21\x23-\x5b\x5d-\x7e]{1,128})"|([0-9]{1,12})(?=[^0-9]))'
)
_ALIASES = {b"prompt_tokens": "input_tokens", b"completion_tokens": "output_tokens"}
WINDOW = 512


class ModelUsage:
    """Feed response body chunks; read `.model` and `.usage` at the end."""

    def __init__(self) -> None:
        self.model: str | None = None
        self.usage: dict[str, int] = {}
        self._tail = b""

    def feed(self, data: bytes) -> None:
        window = self._tail + data
        for m in _MEMBER.finditer(window):
            key = m.group(1)
            if key == b"model":
                if self.model is None and m.group(2) is not None:
                    self.model = m.group(2).decode("ascii")
            elif m.group(3) is not None:
                self.usage[_ALIASES.get(key, key.decode())] = int(m.group(3))
        self._tail = window[-WINDOW:]

    def finish(self) -> None:
        """End of body: a number at the very end is complete now."""
        self.feed(b" ")

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.model is not None:
            out["model"] = self.model
        if self.usage:
            out["usage"] = dict(sorted(self.usage.items()))
        return out
