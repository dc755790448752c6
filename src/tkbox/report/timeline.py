"""From a bundle's records to what a person wants to read of a run (no I/O).

`build_report(bundle, trust)` verifies, then folds the records into a
`Timeline`. Record bodies are read defensively: a field of an unexpected type
is shown as missing, never an exception, since the signer records what the
daemon sent and a future kind may carry other shapes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tkbox.formats import FormatError, bundle, record
from tkbox.verify.core import Report, verify_bundle


@dataclass
class Command:
    seq: int
    time: str
    command: str
    allowed: bool
    reason: str
    cwd: str = ""
    status: int | None = None
    signal: int | None = None
    error: str = ""
    duration_ms: int | None = None
    stdout_bytes: int | None = None
    stderr_bytes: int | None = None
    completed: bool = False


@dataclass
class Connection:
    host: str
    port: int | None
    allowed: int = 0
    refused: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


@dataclass
class FileWrite:
    seq: int
    path: str
    status: str  # written, refused, held back
    reason: str = ""
    mode: str = ""
    sha256: str = ""


@dataclass
class Timeline:
    """Everything the page shows, in the order the run did it."""

    report: Report
    records: list[record.Record]
    commands: list[Command] = field(default_factory=list)
    connections: dict[tuple[str, int | None], Connection] = field(default_factory=dict)
    approvals: list[dict[str, Any]] = field(default_factory=list)
    secret_uses: list[dict[str, Any]] = field(default_factory=list)
    secret_leaks: list[dict[str, Any]] = field(default_factory=list)
    model_calls: list[dict[str, Any]] = field(default_factory=list)
    files: list[FileWrite] = field(default_factory=list)
    incidents: list[record.Record] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, report: Report, records: list[record.Record]) -> Timeline:
        t = cls(report, records)
        by_seq: dict[int, record.Record] = {}
        cmds: dict[int, Command] = {}
        writes: dict[int, FileWrite] = {}
        conns: dict[int, tuple[str, int | None]] = {}
        for rec in records:
            by_seq[rec.seq] = rec
            b = rec.body
            if rec.kind == record.OPEN:
                t.facts = _dict(b.get("facts"))
            elif rec.kind == record.DECISION:
                t._decision(rec, cmds, writes, conns)
            elif rec.kind == record.COMPLETE:
                t._complete(rec, cmds, writes, conns)
            elif rec.kind == "tkbox.approval":
                t.approvals.append({**b, "time": rec.time})
            elif rec.kind == "tkbox.secret.use":
                t.secret_uses.append({**b, "time": rec.time})
            elif rec.kind == "tkbox.secret.leak":
                t.secret_leaks.append({**b, "time": rec.time})
            elif rec.kind == "tkbox.model.call":
                t.model_calls.append({**b, "time": rec.time})
            elif rec.kind == "tkbox.egress.refused":
                host, port = _str(b.get("host")) or "(no host)", _int(b.get("port"))
                c = t._conn(host, port)
                c.refused += 1
                c.reasons[_str(b.get("reason"))] += 1
            elif rec.kind == "tkbox.command.refused":
                t.commands.append(Command(rec.seq, rec.time, _str(b.get("argv0")), False,
                                          _str(b.get("reason"))))
            elif rec.kind == "tkbox.apply":
                for f in _list(b.get("held_back")):
                    fd = _dict(f)
                    t.files.append(FileWrite(rec.seq, _str(fd.get("path")), "held back",
                                             _str(fd.get("reason"))))
            elif rec.kind in ("tkbox.gap", "tkbox.containment", "tkbox.hold", "tkbox.release",
                              "tkbox.quarantine", "tkbox.unsafe", "tkbox.budget"):
                t.incidents.append(rec)
        return t

    def _conn(self, host: str, port: int | None) -> Connection:
        key = (host, port)
        if key not in self.connections:
            self.connections[key] = Connection(host, port)
        return self.connections[key]

    def _decision(self, rec: record.Record, cmds: dict[int, Command],
                  writes: dict[int, FileWrite], conns: dict[int, tuple[str, int | None]]) -> None:
        b = rec.body
        action = _str(b.get("action"))
        allowed = b.get("allowed") is True
        res, ctx = _dict(b.get("resource")), _dict(b.get("context"))
        reason = _str(b.get("reason"))
        if action == "Bash":
            cmd = Command(rec.seq, rec.time, _str(res.get("command")), allowed, reason,
                          cwd=_str(ctx.get("cwd")))
            cmds[rec.seq] = cmd
            self.commands.append(cmd)
        elif action == "Write":
            w = FileWrite(rec.seq, _str(res.get("path")), "allowed" if allowed else "refused",
                          "" if allowed else reason, _str(res.get("mode")),
                          _str(res.get("sha256")))
            writes[rec.seq] = w
            self.files.append(w)
        elif action == "Connect":
            host, port = _str(res.get("host")), _int(res.get("port"))
            c = self._conn(host, port)
            if allowed:
                c.allowed += 1
                conns[rec.seq] = (host, port)
            else:
                c.refused += 1
                c.reasons[reason] += 1

    def _complete(self, rec: record.Record, cmds: dict[int, Command],
                  writes: dict[int, FileWrite], conns: dict[int, tuple[str, int | None]]) -> None:
        d = _int(rec.body.get("decision"))
        out = _dict(rec.body.get("outcome"))
        if d in cmds:
            c = cmds[d]
            c.completed = True
            c.status, c.signal = _int(out.get("status")), _int(out.get("signal"))
            c.error = _str(out.get("error"))
            c.duration_ms = _int(out.get("duration_ms"))
            c.stdout_bytes, c.stderr_bytes = (_int(out.get("stdout_bytes")),
                                              _int(out.get("stderr_bytes")))
        elif d in writes:
            w = writes[d]
            ok = out.get("written") is not False and not out.get("error")
            w.status = "written" if ok else "not written"
            if not ok:
                w.reason = _str(out.get("error")) or "not written"
        elif d in conns:
            conn = self.connections[conns[d]]
            conn.bytes_up += _int(out.get("bytes_up")) or 0
            conn.bytes_down += _int(out.get("bytes_down")) or 0

    @property
    def tokens(self) -> tuple[int, int]:
        """Input and output tokens over every model call that reported them."""
        i = o = 0
        for m in self.model_calls:
            u = _dict(m.get("usage"))
            i += _int(u.get("input_tokens", m.get("input_tokens"))) or 0
            o += _int(u.get("output_tokens", m.get("output_tokens"))) or 0
        return i, o


@dataclass(frozen=True)
class Outcome:
    """A verified timeline, or the first fault that stopped verification."""

    timeline: Timeline | None
    error: FormatError | None


def build_report(bundle_bytes: bytes, trust_bytes: bytes) -> Outcome:
    """Verify, then fold the records. Never raises for a bad bundle: it says FAILED."""
    try:
        rep = verify_bundle(bundle_bytes, trust_bytes)
        parsed = bundle.parse(bundle_bytes)
        recs = []
        for j, e in enumerate(parsed.entries):
            assert e.extra is not None
            recs.append(record.parse(e.extra, f"record {j}"))
    except FormatError as exc:
        return Outcome(None, exc)
    return Outcome(Timeline.build(rep, recs), None)


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []
