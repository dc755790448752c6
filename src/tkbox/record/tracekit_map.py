"""The Tracekit backend's mapping, sans-IO: tkbox crossings to Tracekit calls and back.

Pure functions of values and bytes, tested by feeding them
(`tests/unit/record/test_tracekit_mapping.py`): `tool_call` (a decision as
Tracekit's tool and args), `read_answer` (its verdict), `event_source` (an
event's one-line `source`), `read_webhook` (a signed incident POST, checked
and turned into holds and quarantines), `is_final` (a v2 bundle that ends
with `run.final`). `tkbox.record.tracekit` says how each is used.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from tkbox.errors import SignerUnavailable
from tkbox.record.client import JSON, Action

SOURCE_MAX = 256  # Tracekit's limit on observe's `source`
WEBHOOK_BODY_MAX = 4 << 20
WEBHOOK_SKEW_S = 300  # a signature older or newer than this is refused (a replay)


# --- the mapping (pure) ------------------------------------------------------------


def tool_call(action: Action, resource: JSON, context: JSON) -> tuple[str, dict[str, Any]]:
    """(Tracekit tool, args) for a tkbox decision."""
    if action == "Bash":
        command = resource.get("command")
        if not isinstance(command, str):
            argv = resource.get("argv")
            if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
                raise SignerUnavailable("a Bash decision needs resource.command or resource.argv")
            import shlex

            command = shlex.join(argv)
        return "Bash", {**dict(context), "command": command}
    if action == "Connect":
        host, port = resource.get("host"), resource.get("port")
        if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
            raise SignerUnavailable("a Connect decision needs resource.host and resource.port")
        scheme = "http" if port == 80 else "https"
        h = f"[{host}]" if ":" in host else host
        return "Connect", {"url": f"{scheme}://{h}:{port}",
                           "addresses": list(resource.get("addresses") or [])}
    if action == "Write":
        path = resource.get("path")
        if not isinstance(path, str):
            raise SignerUnavailable("a Write decision needs resource.path")
        rest = {k: v for k, v in resource.items() if k != "path"}
        sha = rest.pop("sha256", None)
        # the path the policy reads goes last: no context key may replace it
        return "Write", {**dict(context), **rest,
                         **({"content_sha256": sha} if sha is not None else {}),
                         "file_path": "/workspace/" + path.lstrip("/")}
    return "tkbox." + action, {"resource": dict(resource), "context": dict(context)}


@dataclass(frozen=True)
class Answer:
    allowed: bool
    reason: str
    decision_id: str
    push: str | None  # "hold" or "quarantine" when the answer says the run is contained


def read_answer(tool: str, d: Any) -> Answer:
    """A decide answer -> Answer; SignerUnavailable when it is malformed."""
    if not isinstance(d, dict):
        raise SignerUnavailable("the Tracekit signer's decision is malformed; refusing")
    decision, did, rules = d.get("decision"), d.get("decision_id"), d.get("rule_ids", [])
    if decision not in ("allow", "deny", "ask") or not isinstance(did, str) \
            or not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise SignerUnavailable("the Tracekit signer's decision is malformed; refusing")
    why = d.get("reason") if isinstance(d.get("reason"), str) else ""
    named = ", ".join(r for r in rules if r != "TK-UNKNOWN-TOOL")
    push = "quarantine" if "TK-QUARANTINE" in rules else "hold" if "TK-HOLD" in rules else None
    if decision == "allow":
        return Answer(True, f"allowed by Tracekit ({named})" if named else "allowed by Tracekit",
                      did, None)
    what = ("refused by Tracekit" if decision == "deny" else
            "held by Tracekit for a person's approval, which a tkbox door cannot wait for")
    reason = f"{tool} {what}: {why or 'no reason given'}" + (f" [{named}]" if named else "")
    return Answer(False, " ".join(reason.split())[:1024], did, push)


def event_source(kind: str, body: JSON) -> str:
    """observe's `source` for a tkbox event: the kind and a one-line summary of
    the body, in clear, at most SOURCE_MAX characters (the body is committed)."""
    summary = json.dumps(dict(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    s = f"{kind} {summary}" if body else kind
    return s if len(s) <= SOURCE_MAX else s[: SOURCE_MAX - 1] + "…"


def args_digest(tool: str, args: Any) -> str:
    """Tracekit's binding of a call's arguments: sha256 of RFC 8785 {tool, args}."""
    from tracekit.format.canon import event_hash

    return str(event_hash({"tool": tool, "args": args}))


# --- the webhook (sans-IO) -----------------------------------------------------------

INCIDENT_PUSH = {"run.held": "hold", "run.resumed": "release", "run.quarantined": "quarantine"}


@dataclass(frozen=True)
class Contained:
    kind: str  # hold, release, quarantine
    run_id: str
    incident: str
    run_seq: int | None


def read_webhook(body: bytes, signature: str | None, secret: bytes,
                 now: float) -> list[Contained]:
    """The holds, releases and quarantines in one webhook POST.

    Raises SignerUnavailable (the POST is answered 401/400 and ignored) when the
    signature is missing, does not match `secret`, or is older than
    WEBHOOK_SKEW_S (tracekit/signer/webhook.py: `t=<unix s>,v1=<hex
    HMAC-SHA256(secret, "<t>." + body)>`), or the body is not a JSON array.
    """
    if not signature:
        raise SignerUnavailable("webhook without X-Tracekit-Signature")
    fields = dict(p.partition("=")[::2] for p in signature.split(","))
    t, v1 = fields.get("t", ""), fields.get("v1", "")
    if not t.isdigit() or str(int(t)) != t or len(v1) != 64:
        raise SignerUnavailable("webhook with a malformed signature")
    want = hmac.new(secret, t.encode() + b"." + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, v1):
        raise SignerUnavailable("webhook with a signature that does not match our secret")
    if abs(now - int(t)) > WEBHOOK_SKEW_S:
        raise SignerUnavailable("webhook signed too long ago (a replay?)")
    try:
        events = json.loads(body)
    except (ValueError, RecursionError):
        raise SignerUnavailable("webhook body is not JSON") from None
    if not isinstance(events, list):
        raise SignerUnavailable("webhook body is not a JSON array")
    out = []
    for e in events:
        tk = e.get("unmapped", {}).get("tracekit", {}) if isinstance(e, dict) else {}
        if not isinstance(tk, dict):
            continue
        kind, run = INCIDENT_PUSH.get(str(tk.get("type"))), tk.get("run_id")
        if kind is None or not isinstance(run, str):
            continue
        infos = e.get("finding_info_list") or [{}]
        iid = infos[0].get("uid") if isinstance(infos, list) and isinstance(infos[0], dict) else ""
        seq = tk.get("run_seq")
        out.append(Contained(kind, run, iid if isinstance(iid, str) else "",
                             seq if isinstance(seq, int) and not isinstance(seq, bool) else None))
    return out


def is_final(bundle: bytes) -> bool:
    """Whether a Tracekit v2 bundle's run ends with its `run.final` record
    (`tracekit verify` says VERIFIED TO HEAD for one that does not)."""
    import io
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(bundle)) as z:
            for name in z.namelist():
                if name.startswith("runs/") and name.endswith(".jsonl"):
                    lines = [ln for ln in z.read(name).decode().splitlines() if ln.strip()]
                    last = max((json.loads(ln)["event"] for ln in lines),
                               key=lambda e: e["run_seq"], default=None)
                    return bool(last and last.get("type") == "run.final")
    except (zipfile.BadZipFile, ValueError, KeyError, TypeError):
        return False
    return False
