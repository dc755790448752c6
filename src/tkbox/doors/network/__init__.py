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
- `Interceptor`: what the door asks of the secrets door that plugs into its
  tunnels (`EgressDoor(..., mitm=SecretsDoor(...))`).

Module map. The pure core (no I/O): `addresses` (IP literals, unwrapping,
refused ranges), `names` (normalised hosts), `allowlist`, `presets`,
`request` (proxy request heads), `tls` (ClientHello/ServerHello inspection),
`policy` (the decision), `records` (excerpts, refusal summaries), `config`;
with `limits`, `approvals`, `resolver` and `clock` nearly so. The asyncio
shell, one seam a module: `decide` (read the head, the allowlist, a person,
addresses, the signer), `tunnel` (CONNECT: splice through the TLS check, or
hand to the secrets door through `tunnel.Interceptor`), `relay` (one plain
http:// request), `connection` (one connection's counts, ends, time limits
and tasks), `door` (`EgressDoor`: wires them, dials, records), `listener`
(a loopback TCP adapter). `testing` ships the fakes and builders.

Errors: the door's tree is drawn in `errors` (`Stage`, `EgressRefused`,
`ConnectionEnded`, `OriginError`, and where each core's own error lives).
"""

from tkbox._clock import Clock, FakeClock, SystemClock
from tkbox.doors.network.approvals import Answer, ApprovalBoard, PendingApproval, Via
from tkbox.doors.network.config import OperatorConfig
from tkbox.doors.network.door import EgressDoor, open_tcp
from tkbox.doors.network.errors import ConnectionEnded, EgressRefused, OriginError, Stage
from tkbox.doors.network.hostpolicy import Explanation
from tkbox.doors.network.listener import serve_tcp
from tkbox.doors.network.presets import describe_presets
from tkbox.doors.network.resolver import FakeResolver, Resolver, SystemResolver
from tkbox.doors.network.tunnel import Interceptor

__all__ = [
    "Answer",
    "ApprovalBoard",
    "Clock",
    "ConnectionEnded",
    "EgressDoor",
    "EgressRefused",
    "Explanation",
    "FakeClock",
    "FakeResolver",
    "Interceptor",
    "OperatorConfig",
    "OriginError",
    "PendingApproval",
    "Resolver",
    "Stage",
    "SystemClock",
    "SystemResolver",
    "Via",
    "describe_presets",
    "open_tcp",
    "serve_tcp",
]
