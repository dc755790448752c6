"""Method and path rules for one host: parse, normalise, bound, then decide. Pure.

An allowlist entry may carry rules after its host, separated by a space (a
host never holds one, so an entry with rules cannot be read as `host:port`):

    api.github.com GET HEAD /**; POST /repos/acme/app/pulls; ask DELETE /repos/acme/*/git/refs/**
    github.com:8443 GET /*/*/info/refs?service=git-upload-pack; POST /*/*/git-upload-pack

Grammar (`parse_rules`), rules separated by `;`:

    rule    = [action] methods pattern
    action  = "allow" | "ask" | "refuse"          (lower case; default allow)
    methods = "*" | METHOD *(" " METHOD)          (upper case tokens, RFC 9110 §9.1)
    pattern = "/" segment *("/" segment) ["?" key "=" value *("&" key "=" value)]
    segment = literal | "*" (exactly one non-empty segment) | "**" (any number, alone)

Order does not matter: a request that a `refuse` rule matches is refused, else
one an `ask` rule matches waits for a person, else one an `allow` rule matches
passes; a request no rule matches is refused. A pattern with a query matches only a
request whose query holds exactly those keys, each once, with those values;
one without a query matches any query.

**How a request is read** (`Target`, `RequestFacts`). The rules are matched on
what the origin will act on, and where origins differ, on every reading one
could take: a request is allowed only if every reading is, asks if any asks,
and is refused if any is refused (the refusal names the reading). Readings:

- percent-decoding: an escape of an unreserved character is that character
  (RFC 3986 §6.2.2.2, every origin agrees); `%2F` and `%5C` are read both as
  data and as a separator; an escaped `%` that forms another escape (`%252F`:
  decoded twice by some origins), an escape of a control character, a
  malformed escape, or bytes that are not UTF-8 once decoded are refused;
- `\\` (raw) read both as data and as a separator (Windows servers);
- dot segments (`.`, `..`, literal or escaped) are refused: clients remove
  them before sending (RFC 3986 §5.2.4), and origins differ on resolving them;
- empty segments (`//`, a trailing `/`) read both as written and merged, and
  a target beginning `//name/…` also as a URL whose authority is `name`;
- `;params` read both as part of the segment and stripped (Tomcat, Jetty);
- case: read both as written and case-folded (case-insensitive origins;
  a code host's owner and repository names are);
- the query split on `&`, and on `&` and `;`;
- the method: upper case only (a method in lower case is refused: origins
  differ on whether `get` is `GET`); `X-HTTP-Method-Override`,
  `X-HTTP-Method`, `X-Method-Override` and a `_method` query parameter add
  the method they name; a `POST` with a form body (Rails, Laravel, Symfony
  read `_method` there) adds `PUT`, `PATCH` and `DELETE`.

A request target must be origin-form (`/…`; absolute-form and `*` are
refused) of at most `MAX_TARGET` bytes and `MAX_SEGMENTS` segments, printable
ASCII without `#`. Nothing here does I/O; `RuleSet.decide` is a pure function.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tkbox.errors import UserError

Action = Literal["allow", "ask", "refuse"]
ACTIONS: tuple[Action, ...] = ("allow", "ask", "refuse")
#: refuse > ask > allow: the most restrictive reading wins
_RANK = {"allow": 0, "ask": 1, "refuse": 2}
MAX_TARGET = 8192
MAX_SEGMENTS = 128
MAX_RULES = 256
MAX_RULE_TEXT = 1024
#: characters of a path a reason or record shows
SHOWN_PATH = 200
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_METHOD = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Z]{1,32}")
_HEX = b"0123456789abcdefABCDEF"
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
#: headers that name another method for frameworks that honour them
OVERRIDE_HEADERS = frozenset({b"x-http-method-override", b"x-http-method", b"x-method-override"})
OVERRIDE_PARAMS = frozenset({"_method"})
#: what Rails, Laravel and Symfony read from a form's `_method` on a POST
FORM_METHODS = ("PUT", "PATCH", "DELETE")
FORM_TYPES = (b"application/x-www-form-urlencoded", b"multipart/form-data")
#: the only headers the rules read
_READ_HEADERS = OVERRIDE_HEADERS | {b"content-type"}


class RuleError(UserError):
    """Rules an operator wrote that do not parse (one line, what to fix)."""


class Ambiguous(Exception):  # noqa: N818 - a refusal reason, not a bug
    """A request target the door cannot read the way every origin would."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


