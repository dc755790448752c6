"""The errors of the launchers, in tkbox's error tree.

```
HostError (tkbox.errors)
└── VMError            a VMM failed: it did not start, refused a request, or
    │                  its control socket broke
    └── VMEnded        the VM ended (its VMM exited, or was killed) while
        │              something still needed it
        └── VMExitedAtStart  its VMM exited before the guest could run (its own
                             last words say why: a bad option, no /dev/kvm access)
```

A VM that ends under a box is the VM's story, told here, not a guest
transport error: on the host, `tkbox.protocol.errors.TransportClosed` from a
VM's ports means its VMM closed its end, and callers that see it ask the VM
(`VM.wait`) or map it to `VMEnded`. A missing binary or an unusable `/dev/kvm`
stays a plain `HostError` (the host lacks something; nothing failed yet).
"""

from __future__ import annotations

from tkbox.errors import HostError


class VMError(HostError):
    """A VMM failed: it did not start, refused a request, or its socket broke."""


class VMEnded(VMError):
    """The VM ended (its VMM exited or was killed) while something still needed it."""


class VMExitedAtStart(VMEnded):
    """The VMM exited before its guest could run; `status` its exit status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
