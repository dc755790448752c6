"""The `--secret` flag: parse, read the value, check it. Pure except `read_value`.

Grammar (one flag, repeatable; the same strings in the API's create body)::

    NAME=SOURCE@HOST[:PORT][,HOST[:PORT]...][;header=HEADER[,HEADER...]]
    NAME    an environment name: [A-Za-z_][A-Za-z0-9_]{0,63}
    SOURCE  env:VAR | file:PATH   (PATH may not contain '@' or ';')
    HOST    a DNS name (never an IP address: the box CA excludes every IP range)
    PORT    the port the value is swapped on, canonical decimal; default 443.
            The value goes to a bound host on its bound ports only: a request
            to any other port of the host is read like any other, and the
            placeholder in it is a leak (`rules`). To swap on two ports of
            one host, name it twice (`@api.example,api.example:8443`)
    HEADER  an HTTP header name (token); default Authorization. Several may be
            named (`x-api-key,authorization`): clients differ in where they
            put one credential, and each named header gets the swap

The value:

- read once, when the box is created, and kept only in the daemon's memory;
- a file's one trailing newline (LF or CRLF) is dropped, nothing else;
- 8 to 4096 bytes of visible ASCII (0x21-0x7E): it must fit in an HTTP header,
  and below 8 bytes the leak scanner's encoded forms (case-folded base64 at
  three alignments, hex) match ordinary traffic too often to block on;
- no two values of one box may contain one another, or share 8 bytes or
  more: a swap of one would then reveal part of the other, and a block could
  not say which secret leaked.

Every error is a `UserError` naming the secret and the flag, never a byte of a
value.
"""

from __future__ import annotations

import os
import re
import secrets as _random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tkbox.doors.network.names import HostNameError, parse_host, parse_port, split_authority
from tkbox.errors import UserError

MIN_VALUE = 8
MAX_VALUE = 4096
MAX_SPEC = 2048
MAX_SECRETS = 32
MAX_HOSTS = 32
DEFAULT_PORT = 443  # HTTPS: the only port a value is swapped on unless the spec names one
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
VAR_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
# Headers that carry framing or routing: a value swapped into them would change
# what the request means to the origin, not just who it is from.
FORBIDDEN_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "upgrade", "te",
    "trailer", "keep-alive", "proxy-connection", "expect",
})
_HINT = "use NAME=env:VAR@host[:port][,host...][;header=H] or NAME=file:PATH@host"


@dataclass(frozen=True)
class SecretSpec:
    """One parsed `--secret` flag, before its value is read."""

    name: str
    source: str  # "env" or "file"
    ref: str  # the variable name or the path
    hosts: tuple[str, ...]  # the bound names (each once)
    header: str = "authorization"  # lower case; several joined by ","
    # (host, port) pairs the value is swapped on; empty means each host on 443
    ports: tuple[tuple[str, int], ...] = ()

    @property
    def headers(self) -> tuple[str, ...]:
        return tuple(self.header.split(","))

    @property
    def binds(self) -> tuple[tuple[str, int], ...]:
        """Where the value may go: (host, port) pairs."""
        return self.ports or tuple((h, DEFAULT_PORT) for h in self.hosts)

    def bound_to(self, host: str, port: int) -> bool:
        return (host, port) in self.binds

    def describe(self) -> dict[str, object]:
        """What may be stored and recorded: never the value. A host bound on a port
        other than 443 is written `host:port` (a spec without ports reads as before)."""
        return {"name": self.name, "source": f"{self.source}:{self.ref}",
                "hosts": [show_bind(h, p) for h, p in self.binds], "header": self.header}


def show_bind(host: str, port: int) -> str:
    return host if port == DEFAULT_PORT else f"{host}:{port}"


@dataclass(frozen=True)
class Secret:
    """A secret with its value (daemon memory only) and its placeholder."""

    spec: SecretSpec
    value: bytes = field(repr=False)
    placeholder: bytes

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:  # never the value, whatever prints this
        return f"Secret({self.spec.name!r}, hosts={self.spec.hosts!r})"


