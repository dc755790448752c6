"""Where a pull asks: a registry's mirrors first, then the registry (containerd's "hosts").

Three ways to say it, read into one table (`Registries`), the same for every pull of a
host (`tkbox daemon`, `tkbox run`, `tkbox image pull`):

```
--registry-mirror docker.io=https://mirror.internal   repeatable; a registry's mirrors in order
--registry-mirror-only                                never ask a registry that has a mirror
--registry-config /etc/containerd/certs.d             containerd's hosts directory:
                                                      DIR/<host>/hosts.toml, DIR/_default/hosts.toml
--registry-config /etc/docker/daemon.json             Docker's: its `registry-mirrors` (docker.io)
```

A pull of a reference (`Registries.endpoints`):

1. names its registry as the reference does: Docker Hub's short names first
   (`python:3.12-slim` is `docker.io/library/python:3.12-slim`);
2. takes that registry's endpoints from the one place that configures it (the flags; else
   `DIR/<host>/hosts.toml`, with `host:port` written `host_port_` or `host:port`; else
   `DIR/_default/hosts.toml`; else daemon.json, for docker.io only): its mirrors in order,
   then the registry itself (`https://registry-1.docker.io/v2` for docker.io), or what
   hosts.toml's `server` names instead;
3. leaves out, with `--registry-mirror-only`, every endpoint that is not a mirror of a
   registry that has one;
4. asks, for each document or blob, the first endpoint that may answer it: a tag needs
   `pull` and `resolve`, a digest `pull` (containerd's capabilities; `push` is accepted
   and unused). The registry client (`registry.RegistryPull`) falls through to the next
   endpoint when one cannot answer, never when one answered wrongly.

The API root of an endpoint, as containerd computes it: a URL without a path asks
`/v2`; a path gets `/v2` appended unless it ends with it (`https://proxy/docker-hub` asks
`https://proxy/docker-hub/v2/library/python/manifests/3.12-slim`, as Artifactory's and
Nexus's proxies serve); with `override_path = true` (hosts.toml) the path is the API root
as written (a Harbor proxy project: `https://harbor/v2/hub-proxy`). A `v2` segment inside
a path without `override_path` is refused rather than guessed at.

A mirror is not trusted for content: what it sends is checked as a registry's is (the
digest asked for, the `Docker-Content-Digest` it claims, every blob), and the endpoint
that answered a tag is recorded with the digest it answered (`registry.RegistryPull`).

Refused, in one line naming the flag or file: `http://` (tkbox speaks HTTPS only),
`skip_verify = true` (tkbox does not skip TLS checks: name the CA with `ca`), client
certificates, headers and credentials in a URL (no private registries yet), a query or
fragment, `dial_timeout`, an unknown key or capability, a value of the wrong type, a
registry configured in two places, a directory of the hosts directory without a
`hosts.toml` (Docker's `*.crt` layout is not read), and more than the bounds below.

Parsing is pure (text in, tables out; `parse_*`); `load` reads the files named, once,
and checks that each CA file holds certificates. Errors are `UserError`s: the operator
wrote the settings.
"""

from __future__ import annotations

import json
import re
import ssl
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tkbox.errors import UserError
from tkbox.image.reference import (
    DOCKER_HUB,
    DOCKER_HUB_API,
    HUB_ALIASES,
    host_port,
    registry_host,
)

MAX_URL = 2048
MAX_ENDPOINTS = 16  # mirrors of one registry
MAX_CA_FILES = 16  # per endpoint
MAX_PATH = 4096
MAX_HOSTS_FILE = 64 * 1024
MAX_DAEMON_JSON = 1024 * 1024
MAX_HOST_DIRS = 1000
MAX_SETTINGS = 256  # --registry-mirror flags

