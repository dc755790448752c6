"""Booted templates: the guest saved once, waiting for its boot config, restored per box.

A box's start is mostly the guest kernel booting and the guest's Python
starting: the same work for every box. A template does it once. The guest boots
with `tkbox.template=1` on its command line, loads every module but
`virtio_blk` (no disk is probed, nothing is read from one), writes `PARKED` on
the mux port and blocks; the launcher saves the VM there (QEMU: `stop`, then
migration to a file) and ends it. Each box then starts a new VMM process with
the same machine and `-incoming` from that file, writes `WAKE`, and the guest
goes on: it loads `virtio_blk` (the box's own disks are probed fresh, at their
own sizes), reads its boot config on port 1026, reseeds the kernel's random
generator from the host randomness in it, sets the host's clock, mounts.

What holds (docs/design.md, "Divergences"):

- one VMM process per box, as for a cold boot; boxes share only the template's
  files (device state and RAM), never written once saved (0600 in a 0700
  directory), and the page cache of the RAM file's unchanged pages;
- fresh entropy: the boot config carries 64 bytes from the host's
  `os.urandom`, credited to the guest kernel's pool and the generator reseeded
  (`RNDADDENTROPY`, `RNDRESEEDCRNG`) before anything else runs; a restored
  guest without a seed refuses to start;
- the host's clock: set from the boot config, as on every boot;
- disks: the template is built with placeholder disks in the same layout
  (count, roles, read-only flags) and the guest never probes them;
- the template is keyed (`Key`) by everything that shapes the saved state: the
  kernel's and initramfs's contents, memory, vCPUs, the VMM's version, the
  device layout and the whole VMM command line (accelerator, kernel command
  line, devices). A key with no template, or a template whose metadata does
  not match its key, means a cold boot, and the VM says which it had and why
  (`VM.start_kind`, `VM.start_reason`).

Each restore marks its template used (its metadata's mtime). When a template
is committed, every other one no box restored from for `UNUSED_AFTER` (14
days) is removed: each new guest build, memory size or QEMU makes a new key,
and the old templates (about 170 MiB each) would pile up for ever. A template
being built (its lock held) is left alone; a box running from a removed one
keeps its open files.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tkbox.vm.base import VMSpec

#: Bump when the guest's template handshake or the saved state's meaning changes.
TEMPLATE_VERSION = 1
STATE, RAM, META = "state", "ram", "meta.json"
#: every file a template's directory holds, a build's partial ones included
FILES = (META, STATE, RAM, STATE + ".partial", RAM + ".partial")
DISABLE_ENV = "TKBOX_TEMPLATE"  # "0": always boot cold
UNUSED_AFTER = 14 * 24 * 3600.0  # seconds since its last restore before a template goes
_DIGEST_CHARS = frozenset("0123456789abcdef")

_digests: dict[tuple[str, int, int, int], str] = {}
_versions: dict[tuple[str, int, int], str] = {}


def file_digest(path: Path) -> str:
    """SHA-256 of a file's contents, remembered per (path, inode, size, mtime)."""
    st = path.stat()
    ident = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if ident not in _digests:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        _digests[ident] = h.hexdigest()
    return _digests[ident]


def vmm_version(binary: str) -> str:
    """The VMM's own `--version` line, remembered per binary (path, inode, mtime)."""
    st = os.stat(binary)
    ident = (binary, st.st_ino, st.st_mtime_ns)
    if ident not in _versions:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             check=False, timeout=30).stdout
        _versions[ident] = out.splitlines()[0].strip() if out else f"unknown ({binary})"
    return _versions[ident]


def layout(spec: VMSpec) -> list[list[Any]]:
    """The device layout a template fixes: each disk's role and read-only flag, in order."""
    return [[d.role, d.read_only] for d in spec.disks]


