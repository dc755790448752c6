"""One request on an intercepted tunnel, as far as it got (HTTP/1.1 or one HTTP/2
stream): what its `tkbox.model.call` and `tkbox.http.request` say, whichever way
it ended. Pure."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from tkbox.doors.secrets.leaks import scan_once
from tkbox.doors.secrets.model import ModelUsage
from tkbox.doors.secrets.rules import TunnelRules

#: characters of a request's path a `tkbox.model.call` keeps
MAX_PATH = 512


@dataclass
class Exchange:
    """One request, as far as it got. `ended` is None once it completed."""

    method: bytes
    target: bytes
    started: float
    forwarded: bool = False
    status: int | None = None
    up: int = 0
    down: int = 0
    ended: str | None = "refused"
    model: ModelUsage = field(default_factory=ModelUsage)

    def model_call(self, host: str, rules: TunnelRules) -> dict[str, Any]:
        path = self.target.decode("ascii", "replace")
        body: dict[str, Any] = {
            "host": host, "method": self.method.decode("ascii", "replace"),
            "path": path if len(path) <= MAX_PATH else path[:MAX_PATH] + "...",
            "status": self.status, "bytes_up": self.up, "bytes_down": self.down,
            "duration_ms": round((time.monotonic() - self.started) * 1000)}
        if self.ended is not None:
            body["ended"] = self.ended
        fields = self.model.fields()
        name = fields.get("model")
        if name is not None and scan_once(rules.scan_patterns, name.encode("ascii", "replace")):
            fields["model"] = "(withheld)"  # a form the redactor does not replace
        body.update(fields)
        return body


def reason_phrase(status: int) -> bytes:
    """The standard reason phrase of `status` (RFC 9110 §15), or none."""
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""