# --- rules --------------------------------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    """A path pattern: segments (`*`, `**`, literals) and an optional exact query."""

    segments: tuple[str, ...]
    query: tuple[tuple[str, str], ...] | None

    @property
    def text(self) -> str:
        path = "/" + "/".join(self.segments)
        if self.query is None:
            return path
        return path + "?" + "&".join(f"{k}={v}" for k, v in self.query)

    def matches(self, segments: Sequence[str], query: Query | None, fold: bool) -> bool:
        if self.query is not None:
            if query is None or not query.has_exactly(self.query, fold):
                return False
        pat = [s.lower() for s in self.segments] if fold else list(self.segments)
        segs = [s.lower() for s in segments] if fold else list(segments)
        return _glob(pat, segs)


def _glob(pat: list[str], segs: list[str]) -> bool:
    """Segment glob: `*` one non-empty segment, `**` zero or more. Linear in
    len(pat) x len(segs) (dynamic programming, no backtracking blow-up)."""
    n, m = len(pat), len(segs)
    ok = [[False] * (m + 1) for _ in range(n + 1)]
    ok[n][m] = True
    for i in range(n - 1, -1, -1):
        p = pat[i]
        for j in range(m, -1, -1):
            if p == "**":
                ok[i][j] = ok[i + 1][j] or (j < m and ok[i][j + 1])
            elif j < m and (segs[j] == p or (p == "*" and segs[j] != "")):
                ok[i][j] = ok[i + 1][j + 1]
    return ok[0][0]


@dataclass(frozen=True)
class Rule:
    action: Action
    methods: frozenset[str] | None  # None: any method
    pattern: Pattern

    @property
    def text(self) -> str:
        methods = "*" if self.methods is None else " ".join(sorted(self.methods))
        head = "" if self.action == "allow" else self.action + " "
        return f"{head}{methods} {self.pattern.text}"

    def matches(self, method: str, segments: Sequence[str], query: Query | None,
                fold: bool) -> bool:
        return ((self.methods is None or method in self.methods)
                and self.pattern.matches(segments, query, fold))


def _parse_pattern(text: str, where: str) -> Pattern:
    if not text.startswith("/"):
        raise RuleError(f"{where}: the path pattern {text[:60]!r} must begin with /")
    path, q, query = text.partition("?")
    segments = tuple(path[1:].split("/"))
    for s in segments:
        if "**" in s and s != "**":
            raise RuleError(f"{where}: ** stands alone in a segment (/a/**/b), not in {s!r}")
        if "*" in s and s not in ("*", "**"):
            raise RuleError(f"{where}: * stands alone in a segment (/a/*/b), not in {s!r}")
        if s in (".", ".."):
            raise RuleError(f"{where}: a pattern has no dot segments (requests with them "
                            "are refused)")
        if any(not (0x21 <= ord(c) <= 0x7E) or c in "#?%\\;" for c in s):
            raise RuleError(f"{where}: segment {s[:40]!r} may hold only printable ASCII, "
                            "without # ? % \\ ; (write the decoded character)")
    if len(segments) > MAX_SEGMENTS:
        raise RuleError(f"{where}: more than {MAX_SEGMENTS} segments")
    items: tuple[tuple[str, str], ...] | None = None
    if q:
        pairs = []
        for part in query.split("&"):
            k, eq, v = part.partition("=")
            if not eq or not k or any(c in "&;=#%+ " or not (0x21 <= ord(c) <= 0x7E)
                                      for c in k + v):
                raise RuleError(f"{where}: the query {query[:60]!r} must be key=value pairs "
                                "joined by & (printable, without ; % + #)")
            pairs.append((k, v))
        if len({k for k, _ in pairs}) != len(pairs):
            raise RuleError(f"{where}: the query {query[:60]!r} names a key twice")
        items = tuple(sorted(pairs))
    return Pattern(segments, items)