def parse_spec(text: str) -> SecretSpec:
    """One flag's text to a SecretSpec; UserError naming what to fix."""
    if not isinstance(text, str) or not text:
        raise UserError(f"--secret is empty; {_HINT}")
    if len(text) > MAX_SPEC:
        raise UserError(f"--secret of {len(text)} characters is too long (at most {MAX_SPEC})")
    if not text.isprintable():
        raise UserError(f"--secret holds control characters; {_HINT}")
    name, eq, rest = text.partition("=")
    if not eq:
        raise UserError(f"--secret {_clip(text)!r} has no '='; {_HINT}")
    if not NAME_RE.fullmatch(name):
        raise UserError(f"--secret name {_clip(name)!r} is not an environment name "
                        "(letters, digits and '_', not starting with a digit, at most 64)")
    rest, semi, opts = rest.partition(";")
    source, at, hosts_text = rest.rpartition("@")
    if not at:
        raise UserError(f"--secret {name}: no '@host' naming where the value may go; {_HINT}")
    kind, colon, ref = source.partition(":")
    if not colon or kind not in ("env", "file"):
        raise UserError(f"--secret {name}: source {_clip(source)!r} is not env:VAR or "
                        f"file:PATH; {_HINT}")
    if kind == "env" and not VAR_RE.fullmatch(ref):
        raise UserError(f"--secret {name}: {_clip(ref)!r} is not an environment variable name")
    if kind == "file" and (not ref or "@" in ref):
        raise UserError(f"--secret {name}: file:PATH needs a path without '@'")
    binds = list(dict.fromkeys(_bind(name, h.strip()) for h in hosts_text.split(",")))
    if len(binds) > MAX_HOSTS:
        raise UserError(f"--secret {name}: {len(binds)} hosts (at most {MAX_HOSTS})")
    header = "authorization"
    if semi:
        key, eq2, val = opts.partition("=")
        if key.strip().lower() != "header" or not eq2:
            raise UserError(f"--secret {name}: unknown option {_clip(opts)!r}; the only option "
                            "is ';header=NAME'")
        names: list[str] = []
        for one in val.split(","):
            one = one.strip()
            if not TOKEN_RE.fullmatch(one):
                raise UserError(f"--secret {name}: header {_clip(one)!r} is not an HTTP "
                                "header name")
            one = one.lower()
            if one in FORBIDDEN_HEADERS or one.startswith("proxy-"):
                raise UserError(f"--secret {name}: header {one} carries framing or routing "
                                "and cannot hold a secret; name an authentication header")
            names.append(one)
        if len(names) > 8:
            raise UserError(f"--secret {name}: more than 8 headers")
        header = ",".join(dict.fromkeys(names))
    # only 443 (what every spec meant before ports): no ports, as such a spec always was
    ports = tuple(binds) if any(p != DEFAULT_PORT for _, p in binds) else ()
    return SecretSpec(name, kind, ref, tuple(dict.fromkeys(h for h, _ in binds)), header,
                      ports)


def _bind(name: str, text: str) -> tuple[str, int]:
    """`host` or `host:port` to (host, port); the port defaults to 443."""
    try:
        host_text, port_text = split_authority(text)
        port = DEFAULT_PORT if port_text is None else parse_port(port_text)
    except HostNameError:
        raise UserError(f"--secret {name}: {_clip(text)!r} is not HOST or HOST:PORT (a DNS "
                        "name, and a port from 1 to 65535)") from None
    return _host(name, host_text), port


def _host(name: str, text: str) -> str:
    try:
        parsed = parse_host(text)
        if parsed.literal is not None:
            raise HostNameError("an address")
        host = parsed.name
    except HostNameError:
        raise UserError(f"--secret {name}: host {_clip(text)!r} is not a DNS name; name the "
                        "host the value is for (IP addresses cannot be bound: the box CA "
                        "excludes every address range)") from None
    if "*" in host:
        raise UserError(f"--secret {name}: wildcard hosts cannot be bound; name each host")
    return host


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."


