"""Allowlist presets: named groups of hosts.

The package-registry presets (`pypi`, `npm`, `debian`, `apt-ubuntu`) are
never spelled in this repository: they are read at run time from the
clients' own definitions on this host, so they follow the clients and a
preset says honestly when its client is missing.

- `pypi`: pip's own default index (`pip._internal.models.index.PyPI`): its
  `netloc` and its `file_storage_domain`.
- `npm`: `npm config get registry`, when npm exists.
- `debian` / `apt-ubuntu`: the hosts of this host's APT sources
  (`/etc/apt/sources.list`, `sources.list.d/*.list` one-line format,
  `sources.list.d/*.sources` deb822 format; other file names are ignored, as
  APT ignores them). A source belongs to `debian` or `apt-ubuntu` by its
  suite's release codename (from `distro-info-data`'s tables when installed,
  else from this host's `/etc/os-release`).

The others are fixed lists of hosts, each with its port rule (`host` → 443
and 80; `host:port` → that port only).

Read-only presets carry method and path rules (`httprules`), so the door
reads their hosts and refuses what they do not allow:

- `github-read`: git clone and fetch over smart HTTP (the `git-upload-pack`
  service: `GET …/info/refs?service=git-upload-pack`, `POST
  …/git-upload-pack`), archives and release downloads on `github.com`; `GET`
  and `HEAD` on the API and the download hosts. Never `git-receive-pack`
  (push), an API write, or GraphQL (a `POST`). `github-read@HOST[:PORT]` is
  the same for a GitHub Enterprise Server at HOST (its API under `/api/v3`).
- `pypi-read`, `npm-read`: `GET` and `HEAD` on the `pypi` and `npm` hosts
  (and npm's audit, a `POST` that reads): download, never publish.

The APT source parsers are hand-written: no maintained library parses both
formats without python-apt, which is not installable from PyPI.
"""

from __future__ import annotations

import csv
import functools
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import urlsplit

FIXED: dict[str, tuple[str, ...]] = {
    "github": (
        "github.com",
        "api.github.com",
        "codeload.github.com",
        "raw.githubusercontent.com",
        "objects.githubusercontent.com",
        "release-assets.githubusercontent.com",
        "uploads.github.com",
    ),
    "go-proxy": ("proxy.golang.org", "sum.golang.org"),
    "anthropic": ("api.anthropic.com",),
    "openai": ("api.openai.com",),
    "gemini": ("generativelanguage.googleapis.com",),
    "claude-code": (
        "api.anthropic.com",
        "console.anthropic.com",
        "statsig.anthropic.com",
        "claude.ai",
    ),
}

_GIT_READ = ("GET /*/*/info/refs?service=git-upload-pack; POST /*/*/git-upload-pack; "
             "GET HEAD /*/*/archive/**; GET HEAD /*/*/releases/download/**")
_READ = "GET HEAD /**"
RULED: dict[str, tuple[str, ...]] = {
    "github-read": (
        f"github.com {_GIT_READ}",
        f"api.github.com {_READ}",
        f"codeload.github.com {_READ}",
        f"raw.githubusercontent.com {_READ}",
        f"objects.githubusercontent.com {_READ}",
        f"release-assets.githubusercontent.com {_READ}",
    ),
}
#: a ruled preset aimed at another host (`PRESET@HOST[:PORT]`): the rules that host gets
RETARGET: dict[str, str] = {
    "github-read": f"{_GIT_READ}; GET HEAD /api/v3/**",
}
#: download-only variants of derived presets: (the preset, its rules)
READ_ONLY: dict[str, tuple[str, str]] = {
    "pypi-read": ("pypi", _READ),
    "npm-read": ("npm", _READ + "; POST /-/npm/v1/security/advisories/bulk; "
                 "POST /-/npm/v1/security/audits/quick"),
}
#: clients known to work with a read (ruled) host, and those that cannot
PINNING_NOTE = ("ruled hosts are read by the door: a client must trust the box CA "
                "(curl, git, pip, npm, gh, Python, Node and Go do, through the variables "
                "tkbox sets); one that pins a certificate or carries only its own roots fails")

DERIVED = ("pypi", "npm", "debian", "apt-ubuntu")
NAMES = tuple(sorted((*FIXED, *DERIVED, *RULED, *READ_ONLY)))
#: the presets whose hosts are model APIs: every request to them is recorded as a
#: `tkbox.model.call` (its model and tokens read by `tkbox.doors.secrets.model`, which
#: tells the API from the answer's shape)
MODEL_PRESETS = ("anthropic", "openai", "gemini", "claude-code")

_MAX_SOURCE_FILE = 1 << 20


def _url_entry(url: str) -> str | None:
    """An allowlist entry for the host of a URL, with its port if not default."""
    try:
        parts = urlsplit(url.strip())
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host or parts.scheme not in ("http", "https"):
        return None
    default = {"http": 80, "https": 443}[parts.scheme]
    return host if port in (None, default) else f"{host}:{port}"


def pip_hosts() -> list[str]:
    """pip's own default index and its file storage host."""
    try:
        from pip._internal.models.index import PyPI
    except Exception:  # noqa: BLE001 - pip absent or changed: an empty preset, said so
        return []
    hosts = [str(PyPI.netloc), str(PyPI.file_storage_domain)]
    return [h for h in hosts if h]