def parse_rule(text: str) -> Rule:
    """One rule (see the module docstring). Raises RuleError."""
    where = f"rule {text.strip()[:80]!r}"
    if len(text) > MAX_RULE_TEXT:
        raise RuleError(f"a rule longer than {MAX_RULE_TEXT} characters")
    words = text.split()
    if not words:
        raise RuleError("an empty rule (two ; in a row, or one at the end?)")
    action: Action = "allow"
    if words[0] in ACTIONS:
        action = words[0]
        words = words[1:]
    elif words[0].lower() in ACTIONS:
        raise RuleError(f"{where}: write the action in lower case ({words[0].lower()})")
    if len(words) < 2:
        raise RuleError(f"{where}: a rule is [allow|ask|refuse] METHOD... /path")
    *methods, pattern = words
    if methods == ["*"]:
        mset: frozenset[str] | None = None
    else:
        for m in methods:
            if not _METHOD.fullmatch(m):
                raise RuleError(f"{where}: {m[:40]!r} is not a method; methods are upper "
                                "case (GET, POST, ...) or * for any")
        mset = frozenset(methods)
    return Rule(action, mset, _parse_pattern(pattern, where))


def parse_rules(text: str) -> tuple[Rule, ...]:
    """`RULE; RULE; ...`. Raises RuleError."""
    rules = tuple(parse_rule(part) for part in text.split(";"))
    if len(rules) > MAX_RULES:
        raise RuleError(f"more than {MAX_RULES} rules for one host")
    return rules


def split_entry(text: str) -> tuple[str, str | None]:
    """An allowlist entry's host part and its rules' text (None: no rules)."""
    stripped = text.strip()
    host, sep, rules = stripped.partition(" ")
    if not sep:
        host, sep, rules = stripped.partition("\t")
    return host, (rules.strip() if sep else None)


# --- requests -----------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """One reading of a query: its items, decoded, in order."""

    items: tuple[tuple[str, str], ...]

    def has_exactly(self, want: tuple[tuple[str, str], ...], fold: bool) -> bool:
        got = [(k, v) for k, v in self.items]
        if len(got) != len(want) or len({k for k, _ in got}) != len(got):
            return False  # a key twice: origins take the first or the last
        if fold:
            return sorted((k.lower(), v.lower()) for k, v in got) == sorted(
                (k.lower(), v.lower()) for k, v in want)
        return sorted(got) == list(want)

    def get_all(self, key: str) -> list[str]:
        return [v for k, v in self.items if k == key]


@dataclass(frozen=True)
class Reading:
    """One way an origin could read the target: its segments and query, and what
    made it differ from the plain reading (for the refusal's text)."""

    segments: tuple[str, ...]
    query: Query | None
    fold: bool
    how: str  # "" for the plain reading

    @property
    def path(self) -> str:
        return "/" + "/".join(self.segments)


def _decode_escape(b: bytes) -> int:
    return int(b, 16)


def _split_path(path: bytes) -> list[list[tuple[str, bytes]]]:
    """Path bytes into segments of tokens: ("c", byte) a literal byte, ("e", byte) an
    escape's decoded byte. Raises Ambiguous."""
    segs: list[list[tuple[str, bytes]]] = [[]]
    i, n = 1, len(path)
    while i < n:
        c = path[i]
        if c == 0x2F:  # "/"
            segs.append([])
            i += 1
            continue
        if c == 0x25:  # "%"
            esc = path[i + 1:i + 3]
            if len(esc) != 2 or esc[0] not in _HEX or esc[1] not in _HEX:
                raise Ambiguous("a malformed percent-escape")
            v = _decode_escape(esc)
            if v < 0x20 or v == 0x7F:
                raise Ambiguous("an escaped control character")
            if v == 0x25 and path[i + 3:i + 4] and path[i + 3] in _HEX \
                    and path[i + 4:i + 5] and path[i + 4] in _HEX:
                raise Ambiguous("an escaped % that forms another escape (decoded twice by "
                                "some origins)")
            segs[-1].append(("e", bytes([v])))
            i += 3
            continue
        segs[-1].append(("c", bytes([c])))
        i += 1
    if len(segs) > MAX_SEGMENTS:
        raise Ambiguous(f"more than {MAX_SEGMENTS} path segments")
    return segs


