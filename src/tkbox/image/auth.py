"""The registry's anonymous token dance, as pure functions.

A registry that wants a token answers 401 with (Docker's "Token Authentication
Specification", RFC 7235 §4.1 syntax):

    WWW-Authenticate: Bearer realm="https://auth.example/token",service="reg",scope="repository:a/b:pull"

The client then asks `GET realm?service=...&scope=...` with no credentials and
gets `{"token": "..."}` (or `access_token`) back, which it sends as
`Authorization: Bearer <token>` to the registry, and only to it.

tkbox fetches anonymous tokens only. A registry that answers 401 again with
that token, or asks for Basic authentication, holds a private image: refused
with a message saying private registries are not supported yet.

Hand-written because no maintained library parses this header on its own
(httpx and h11 leave `WWW-Authenticate` to the caller).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from tkbox.errors import RegistryError

MAX_HEADER = 8192
MAX_TOKEN_RESPONSE = 64 * 1024
MAX_TOKEN = 16 * 1024

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 7230 token
_TOKEN68 = re.compile(r"[A-Za-z0-9._~+/-]+=*")


@dataclass(frozen=True, slots=True)
class Challenge:
    scheme: str  # lowercased
    params: tuple[tuple[str, str], ...]

    def get(self, key: str) -> str | None:
        return dict(self.params).get(key)


def parse_challenges(header: str) -> list[Challenge]:
    """All challenges in one `WWW-Authenticate` value. Raises `RegistryError`."""
    if len(header) > MAX_HEADER:
        raise RegistryError("the registry's WWW-Authenticate header is too long")
    s = header
    i = 0
    n = len(s)
    out: list[Challenge] = []
    current: tuple[str, list[tuple[str, str]]] | None = None

    def skip_ws(j: int) -> int:
        while j < n and s[j] in " \t":
            j += 1
        return j

    def bad(why: str) -> RegistryError:
        return RegistryError(f"the registry's WWW-Authenticate header is malformed: {why}")

    while True:
        i = skip_ws(i)
        while i < n and s[i] == ",":
            i = skip_ws(i + 1)
        if i >= n:
            break
        m = _TOKEN.match(s, i)
        if not m:
            raise bad(f"unexpected {s[i]!r}")
        word = m.group(0)
        j = skip_ws(m.end())
        if current is not None and _starts_param(s, i):
            # auth-param: key = token / quoted-string
            j = skip_ws(j + 1)
            if j < n and s[j] == '"':
                j += 1
                buf: list[str] = []
                while True:
                    if j >= n:
                        raise bad("unterminated quoted string")
                    c = s[j]
                    if c == "\\":
                        if j + 1 >= n:
                            raise bad("unterminated escape")
                        buf.append(s[j + 1])
                        j += 2
                    elif c == '"':
                        j += 1
                        break
                    else:
                        buf.append(c)
                        j += 1
                value = "".join(buf)
            else:
                vm = _TOKEN.match(s, j)
                if not vm:
                    raise bad(f"no value for {word!r}")
                value = vm.group(0)
                j = vm.end()
            key = word.lower()
            if any(k == key for k, _ in current[1]):
                raise bad(f"parameter {key!r} given twice")
            current[1].append((key, value))
            i = skip_ws(j)
            if i < n and s[i] != ",":
                raise bad("parameters must be separated by commas")
        else:
            # a new challenge: scheme [token68 | params]
            if current is not None:
                out.append(Challenge(current[0], tuple(current[1])))
            current = (word.lower(), [])
            i = j
            if not _starts_param(s, i):
                t = _TOKEN68.match(s, i)
                if t and (skip_ws(t.end()) >= n or s[skip_ws(t.end())] == ","):
                    current[1].append(("token68", t.group(0)))  # e.g. "Negotiate abc=="
                    i = t.end()
    if current is not None:
        out.append(Challenge(current[0], tuple(current[1])))
    return out


def _starts_param(s: str, i: int) -> bool:
    """Whether `s[i:]` begins `token BWS "=" BWS` with a value (not a token68's padding)."""
    m = _TOKEN.match(s, i)
    if not m:
        return False
    j = m.end()
    while j < len(s) and s[j] in " \t":
        j += 1
    return j < len(s) and s[j] == "=" and not s.startswith("==", j) and j + 1 < len(s)


@dataclass(frozen=True, slots=True)
class TokenRequest:
    url: str  # realm with the query added


def token_request(challenge: Challenge, repository: str) -> TokenRequest:
    """The anonymous token request for a Bearer challenge. Realm must be https."""
    realm = challenge.get("realm")
    if not realm:
        raise RegistryError("the registry's Bearer challenge names no realm")
    try:
        parts = urlsplit(realm)
    except ValueError:  # "Invalid IPv6 URL"
        raise RegistryError(f"the registry's token service {realm[:100]!r} is not a URL; "
                            "refused") from None
    if parts.scheme != "https" or not parts.hostname:
        raise RegistryError(
            f"the registry's token service {realm[:100]!r} is not an https URL; refused"
        )
    if parts.fragment:
        raise RegistryError("the registry's token realm has a fragment")
    query: list[tuple[str, str]] = []
    service = challenge.get("service")
    if service:
        query.append(("service", service))
    scope = challenge.get("scope") or f"repository:{repository}:pull"
    query.append(("scope", scope))
    sep = "&" if parts.query else "?"
    return TokenRequest(realm + sep + urlencode(query))


def parse_token_response(body: bytes) -> str:
    """The token from the token service's JSON answer; bounded and header-safe."""
    if len(body) > MAX_TOKEN_RESPONSE:
        raise RegistryError("the token service's answer is too large")
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise RegistryError("the token service's answer is not JSON") from None
    if not isinstance(obj, dict):
        raise RegistryError("the token service's answer is not a JSON object")
    token = obj.get("token") or obj.get("access_token")
    if not isinstance(token, str) or not token:
        raise RegistryError("the token service's answer holds no token")
    if len(token) > MAX_TOKEN or not all(0x21 <= ord(c) <= 0x7E for c in token):
        # A CR/LF or space would let the answer write its own HTTP headers.
        raise RegistryError("the token service's token has characters a header cannot carry")
    return token
