"""The errors of the host ⇄ guest transports, in tkbox's error tree.

```
TkboxError (tkbox.errors)
├── PortError              a port stream could not be opened or used: nothing
│   │                      listens there, the other side refused, a bound hit
│   └── TransportClosed    the transport is gone for good: its link ended (on
│                          the host: the VMM ended) or it was closed. Nobody
│                          *sent* anything wrong; the VM layer says why it ended
├── StreamClosed           sending on a stream whose other side is gone or reset
└── RemoteError (tkbox.errors)
    ├── MuxError           the peer broke the serial mux protocol (the whole
    │                      mux is unusable)
    └── FrameError         the peer sent something that is not a valid frame
```

"Peer" is symmetric: on the host the peer is the guest, so `MuxError` and
`FrameError` are the guest's doing and the host maps them to `GuestError`;
in the guest the peer is the host. Nothing here is matched on message text:
callers tell the cases apart by type.

Standard library and `tkbox.errors` only: the guest agent imports this module.
"""

from __future__ import annotations

from tkbox.errors import RemoteError, TkboxError


class PortError(TkboxError):
    """A port stream could not be opened: no listener, refused, a bound reached."""


class TransportClosed(PortError):
    """The transport is gone for good: its link ended, or it was closed here.

    On the host a serial mux whose link ends means the VMM closed its end,
    i.e. the VM ended; that is the VM's story to tell (`tkbox.vm.errors`),
    not a fault of the guest.
    """


class StreamClosed(TkboxError):
    """Sending on a stream whose other side is gone, or that was reset."""


class MuxError(RemoteError):
    """The peer broke the mux protocol; the whole mux is unusable."""


class FrameError(RemoteError):
    """The peer sent something that is not a valid frame. The stream is unusable."""
