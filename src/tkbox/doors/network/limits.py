"""Egress resources shared by every box: file descriptors, connections, time.

Each proxied connection holds a socket to its origin (and, over vsock, one
to the guest too), so one box holding tunnels open could take every file
descriptor of the daemon: the other boxes' connections and the API would
fail. So:

- `raise_nofile()` at daemon start raises the soft `RLIMIT_NOFILE` to the
  hard limit (the kernel's ceiling for this process, no privilege needed);
- `ConnectionPool` caps egress connections daemon-wide from that limit,
  keeping `FD_RESERVE` descriptors for the daemon itself (API, signer, disks,
  VM sockets) and counting `FDS_PER_CONNECTION` per connection;
- each box gets a fair share: while `n` other boxes hold connections, a box
  may hold at most `max(MIN_SHARE, cap // (n + 2))`: a box alone gets half,
  and there is always room for a box that has none yet, so a newcomer is
  never locked out by one that came first. A box over its share keeps what
  it has and is refused new ones until it is under;
- tunnels (and plain HTTP exchanges) end after `idle` seconds without a byte
  either way and after `total` seconds in all (`tkbox daemon --tunnel-idle`,
  `--tunnel-total`).

A refused connection gets a `503` with the reason; nothing is dialed.
"""

from __future__ import annotations

import resource
from collections import Counter

from tkbox.errors import InternalError

#: descriptors kept for the daemon itself (API, signer, VM sockets and disks, logs)
FD_RESERVE = 512
#: descriptors one egress connection may hold (the origin's socket; the guest's over vsock)
FDS_PER_CONNECTION = 2
#: a box may always hold this many, whatever the others do
MIN_SHARE = 16
#: default seconds a tunnel may carry nothing either way
TUNNEL_IDLE = 300.0
#: default seconds a tunnel may stay open at all
TUNNEL_TOTAL = 4 * 3600.0
#: never ask for more than this many descriptors, even when the hard limit is unlimited
NOFILE_CEILING = 1 << 20


def raise_nofile() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (bounded); return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = NOFILE_CEILING if hard == resource.RLIM_INFINITY else min(hard, NOFILE_CEILING)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return NOFILE_CEILING if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        return soft
    return want


def connections_for(nofile: int) -> int:
    """The daemon-wide egress connection cap a descriptor limit allows."""
    return max(MIN_SHARE, (nofile - FD_RESERVE) // FDS_PER_CONNECTION)


class ConnectionPool:
    """Daemon-wide egress connections, with a fair share per box (module docstring)."""

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise InternalError("a connection pool needs a positive cap")
        self.cap = cap
        self._held: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self._held.values())

    def held(self, box: str) -> int:
        return self._held[box]

    def share(self, box: str) -> int:
        """How many connections `box` may hold now."""
        others = sum(1 for b, n in self._held.items() if n and b != box)
        return max(MIN_SHARE, self.cap // (others + 2))

    def refusal(self, box: str) -> str | None:
        """Why `box` may not open one more connection now (None: it may)."""
        if self.total >= self.cap:
            return (f"refused: the daemon holds {self.cap} egress connections (its limit, from "
                    "the open-file limit); retry when some have closed")
        share = self.share(box)
        if self._held[box] >= share:
            return (f"refused: box {box} holds {self._held[box]} egress connections, its fair "
                    f"share of the daemon's {self.cap} while other boxes use theirs; close some "
                    "and retry")
        return None

    def acquire(self, box: str) -> str | None:
        """Take one connection for `box`, or say why not."""
        why = self.refusal(box)
        if why is None:
            self._held[box] += 1
        return why

    def release(self, box: str) -> None:
        if self._held[box] > 0:
            self._held[box] -= 1
        if not self._held[box]:
            del self._held[box]