DEFAULT_DIR = "_default"
_SEGMENT = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@-]+")  # RFC 3986 pchar, without '%'
_CAPABILITIES = ("pull", "resolve", "push")
_OPTIONS = ("capabilities", "ca", "skip_verify", "override_path")
_UNSUPPORTED = {
    "client": "client certificates are not supported (no private registries yet)",
    "header": "headers are not sent (they carry credentials, and private registries are not "
              "supported yet)",
    "dial_timeout": "dial_timeout is not read (tkbox waits 15 s for a connection)",
}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One place to ask a registry's API: `origin` + `root` + `/<repository>/...`."""

    origin: str  # "https://host[:port]"
    root: str  # the API root path: "/v2", "/docker-hub/v2", "/v2/hub-proxy", or ""
    pull: bool = True
    resolve: bool = True
    ca: tuple[str, ...] = ()  # CA files trusted for it, besides the default trust
    where: str = ""  # the flag or file that named it
    mirror: bool = False  # set by `Registries.endpoints`: not the registry's own host

    @property
    def url(self) -> str:
        return self.origin + self.root

    @property
    def netloc(self) -> str:
        return self.origin.split("://", 1)[1]

    def describe(self) -> str:
        return f"{'mirror' if self.mirror else 'registry'} {self.url}"


def default_endpoint(registry: str) -> Endpoint:
    """The registry's own API: `https://<host>/v2` (registry-1.docker.io for docker.io)."""
    host = DOCKER_HUB_API if registry == DOCKER_HUB else registry
    return Endpoint(f"https://{host}", "/v2", where="the registry itself")


def _own_hosts(registry: str) -> tuple[str, ...]:
    return HUB_ALIASES if registry == DOCKER_HUB else (registry,)


def _safe(text: str) -> str:
    """`text` as an error may quote it: bounded, escapes shown, userinfo never."""
    return repr(re.sub(r"//[^/@]*@", "//…@", text)[:120])


# --- URLs -------------------------------------------------------------------------------


def parse_url(text: object, *, override_path: bool = False,
              what: str) -> tuple[str, str]:
    """(origin, API root) of an endpoint's URL, by containerd's rule (module docstring).

    A URL without a scheme is https (as containerd reads one); only https is accepted.
    """
    if not isinstance(text, str) or not text:
        raise UserError(f"{what}: a URL must be a non-empty string")
    if len(text) > MAX_URL:
        raise UserError(f"{what}: the URL is longer than {MAX_URL} characters")
    if not text.isascii() or not text.isprintable() or any(c.isspace() for c in text):
        raise UserError(f"{what}: the URL {_safe(text)} holds spaces or characters a URL "
                        "cannot have")
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "https", text
    scheme = scheme.lower()
    if scheme == "http":
        raise UserError(f"{what}: {_safe(text)} is plain http; tkbox speaks to registries "
                        "and mirrors over HTTPS only")
    if scheme != "https":
        raise UserError(f"{what}: {_safe(text)} is not an https URL")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        raise UserError(f"{what}: the URL {_safe(text)} holds credentials; private "
                        "registries and mirrors are not supported yet, and a URL is no place "
                        "for a password")
    if "?" in rest or "#" in rest:
        raise UserError(f"{what}: the URL {_safe(text)} has a query or fragment; give "
                        "https://HOST[:PORT][/PATH]")
    host = host_port(netloc, f"{what}: the URL {_safe(text)}")
    segments: list[str] = []
    if path:
        segments = path[:-1].split("/") if path.endswith("/") else path.split("/")
        for s in segments:
            if not _SEGMENT.fullmatch(s) or s in (".", ".."):
                raise UserError(f"{what}: the URL {_safe(text)} has a path that is not "
                                "canonical (empty, '.' or '..' segments, or escapes)")
    if override_path:
        root = "/" + "/".join(segments) if segments else ""
    else:
        if "v2" in segments[:-1]:
            raise UserError(
                f"{what}: the URL {_safe(text)} has 'v2' inside its path; for an API root "
                "written in full (a Harbor proxy project) use a hosts.toml entry with "
                "override_path = true")
        if not segments or segments[-1] != "v2":
            segments.append("v2")
        root = "/" + "/".join(segments)
    return f"https://{host}", root


