"""The operator's egress exceptions: the host's to set, never the box's.

From `tkbox daemon` flags: `--egress-block CIDR` (refused even if public, e.g.
the host's own public address on a cloud VM), `--egress-permit CIDR` (a host
service a box may reach on purpose: the only way into an always-refused
range), `--egress-hosts FILE` (hosts-file names for internal mirrors; such a
name is never looked up in DNS) and `--ca-cert FILE` (extra CA certificates
the box trusts; carried here, installed in the guest by the daemon).
`facts()` is what the run records about them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tkbox.doors.network.addresses import IPAddress, IPNetwork, parse_networks
from tkbox.doors.network.resolver import read_hosts_file


@dataclass(frozen=True)
class OperatorConfig:
    block: tuple[IPNetwork, ...] = ()
    permit: tuple[IPNetwork, ...] = ()
    hosts: Mapping[str, tuple[IPAddress, ...]] = field(default_factory=dict)
    ca_certs: tuple[Path, ...] = ()
    hosts_file: Path | None = None

    @classmethod
    def from_flags(
        cls,
        block: Iterable[str] = (),
        permit: Iterable[str] = (),
        hosts_file: Path | str | None = None,
        ca_certs: Iterable[Path | str] = (),
    ) -> OperatorConfig:
        """Parse the daemon's flags; a bad value raises UserError naming the flag."""
        path = Path(hosts_file) if hosts_file is not None else None
        return cls(
            block=parse_networks(block, "--egress-block"),
            permit=parse_networks(permit, "--egress-permit"),
            hosts=read_hosts_file(path) if path is not None else {},
            ca_certs=tuple(Path(p) for p in ca_certs),
            hosts_file=path,
        )

    def facts(self) -> dict[str, Any]:
        """What the run records about the operator's exceptions (open-run facts)."""
        return {
            "egress_block": [str(n) for n in self.block],
            "egress_permit": [str(n) for n in self.permit],
            "egress_hosts": {k: [str(a) for a in v] for k, v in sorted(self.hosts.items())},
            "ca_certs": [str(p) for p in self.ca_certs],
        }
