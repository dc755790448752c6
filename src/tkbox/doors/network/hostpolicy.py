"""The door's decision for one host and port, pure and explainable.

Order, per DESIGN §7: (1) the allowlist, then the box's earlier approvals;
(2) a host allowed by neither waits for a person; (3) addresses: a literal IP
is its own address, an operator-mapped name (`--egress-hosts`) has its
mapped addresses and is never looked up, any other name is resolved on the
host — but only once steps 1 and 2 have let it through, so the box cannot
use the host's resolver to send data out in a name nobody allowed;
(4) every address is checked (`AddressPolicy`), and only those that pass are
dialed.

An IP host whose address is always refused is refused before anyone is
asked: no person can approve the metadata service, only the operator's
`--egress-permit` opens such a range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tkbox.doors.network.addresses import AddressPolicy, AddressVerdict, IPAddress
from tkbox.doors.network.allowlist import Allowlist
from tkbox.doors.network.config import OperatorConfig
from tkbox.doors.network.names import Host

Verdict = Literal["allow", "ask", "refuse"]


@dataclass(frozen=True)
class Admission:
    """Steps 1-2: may this host and port be tried at all?"""

    verdict: Verdict
    reason: str
    rule: str | None = None
    require_tls: bool = True  # False only for an entry that names its port


@dataclass
class Explanation:
    """What the door would decide for a host and port, and why."""

    host: str
    port: int
    verdict: Verdict
    reason: str
    rule: str | None = None
    require_tls: bool = True
    source: Literal["literal", "egress-hosts", "dns", "not resolved"] = "not resolved"
    addresses: list[AddressVerdict] = field(default_factory=list)

    @property
    def allowed_addresses(self) -> list[IPAddress]:
        return [a.address for a in self.addresses if a.allowed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "verdict": self.verdict,
            "reason": self.reason,
            "rule": self.rule,
            "tls_required": self.require_tls,
            "addresses_from": self.source,
            "addresses": [
                {"address": str(a.address), "allowed": a.allowed, "reason": a.reason}
                for a in self.addresses
            ],
        }


class EgressPolicy:
    """A box's allowlist, its approvals so far, and the operator's exceptions."""

    def __init__(
        self, allowlist: Allowlist, operator: OperatorConfig, addresses: AddressPolicy
    ) -> None:
        self.allowlist = allowlist
        self.operator = operator
        self.addresses = addresses
        # (host, port) -> (approval id, who answered: approvals.ANSWERED_BY)
        self.approved: dict[tuple[str, int], tuple[int, str]] = {}
        self.denied: dict[tuple[str, int], tuple[int, str]] = {}

    def admit(self, host: Host, port: int) -> Admission:
        match = self.allowlist.match(host, port)
        if match is not None:
            return Admission(
                "allow", f"allowed by {match.rule}", match.rule, not match.entry.explicit_port
            )
        key = (host.name, port)
        if key in self.approved:
            n, by = self.approved[key]
            return Admission(
                "allow",
                f"approved by {by} (approval {n})",
                f"approval {n}",
                port in (80, 443),
            )
        if key in self.denied:
            n, by = self.denied[key]
            return Admission(
                "refuse",
                f"refused: {host}:{port} was denied by {by} "
                f"(approval {n}); add it with --allow to change that",
            )
        others = self.allowlist.names_host(host)
        if others:
            ports = ", ".join(e.text for e in others)
            hint = f"only {ports} is allowed"
        else:
            hint = "not in the allowlist"
        return Admission("ask", f"{host}:{port} is {hint}; waiting for a person on the host")

    def static_addresses(
        self, host: Host
    ) -> tuple[Literal["literal", "egress-hosts"], list[IPAddress]] | None:
        """Addresses known without DNS: the literal itself, or the operator's map."""
        if host.literal is not None:
            return "literal", [host.literal.address]
        mapped = self.operator.hosts.get(host.name)
        if mapped is not None:
            return "egress-hosts", list(mapped)
        return None

    def check_addresses(self, addresses: list[IPAddress]) -> list[AddressVerdict]:
        return [self.addresses.check(a) for a in addresses]

    def explain(
        self, host: Host, port: int, resolved: list[IPAddress] | None = None
    ) -> Explanation:
        """Everything decidable without a person and without dialing."""
        adm = self.admit(host, port)
        ex = Explanation(str(host), port, adm.verdict, adm.reason, adm.rule, adm.require_tls)
        known = self.static_addresses(host)
        if known is not None:
            ex.source, addrs = known
        elif resolved is not None and adm.verdict == "allow":
            ex.source, addrs = "dns", resolved
        else:
            return ex
        ex.addresses = self.check_addresses(addrs)
        if host.literal is not None and host.literal.zone is not None:
            ex.verdict = "refuse"
            ex.reason = (
                f"refused: {host.name}%{host.literal.zone} carries an IPv6 zone id, which names an "
                "interface of the host; zone ids are not allowed"
            )
            return ex
        if not ex.allowed_addresses and ex.addresses:
            ex.verdict = "refuse"
            ex.reason = ex.addresses[0].reason
        elif adm.verdict == "allow":
            permits = sorted({a.rule for a in ex.addresses if a.allowed and a.rule != "public"})
            if permits:
                ex.reason += f"; address {', '.join(permits)}"
        return ex