# --- --registry-mirror --------------------------------------------------------------------


def parse_mirror_flag(text: str) -> tuple[str, Endpoint]:
    """`REGISTRY=URL` -> (registry, its mirror). REGISTRY as references name it."""
    what = "--registry-mirror"
    if not isinstance(text, str):
        raise UserError(f"{what} must be REGISTRY=URL")
    registry, eq, url = text.partition("=")
    if not eq or not registry or not url:
        raise UserError(f"{what} {_safe(text)} must be REGISTRY=URL, e.g. "
                        "docker.io=https://mirror.internal")
    registry = registry_host(registry, f"{what} {_safe(text)}")
    origin, root = parse_url(url, what=f"{what} {registry}=…")
    return registry, Endpoint(origin, root, where=f"--registry-mirror {registry}=…")


# --- hosts.toml ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostsConfig:
    """One hosts.toml: its mirrors in order, then its `server` (None: the registry)."""

    hosts: tuple[Endpoint, ...]
    server: Endpoint | None
    #: the top level's options, for the registry itself when there is no `server`
    top: Endpoint
    where: str

    def endpoints(self, registry: str) -> tuple[Endpoint, ...]:
        last = self.server
        if last is None:
            own = default_endpoint(registry)
            last = replace(self.top, origin=own.origin, root=own.root)
        return (*self.hosts, last)


def _capabilities(value: object, what: str) -> tuple[bool, bool]:
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise UserError(f"{what}: capabilities must be a list of strings")
    if not value:
        raise UserError(f"{what}: capabilities = [] (containerd would read it as every "
                        "capability); name them, e.g. [\"pull\", \"resolve\"]")
    caps = {c.lower() for c in value}
    unknown = caps - set(_CAPABILITIES)
    if unknown:
        raise UserError(f"{what}: unknown capability {sorted(unknown)[0][:40]!r} (pull, "
                        "resolve, push)")
    return "pull" in caps, "resolve" in caps