def read_value(spec: SecretSpec, environ: Mapping[str, str] | None = None) -> bytes:
    """The value, from the daemon's own environment or a file. UserError otherwise."""
    if spec.source == "env":
        env = os.environ if environ is None else environ
        if spec.ref not in env:
            raise UserError(f"--secret {spec.name}: variable {spec.ref} is not set where "
                            "tkbox reads it; export it (for 'tkbox run', in the shell that "
                            "runs it)")
        raw = env[spec.ref].encode("utf-8", "surrogateescape")
    else:
        path = Path(spec.ref).expanduser()
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_VALUE + 3)
        except OSError as exc:
            raise UserError(f"--secret {spec.name}: cannot read {spec.ref} "
                            f"({exc.strerror or exc.__class__.__name__}); check the path and "
                            "its permissions") from None
        if raw.endswith(b"\r\n"):
            raw = raw[:-2]
        elif raw.endswith(b"\n"):
            raw = raw[:-1]
    return check_value(spec.name, raw)


def check_value(name: str, raw: bytes) -> bytes:
    """Refuse values that cannot be swapped or detected safely (see the module docstring)."""
    if not raw:
        raise UserError(f"--secret {name}: the value is empty; set it to the credential")
    if len(raw) > MAX_VALUE:
        raise UserError(f"--secret {name}: the value is longer than {MAX_VALUE} bytes")
    if any(b < 0x21 or b > 0x7E for b in raw):
        raise UserError(f"--secret {name}: the value holds spaces, control or non-ASCII "
                        "characters, which cannot go in an HTTP header; check its source")
    if len(raw) < MIN_VALUE:
        raise UserError(f"--secret {name}: the value is shorter than {MIN_VALUE} characters, "
                        "too short to tell from ordinary traffic when scanning for leaks; "
                        "use a real credential")
    return raw


def placeholder(name: str) -> bytes:
    """`tkbox_<NAME>_<random>`: 128 random bits, so it matches nothing by chance."""
    return f"tkbox_{name}_{_random.token_hex(16)}".encode()


def load(specs: Iterable[str], environ: Mapping[str, str] | None = None) -> list[Secret]:
    """Parse every flag, read every value, check them against one another."""
    out: list[Secret] = []
    for text in specs:
        spec = parse_spec(text)
        if any(s.name == spec.name for s in out):
            raise UserError(f"--secret {spec.name} is given twice; give each name once")
        if len(out) >= MAX_SECRETS:
            raise UserError(f"more than {MAX_SECRETS} --secret flags")
        value = read_value(spec, environ)
        check_distinct(spec, value, out)
        out.append(Secret(spec, value, placeholder(spec.name)))
    return out


def check_distinct(spec: SecretSpec, value: bytes, others: Sequence[Secret]) -> None:
    """No two secrets overlap, nor share a header on a host (which one would go?)."""
    for other in others:
        shared = set(spec.binds) & set(other.spec.binds)
        both = set(spec.headers) & set(other.spec.headers)
        if shared and both:
            where = show_bind(*sorted(shared)[0])
            raise UserError(f"--secret {spec.name} and --secret {other.name} are both bound "
                            f"to header {sorted(both)[0]} of {where}; bind one")
        if overlap(value, other.value):
            raise UserError(f"--secret {spec.name} and --secret {other.name} have values "
                            f"that overlap (one holds {MIN_VALUE} or more bytes of the "
                            "other); each secret must be distinct")


def overlap(a: bytes, b: bytes, n: int = MIN_VALUE) -> bool:
    """Whether `a` and `b` share a run of `n` bytes (or one holds the other), any case."""
    a, b = a.lower(), b.lower()
    if a in b or b in a:
        return True
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    return any(short[i:i + n] in long_ for i in range(len(short) - n + 1))
