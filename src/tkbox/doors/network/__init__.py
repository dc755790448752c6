"""tkbox.doors.network: the egress door, the only route out of a box.

Public API (the daemon wires these):

- `EgressDoor(run_id, signer, allow, operator, resolver, board, clock, ...)`:
  one per box; `await door.handle(stream)` per port-1025 stream,
  `await door.close()` at stop, `door.check(host, port)` for
  `tkbox egress check`.
- `ApprovalBoard(signer, clock)`: one per daemon; `list()`,
  `await answer(box, id, allow)`.
- `OperatorConfig.from_flags(block, permit, hosts_file, ca_certs)`.
- `SystemResolver` / `FakeResolver`, `SystemClock` / `FakeClock`.
- `describe_presets()` for `tkbox presets`.

Module map: `addresses` (IP literals, unwrapping, refused ranges), `names`
(normalised hosts), `allowlist`, `presets`, `request` (proxy request heads),
`tls` (ClientHello/ServerHello inspection), `policy` (the decision),
`approvals`, `resolver`, `config`, `clock` — all pure or nearly — and
`door` (the asyncio shell), `listener` (a loopback TCP adapter).

Errors (all from `tkbox.errors`):

```
GuestError
├── AddressError      addresses: a numeric host that is no valid address
├── HostNameError     names: a host, authority or port that is not valid
├── BadRequest        request: malformed or refused request head (.status)
└── TLSRefused        tls: bad TLS, hidden or mismatched server name
RemoteError
└── ResolveError      resolver: a name that does not resolve
UserError             operator input (flags, --allow, hosts file)
Refused               approvals: too many pending / opened a minute
```
"""

from tkbox.doors.network.approvals import Answer, ApprovalBoard, PendingApproval
from tkbox.doors.network.clock import Clock, FakeClock, SystemClock
from tkbox.doors.network.config import OperatorConfig
from tkbox.doors.network.door import EgressDoor, open_tcp
from tkbox.doors.network.listener import serve_tcp
from tkbox.doors.network.policy import Explanation
from tkbox.doors.network.presets import describe_presets
from tkbox.doors.network.resolver import FakeResolver, Resolver, SystemResolver

__all__ = [
    "Answer",
    "ApprovalBoard",
    "Clock",
    "EgressDoor",
    "Explanation",
    "FakeClock",
    "FakeResolver",
    "OperatorConfig",
    "PendingApproval",
    "Resolver",
    "SystemClock",
    "SystemResolver",
    "describe_presets",
    "open_tcp",
    "serve_tcp",
]
