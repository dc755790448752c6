"""A reference for the request rules, written apart from `httprules`: origin models and
a regular-expression matcher.

Each origin model turns a request (method, target, headers) into what that kind of
server acts on: (methods it may run, the path it routes, the query it reads), each
written the plain way from what such servers are documented to do:

- `strict`: RFC 3986 normalisation only (escapes of unreserved characters decoded);
- `decoding`: every escape decoded (%2F too), `//` merged, dot segments resolved
  (RFC 3986 §5.2.4), a trailing slash ignored (nginx with merge_slashes, many
  frameworks' routers);
- `params`: `;params` stripped from each segment, then decoded except %2F (Tomcat,
  Jetty, Spring);
- `windows`: decoded, `\\` read as `/`, case-insensitive, `//` merged (IIS);
- `double`: decoded twice (a router behind a decoding proxy);
- `compat`: decoded, Unicode compatibility characters folded (NFKC);
- `override`: honours X-HTTP-Method-Override and its siblings, `_method` in the
  query, and `_method` in a POSTed form (Rails, Laravel, Symfony);
- `semicolon`: splits the query on `;` as well as `&` (and so may find `_method`);
- `urlref`: parses its path as a URL reference (`//name/x` has the authority `name`).

`reference_verdict(rules_text, model_view)` matches a model's reading against the
rules' text with regular expressions, most restrictive rule first.
"""

from __future__ import annotations

import posixpath
import re
import unicodedata
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

OVERRIDES = ("x-http-method-override", "x-http-method", "x-method-override")


@dataclass(frozen=True)
class View:
    methods: tuple[str, ...]
    path: str
    query: tuple[tuple[str, str], ...] | None
    nocase: bool = False


def _pct(s: str, keep_slash: bool = False) -> str:
    raw = s.encode("utf-8")
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i:i + 1] == b"%" and re.fullmatch(rb"[0-9a-fA-F]{2}", raw[i + 1:i + 3]):
            v = int(raw[i + 1:i + 3], 16)
            if keep_slash and v in (0x2F, 0x5C):
                out += raw[i:i + 3].upper()
            else:
                out.append(v)
            i += 3
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8", "replace")


def _unreserved_only(path: str) -> str:
    def dec(m: re.Match[str]) -> str:
        c = chr(int(m.group(1), 16))
        return c if re.fullmatch(r"[A-Za-z0-9\-._~]", c) else m.group(0)
    return re.sub(r"%([0-9a-fA-F]{2})", dec, path)


def _resolve(path: str) -> str:
    merged = re.sub(r"/+", "/", path)
    out = posixpath.normpath(merged) if merged else "/"
    if out.startswith("//"):
        out = out[1:]
    return out


def _query(q: str | None, semicolons: bool = False) -> tuple[tuple[str, str], ...] | None:
    if q is None:
        return None
    parts = re.split("[&;]" if semicolons else "&", q)
    out = []
    for p in parts:
        if not p:
            continue
        k, _, v = p.partition("=")
        out.append((urllib.parse.unquote_plus(k), urllib.parse.unquote_plus(v)))
    return tuple(out)


def views(method: str, target: str, headers: Sequence[tuple[str, str]]) -> dict[str, View]:
    path, q, query = target.partition("?")
    qv = query if q else None
    m = (method,)
    out = {
        "strict": View(m, _unreserved_only(path), _query(qv)),
        "decoding": View(m, _resolve(_pct(path)).rstrip("/") or "/", _query(qv)),
        "params": View(m, "/".join(_pct(seg.split(";")[0], keep_slash=True)
                                   for seg in path.split("/")), _query(qv)),
        "windows": View(m, _resolve(_pct(path).replace("\\", "/")), _query(qv), True),
        "double": View(m, _resolve(_pct(_pct(path))), _query(qv)),
        "compat": View(m, _resolve(unicodedata.normalize("NFKC", _pct(path)).replace(
            "\\", "/")), _query(qv)),
        "semicolon": View(m, _unreserved_only(path), _query(qv, semicolons=True)),
        # a router that parses its path as a URL reference: `//name/x` is authority `name`
        "urlref": View(m, urllib.parse.urlsplit(_unreserved_only(path)).path or "/",
                       _query(qv)),
    }
    over = [v.upper() for k, v in headers if k.lower() in OVERRIDES]
    for k, v in _query(qv, semicolons=True) or ():
        if k == "_method":
            over.append(v.upper())
    form = method == "POST" and any(
        k.lower() == "content-type" and v.lower().startswith(
            ("application/x-www-form-urlencoded", "multipart/form-data"))
        for k, v in headers)
    if form:
        over += ["PUT", "PATCH", "DELETE"]
    out["override"] = View((method, *over), _unreserved_only(path), _query(qv))
    return out


def _regex(pattern_path: str) -> str:
    segs = pattern_path[1:].split("/")
    out = ""
    for s in segs:
        if s == "**":
            out += "(?:/[^/]*)*"
        elif s == "*":
            out += "/[^/]+"
        else:
            out += "/" + re.escape(s)
    return out


def _rule_matches(rule: str, method: str, view: View) -> bool:
    words = rule.split()
    if words[0] in ("allow", "ask", "refuse"):
        words = words[1:]
    *methods, pattern = words
    if methods != ["*"] and method not in methods:
        return False
    ppath, q, pquery = pattern.partition("?")
    flags = re.IGNORECASE if view.nocase else 0
    if not re.fullmatch(_regex(ppath), view.path, flags):
        return False
    if q:
        if view.query is None:
            return False
        want = sorted(tuple(p.split("=", 1)) for p in pquery.split("&"))
        got = sorted(view.query)
        if len({k for k, _ in got}) != len(got):
            return False
        if view.nocase:
            return [(a.lower(), b.lower()) for a, b in want] == [
                (a.lower(), b.lower()) for a, b in got]
        return want == got
    return True


def reference_verdict(rules: Sequence[str], view: View) -> str:
    """The most restrictive verdict over the view's methods: refuse, ask or allow."""
    worst = "allow"
    rank = {"allow": 0, "ask": 1, "refuse": 2}
    for method in view.methods:
        actions = [(r.split()[0] if r.split()[0] in rank else "allow") for r in rules
                   if _rule_matches(r, method, view)]
        v = max(actions, key=lambda a: rank[a]) if actions else "refuse"
        if rank[v] > rank[worst]:
            worst = v
    return worst
