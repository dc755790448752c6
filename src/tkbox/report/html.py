"""The report page: one HTML document, no script, nothing loaded from anywhere.

Every value from the bundle goes through `_text` (bounded, control characters
shown as escapes, then HTML-escaped): a hostile command line, path or reason
can neither run in the page nor make it unbounded.
"""

from __future__ import annotations

import html
import json
from typing import Any

from tkbox.formats import FormatError
from tkbox.report.timeline import Outcome, Timeline, _dict, _int, _str

#: longest text shown for one value; the rest is cut with a note
MAX_TEXT = 400
#: rows shown per section; the rest is counted
MAX_ROWS = 2000

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
 margin:0;color:#1b1f24;background:#f6f7f9}
main{max-width:1100px;margin:0 auto;padding:24px}
.banner{padding:18px 24px;color:#fff;font-size:22px;font-weight:700;letter-spacing:.02em}
.ok{background:#1a7f37}.bad{background:#b42318}
.banner small{display:block;font-size:14px;font-weight:400;opacity:.95}
h2{font-size:17px;margin:28px 0 8px}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #d8dee4}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #eaeef2;vertical-align:top}
th{background:#f0f3f6;font-weight:600}
td.c,code{font-family:"DejaVu Sans Mono",ui-monospace,monospace;font-size:12.5px;
 word-break:break-all}
.pill{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;font-weight:600}
.allowed,.written,.exit0,.use{background:#dafbe1;color:#116329}
.refused,.leak,.fail,.notwritten{background:#ffebe9;color:#a40e26}
.held,.wait{background:#fff8c5;color:#7d4e00}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(160px,1fr));gap:10px}
.card{background:#fff;border:1px solid #d8dee4;padding:10px 12px}
.card b{display:block;font-size:20px}
.muted{color:#57606a}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0}
dt{color:#57606a}dd{margin:0}
"""


def _text(v: Any, limit: int = MAX_TEXT) -> str:
    """A value as page text: bounded, control characters visible, HTML-escaped."""
    s = v if isinstance(v, str) else json.dumps(v, sort_keys=True, ensure_ascii=False)
    cut = len(s) > limit
    s = s[:limit]
    s = "".join(c if c.isprintable() or c == " " else f"\\x{ord(c):02x}" if ord(c) < 256
                else f"\\u{ord(c):04x}" for c in s)
    return html.escape(s) + (f' <span class="muted">… ({len(v) if isinstance(v, str) else "more"}'
                             ' characters)</span>' if cut else "")


def _pill(label: str, cls: str) -> str:
    return f'<span class="pill {cls}">{html.escape(label)}</span>'


def _table(headers: list[str], rows: list[list[str]], empty: str) -> str:
    if not rows:
        return f'<p class="muted">{html.escape(empty)}</p>'
    more = ""
    if len(rows) > MAX_ROWS:
        more = f'<p class="muted">{len(rows) - MAX_ROWS} more rows not shown.</p>'
        rows = rows[:MAX_ROWS]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _page(title: str, banner: str, content: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
        f"{banner}<main>{content}</main></body></html>\n"
    )


def render_html(outcome: Outcome, source: str = "") -> str:
    """The whole page for a verified timeline, or for the fault that stopped it."""
    if outcome.timeline is None:
        assert outcome.error is not None
        return _failed(outcome.error, source)
    return _verified(outcome.timeline, source)


def _failed(exc: FormatError, source: str) -> str:
    banner = ('<div class="banner bad" id="verdict">Integrity: FAILED.'
              f"<small>{_text(source)}</small></div>")
    content = (
        "<h2>What failed</h2><dl>"
        f"<dt>check</dt><dd><code>{_text(exc.code)}</code></dd>"
        f"<dt>where</dt><dd>{_text(exc.where or '(the whole bundle)')}</dd>"
        f"<dt>what</dt><dd id=\"fault\">{_text(exc.what)}</dd></dl>"
        "<p>Nothing in this bundle can be relied on, so none of its records is shown. "
        "Check that the trust file is the one for this bundle's signer, and where the "
        "bundle came from.</p>")
    return _page("tkbox report: FAILED", banner, content)


def _verified(t: Timeline, source: str) -> str:
    r = t.report
    banner = ('<div class="banner ok" id="verdict">Integrity: VERIFIED.'
              f"<small>run {_text(r.run)} · {r.records} records · assurance {_text(r.assurance)}"
              f" · {_text(source)}</small></div>")
    if r.workload is not None:  # who recorded it, as the remote signer checked it
        banner += (f'<div class="banner ok" id="workload">Workload: {_text(r.workload_line)}'
                   f"<small>isolation {_text(r.isolation)}</small></div>")
    parts = [_summary(t), _commands(t), _connections(t), _approvals(t), _secrets(t),
             _models(t), _files(t), _incidents(t), _all_records(t)]
    return _page(f"tkbox report: {r.run}", banner, "".join(parts))


def _summary(t: Timeline) -> str:
    r = t.report
    failed = sum(1 for c in t.commands if not c.allowed or (c.status not in (0, None))
                 or (c.allowed and not c.completed))
    refused_conn = sum(c.refused for c in t.connections.values())
    allowed_conn = sum(c.allowed for c in t.connections.values())
    tin, tout = t.tokens
    written = sum(1 for f in t.files if f.status == "written")
    held = sum(1 for f in t.files if f.status == "held back")
    cards = [
        ("commands", len(t.commands), f"{failed} refused or failed"),
        ("connections", allowed_conn, f"{refused_conn} refused"),
        ("approvals", len(t.approvals), ""),
        ("secret uses", len(t.secret_uses), f"{len(t.secret_leaks)} leaks blocked"),
        ("model calls", len(t.model_calls), f"{tin} in / {tout} out tokens"),
        ("files written", written, f"{held} held back"),
    ]
    grid = "".join(f'<div class="card" id="card-{html.escape(k.replace(" ", "-"))}">'
                   f'<span class="muted">{html.escape(k)}</span><b>{v}</b>'
                   f'<span class="muted">{html.escape(s)}</span></div>' for k, v, s in cards)
    image = _str(t.facts.get("image")) or _str(_dict(t.facts.get("image")).get("digest"))
    dl = "".join(f"<dt>{html.escape(k)}</dt><dd>{v}</dd>" for k, v in [
        ("run", _text(r.run)),
        ("time", f"{_text(r.first_time)} to {_text(r.last_time)}"),
        ("isolation", _text(r.isolation)),
        *([("workload", _text(r.workload_line))] if r.workload is not None else []),
        ("assurance", _text(r.assurance) + (f" (cosigned by {_text(', '.join(r.cosigned_by))})"
                                            if r.cosigned_by else " (no witness cosigned)")),
        ("signer", f"<code>{_text(r.log_key)}</code>"),
        ("checkpoint", f"size {r.tree_size}, root <code>{_text(r.root_hash)}</code>"),
        ("image", f"<code>{_text(image)}</code>" if image else '<span class="muted">-</span>'),
        ("refused decisions", str(r.refused)),
    ])
    return f'<div class="grid">{grid}</div><h2>The run</h2><dl>{dl}</dl>'


def _commands(t: Timeline) -> str:
    rows = []
    for c in t.commands:
        if not c.allowed:
            verdict = _pill("refused", "refused")
            result = _text(c.reason)
        elif not c.completed:
            verdict, result = _pill("no exit recorded", "fail"), ""
        else:
            ok = c.status == 0
            label = (f"exit {c.status}" if c.status is not None
                     else f"signal {c.signal}" if c.signal is not None else "no status")
            verdict = _pill(label, "exit0" if ok else "fail")
            result = _text(c.error) if c.error else ""
        dur = f"{c.duration_ms / 1000:.2f} s" if c.duration_ms is not None else ""
        io = (f"{c.stdout_bytes} / {c.stderr_bytes} B" if c.stdout_bytes is not None else "")
        rows.append([_text(c.time[11:23]), f'<code>{_text(c.command)}</code>', verdict, dur,
                     io, result])
    return "<h2 id=\"commands\">Commands</h2>" + _table(
        ["time", "command", "result", "duration", "stdout / stderr", "why"], rows,
        "No command ran in this box.")


def _connections(t: Timeline) -> str:
    rows = []
    for c in sorted(t.connections.values(), key=lambda c: (c.host, c.port or 0)):
        verdict = " ".join(p for p in [
            _pill(f"{c.allowed} allowed", "allowed") if c.allowed else "",
            _pill(f"{c.refused} refused", "refused") if c.refused else ""] if p)
        why = "; ".join(f"{_text(k, 200)}" + (f" ×{n}" if n > 1 else "")
                        for k, n in c.reasons.most_common(5) if k)
        port = "" if c.port is None else f":{c.port}"
        rows.append([f"<code>{_text(c.host + port)}</code>", verdict,
                     f"{c.bytes_up} / {c.bytes_down} B", why])
    return "<h2 id=\"connections\">Connections</h2>" + _table(
        ["host", "verdict", "up / down", "why refused"], rows, "No connection was tried.")


def _approvals(t: Timeline) -> str:
    rows = []
    for a in t.approvals:
        state = _str(a.get("state"))
        cls = {"approved": "allowed", "pending": "wait"}.get(state, "refused")
        waited = _int(a.get("waited_ms"))
        rows.append([_text(_str(a.get("time"))[11:23]),
                     f"<code>{_text(_str(a.get('host')))}:{_int(a.get('port'))}</code>",
                     _pill(state or "?", cls), _text(_str(a.get("by"))),
                     f"{waited / 1000:.1f} s" if waited is not None else ""])
    return "<h2 id=\"approvals\">Approvals</h2>" + _table(
        ["time", "host", "state", "answered by", "waited"], rows,
        "No connection waited for a person.")


def _secrets(t: Timeline) -> str:
    rows = []
    for s in t.secret_uses:
        rows.append([_text(_str(s.get("time"))[11:23]), _pill("used", "use"),
                     _text(_str(s.get("name"))), f"<code>{_text(_str(s.get('host')))}</code>",
                     _text(_str(s.get("header")) or _str(s.get("where")))])
    for s in t.secret_leaks:
        rows.append([_text(_str(s.get("time"))[11:23]), _pill("leak blocked", "leak"),
                     _text(_str(s.get("name"))), f"<code>{_text(_str(s.get('host')))}</code>",
                     _text(_str(s.get("where")) or _str(s.get("reason")))])
    rows.sort(key=lambda r: r[0])
    return "<h2 id=\"secrets\">Secrets</h2>" + _table(
        ["time", "what", "secret", "host", "where"], rows,
        "No secret was used or leaked (records name secrets, never their values).")


def _models(t: Timeline) -> str:
    rows = []
    for m in t.model_calls:
        u = _dict(m.get("usage"))
        tin = _int(u.get("input_tokens", m.get("input_tokens")))
        tout = _int(u.get("output_tokens", m.get("output_tokens")))
        dur = _int(m.get("duration_ms"))
        rows.append([_text(_str(m.get("time"))[11:23]), f"<code>{_text(_str(m.get('host')))}"
                     f"{_text(_str(m.get('path')), 120)}</code>", _text(_str(m.get("model"))),
                     str(_int(m.get("status")) or ""),
                     f"{tin if tin is not None else '-'} / {tout if tout is not None else '-'}",
                     f"{dur / 1000:.2f} s" if dur is not None else ""])
    return "<h2 id=\"models\">Model calls</h2>" + _table(
        ["time", "request", "model", "status", "tokens in / out", "duration"], rows,
        "No model call was made through the door.")


def _files(t: Timeline) -> str:
    rows = []
    for f in t.files:
        cls = {"written": "written", "held back": "held", "allowed": "wait"}.get(f.status,
                                                                                 "refused")
        label = "decided, not written" if f.status == "allowed" else f.status
        rows.append([f"<code>{_text(f.path)}</code>", _pill(label, cls), _text(f.mode),
                     f"<code>{_text(f.sha256[:16])}</code>" if f.sha256 else "", _text(f.reason)])
    return "<h2 id=\"files\">Files</h2>" + _table(
        ["path", "status", "mode", "sha256", "why"], rows, "No file was written to a checkout.")


def _incidents(t: Timeline) -> str:
    rows = [[_text(r.time[11:23]), _text(r.kind), _text(_brief(r.body), 300)]
            for r in t.incidents]
    return "<h2 id=\"incidents\">Holds, gaps and containment</h2>" + _table(
        ["time", "kind", "details"], rows, "Nothing was held, lost or contained.")


def _all_records(t: Timeline) -> str:
    rows = [[str(r.seq), _text(r.time), _text(r.kind), _text(_brief(r.body), 240)]
            for r in t.records]
    return "<h2 id=\"records\">Every record</h2>" + _table(
        ["seq", "time (signer)", "kind", "body"], rows, "")


def _brief(body: dict[str, Any]) -> str:
    """A record body in one line: the action and resource of a decision first."""
    if "action" in body:
        lead = {k: body[k] for k in ("action", "allowed", "resource", "reason") if k in body}
        return json.dumps(lead, sort_keys=False, ensure_ascii=False)
    return json.dumps(body, sort_keys=True, ensure_ascii=False)
