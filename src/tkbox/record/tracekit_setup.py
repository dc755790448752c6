"""Setting up a same-user Tracekit signer for tkbox (`python -m tkbox.record.tracekit init`).

`init_dev` writes the signer's config (`signer.yaml`: socket, loopback HTTP
listener, webhook, the policy tkbox ships (`POLICY`), quotas for many boxes
(`LIMITS`), witnesses) and its token store into `tracekit_home()`;
`load_setup` reads what it wrote back, so the daemon (`tkbox daemon --signer
tracekit`) finds the socket, the webhook and the per-box identities.
`tkbox.record.tracekit` says why each box is its own identity.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tkbox.errors import HostError, UserError

# The policy tkbox ships for Tracekit: its dev pack (coding rules: `curl … | sh`
# refused, credential files, …) plus the Connect tool as Tracekit's `http`
# class, so its internal-address and internal-name rules read every connection.
# Tracekit's TK-N003 (server-net pack): localhost, a dotless name, internal suffixes.
_INTERNAL_NAME = (r"^(localhost|[^.:\[]+|kubernetes\.default|"
                  r".*?\.(localhost|internal|local|lan|corp|intranet|svc|home\.arpa))\.?$")
POLICY = f"""\
# tkbox's mapping for a Tracekit signer (tkbox.record.tracekit.POLICY).
# Connect (one egress connection of a box) is an `http` call with {{url}}; the two
# rules below refuse internal addresses and names as Tracekit's server-net pack
# does (TK-N001, TK-N003). tkbox's door refuses them before it asks, too.
version: 'tkbox-1'
description: tkbox boxes (Bash, Write, Connect)
tools:
  Connect: http
  tkbox.Approval: app
deny:
  - id: TKBOX-N001
    class: http
    field: internal
    pattern: '^true$'
    reason: connection to an internal address (private, loopback, link-local or metadata)
    rationale: A box reaches the web it was given, never the host's network or metadata.
  - id: TKBOX-N003
    class: http
    field: host
    pattern: '{_INTERNAL_NAME}'
    reason: connection to an internal name
    rationale: The name twin of TKBOX-N001.
"""

# Quotas for a daemon with many boxes (Tracekit's defaults: 200 events/s, burst
# 400, 100 open runs per identity; every box's run has the daemon's identity).
LIMITS = {"events_per_s": 2000, "burst": 4000, "open_runs": 1000}
# What a box's identity may call (Tracekit grants a token identity nothing by default).
BOX_METHODS = ["register_run", "decide", "complete", "observe", "close_run", "read", "status"]
BOX_TOKEN_TTL_S = 30 * 86400




# --- setup ---------------------------------------------------------------------------


def tracekit_home() -> Path:
    """$TKBOX_TRACEKIT_HOME, else $TKBOX_HOME/tracekit."""
    from tkbox import paths

    env = os.environ.get("TKBOX_TRACEKIT_HOME")
    return Path(env) if env else paths.home() / "tracekit"


@dataclass(frozen=True)
class Setup:
    """What `init_dev` wrote; `tkbox.json` in the home names it for the daemon."""

    home: Path
    config: Path  # signer.yaml
    socket: Path
    webhook_port: int
    webhook_secret: Path
    operator_token: Path
    http_port: int
    tokens: Path  # the signer's token store (http.tokens): one identity per box

    def as_json(self) -> dict[str, Any]:
        return {"config": str(self.config), "socket": str(self.socket),
                "webhook_port": self.webhook_port, "webhook_secret": str(self.webhook_secret),
                "operator_token": str(self.operator_token), "http_port": self.http_port,
                "tokens": str(self.tokens)}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_dev(home: Path, *, webhook_port: int | None = None, http_port: int | None = None,
             witnesses: list[dict[str, str]] | None = None) -> Setup:
    """Write a same-user Tracekit signer's config under `home` (0700).

    signer.yaml: store in `home/data`, socket `home/signer.sock`, tkbox's
    POLICY on top of Tracekit's dev pack, LIMITS, a webhook to
    127.0.0.1:`webhook_port` for incident records, and a loopback HTTP listener
    whose bearer token (`home/operator.token`, identity `token:http`) is the
    operator who may hold, quarantine and resume runs; Tracekit refuses to
    give those calls to the identity that registers runs (the daemon's uid).
    """
    try:
        from tracekit.signer import service
    except ImportError:
        raise HostError("tracekit-ai is not installed; pip install 'tracekit-ai==1.4.2'") from None
    home = home.absolute()
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(home, 0o700)
        (home / "data").mkdir(mode=0o700, exist_ok=True)
        port = webhook_port or _free_port()
        http_port = http_port or _free_port()
        (home / "boxes").mkdir(mode=0o700, exist_ok=True)
        secret, token = home / "webhook.secret", home / "operator.token"
        for p in (secret, token):
            if not p.exists():
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(base64.urlsafe_b64encode(os.urandom(32)).decode() + "\n")
        (home / "tkbox-policy.yaml").write_text(POLICY)
        dev_pack = os.path.relpath(service.DEFAULT_POLICY, home)
        (home / "policy.yaml").write_text(
            "# Tracekit's dev pack, then tkbox's mapping (written by tkbox)\n"
            f"extends: [{json.dumps(dev_pack)}, tkbox-policy.yaml]\n")
        lines = {
            "data_dir": str(home / "data"),
            "socket": str(home / "signer.sock"),
            "policy": str(home / "policy.yaml"),
            "grace_s": 1,
            "limits": LIMITS,
            "http": {"listen": f"127.0.0.1:{http_port}", "insecure_loopback": True,
                     "authenticators": ["token"], "token_file": str(token),
                     "tokens": str(home / "tokens.json")},
            # token:http is the operator; every other token is one box's run
            "authorize": {"token:http": ["run_hold", "run_quarantine", "run_resume",
                                         "incident_list", "incident_show",
                                         "incident_resolve", "status"],
                          "token:*": [*BOX_METHODS, "delegate_run"],
                          # the daemon, acting for each box's identity (delegate_run)
                          f"uid:{os.getuid()}": BOX_METHODS},
            "approvals": {"approvers": ["token:http"], "persons": {"token:http": "operator"}},
            "webhook": [{"format": "ocsf", "url": f"http://127.0.0.1:{port}/tkbox",
                         "events": ["incident"], "secret_file": str(secret)}],
            **({"witnesses": witnesses} if witnesses else {}),
        }
        # JSON is YAML: Tracekit's reader takes it as it is.
        (home / "signer.yaml").write_text(
            "\n".join(f"{k}: {json.dumps(v)}" for k, v in lines.items()) + "\n")
        setup = Setup(home, home / "signer.yaml", home / "signer.sock", port, secret, token,
                      http_port, home / "tokens.json")
        (home / "tkbox.json").write_text(json.dumps(setup.as_json(), indent=2) + "\n")
    except OSError as exc:
        raise HostError(f"cannot write the Tracekit signer's config in {home}: "
                        f"{exc.strerror or exc}") from None
    return setup


def load_setup(home: Path) -> Setup | None:
    """The Setup `init_dev` wrote in `home`, or None when there is none."""
    try:
        d = json.loads((home / "tkbox.json").read_text())
        return Setup(home, Path(d["config"]), Path(d["socket"]), int(d["webhook_port"]),
                     Path(d["webhook_secret"]), Path(d["operator_token"]), int(d["http_port"]),
                     Path(d["tokens"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{home / 'tkbox.json'} is unreadable ({exc}); run "
                        "`python -m tkbox.record.tracekit init` again") from None


def tracekit_command() -> list[str]:
    """How to run the `tracekit` command of the Tracekit installed beside tkbox."""
    return [sys.executable, "-m", "tracekit"]