def _render(tokens: Sequence[tuple[str, bytes]]) -> str:
    """A segment's tokens as text: escapes of unreserved characters decoded, every
    other escape decoded too (data), bytes as UTF-8. Raises Ambiguous."""
    raw = b"".join(b for _, b in tokens)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Ambiguous("escaped bytes that are not UTF-8 (an overlong or broken "
                        "sequence)") from None


def _segment_variants(segs: list[list[tuple[str, bytes]]], decode_slash: bool,
                      backslash: bool, strip_params: bool) -> list[str]:
    out: list[str] = []
    for seg in segs:
        pieces: list[list[tuple[str, bytes]]] = [[]]
        for kind, b in seg:
            sep = (decode_slash and kind == "e" and b in (b"/", b"\\")) or (
                backslash and kind == "c" and b == b"\\")
            if sep:
                pieces.append([])
            else:
                pieces[-1].append((kind, b))
        for piece in pieces:
            if strip_params:
                cut = next((k for k, (kind, b) in enumerate(piece)
                            if kind == "c" and b == b";"), None)
                if cut is not None:
                    piece = piece[:cut]
            out.append(_render(piece))
    return out


def _parse_query(query: bytes, semicolons: bool) -> Query:
    parts = re.split(rb"[&;]" if semicolons else rb"&", query)
    items = []
    for part in parts:
        if not part:
            continue
        k, _, v = part.partition(b"=")
        items.append((_unquote(k), _unquote(v)))
    return Query(tuple(items))


def _unquote(b: bytes) -> str:
    out = bytearray()
    i = 0
    while i < len(b):
        c = b[i]
        if c == 0x25:
            esc = b[i + 1:i + 3]
            if len(esc) != 2 or esc[0] not in _HEX or esc[1] not in _HEX:
                raise Ambiguous("a malformed percent-escape in the query")
            out.append(int(esc, 16))
            i += 3
        else:
            out.append(0x20 if c == 0x2B else c)
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise Ambiguous("a query that is not UTF-8 once decoded") from None


