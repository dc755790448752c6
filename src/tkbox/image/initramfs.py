"""`tkbox guest build`: the guest's initramfs, built from this host's own parts.

It holds: the host's Python interpreter and the shared libraries it (and the
extension modules the agent needs) link, at their host paths; a stdlib trimmed
to what the guest agent imports, compiled ahead of time to unchecked-hash
bytecode; the guest agent, `tkbox.protocol`, `tkbox.errors` and `msgpack`;
`tkbox-spawn` (`tkbox/guest/spawn.c`, compiled static with the host's C
compiler: the step that confines and execs each command without forking the
agent); and the kernel modules the guest needs, in dependency order. Same inputs give
the same bytes (sorted entries, zero times and owners, hash-based bytecode),
and the result is cached under a digest of those inputs.

The newc cpio writer is hand-written: it is forty lines, and the `cpio` tool
cannot take a list of (name, bytes) entries without staging a tree first.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import modulefinder
import os
import py_compile
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tkbox
from tkbox._fs import publish, write_atomic
from tkbox.errors import HostError
from tkbox.image.kernel import Kernel, cached_vmlinux, find_kernel, read_module

BUILD_VERSION = "1"  # bump when the layout below changes
PY_DIR = "/tkbox/python"
APP_DIR = "/tkbox/app"
SPAWN_PATH = "/tkbox/bin/tkbox-spawn"  # tkbox.guest.spawn.SPAWN
#: static (no loader, no libraries in the guest), stripped, no build id: same source,
#: same compiler, same bytes
SPAWN_FLAGS = ["-static", "-Os", "-s", "-Wall", "-Wextra", "-Wl,--build-id=none"]

#: stdlib modules never needed in the guest, however modulefinder reads imports
EXCLUDE = [
    "tkinter", "turtle", "idlelib", "test", "unittest", "pydoc", "pydoc_data", "lib2to3",
    "ensurepip", "venv", "distutils", "doctest", "sqlite3", "curses", "dbm", "xmlrpc",
    "http.server", "multiprocessing", "concurrent.futures.process", "ssl", "_ssl",
    "_hashlib", "lzma", "_lzma", "bz2", "_bz2", "readline", "pdb", "_tkinter",
]

INIT = f"""#!{PY_DIR}/bin/python3 -IS
import sys
sys.path.insert(0, "{APP_DIR}")
from tkbox.guest.agent import main
main()
"""


# ---- cpio ---------------------------------------------------------------------


class Cpio:
    """A deterministic newc cpio archive written to a binary file."""

    def __init__(self, out: io.BufferedIOBase) -> None:
        self.out = out
        self.ino = 0
        self.names: set[str] = set()

    def _entry(self, name: str, mode: int, data: bytes = b"",
               rdev: tuple[int, int] = (0, 0)) -> None:
        name = name.lstrip("/")
        if name in self.names:
            return
        self.names.add(name)
        self.ino += 1
        bname = name.encode() + b"\0"
        fields = (self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(bname), 0)
        hdr = b"070701" + b"".join(b"%08X" % f for f in fields)
        self.out.write(hdr + bname + b"\0" * (-(len(hdr) + len(bname)) % 4))
        self.out.write(data + b"\0" * (-len(data) % 4))

    def dirs_for(self, name: str) -> None:
        parts = name.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self._entry("/".join(parts[:i]), 0o40755)

    def dir(self, name: str) -> None:
        self.dirs_for(name)
        self._entry(name, 0o40755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self.dirs_for(name)
        self._entry(name, 0o100000 | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self.dirs_for(name)
        self._entry(name, 0o120777, target.encode())

    def chardev(self, name: str, major: int, minor: int, mode: int = 0o600) -> None:
        self.dirs_for(name)
        self._entry(name, 0o20000 | mode, rdev=(major, minor))

    def close(self) -> None:
        self._entry("TRAILER!!!", 0)
        self.out.write(b"\0" * (-self.out.tell() % 512))


# ---- what goes in ------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    python: Path  # the real interpreter binary
    stdlib: Path
    files: dict[str, Path]  # archive name -> host file (to be compiled if .py)
    libs: list[Path]  # shared libraries, kept at their host paths
    kernel: Kernel
    modules: list[Path]
    spawn: bytes  # the compiled tkbox-spawn

    def digest(self) -> str:
        h = hashlib.sha256(f"tkbox-initramfs/{BUILD_VERSION}/{tkbox.__version__}\n".encode())
        h.update(b"tkbox-spawn\0" + hashlib.sha256(self.spawn).digest())
        items = [("python", self.python), *sorted(self.files.items()),
                 *[(str(p), p) for p in self.libs], *[(str(p), p) for p in self.modules]]
        for name, path in items:
            h.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
        return h.hexdigest()


def _ldd(paths: list[Path]) -> list[Path]:
    libs: set[Path] = set()
    for p in paths:
        proc = subprocess.run(["ldd", str(p)], capture_output=True, text=True, check=False)
        for line in proc.stdout.splitlines():
            m = re.search(r"(/\S+)\s+\(0x", line)
            if m:
                libs.add(Path(m.group(1)))
    return sorted(libs)


def _stdlib_closure(scanned: list[Path], pkg_root: Path, stdlib: Path,
                    cache: Path | None) -> dict[str, Path]:
    """The standard library modules the agent imports (archive name -> host file), read
    by `modulefinder` from `scanned`. That read takes seconds and its answer depends only
    on the scanned files' bytes, this interpreter and `EXCLUDE`, so it is kept in `cache`
    under a digest of those (a box's start re-checks the guest build every time)."""
    h = hashlib.sha256(f"tkbox-stdlib/{BUILD_VERSION}/{sys.version}/{stdlib}/"
                       f"{sys.executable}/{sorted(EXCLUDE)}\n".encode())
    for p in scanned:
        h.update(str(p).encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    kept = cache / f"stdlib-{h.hexdigest()[:16]}.json" if cache is not None else None
    if kept is not None:
        try:
            found = {k: Path(v) for k, v in json.loads(kept.read_text()).items()}
            if all(p.is_file() for p in found.values()):
                return found
        except (OSError, ValueError, AttributeError, TypeError):
            pass  # not there, or not ours: read the imports again
    finder = modulefinder.ModuleFinder(path=[str(pkg_root.parent), str(stdlib),
                                             str(stdlib / "lib-dynload")], excludes=EXCLUDE)
    for p in scanned:
        finder.run_script(str(p))
    finder.import_hook("encodings.utf_8")
    finder.import_hook("encodings.latin_1")
    finder.import_hook("encodings.ascii")
    finder.import_hook("encodings.idna")
    out: dict[str, Path] = {}
    for found_mod in finder.modules.values():
        fname = getattr(found_mod, "__file__", None)
        if not fname:
            continue
        path = Path(fname)
        try:
            rel_path = path.relative_to(stdlib)
        except ValueError:
            continue
        if rel_path.parts and rel_path.parts[0] == "site-packages":
            continue
        out[f"{PY_DIR}/lib/python3.{sys.version_info.minor}/{rel_path}"] = path
    if kept is not None:
        with contextlib.suppress(OSError, HostError):
            write_atomic(kept, json.dumps({k: str(v) for k, v in out.items()}).encode())
    return out


def collect(kernel: Kernel | None = None, cache: Path | None = None) -> Inputs:
    """What goes in the initramfs; `cache` keeps the slow read of the agent's imports."""
    python = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    stdlib = Path(sysconfig.get_path("stdlib", vars={"installed_base": sys.base_prefix}))
    if not (stdlib / "os.py").is_file():
        raise HostError(f"cannot find this Python's standard library at {stdlib}")
    pkg_root = Path(tkbox.__file__).parent
    msgpack_spec = importlib.util.find_spec("msgpack")
    if msgpack_spec is None or msgpack_spec.origin is None:
        raise HostError("msgpack is not installed; run 'pip install msgpack'")
    msgpack_dir = Path(msgpack_spec.origin).parent

    files: dict[str, Path] = {}
    for rel in ["__init__.py", "errors.py", "_tasks.py"]:
        files[f"{APP_DIR}/tkbox/{rel}"] = pkg_root / rel
    for sub in ["protocol", "guest"]:
        for p in sorted((pkg_root / sub).glob("*.py")):
            files[f"{APP_DIR}/tkbox/{sub}/{p.name}"] = p
    for p in sorted(msgpack_dir.iterdir()):
        if p.suffix in (".py", ".so"):
            files[f"{APP_DIR}/msgpack/{p.name}"] = p

    # The stdlib the agent imports, found by reading the agent's imports.
    scanned = sorted(p for p in files.values() if p.suffix == ".py" and "msgpack" not in p.parts)
    files.update(_stdlib_closure(scanned, pkg_root, stdlib, cache))
    # Always-needed bootstrap pieces modulefinder does not see.
    for rel in ["encodings/__init__.py", "encodings/aliases.py", "os.py", "site.py"]:
        files[f"{PY_DIR}/lib/python3.{sys.version_info.minor}/{rel}"] = stdlib / rel
    sos = [p for p in files.values() if p.suffix == ".so"]
    kernel = kernel or find_kernel()
    return Inputs(python, stdlib, files, _ldd([python, *sos]), kernel, kernel.module_paths(),
                  compile_spawn(pkg_root / "guest" / "spawn.c"))


def compile_spawn(src: Path) -> bytes:
    """`tkbox-spawn`, built from `src` with the host's C compiler (static, stripped)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise HostError("no C compiler: the guest needs tkbox-spawn built from spawn.c; "
                        "install gcc and libc6-dev (apt-get install gcc libc6-dev)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tkbox-spawn"
        proc = subprocess.run([cc, *SPAWN_FLAGS, "-o", str(out), str(src)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not out.is_file():
            lines = [ln for ln in proc.stderr.splitlines() if "error" in ln] or \
                proc.stderr.splitlines() or [f"exit status {proc.returncode}"]
            raise HostError(f"cannot build tkbox-spawn from {src} with {cc}: {lines[0][:300]}; "
                            "a static build needs libc6-dev (apt-get install gcc libc6-dev)")
        return out.read_bytes()


def _compile(src: Path) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "x.pyc"
        py_compile.compile(str(src), cfile=str(out), dfile=src.name, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        return out.read_bytes()


def _stripped(lib: Path) -> bytes:
    """The library without debug sections (deterministic; the original if `strip` is absent)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / lib.name
        proc = subprocess.run(["strip", "--strip-debug", "-o", str(out), str(lib)],
                              capture_output=True, check=False)
        return out.read_bytes() if proc.returncode == 0 and out.is_file() else lib.read_bytes()


def write_initramfs(inputs: Inputs, out: io.BufferedIOBase) -> None:
    cpio = Cpio(out)
    for d in ["dev", "proc", "sys", "run", "tmp", "etc", "/tkbox/modules"]:
        cpio.dir(d)
    cpio.chardev("dev/console", 5, 1)
    cpio.chardev("dev/null", 1, 3, 0o666)
    cpio.file("init", INIT.encode(), 0o755)
    cpio.file(f"{PY_DIR}/bin/python3", inputs.python.read_bytes(), 0o755)
    cpio.file(SPAWN_PATH, inputs.spawn, 0o755)
    for lib in inputs.libs:
        cpio.file(str(lib), _stripped(lib), 0o755)
    for name in sorted(inputs.files):
        src = inputs.files[name]
        if src.suffix == ".py":
            cpio.file(name[:-3] + ".pyc", _compile(src))
        else:
            cpio.file(name, src.read_bytes(), 0o755 if src.suffix == ".so" else 0o644)
    order = []
    for i, mod in enumerate(inputs.modules):
        name = f"{i:02d}-{mod.name.split('.ko')[0]}.ko"
        cpio.file(f"/tkbox/modules/{name}", read_module(mod))
        order.append(name)
    cpio.file("/tkbox/modules/order", ("\n".join(order) + "\n").encode())
    cpio.close()


@dataclass(frozen=True)
class GuestBuild:
    kernel: Path  # ELF vmlinux
    initramfs: Path
    kernel_version: str
    digest: str


def build(cache: Path, *, force: bool = False, kernel: Kernel | None = None) -> GuestBuild:
    """Build (or reuse) the initramfs and the extracted kernel for this host."""
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    inputs = collect(kernel, cache)
    digest = inputs.digest()
    vmlinux = cached_vmlinux(inputs.kernel, cache)
    target = cache / f"initramfs-{digest[:16]}.cpio"
    if force or not target.is_file():
        fd, tmp = tempfile.mkstemp(dir=cache, prefix=".initramfs-")
        try:
            with os.fdopen(fd, "wb") as f:
                write_initramfs(inputs, f)
            publish(Path(tmp), target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return GuestBuild(vmlinux, target, inputs.kernel.version, digest)
