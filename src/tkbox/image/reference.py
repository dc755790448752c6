"""Image references: what a person writes after `--image`, parsed strictly.

```
python:3.12-slim                      Docker Hub, "library/" implied, tag
library/python                        Docker Hub, tag "latest" implied
ghcr.io/org/tool@sha256:<64 hex>      any registry, by digest
localhost:5000/a/b:v1                 a host with a port (host = has '.' or ':', or "localhost")
[::1]:5000/a:v1                       an IPv6 literal in brackets
oci:DIR[:TAG]                         an OCI image layout directory
oci-archive:FILE[:TAG]                a tar of an OCI image layout
tkbox/default                         an image imported or built here (looked up first)
```

The grammar is Docker's (`distribution/reference`): path components
`[a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*`, tags `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`,
names at most 255 characters. Only `sha256` digests are accepted. For `oci:`
and `oci-archive:` the path ends at the first `:`, as in containers/image.

Pure; a malformed reference raises `UserError` (the person typed it) and
nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tkbox.errors import UserError

DOCKER_HUB = "docker.io"
#: the host serving Docker Hub's registry API (the name `docker.io` is only an alias)
DOCKER_HUB_API = "registry-1." + DOCKER_HUB
HUB_ALIASES = (DOCKER_HUB, "index." + DOCKER_HUB, DOCKER_HUB_API)
DEFAULT_TAG = "latest"

MAX_REFERENCE = 1024
MAX_NAME = 255

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?")
_IPV6 = re.compile(r"\[[0-9A-Fa-f:.]{2,45}\]")


@dataclass(frozen=True, slots=True)
class RegistryRef:
    """An image in a registry. `tag` is None when only a digest was given."""

    registry: str  # as normalized: "docker.io" for Docker Hub
    repository: str  # "library/python"
    tag: str | None
    digest: str | None
    #: the name as written without the registry (for local lookups): "python", "tkbox/default"
    short: str
    #: whether the person wrote a registry host
    explicit_registry: bool

    @property
    def api_host(self) -> str:
        """host[:port] to speak the registry API to."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def reference(self) -> str:
        """What to ask `/v2/<name>/manifests/<reference>` for: the digest if given."""
        ref = self.digest or self.tag
        assert ref is not None
        return ref

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        s = self.name
        if self.tag:
            s += f":{self.tag}"
        if self.digest:
            s += f"@{self.digest}"
        return s

    @property
    def local_key(self) -> str | None:
        """The key of a local (imported/built) image this could name, if any."""
        if self.explicit_registry or self.digest:
            return None
        return f"{self.short}:{self.tag or DEFAULT_TAG}"


@dataclass(frozen=True, slots=True)
class LayoutRef:
    """`oci:DIR[:TAG]` (archive=False) or `oci-archive:FILE[:TAG]` (archive=True)."""

    path: Path
    tag: str | None
    archive: bool

    def __str__(self) -> str:
        scheme = "oci-archive" if self.archive else "oci"
        return f"{scheme}:{self.path}" + (f":{self.tag}" if self.tag else "")


@dataclass(frozen=True, slots=True)
class DigestRef:
    """A bare `sha256:...`: an image already in the store, by manifest digest."""

    digest: str

    def __str__(self) -> str:
        return self.digest


Reference = RegistryRef | LayoutRef | DigestRef


def _bad(ref: str, why: str) -> UserError:
    shown = ref if len(ref) <= 120 else ref[:117] + "..."
    return UserError(f"image reference {shown!r} is not valid: {why}")


def _is_host(component: str) -> bool:
    return ("." in component or ":" in component or component == "localhost"
            or component.lower() != component)


def _check_host(ref: str, host: str) -> None:
    if host.startswith("["):
        end = host.find("]")
        if end < 0 or not _IPV6.fullmatch(host[: end + 1]):
            raise _bad(ref, "malformed IPv6 registry address")
        port = host[end + 1:]
        if port and not (port.startswith(":") and _port_ok(port[1:])):
            raise _bad(ref, "malformed registry port")
        return
    name, sep, port = host.partition(":")
    if sep and not _port_ok(port):
        raise _bad(ref, "malformed registry port")
    if len(name) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in name.split(".")):
        raise _bad(ref, f"malformed registry host {name!r}")


