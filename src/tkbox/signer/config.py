"""The signer's home: key, configuration, log, user policy, trust file.

    <home>/config.json     origin, witnesses, quorum (written by `tkbox signer init`)
    <home>/signer.key      the Ed25519 note key, Go's PRIVATE+KEY+… form (0600)
    <home>/log.db          the log (SQLite, WAL)
    <home>/policy.cedar    the user's Cedar policy (optional)
    <home>/trust.json      the trust file every export carries

`home` is `tkbox.paths.signer_home()` for `--dev`, `/var/lib/tkbox-signer` for
`--system`. Everything is created 0700/0600 and must belong to the signer's
user.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tkbox._fs import write_atomic
from tkbox.errors import HostError, UserError
from tkbox.formats import bundle, cosignature, note, tlogpolicy

CONFIG = "config.json"
KEY = "signer.key"
DB = "log.db"
POLICY = "policy.cedar"
TRUST = "trust.json"

POLICY_TEMPLATE = """\
// tkbox signer: your Cedar policy, added to the built-in packs (base,
// download-exec). A forbid here refuses; a permit cannot override a pack's
// forbid. The request: principal Tkbox::Run::"<run>", action Action::"Bash" |
// "Connect" | "Write" | "Approval" | "Http" (a request on a host with rules:
// context.resource.method, .path), context.resource, context.request,
// context.analysis (see docs/signer.md). Example:
//
// @id("no-netcat")
// @reason("netcat is refused by this host's policy")
// forbid (principal, action == Action::"Bash", resource)
// when { context.analysis.programs.contains("nc") };
//
// A policy that fails to parse or to evaluate refuses every decision, with
// its error in the record: test a change with `tkbox signer status`.
"""


@dataclass
class WitnessConf:
    name: str  # the name in the policy (a short label)
    vkey: str  # the witness's cosignature/v1 verifier key
    url: str  # its submission prefix: POST <url>/add-checkpoint
    independent: bool = False  # run by someone other than this signer's operator

    def verifier(self) -> cosignature.CosignatureVerifier:
        return cosignature.parse_vkey(self.vkey)


@dataclass
class Config:
    home: Path
    origin: str
    witnesses: list[WitnessConf] = field(default_factory=list)
    quorum: int | None = None  # how many witnesses must cosign (default: all)
    checkpoint_interval: float = 10.0  # seconds between submissions to witnesses
    mode: str = "dev"  # dev | system

    @property
    def key_path(self) -> Path:
        return self.home / KEY

    @property
    def db_path(self) -> Path:
        return self.home / DB

    @property
    def policy_path(self) -> Path:
        return self.home / POLICY

    @property
    def trust_path(self) -> Path:
        return self.home / TRUST

    def to_json(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "mode": self.mode,
            "quorum": self.quorum,
            "checkpoint_interval": self.checkpoint_interval,
            "witnesses": [
                {"name": w.name, "vkey": w.vkey, "url": w.url, "independent": w.independent}
                for w in self.witnesses
            ],
        }

    def save(self) -> None:
        write_private(self.home / CONFIG, (json.dumps(self.to_json(), indent=2) + "\n").encode())

    def signer(self) -> note.Ed25519Signer:
        try:
            return note.parse_skey(self.key_path.read_text().strip())
        except FileNotFoundError:
            raise UserError(f"no signer key at {self.key_path}; run `tkbox signer init`") from None
        except note.NoteError as exc:
            raise HostError(f"{self.key_path}: {exc.what}") from None

    def trust(self, log_key: note.Ed25519Verifier) -> bytes:
        ws = {w.name: (w.verifier(), w.url) for w in self.witnesses}
        pol = tlogpolicy.build(log_key, ws, self.quorum)
        return bundle.make_trust(pol, [w.name for w in self.witnesses if w.independent])


def load(home: Path) -> Config:
    path = home / CONFIG
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no signer at {home}; run `tkbox signer init --dev` first") from None
    except (OSError, ValueError) as exc:
        raise HostError(f"{path}: {exc}") from None
    try:
        ws = [WitnessConf(str(w["name"]), str(w["vkey"]), str(w["url"]),
                          bool(w.get("independent", False))) for w in obj.get("witnesses", [])]
        return Config(home, str(obj["origin"]), ws, obj.get("quorum"),
                      float(obj.get("checkpoint_interval", 10.0)), str(obj.get("mode", "dev")))
    except (KeyError, TypeError, ValueError) as exc:
        raise HostError(f"{path}: not a signer configuration ({exc})") from None


def init(home: Path, origin: str | None = None, mode: str = "dev") -> Config:
    """Create a signer at `home`: key, config, empty policy, trust file. Idempotent."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    home.chmod(0o700)
    if (home / CONFIG).exists():
        cfg = load(home)
    else:
        origin = origin or f"tkbox.local/signer/{secrets.token_hex(6)}"
        if not note.valid_name(origin):
            raise UserError(f"{origin!r} cannot be a log origin (no spaces, no '+')")
        cfg = Config(home, origin, mode=mode)
        cfg.save()
    if not cfg.key_path.exists():
        write_private(cfg.key_path, (note.generate(cfg.origin).skey() + "\n").encode())
    if not cfg.policy_path.exists():
        write_private(cfg.policy_path, POLICY_TEMPLATE.encode())
    write_trust(cfg)
    return cfg


def write_trust(cfg: Config) -> bytes:
    data = cfg.trust(cfg.signer().verifier())
    write_private(cfg.trust_path, data, mode=0o644)
    return data


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Atomically (temporary file, fsync, rename), readable by the signer's user only."""
    write_atomic(path, data, mode)
