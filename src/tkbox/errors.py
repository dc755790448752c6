"""The error tree shared by every layer of tkbox.

```
TkboxError                       everything tkbox raises on purpose
├── UserError                    the person (or program) driving tkbox was wrong:
│   │                            bad flag, unknown box, name in use, missing file
│   └── BoxNotFound              ... it named a box that does not exist (HTTP 404)
├── HostError                    this host lacks something (QEMU, a kernel, KVM),
│                                or a host resource failed (disk full, socket)
├── RemoteError                  a party we do not control sent something bad;
│   ├── GuestError               ... the VM (every byte from it is hostile)
│   ├── RegistryError            ... an image registry
│   ├── OriginError              ... a server a box reached through a door (its
│   │                            TLS, its HTTP answer); never the guest's fault
│   ├── SignerUnavailable        ... the signer did not answer (fail closed)
│   │   └── SignerRefused        ... it answered, and would not take the request
│   └── BundleError              ... a bundle or trust file under verification
├── Refused                      a door or the signer said no; carries the reason
└── InternalError                our own bug; never caused by input
```

Every message is one line for a person: what happened, and what to do next.
Layers translate the errors below them into these; a parser never lets a bare
`ValueError`, `KeyError` or `struct.error` escape. The guest can only ever cause
a `GuestError` (or a `Refused`), never an `InternalError`.

Each class carries the exit status the CLI ends with for it (`exit_code`: 1 our
bug, 2 the user's, 3 the host's, 4 a remote party's, 5 refused, 70 internal;
docs/exit-status.md). Every `tkbox` command, its sub-apps (`signer`, `witness`,
`image`, `verify`, …) and the daemon's foreground process say an error the same
way, through `exit_with`: one line `tkbox: error: MESSAGE` on stderr, then that
status. It lives here, at the bottom, so every layer's commands can use it.

This module imports nothing but the standard library, so the guest agent and the
offline verifier may use it.
"""

from __future__ import annotations


class TkboxError(Exception):
    """Base of every error tkbox raises on purpose."""

    #: exit status the CLI uses for this kind of error
    exit_code = 1

    def __init__(self, message: str) -> None:
        # One line, always: a multi-line message would break logs and tables.
        super().__init__(" ".join(str(message).split()))

    @property
    def message(self) -> str:
        return str(self)


class UserError(TkboxError):
    exit_code = 2


class BoxNotFound(UserError):
    """A request named a box that does not exist. The daemon's API answers 404 for it
    (by this type, never by its message) and still names it `UserError` on the wire,
    so every client, old or new, exits 2 for it."""


class HostError(TkboxError):
    exit_code = 3


class RemoteError(TkboxError):
    exit_code = 4


class GuestError(RemoteError):
    """The guest sent something we refuse to parse, or stopped answering."""


class RegistryError(RemoteError):
    """An image registry answered wrongly (bad digest, bad manifest, HTTP error)."""


class OriginError(RemoteError):
    """A server that a box reached through a door (the network or secrets door) sent
    something the door cannot relay: a malformed answer, bad TLS, a connection cut
    mid-answer. The origin is to blame, not the guest: a box whose origin misbehaves
    is not a hostile box."""


class SignerUnavailable(RemoteError):
    """No answer from the signer; every crossing that needed it is refused."""


class SignerRefused(SignerUnavailable):
    """The signer answered and would not take the request (a closed run, a record it
    cannot make). Fails closed exactly as `SignerUnavailable` does; only code that must
    tell "down" from "no" (the daemon's queue of gaps) looks for it."""


class BundleError(RemoteError):
    """A bundle or trust file under verification is malformed or does not verify."""


class Refused(TkboxError):
    """A door or the signer refused a crossing; `reason` is for a person."""

    exit_code = 5

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = str(self)


class InternalError(TkboxError):
    """A bug in tkbox. Never raised because of input."""

    exit_code = 70