@dataclass(frozen=True)
class Key:
    """Everything that shapes a saved guest; `digest` names its template."""

    parts: dict[str, Any]

    @property
    def digest(self) -> str:
        text = json.dumps(self.parts, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def differences(self, other: dict[str, Any]) -> list[str]:
        return sorted(k for k in set(self.parts) | set(other)
                      if self.parts.get(k) != other.get(k))


def make_key(spec: VMSpec, vmm: str, argv: list[str]) -> Key:
    """The key of `spec`'s template; `argv` is the VMM command line with the
    per-VM paths (working directory, disks) replaced by placeholders."""
    return Key({
        "v": TEMPLATE_VERSION,
        "kernel": file_digest(spec.kernel),
        "initramfs": file_digest(spec.initramfs),
        "memory_mib": spec.memory_mib,
        "vcpus": spec.vcpus,
        "vmm": vmm,
        "layout": layout(spec),
        "argv": argv,
    })


@dataclass(frozen=True)
class Lookup:
    state: Path | None  # the saved VM to restore, or None: boot cold
    reason: str  # for a person: which start this is and why
    build: bool = True  # a cold boot for want of a template: build one


class TemplateStore:
    """Templates on disk: `<root>/<key digest>/{state,meta.json}`, root 0700."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, key: Key) -> Path:
        return self.root / key.digest

    def lookup(self, key: Key) -> Lookup:
        if os.environ.get(DISABLE_ENV) == "0":
            return Lookup(None, f"cold boot: templates are disabled ({DISABLE_ENV}=0)",
                          build=False)
        d = self._dir(key)
        meta = self._meta(d)
        if meta is not None and meta.get("parts") == key.parts and (d / STATE).is_file() \
                and (d / RAM).is_file():
            with contextlib.suppress(OSError):
                os.utime(d / META)  # used: kept by `prune`
            return Lookup(d / STATE, f"restored from template {key.digest[:12]}")
        if meta is not None:
            return Lookup(None, "cold boot: template {} does not match its key ({}); it is "
                          "rebuilt".format(key.digest[:12], ", ".join(key.differences(
                              meta.get("parts", {})))))
        stale = self._nearest(key)
        if stale:
            return Lookup(None, f"cold boot: no template yet for this machine ({stale} "
                                "changed since the last one); one is being built")
        return Lookup(None, "cold boot: no template yet for this machine; one is being built")

    def _meta(self, d: Path) -> dict[str, Any] | None:
        try:
            meta = json.loads((d / META).read_text())
        except (OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    def _nearest(self, key: Key) -> str:
        """What changed since the newest template with the same layout, for a person."""
        if not self.root.is_dir():
            return ""
        best: tuple[float, list[str]] | None = None
        for d in self.root.iterdir():
            meta = self._meta(d)
            if meta is None or not isinstance(meta.get("parts"), dict):
                continue
            diff = key.differences(meta["parts"])
            mtime = (d / META).stat().st_mtime
            if best is None or mtime > best[0]:
                best = (mtime, diff)
        return ", ".join(best[1]) if best else ""

    @contextlib.contextmanager
    def building(self, key: Key) -> Iterator[Path | None]:
        """Hold the key's build lock; yields the directory to build in, or None
        when another builder has it (never waits: the caller is an event loop)
        or finished it meanwhile."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)
        d = self._dir(key)
        d.mkdir(exist_ok=True, mode=0o700)
        with open(self.root / f".{key.digest}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield None  # another process is building it
                return
            meta = self._meta(d)
            if meta is not None and meta.get("parts") == key.parts and (d / STATE).is_file():
                yield None
                return
            # A build cut short (the daemon killed) leaves partial files: a RAM file
            # is never reused, so the new guest starts on zeroed memory.
            for name in FILES:
                (d / name).unlink(missing_ok=True)
            yield d

    def commit(self, d: Path, key: Key, saved: Path, ram: Path, build_seconds: float) -> Path:
        """Make a saved VM durable and move it into place, then write the metadata
        that makes it valid (a crash before leaves no template, never a torn one)."""
        for f, name in ((ram, RAM), (saved, STATE)):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.chmod(f, 0o600)
            os.replace(f, d / name)
        tmp = d / (META + ".tmp")
        tmp.write_text(json.dumps({"parts": key.parts, "build_seconds": round(build_seconds, 3),
                                   "bytes": (d / STATE).stat().st_size}, indent=1))
        os.replace(tmp, d / META)
        self.prune(key)
        return d / STATE

    def prune(self, keep: Key, now: float | None = None) -> list[str]:
        """Remove every template but `keep`'s that no box restored from for
        `UNUSED_AFTER` and that nobody is building; the digests removed."""
        cutoff = (time.time() if now is None else now) - UNUSED_AFTER
        removed = []
        for d in self.root.iterdir():
            name = d.name
            if name == keep.digest or len(name) != 32 or not set(name) <= _DIGEST_CHARS \
                    or d.is_symlink() or not d.is_dir():
                continue
            try:
                used = max(p.stat().st_mtime for p in (d, d / META) if p.exists())
            except (OSError, ValueError):
                continue
            if used >= cutoff:
                continue
            with open(self.root / f".{name}.lock", "w") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # being built
                for f in FILES:
                    with contextlib.suppress(OSError):
                        (d / f).unlink()
                with contextlib.suppress(OSError):
                    d.rmdir()  # anything else in it stays, and so does it
                removed.append(name)
        return removed

    def discard(self, key: Key) -> None:
        """Drop a template that would not restore: the next start rebuilds it."""
        for name in (META, STATE, RAM):
            with contextlib.suppress(OSError):
                (self._dir(key) / name).unlink()
