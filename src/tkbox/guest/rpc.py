"""The agent RPC on port 1024: message shapes shared by host and guest.

One connection per request. The host sends a request frame, then (for some
ops) more frames; the guest answers with event frames. Every frame is a
msgpack map (`tkbox.protocol.framing`).

| op | host sends after the request | guest answers |
| --- | --- | --- |
| `exec` | `stdin` chunks, `stdin_eof`, `signal` | `started`, `out` (fd 1/2) chunks, `exit` |
| `read` | - | `data` chunks, `end` (size) |
| `write` | `data` chunks, `end` | `ok` |
| `diff` | - | `data` chunks of the patch, `end` (stats) |
| `shutdown` | - | `ok`, then the VM powers off |
| `ping` | - | `ok` (uptime) |

Any op may be answered with `error` (`message`). The guest is untrusted: the
host validates every answer (`tkbox.daemon.guest_client`).
"""

from __future__ import annotations

CHUNK = 256 * 1024  # payload bytes per data frame (well under the 1 MiB frame limit)
MAX_PATCH = 256 * 1024 * 1024  # the largest patch the guest will compute
MAX_FILE = 64 * 1024 * 1024  # read/write RPC limit

OPS = frozenset({"exec", "read", "write", "diff", "shutdown", "ping"})