def host_port(host: str, what: str) -> str:
    """`host[:port]` (a name, or an IPv6 literal in brackets), checked and lowercased; a
    malformed one is a `UserError` that begins with `what`."""
    if not isinstance(host, str) or not host or len(host) > 300:
        raise UserError(f"{what}: a registry host is 1 to 300 characters")
    if not host.isascii() or not host.isprintable() or any(c.isspace() for c in host):
        raise UserError(f"{what}: {host[:100]!r} holds characters a host name cannot have")
    try:
        _check_host(host, host)
    except UserError as e:
        raise UserError(f"{what}: {str(e).rsplit(': ', 1)[-1]}") from None
    return host.lower()


def registry_host(host: str, what: str) -> str:
    """A registry as references name it: `host_port`, with Docker Hub's aliases as
    `docker.io`."""
    host = host_port(host, what)
    return DOCKER_HUB if host in HUB_ALIASES else host


def _port_ok(port: str) -> bool:
    return port.isascii() and port.isdigit() and str(int(port)) == port and 0 < int(port) < 65536


def parse_reference(ref: str) -> Reference:
    if not isinstance(ref, str) or not ref:
        raise _bad(str(ref), "empty")
    if len(ref) > MAX_REFERENCE:
        raise _bad(ref, f"longer than {MAX_REFERENCE} characters")
    if not ref.isprintable() or any(c.isspace() for c in ref):
        raise _bad(ref, "it holds spaces or control characters")
    for scheme, archive in (("oci:", False), ("oci-archive:", True)):
        if ref.startswith(scheme):
            rest = ref[len(scheme):]
            path, sep, layout_tag = rest.partition(":")
            if not path:
                raise _bad(ref, "no path after " + scheme)
            if sep and not _TAG.fullmatch(layout_tag):
                raise _bad(ref, f"malformed tag {layout_tag!r}")
            return LayoutRef(Path(path), layout_tag if sep else None, archive)
    if _DIGEST.fullmatch(ref):
        return DigestRef(ref)

    name, at, digest = ref.partition("@")
    if at:
        if not _DIGEST.fullmatch(digest):
            raise _bad(ref, "the digest must be sha256: followed by 64 lowercase hex digits")
    tag: str | None = None
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1:]
        if not _TAG.fullmatch(tag):
            raise _bad(ref, f"malformed tag {tag!r}")
    if not name:
        raise _bad(ref, "no repository name")
    first, sep, remainder = name.partition("/")
    explicit = bool(sep) and _is_host(first)
    if explicit:
        registry, path = first, remainder
        _check_host(ref, registry)
        if registry in HUB_ALIASES:
            registry = DOCKER_HUB
    else:
        registry, path = DOCKER_HUB, name
    if not path:
        raise _bad(ref, "no repository name")
    components = path.split("/")
    for c in components:
        if not _COMPONENT.fullmatch(c):
            raise _bad(ref, f"malformed name component {c!r} (lowercase letters, digits, "
                            "and . _ - between them)")
    short = path
    if registry == DOCKER_HUB and len(components) == 1:
        path = "library/" + path
    if len(f"{registry}/{path}") > MAX_NAME:
        raise _bad(ref, f"the name is longer than {MAX_NAME} characters")
    if tag is None and not at:
        tag = DEFAULT_TAG
    return RegistryRef(registry, path, tag, digest if at else None, short, explicit)


def parse_local_tag(tag: str) -> str:
    """The store key for `tkbox image import --tag NAME[:TAG]`: no registry host allowed."""
    ref = parse_reference(tag)
    if not isinstance(ref, RegistryRef) or ref.digest is not None:
        raise UserError(f"tag {tag!r} must be NAME or NAME:TAG (no digest, no oci: path)")
    if ref.explicit_registry:
        raise UserError(
            f"tag {tag!r} names a registry host; a local image's name must not look like "
            "one (use e.g. 'me/tool:v1')"
        )
    key = ref.local_key
    assert key is not None
    return key