@dataclass(frozen=True)
class Target:
    """Every reading of one request target (`Target.parse`)."""

    raw: bytes
    readings: tuple[Reading, ...]
    query_raw: bytes | None

    @property
    def has_upper(self) -> bool:
        """An upper-case letter anywhere, escapes decoded (`%41` is `A`) and in
        every reading (NFKC can make one)."""
        return any(c.isupper() for r in self.readings for s in r.segments for c in s) or (
            any(c.isupper() for r in self.readings if r.query is not None
                for kv in r.query.items for x in kv for c in x))

    @classmethod
    def parse(cls, target: bytes) -> Target:
        """Raises Ambiguous for a target no reading can be trusted of."""
        if len(target) > MAX_TARGET:
            raise Ambiguous(f"a request target longer than {MAX_TARGET} bytes")
        if not target.startswith(b"/"):
            raise Ambiguous("a request target that is not origin-form (/path)")
        if any(c < 0x21 or c > 0x7E for c in target) or b"#" in target:
            raise Ambiguous("a request target with a fragment, a space, a control or a "
                            "non-ASCII byte")
        path, q, query = target.partition(b"?")
        segs = _split_path(path)
        has = {
            "slash": any(k == "e" and b in (b"/", b"\\") for s in segs for k, b in s),
            "backslash": any(k == "c" and b == b"\\" for s in segs for k, b in s),
            "params": any(k == "c" and b == b";" for s in segs for k, b in s),
        }
        queries: list[tuple[Query | None, str]] = [(None, "")]
        if q:
            queries = [(_parse_query(query, False), "")]
            if b";" in query:
                queries.append((_parse_query(query, True), "the query split on ;"))
        readings: list[Reading] = []
        seen: set[tuple[tuple[str, ...], Query | None, bool]] = set()
        for slash, back, params in itertools.product(
                (False, True) if has["slash"] else (False,),
                (False, True) if has["backslash"] else (False,),
                (False, True) if has["params"] else (False,)):
            segments = _segment_variants(segs, slash, back, params)
            if any(s in (".", "..") for s in segments):
                raise Ambiguous("a dot segment (. or ..; origins differ on resolving it)")
            hows = [h for h, on in (("%2F or %5C read as /", slash), ("\\ read as /", back),
                                    (";params stripped", params)) if on]
            forms = [(tuple(segments), hows)]
            if any(not s.isascii() for s in segments):
                # origins that fold compatibility characters (a fullwidth solidus is a /)
                nfkc = [p for s in segments
                        for p in re.split(r"[/\\]", unicodedata.normalize("NFKC", s))]
                if any(p in (".", "..") for p in nfkc):
                    raise Ambiguous("a dot segment once Unicode compatibility characters "
                                    "are folded (NFKC)")
                forms.append((tuple(nfkc), [*hows, "Unicode NFKC"]))
            if len(segments) > 1 and segments[0] == "":
                # `//name/path`: a router that parses its path as a URL reference reads
                # `name` as an authority (RFC 3986 §4.2) and routes `/path`
                forms.append((tuple(segments[2:]) or ("",),
                              [*hows, "read as //authority/path"]))
            for form, how in list(forms):
                if "" in form:
                    forms.append((tuple(s for s in form if s != ""),
                                  [*how, "empty segments merged"]))
            for (segments_t, how), (qr, qhow), fold in itertools.product(
                    forms, queries, (False, True)):
                key = (segments_t, qr, fold)
                if key in seen:
                    continue
                seen.add(key)
                words = [*how, *([qhow] if qhow else []), *(["case-folded"] if fold else [])]
                readings.append(Reading(segments_t, qr, fold, ", ".join(words)))
        return cls(target, tuple(readings), query if q else None)


@dataclass(frozen=True)
class RequestFacts:
    """What the rules read of one request: the method as sent, the methods an origin
    could act on (overrides), and the target's readings."""

    method: str
    methods: tuple[str, ...]
    target: Target

    @classmethod
    def parse(cls, method: bytes, target: bytes,
              headers: Iterable[tuple[bytes, bytes]]) -> RequestFacts:
        """Raises Ambiguous."""
        m = method.decode("ascii", "replace")
        if not _TOKEN.fullmatch(m) or len(m) > 32:
            raise Ambiguous("a method that is not a token")
        if m != m.upper():
            raise Ambiguous(f"the method {m[:32]!r} is not in upper case (methods are "
                            "case-sensitive, and origins differ on reading it)")
        t = Target.parse(target)
        methods = [m]
        form = False
        for name, value in headers:
            low = name.lower()
            if low in OVERRIDE_HEADERS:
                v = value.strip().decode("ascii", "replace")
                if not _TOKEN.fullmatch(v) or len(v) > 32:
                    raise Ambiguous(f"a {name.decode('ascii', 'replace')[:40]} header that "
                                    "is not a method")
                methods.append(v.upper())
            elif low == b"content-type" and m == "POST":
                form = form or value.strip().lower().startswith(FORM_TYPES)
        for r in t.readings:
            if r.query is not None:
                for k in OVERRIDE_PARAMS:
                    for v in r.query.get_all(k):
                        if not _TOKEN.fullmatch(v) or len(v) > 32:
                            raise Ambiguous("a _method parameter that is not a method")
                        methods.append(v.upper())
        if form:
            methods.extend(FORM_METHODS)
        return cls(m, tuple(dict.fromkeys(methods)), t)


# --- deciding -----------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    action: Action
    rule: str | None  # the deciding rule's text (None: no rule matched, or ambiguous)
    reason: str