def npm_hosts(run: Callable[[list[str]], str] | None = None) -> list[str]:
    """npm's configured registry, when npm exists on this host."""
    if run is None:
        if shutil.which("npm") is None:
            return []
        run = _run
    try:
        out = run(["npm", "config", "get", "registry"])
    except (OSError, subprocess.SubprocessError):
        return []
    entry = _url_entry(out.strip().splitlines()[0] if out.strip() else "")
    return [entry] if entry else []


def _run(argv: list[str]) -> str:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=15, check=True, stdin=subprocess.DEVNULL
    ).stdout


def parse_one_line_sources(text: str) -> list[tuple[str, str]]:
    """`deb [opts] URI suite [components]` lines → (URI, suite)."""
    out: list[tuple[str, str]] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        if words[0] not in ("deb", "deb-src"):
            continue
        words = words[1:]
        if words and words[0].startswith("["):
            # options run to the word ending with ']'
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2:
            out.append((words[0], words[1]))
    return out


def parse_deb822_sources(text: str) -> list[tuple[str, str]]:
    """deb822 stanzas (`Types:`, `URIs:`, `Suites:`, `Enabled:`) → (URI, suite)."""
    out: list[tuple[str, str]] = []
    for stanza in _stanzas(text):
        if stanza.get("enabled", "yes").strip().lower() == "no":
            continue
        if not set(stanza.get("types", "").split()) & {"deb", "deb-src"}:
            continue
        suites = stanza.get("suites", "").split() or [""]
        for uri in stanza.get("uris", "").split():
            out.extend((uri, s) for s in suites)
    return out


def _stanzas(text: str) -> Iterable[dict[str, str]]:
    fields: dict[str, str] = {}
    key = ""
    for raw in text.splitlines() + [""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if fields:
                yield fields
            fields, key = {}, ""
            continue
        if raw[0] in " \t" and key:
            fields[key] += " " + raw.strip()
            continue
        k, sep, v = raw.partition(":")
        if sep:
            key = k.strip().lower()
            fields[key] = v.strip()


def apt_sources(root: Path = Path("/")) -> list[tuple[str, str]]:
    """(URI, suite) of every enabled APT source on this host."""
    apt = root / "etc/apt"
    files: list[tuple[Path, bool]] = [(apt / "sources.list", False)]
    d = apt / "sources.list.d"
    if d.is_dir():
        for f in sorted(d.iterdir()):
            if f.suffix == ".list":
                files.append((f, False))
            elif f.suffix == ".sources":
                files.append((f, True))
    out: list[tuple[str, str]] = []
    for f, deb822 in files:
        try:
            if not f.is_file() or f.stat().st_size > _MAX_SOURCE_FILE:
                continue
            text = f.read_text(errors="replace")
        except OSError:
            continue
        out.extend(parse_deb822_sources(text) if deb822 else parse_one_line_sources(text))
    return out


def _codenames(root: Path) -> dict[str, str]:
    """Release codename → 'debian' | 'ubuntu'."""
    names: dict[str, str] = {}
    for distro in ("debian", "ubuntu"):
        table = root / f"usr/share/distro-info/{distro}.csv"
        try:
            with table.open(newline="") as fh:
                for row in csv.DictReader(fh):
                    series = (row.get("series") or "").strip().lower()
                    if series:
                        names[series] = distro
        except OSError:
            continue
    osr = root / "etc/os-release"
    try:
        info = dict(line.split("=", 1) for line in osr.read_text().splitlines() if "=" in line)
    except OSError:
        info = {}
    distro = info.get("ID", "").strip('"').lower()
    code = info.get("VERSION_CODENAME", "").strip('"').lower()
    if distro in ("debian", "ubuntu") and code:
        names.setdefault(code, distro)
        if distro == "debian":
            names.setdefault("stable", "debian")
            names.setdefault("sid", "debian")
    return names


def apt_hosts(distro: str, root: Path = Path("/")) -> list[str]:
    """Entries for the APT sources of one distribution ('debian' or 'ubuntu')."""
    names = _codenames(root)
    out: list[str] = []
    for uri, suite in apt_sources(root):
        base = suite.split("/")[0].split("-")[0].lower()
        if names.get(base) != distro:
            continue
        entry = _url_entry(uri)
        if entry and entry not in out:
            out.append(entry)
    return out


@functools.cache
def _derived(name: str) -> tuple[str, ...]:
    if name == "pypi":
        return tuple(pip_hosts())
    if name == "npm":
        return tuple(npm_hosts())
    if name == "debian":
        return tuple(apt_hosts("debian"))
    if name == "apt-ubuntu":
        return tuple(apt_hosts("ubuntu"))
    return ()


def preset_entries(name: str) -> tuple[str, ...] | None:
    """The entries a preset means on this host, or None if no such preset.
    `PRESET@HOST[:PORT]` aims a ruled preset at another host."""
    base, at, target = name.partition("@")
    if at:
        if base not in RETARGET or not target or any(c.isspace() for c in target):
            return None
        return (f"{target} {RETARGET[base]}",)
    if name in FIXED:
        return FIXED[name]
    if name in RULED:
        return RULED[name]
    if name in READ_ONLY:
        preset, rules = READ_ONLY[name]
        return tuple(f"{e} {rules}" for e in _derived(preset))
    if name in DERIVED:
        return _derived(name)
    return None


def describe_presets() -> dict[str, list[str]]:
    """Every preset and what it means on this host (for `tkbox presets`)."""
    return {name: list(preset_entries(name) or ()) for name in NAMES}
