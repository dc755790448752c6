"""Guest CIDs for vhost vsock: claimed from the kernel, held by the VM's own fd.

The host has one vsock address space: every guest on it, tkbox's or anyone
else's, needs a CID no other holds. Counting CIDs in the daemon could not see
other daemons, other users' VMs, or a QEMU that outlived a daemon restart for
a moment. So the kernel decides: we open `/dev/vhost-vsock` and ask it, with
`VHOST_VSOCK_SET_GUEST_CID`, to give that device a candidate CID. It refuses
one in use anywhere on the host (`EADDRINUSE`, checked under the kernel's own
lock in `drivers/vhost/vsock.c: vhost_vsock_set_cid`), and we try another.
The device keeps the CID for as long as the fd is open, and the fd is handed
to QEMU (`-device vhost-vsock-device,guest-cid=N,vhostfd=FD`), which sets the
same CID on it again (the kernel allows that for the device already holding
it). So the CID is held from the moment it is chosen until the VMM ends, and
no second box, daemon or host user can take it in between: no collision
across boxes or daemon restarts, with no state file to go stale.

Candidates are drawn at random from 3 to 2^32 - 2 (0, 1, 2 and -1 are
reserved), so two claimers rarely even try the same one.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass

from tkbox.errors import HostError

VHOST_VSOCK = "/dev/vhost-vsock"
# linux/vhost.h: VHOST_VSOCK_SET_GUEST_CID = _IOW(VHOST_VIRTIO, 0x60, __u64), VHOST_VIRTIO = 0xAF
# _IOW(type, nr, size) = (1 << 30) | (size << 16) | (type << 8) | nr
VHOST_VSOCK_SET_GUEST_CID = (1 << 30) | (8 << 16) | (0xAF << 8) | 0x60
#: The first CID a guest may have (0: hypervisor, 1: local, 2: host).
FIRST_GUEST_CID = 3
#: The last: 2^32 - 1 is VMADDR_CID_ANY.
LAST_GUEST_CID = (1 << 32) - 2
#: Candidates tried before giving up (each refused one is held by someone else).
MAX_TRIES = 64

Ioctl = Callable[[int, int, bytes], object]


@dataclass
class ClaimedCid:
    """A CID the kernel gave to the vhost device `fd`; it is ours while `fd` is open."""

    cid: int
    fd: int

    def close(self) -> None:
        """Release our copy of the fd (QEMU's copy keeps the CID while it runs)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def random_cid() -> int:
    return FIRST_GUEST_CID + secrets.randbelow(LAST_GUEST_CID - FIRST_GUEST_CID + 1)


def claim_cid(device: str = VHOST_VSOCK, *, ioctl: Ioctl = fcntl.ioctl,
              candidates: Callable[[], int] = random_cid,
              tries: int = MAX_TRIES) -> ClaimedCid:
    """Open `device` and have the kernel give it a guest CID no one else holds.

    Raises HostError (one line, what to do) if the device cannot be opened or
    no candidate is free after `tries`.
    """
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise HostError(f"cannot open {device} ({exc.strerror}); run 'sudo modprobe "
                        "vhost_vsock' and give tkbox's user access to it, or let boxes "
                        "use the serial mux") from None
    try:
        for _ in range(tries):
            cid = candidates()
            if not FIRST_GUEST_CID <= cid <= LAST_GUEST_CID:
                continue
            try:
                ioctl(fd, VHOST_VSOCK_SET_GUEST_CID, struct.pack("=Q", cid))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    continue  # held by another VM on this host: try another
                raise HostError(f"{device} refused guest CID {cid} ({exc.strerror}); "
                                "let boxes use the serial mux (TKBOX_TRANSPORT=serial-mux)"
                                ) from None
            return ClaimedCid(cid, fd)
        raise HostError(f"no free vsock guest CID after {tries} tries on {device}; "
                        "too many VMs on this host?")
    except BaseException:
        os.close(fd)
        raise
