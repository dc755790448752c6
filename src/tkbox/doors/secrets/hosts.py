"""Which hosts a box's secrets door reads, from its flags. Pure.

- bound hosts: every host a `--secret` names; binding allows the host on its
  bound port, 443 unless the spec names another (added to the allowlist as
  `host:443`; docs/secrets.md says why);
- model hosts: the hosts of the `anthropic`, `openai` and `claude-code`
  presets that the box may reach (its allowlist, expanded, or bound), and the
  hosts the user marks (`--model-host`), which must be allowed or bound;
- under `inspect == "all"`: every name the allowlist admits (never an IP);
- ruled hosts: every name an allowlist entry gives method and path rules
  (`httprules`): the door must read a request to decide on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tkbox.doors.network import presets
from tkbox.doors.network.allowlist import Allowlist
from tkbox.doors.network.names import HostNameError, normalize_name
from tkbox.doors.secrets.spec import Secret
from tkbox.errors import UserError


@dataclass(frozen=True)
class ReadHosts:
    allow: list[str]  # the allowlist the network door gets
    bound: frozenset[str]
    models: frozenset[str]
    inspect: frozenset[str]
    ruled: frozenset[str] = frozenset()

    @property
    def any(self) -> bool:
        return bool(self.bound or self.models or self.inspect or self.ruled)


def read_hosts(allow: Sequence[str], secrets: Sequence[Secret], inspect: str,
               marked: Iterable[str] = (),
               expand: Callable[[str], tuple[str, ...] | None] = presets.preset_entries
               ) -> ReadHosts:
    bound = sorted({h for s in secrets for h in s.spec.hosts})
    full = list(allow) + [f"{h}:{p}" for h, p in sorted({b for s in secrets
                                                         for b in s.spec.binds})]
    allowlist = Allowlist(full, expand)
    names = {e.host.name for e in allowlist.entries if e.host.literal is None}
    model_names = {h for p in presets.MODEL_PRESETS for h in (expand(p) or ())}
    for text in marked:
        try:
            host = normalize_name(str(text))
        except HostNameError:
            raise UserError(f"--model-host {str(text)[:60]!r} is not a DNS name") from None
        if host not in names:
            raise UserError(f"--model-host {host} is not allowed; add --allow {host} (or bind "
                            "a secret to it)")
        model_names.add(host)
    return ReadHosts(full, frozenset(bound), frozenset(model_names & names),
                     frozenset(names) if inspect == "all" else frozenset(),
                     allowlist.ruled_names())