def _ca_paths(value: object, base: Path, what: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or \
            not all(isinstance(p, str) and p for p in items):
        raise UserError(f"{what}: ca must be a path, or a list of paths")
    if len(items) > MAX_CA_FILES:
        raise UserError(f"{what}: more than {MAX_CA_FILES} ca files")
    out = []
    for p in items:
        if len(p) > MAX_PATH or "\0" in p or not p.isprintable():
            raise UserError(f"{what}: the ca path {p[:80]!r} is not a usable path")
        out.append(str(base / p))  # an absolute path stays as it is (containerd's rule)
    return tuple(out)


def _options(table: Mapping[str, Any], base: Path, what: str,
             allowed: tuple[str, ...]) -> tuple[bool, bool, tuple[str, ...], bool]:
    """(pull, resolve, ca files, override_path) of a table; refuses what tkbox does not do."""
    for key in table:
        if key in _UNSUPPORTED:
            raise UserError(f"{what}: {_UNSUPPORTED[key]}; remove {key!r}")
        if key not in allowed:
            raise UserError(f"{what}: unknown key {key[:40]!r} (tkbox reads "
                            f"{', '.join(allowed)})")
    pull = resolve = True
    if "capabilities" in table:
        pull, resolve = _capabilities(table["capabilities"], what)
    ca: tuple[str, ...] = ()
    if "ca" in table:
        ca = _ca_paths(table["ca"], base, what)
    skip = table.get("skip_verify", False)
    if not isinstance(skip, bool):
        raise UserError(f"{what}: skip_verify must be true or false")
    if skip:
        raise UserError(f"{what}: skip_verify = true; tkbox does not skip TLS checks: give "
                        "the mirror's CA certificate with ca = \"FILE\" instead")
    override = table.get("override_path", False)
    if not isinstance(override, bool):
        raise UserError(f"{what}: override_path must be true or false")
    return pull, resolve, ca, override


def parse_hosts_toml(text: str, *, base: Path, where: str) -> HostsConfig:
    """A containerd hosts.toml (`server`, `[host."https://…"]`, and their options).

    `base` is its directory: relative `ca` paths are read from there. Hosts keep the
    order the file gives them.
    """
    if len(text) > MAX_HOSTS_FILE:
        raise UserError(f"{where} is larger than {MAX_HOSTS_FILE} bytes")
    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        raise UserError(f"{where} is not valid TOML: {str(e)[:200]}") from None
    pull, resolve, ca, override = _options(
        {k: v for k, v in doc.items() if k not in ("server", "host")}, base, where, _OPTIONS)
    top = Endpoint("", "", pull, resolve, ca, where)
    server: Endpoint | None = None
    if "server" in doc:
        origin, root = parse_url(doc["server"], override_path=override,
                                 what=f"{where}: server")
        server = replace(top, origin=origin, root=root)
    hosts: list[Endpoint] = []
    table = doc.get("host", {})
    if not isinstance(table, dict):
        raise UserError(f"{where}: host must be tables, [host.\"https://mirror\"]")
    if len(table) > MAX_ENDPOINTS:
        raise UserError(f"{where}: more than {MAX_ENDPOINTS} hosts")
    for url, options in table.items():
        what = f"{where}: [host.{_safe(url)}]"
        if not isinstance(options, dict):
            raise UserError(f"{what} must be a table")
        h_pull, h_resolve, h_ca, h_override = _options(options, base, what, _OPTIONS)
        origin, root = parse_url(url, override_path=h_override, what=what)
        hosts.append(Endpoint(origin, root, h_pull, h_resolve, h_ca, where))
    return HostsConfig(tuple(hosts), server, top, where)


def host_dir_registry(name: str) -> str:
    """The registry host a directory of the hosts directory configures: `host_port_` (how
    containerd writes `host:port` in a file name) or the host as written."""
    if name.endswith("_") and "_" in name[:-1]:
        head, _, port = name[:-1].rpartition("_")
        if port.isascii() and port.isdigit():
            name = f"{head}:{port}"
    return host_port(name, f"the hosts directory's {name[:80]!r}")


# --- daemon.json ----------------------------------------------------------------------------


def parse_daemon_json(data: bytes, *, where: str) -> tuple[Endpoint, ...]:
    """Docker's daemon.json: its `registry-mirrors`, Docker Hub's mirrors (the rest of the
    file configures Docker, and is not read)."""
    if len(data) > MAX_DAEMON_JSON:
        raise UserError(f"{where} is larger than {MAX_DAEMON_JSON} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise UserError(f"{where} is not JSON") from None
    if not isinstance(doc, dict):
        raise UserError(f"{where} is not a JSON object")
    mirrors = doc.get("registry-mirrors", [])
    if not isinstance(mirrors, list):
        raise UserError(f"{where}: registry-mirrors must be a list of URLs")
    if len(mirrors) > MAX_ENDPOINTS:
        raise UserError(f"{where}: more than {MAX_ENDPOINTS} registry-mirrors")
    out = []
    for url in mirrors:
        origin, root = parse_url(url, what=f"{where}: registry-mirrors")
        out.append(Endpoint(origin, root, where=where))
    return tuple(out)


# --- the settings and the table --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    """What the operator gave: the flags as written and the config path made absolute. The
    daemon shows it in `/v1/info`, so the CLI's own pulls load the same table."""

    mirrors: tuple[str, ...] = ()
    mirror_only: bool = False
    config: str | None = None

    @property
    def empty(self) -> bool:
        return not self.mirrors and not self.mirror_only and self.config is None

    def to_json(self) -> dict[str, Any]:
        return {"mirrors": list(self.mirrors), "mirror_only": self.mirror_only,
                "config": self.config}

    @classmethod
    def from_json(cls, obj: object) -> Settings:
        """The daemon's `registries` (absent from an older daemon: no settings)."""
        if obj is None:
            return cls()
        bad = UserError("the daemon's registry settings are malformed; restart the daemon "
                        "with this version of tkbox")
        if not isinstance(obj, dict):
            raise bad
        mirrors, only, config = obj.get("mirrors", []), obj.get("mirror_only", False), \
            obj.get("config")
        if not isinstance(mirrors, list) or len(mirrors) > MAX_SETTINGS or \
                not all(isinstance(m, str) and len(m) <= MAX_URL + 310 for m in mirrors) or \
                not isinstance(only, bool) or \
                not (config is None or (isinstance(config, str) and 0 < len(config) <= MAX_PATH)):
            raise bad
        return cls(tuple(mirrors), only, config)


@dataclass(frozen=True)
class Registries:
    """Every registry's endpoints, as the settings give them (module docstring)."""

    mirrors: Mapping[str, tuple[Endpoint, ...]] = field(default_factory=dict)
    hosts: Mapping[str, HostsConfig] = field(default_factory=dict)  # host or "_default"
    mirror_only: bool = False
    settings: Settings = field(default_factory=Settings)

    @classmethod
    def parse(cls, settings: Settings, hosts: Mapping[str, HostsConfig] | None = None,
              docker_mirrors: Sequence[Endpoint] = ()) -> Registries:
        """The table from the flags and what `load` read (pure)."""
        if len(settings.mirrors) > MAX_SETTINGS:
            raise UserError(f"more than {MAX_SETTINGS} --registry-mirror flags")
        mirrors: dict[str, list[Endpoint]] = {}
        for flag in settings.mirrors:
            registry, endpoint = parse_mirror_flag(flag)
            listed = mirrors.setdefault(registry, [])
            if any(e.url == endpoint.url for e in listed):
                raise UserError(f"--registry-mirror {registry}=…: {endpoint.url} is given twice")
            listed.append(endpoint)
            if len(listed) > MAX_ENDPOINTS:
                raise UserError(f"--registry-mirror: more than {MAX_ENDPOINTS} mirrors of "
                                f"{registry}")
        hosts = dict(hosts or {})
        for registry in mirrors:
            if registry in hosts:
                raise UserError(f"{registry} is configured twice, by --registry-mirror and "
                                f"by {hosts[registry].where}; keep one")
        if docker_mirrors:
            if DOCKER_HUB in mirrors:
                raise UserError(f"docker.io is configured twice, by --registry-mirror and by "
                                f"{docker_mirrors[0].where}; keep one")
            mirrors[DOCKER_HUB] = list(docker_mirrors)
        if settings.mirror_only and not mirrors and not hosts:
            raise UserError("--registry-mirror-only needs a mirror: give --registry-mirror "
                            "REGISTRY=URL or --registry-config")
        return cls({k: tuple(v) for k, v in mirrors.items()}, hosts, settings.mirror_only,
                   settings)

    def endpoints(self, registry: str) -> tuple[Endpoint, ...]:
        """`registry`'s endpoints in the order they are asked, each marked a mirror or not.

        `registry` as a reference names it (`docker.io` for Docker Hub)."""
        registry = registry.lower()
        if registry in self.mirrors:
            found: tuple[Endpoint, ...] = (*self.mirrors[registry], default_endpoint(registry))
        elif registry in self.hosts:
            found = self.hosts[registry].endpoints(registry)
        elif DEFAULT_DIR in self.hosts:
            found = self.hosts[DEFAULT_DIR].endpoints(registry)
        else:
            found = (default_endpoint(registry),)
        own = _own_hosts(registry)
        marked: list[Endpoint] = []
        for e in found:
            if all(m.url != e.url for m in marked):  # a host named twice is asked once
                marked.append(replace(e, mirror=e.netloc not in own))
        if self.mirror_only and any(e.mirror for e in marked):
            marked = [e for e in marked if e.mirror]
        return tuple(marked)

    def describe(self) -> list[str]:
        """One line per configured registry, for the daemon's log."""
        lines = []
        for registry in sorted({*self.mirrors, *self.hosts}):
            if registry == DEFAULT_DIR:
                probe = "registry.invalid"
                route = ", then ".join(
                    e.describe() if e.mirror else "the registry itself"
                    for e in self.endpoints(probe))
                lines.append(f"any other registry: {route}")
            else:
                route = ", then ".join(e.describe() for e in self.endpoints(registry))
                lines.append(f"{registry}: {route}")
        return lines


def candidates(endpoints: Sequence[Endpoint], *, by_digest: bool) -> list[int]:
    """Indexes of the endpoints that may answer: a digest needs `pull`, a tag `pull` and
    `resolve` (containerd's rule)."""
    return [i for i, e in enumerate(endpoints) if e.pull and (by_digest or e.resolve)]


# --- reading the files (the edge) ------------------------------------------------------------


def _read(path: Path, limit: int, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise UserError(f"{what} {path} is larger than {limit} bytes")
    return data


def _check_ca(endpoint: Endpoint) -> None:
    for ca in endpoint.ca:
        try:
            ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise UserError(f"{endpoint.where}: cannot read the CA {ca[:200]!r}: "
                            f"{getattr(e, 'strerror', None) or e}") from None


def load_hosts_dir(directory: Path) -> dict[str, HostsConfig]:
    """Every `<host>/hosts.toml` of a containerd hosts directory (and `_default`)."""
    try:
        entries = sorted(p for p in directory.iterdir() if p.is_dir())
    except OSError as e:
        raise UserError(f"cannot read the hosts directory {directory}: {e.strerror or e}") \
            from None
    if len(entries) > MAX_HOST_DIRS:
        raise UserError(f"{directory} holds more than {MAX_HOST_DIRS} directories")
    out: dict[str, HostsConfig] = {}
    for d in entries:
        name = d.name if d.name == DEFAULT_DIR else host_dir_registry(d.name)
        f = d / "hosts.toml"
        if not f.is_file():
            raise UserError(f"{d} has no hosts.toml; tkbox reads hosts.toml only (name a CA "
                            "with ca = \"FILE\"; Docker's *.crt layout is not read)")
        if name in out:
            raise UserError(f"{name} is configured twice in {directory} ({d.name} and "
                            f"{out[name].where}); keep one")
        text = _read(f, MAX_HOSTS_FILE, "the hosts file")
        try:
            decoded = text.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{f} is not UTF-8") from None
        config = parse_hosts_toml(decoded, base=d, where=str(f))
        for endpoint in (*config.hosts, config.server or config.top):
            _check_ca(endpoint)
        out[name] = config
    return out


def load(settings: Settings) -> Registries:
    """The table the settings describe, every file they name read and checked now."""
    hosts: dict[str, HostsConfig] = {}
    docker: tuple[Endpoint, ...] = ()
    if settings.config is not None:
        path = Path(settings.config)
        if path.is_dir():
            hosts = load_hosts_dir(path)
        elif path.is_file():
            docker = parse_daemon_json(_read(path, MAX_DAEMON_JSON, "the Docker config"),
                                       where=str(path))
        else:
            raise UserError(f"--registry-config {settings.config}: no such directory (a "
                            "containerd hosts directory) or file (Docker's daemon.json)")
    return Registries.parse(settings, hosts, docker)


def settings_of(mirrors: Sequence[str], mirror_only: bool, config: Path | None) -> Settings:
    """The settings as flags give them, the config path made absolute (the CLI that reads
    them again runs elsewhere)."""
    return Settings(tuple(mirrors), mirror_only,
                    str(config.expanduser().absolute()) if config is not None else None)
