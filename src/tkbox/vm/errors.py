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
    """The VMM (`vmm`, its name) exited before its guest could run, with `status`; `said`
    its last words (one bounded printable line, `vm.base.last_words`), `see` its log."""

    def __init__(self, vmm: str, status: int | None, see: str, said: str = "") -> None:
        super().__init__(f"{vmm} exited at start (status {status})"
                         + (f": {said}" if said else "") + f"; see {see}")
        self.vmm, self.status, self.see = vmm, status, see
