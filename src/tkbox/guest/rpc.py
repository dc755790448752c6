"""The agent RPC on port 1024: message shapes shared by host and guest.

One connection per request. The host sends a request frame, then (for some
ops) more frames; the guest answers with event frames. Every frame is a
msgpack map (`tkbox.protocol.framing`).

| op | host sends after the request | guest answers |
| --- | --- | --- |
| `exec` | `stdin` chunks, `stdin_eof`, `signal` | `started`, `out` (fd 1/2) chunks, `exit` |
| `read` | - | `data` chunks, `end` (size) |
| `write` | `data` chunks, `end` | `ok` |
| `diff` | `ignored` | `paths`…, `paths_end`, `apart`…, `data`… `mark`…, `end` (stats) |
| `shutdown` | - | `ok`, then the VM powers off |
| `ping` | - | `ok` (uptime) |

`diff` (docs/changes.md, "What the patch carries"): with `ask_ignored`, the guest
first sends the changed paths (`paths`: NUL-separated, at most `MAX_ASKED` paths
and `MAX_ASKED_BYTES` in all) and waits for `ignored` (`bits`: one bit per path
asked, bit `i % 8` of byte `i // 8`, set when the checkout's git ignores it). Each
`apart` frame is a change the patch leaves out (path, change, size, sha256, why);
a `mark` follows each file's last `data` frame, so the host can keep every whole
file of a patch that is cut off.

Any op may be answered with `error` (`message`). The guest is untrusted: the
host validates every answer (`tkbox.daemon.guest_client`).
"""

from __future__ import annotations

CHUNK = 256 * 1024  # payload bytes per data frame (well under the 1 MiB frame limit)
MAX_PATCH = 256 * 1024 * 1024  # the largest patch the guest will compute
#: a file larger than this is set apart, never in a patch (the changes door's own
#: per-file limit, `tkbox.doors.changes.patch.Limits.max_file_bytes`)
MAX_PATCH_FILE = 64 * 1024 * 1024
MAX_ASKED = 200_000  # changed paths the guest asks the host about (ignored or not)
MAX_ASKED_BYTES = 16 * 1024 * 1024
MAX_APART = 1000  # set-apart changes listed one by one (the rest counted)
MAX_FILE = 64 * 1024 * 1024  # read/write RPC limit

OPS = frozenset({"exec", "read", "write", "diff", "shutdown", "ping"})