def show(target: bytes, limit: int = SHOWN_PATH) -> str:
    text = target.decode("ascii", "replace")
    return text if len(text) <= limit else text[:limit] + "..."


#: verdicts a `RuleSet` keeps, by request (an agent repeats its requests)
CACHE_ENTRIES = 512


@dataclass(frozen=True)
class RuleSet:
    """The rules of one host (and port): `decide` one request. `decide_raw` keeps the
    last `CACHE_ENTRIES` verdicts by (method, target, the headers the rules read):
    a pure function of those, so a repeat costs a lookup."""

    host: str
    rules: tuple[Rule, ...]
    _cache: dict[tuple[bytes, bytes, tuple[tuple[bytes, bytes], ...]], Verdict] = field(
        default_factory=dict, compare=False, repr=False)

    @property
    def text(self) -> str:
        return "; ".join(r.text for r in self.rules)

    @property
    def _upper(self) -> bool:
        return any(c.isupper() for r in self.rules for c in r.pattern.text)

    def decide_raw(self, method: bytes, target: bytes,
                   headers: Iterable[tuple[bytes, bytes]]) -> Verdict:
        """`decide` from the request's bytes: an ambiguous request is refused."""
        read = tuple((n, v) for n, v in headers if n.lower() in _READ_HEADERS)
        key = (method, target, read)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        try:
            facts = RequestFacts.parse(method, target, read)
        except Ambiguous as a:
            v = Verdict("refuse", None,
                        f"refused: {method[:32].decode('ascii', 'replace')} "
                        f"{show(target)} on {self.host} is ambiguous ({a.why}); the "
                        "rules cannot tell what the origin would do with it")
        else:
            v = self.decide(facts)
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = v
        return v

    def _first(self, method: str, r: Reading) -> Rule | None:
        """The most restrictive rule matching this reading (refuse, ask, allow)."""
        best: Rule | None = None
        for rule in self.rules:
            if (best is None or _RANK[rule.action] > _RANK[best.action]) and rule.matches(
                    method, r.segments, r.query, r.fold):
                best = rule
                if rule.action == "refuse":
                    break
        return best

    def decide(self, facts: RequestFacts) -> Verdict:
        worst: tuple[int, Rule | None, str, Reading] | None = None
        plain: Rule | None = None
        # a case-folded reading differs from its plain one only if a letter is upper
        # case somewhere, in the target or in a pattern
        fold = facts.target.has_upper or self._upper
        readings = [r for r in facts.target.readings if fold or not r.fold]
        for method in facts.methods:
            for r in readings:
                rule = self._first(method, r)
                action = rule.action if rule is not None else "refuse"
                if method == facts.method and not r.how and plain is None:
                    plain = rule
                rank = _RANK[action]
                if worst is None or rank > worst[0]:
                    worst = (rank, rule, method, r)
                if rank == 2:
                    break
            if worst is not None and worst[0] == 2:
                break
        assert worst is not None
        rank, rule, method, r = worst
        shown = f"{facts.method} {show(facts.target.raw)}"
        also = []
        if method != facts.method:
            also.append(f"as {method}, the method it also names")
        if r.how:
            also.append(f"read as {show(r.path.encode('utf-8', 'replace'))} ({r.how})")
        side = f" ({'; '.join(also)})" if also else ""
        if rank == 0:
            chosen = plain if plain is not None else rule
            text = chosen.text if chosen is not None else None
            return Verdict("allow", text, f"allowed by the rule '{text}' of {self.host}")
        if rank == 1:
            assert rule is not None
            return Verdict("ask", rule.text,
                           f"{shown} on {self.host} waits for a person{side}: rule "
                           f"'{rule.text}'")
        if rule is not None:
            return Verdict("refuse", rule.text,
                           f"refused: {shown} on {self.host}{side} matches the rule "
                           f"'{rule.text}'")
        listed = self.text
        if len(listed) > 300:
            listed = listed[:300] + "..."
        return Verdict("refuse", None,
                       f"refused: no rule of {self.host} allows {shown}{side}; its rules: "
                       f"{listed}")
