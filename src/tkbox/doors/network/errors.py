"""The network door's errors and the stages a refusal can come from.

The door's own types, beside those of its pure cores and of `tkbox.errors`:

```
TkboxError
├── RemoteError
│   ├── GuestError
│   │   ├── AddressError      addresses: a numeric host that is no valid address
│   │   ├── HostNameError     names: a host, authority or port that is not valid
│   │   ├── BadRequest        request: malformed or refused request head or body (.status)
│   │   └── TLSRefused        tls: bad TLS, hidden or mismatched server name
│   ├── ResolveError          resolver: a name that does not resolve
│   └── OriginError           relay: the origin answered what the proxy cannot carry
├── UserError                 operator input (flags, --allow, hosts file)
├── Refused                   approvals: too many pending / opened a minute
│   └── EgressRefused         the door refused one connection (.status, .stage)
└── ConnectionEnded           the door ended one connection (box stopping, time limit)
```

`ConnectionEnded` is nobody's fault and no refusal of a crossing (a tunnel
that ran out of time had crossed): it is its own branch, so that code catching
`Refused` (an approval board that says no) never takes a stop for a "no".

Who was wrong decides the type: anything the guest sends can only raise a
`GuestError`; an origin that breaks HTTP raises `OriginError`, never a
`GuestError`. Each failure is mapped to a `Stage` by its type (in
`connection.Ending.from_failure`), never by its message.

`Stage` values are written into records (`tkbox.egress.refused` `stage`, a
completion's `stage`, the summary's `by_stage`): they are part of the bundle
format (`docs/bundle-format.md`) and never change spelling.
"""

from __future__ import annotations

import enum

from tkbox.errors import OriginError, Refused, TkboxError

#: The origin answered with something the proxy cannot carry (malformed HTTP, a
#: protocol switch, a response cut short): `tkbox.errors.OriginError` itself, one class
#: the daemon's API maps to 502 wherever it was raised; its refusal is `Stage.ORIGIN`.
__all__ = ["OriginError"]


class Stage(enum.Enum):
    """Where on a connection's way a refusal happened; `.value` is what records say."""

    LIMIT = "limit"  # too many connections (box, daemon)
    INTERNAL = "internal"  # a bug in the door
    REQUEST = "request"  # the request head: malformed, refused kind, too slow
    SECRET = "secret"  # noqa: S105 - a stage name: a secret found in the request head
    STOP = "stop"  # the box is stopping
    POLICY = "policy"  # the allowlist and the always-refused names
    APPROVAL = "approval"  # a person denied it, nobody answered, too many asked
    RESOLVE = "resolve"  # the name did not resolve
    ADDRESS = "address"  # every address is in a refused range
    SIGNER = "signer"  # the signer did not answer, or its policy said no
    DIAL = "dial"  # no checked address could be reached
    TLS = "tls"  # the tunnel's TLS (ClientHello, ServerHello, the secrets door's TLS)
    ORIGIN = "origin"  # the origin's HTTP response cannot be carried
    REQUEST_BODY = "request body"  # a plain-HTTP request body that cannot be relayed


class EgressRefused(Refused):
    """The door refused one connection: `status` is the HTTP answer, `stage` where.

    `reason` is kept exactly as given (records carry it through `excerpt`).
    `recorded_elsewhere` is set when the run already holds the refusal, so the
    door must not write a `tkbox.egress.refused` event for it: the signer's own
    `Connect` decision, the secrets door's `tkbox.secret.leak`, or the
    connection's completion.
    """

    def __init__(
        self, status: int, reason: str, stage: Stage, *, recorded_elsewhere: bool = False
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.stage = stage
        self.recorded_elsewhere = recorded_elsewhere


class ConnectionEnded(TkboxError):
    """The door ended a connection: the box is stopping, or a tunnel's time is up.

    `reason` is what the completion's `ended` says (`box stopped`,
    `idle timeout: ...`, `time limit: ...`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

