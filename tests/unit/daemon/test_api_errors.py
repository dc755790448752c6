"""The API's status codes come from the error's type, never from its message, and
every client still reads the same `type` on the wire (docs/exit-status.md)."""

from __future__ import annotations

import json

import pytest

from tkbox.daemon.api import error_response
from tkbox.errors import (
    BoxNotFound,
    GuestError,
    HostError,
    InternalError,
    OriginError,
    Refused,
    RegistryError,
    SignerRefused,
    SignerUnavailable,
    TkboxError,
    UserError,
)
from tkbox.sdk import KINDS


@pytest.mark.parametrize("exc, status, wire", [
    (BoxNotFound("no box named 'x'; see 'tkbox ls'"), 404, "UserError"),
    (UserError("no box named 'x'"), 400, "UserError"),  # the words alone decide nothing
    (UserError("no running command 1 in box b"), 400, "UserError"),
    (Refused("refused by the signer: no"), 403, "Refused"),
    (HostError("disk full"), 500, "HostError"),
    (GuestError("bad frame"), 502, "GuestError"),
    (RegistryError("bad digest"), 502, "RegistryError"),
    (OriginError("bad answer"), 502, "OriginError"),
    (SignerUnavailable("down"), 503, "SignerUnavailable"),
    (SignerRefused("closed run"), 503, "SignerRefused"),  # the most specific type it is
    (InternalError("bug"), 500, "InternalError"),
])
def test_status_and_wire_type_follow_the_error_type(exc: TkboxError, status: int,
                                                    wire: str) -> None:
    resp = error_response(exc)
    assert resp.status_code == status
    assert json.loads(bytes(resp.body)) == {"error": {"type": wire, "message": str(exc)}}


def test_a_missing_box_still_exits_2_in_every_client() -> None:
    """Clients map the wire type to an error, and that error's exit status is 2."""
    body = json.loads(bytes(error_response(BoxNotFound("no box named 'x'")).body))
    assert KINDS[body["error"]["type"]].exit_code == 2 == BoxNotFound.exit_code
