"""The Action's small steps around the run: what to install, the guest kernel, the cache keys.

Run with the runner's own `python3` (the standard library, and `guest_kernel` from this
folder), before and after the install step:

    python3 steps.py prepare [--may-sudo]   the kernel package to install (if any), where
                                            tkbox's Python lives and its cache key
    python3 steps.py settle                 the guest kernel (TKBOX_KERNEL for later
                                            steps) and the keys of the other caches

Each cache key holds everything that shapes what the cache holds, and nothing that
changes from run to run (GitHub saves an entry once per key; a key that never
repeats never hits, one that misses an input restores stale files):

- venv (`RUNNER_TEMP/tkbox-venv`): the runner's OS and arch, Python's version,
  tkbox's source;
- guest (`guest/*` but `guest/templates` and `guest/accel.json`, the daemon's KVM
  decision for this very machine): the same and the guest kernel's release;
- templates (`guest/templates`): the same and QEMU's version, KVM or not, the host
  CPU (model and flags: a saved VM restores on the CPU it was saved on), the memory;
- images (`images`): OS and arch, the image input (else the checkout's
  devcontainer.json), tkbox's agents and image code (the default image, the store);
- tools (`tools`): OS and arch, the agent, tkbox's agents code (its pinned version).

"tkbox's source" is a digest of this checkout's `src/tkbox` and `pyproject.toml` (an
action's checkout is a tarball, not a git repository: no commit to ask for). A
stale entry is never wrong, only slow: tkbox keys its own caches by their inputs
(the guest build by its inputs' digest, images by digest, templates by `Key`).

The times the Action measures itself (install, caches, guest) are marks in
`RUNNER_TEMP/tkbox-action/marks` (`NAME EPOCH-SECONDS` lines), read by `run.py`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import guest_kernel  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def temp() -> Path:
    return Path(os.environ.get("RUNNER_TEMP") or "/tmp")


def marks_file() -> Path:
    return temp() / "tkbox-action" / "marks"


def mark(name: str, *, fresh: bool = False) -> None:
    f = marks_file()
    f.parent.mkdir(parents=True, exist_ok=True)
    with open(f, "w" if fresh else "a", encoding="ascii") as out:
        out.write(f"{name} {time.time():.3f}\n")


def output(**values: str) -> None:
    path = os.environ.get("GITHUB_OUTPUT")
    text = "".join(f"{k.replace('_', '-')}={v}\n" for k, v in values.items())
    if "\n" in "".join(values.values()):
        raise ValueError("an output value with a newline")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


def tree_digest(*paths: Path) -> str:
    """SHA-256 over each file's path (relative to the checkout) and contents, in order;
    bytecode caches left out."""
    h = hashlib.sha256()
    for top in paths:
        files = [top] if top.is_file() else sorted(
            p for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        for p in files:
            h.update(str(p.relative_to(ROOT)).encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def slug(text: str) -> str:
    """A key part: what GitHub's cache keys allow (no comma), short and readable."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text)[:60]


def runner_id() -> str:
    os_name = os.environ.get("RUNNER_OS") or "Linux"
    return f"{slug(os_name)}-{slug(os.environ.get('RUNNER_ARCH') or 'X64')}"


def python_version(python: str) -> str:
    try:
        r = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                           capture_output=True, text=True, timeout=60)
    except OSError:
        return "none"
    return r.stdout.strip() or "none"


def qemu_version() -> str:
    try:
        r = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True,
                           text=True, timeout=60)
    except OSError:
        return "none"
    m = re.search(r"version (\S+)", r.stdout)
    return m.group(1) if m else "unknown"


def cpu_digest(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The host CPU as a saved VM depends on it: the first processor's model name and
    flags (KVM boxes run with `-cpu host`)."""
    try:
        first = cpuinfo.read_text().split("\n\n")[0]
    except OSError:
        return "unknown"
    keep = [line for line in first.splitlines()
            if line.split(":")[0].strip() in ("vendor_id", "model name", "flags")]
    return hashlib.sha256("\n".join(keep).encode()).hexdigest()[:12]


def tkbox_digest() -> str:
    return tree_digest(ROOT / "src" / "tkbox", ROOT / "pyproject.toml")


def prepare(argv: list[str]) -> int:
    mark("start", fresh=True)
    install = (os.environ.get("INPUT_INSTALL") or "true").strip().lower() == "true"
    if install:
        d = guest_kernel.decide(explicit=os.environ.get("TKBOX_KERNEL") or None,
                                may_sudo="--may-sudo" in argv)
        for line in d.lines:
            print(line, flush=True)
        if d.error:
            print(f"::error title=tkbox guest kernel::{guest_kernel.command_data(d.error)}",
                  flush=True)
            return 1
        package = d.package
    else:
        package = ""
    python = os.environ.get("TKBOX_PYTHON") or ""
    if not python and install:
        python = str(temp() / "tkbox-venv" / "bin" / "python")
    elif not python:
        # install: false: the runner's python3, if it has tkbox
        found = shutil.which("python3")
        if found is None or subprocess.run([found, "-c", "import tkbox"], capture_output=True,
                                           timeout=120).returncode != 0:
            print("::error title=tkbox::install is false but the runner's python3 has no "
                  "tkbox: set TKBOX_PYTHON to a Python that has it, or install: true",
                  flush=True)
            return 1
        python = found
    source = tkbox_digest()
    venv_key = "" if not install or os.environ.get("TKBOX_PYTHON") else (
        f"tkbox-venv-v1-{runner_id()}-py{python_version(sys.executable)}-{source}")
    output(kernel_package=package, python=python, venv=str(temp() / "tkbox-venv"),
           venv_key=venv_key, source=source, marks=str(marks_file()))
    mark("prepared")
    return 0


def settle(argv: list[str]) -> int:
    d = guest_kernel.decide(explicit=os.environ.get("TKBOX_KERNEL") or None,
                            after_install=True)
    for line in d.lines:
        print(line, flush=True)
    if d.error or d.kernel is None:
        print(f"::error title=tkbox guest kernel::{guest_kernel.command_data(d.error)}",
              flush=True)
        return 1
    env_file = os.environ.get("GITHUB_ENV")
    if env_file:
        with open(env_file, "a", encoding="utf-8") as f:
            f.write(f"TKBOX_KERNEL={d.kernel.image}\n")
    home = os.environ.get("TKBOX_HOME") or str(temp() / "tkbox")
    python = os.environ.get("TKBOX_PYTHON") or str(temp() / "tkbox-venv" / "bin" / "python")
    src = ROOT / "src" / "tkbox"
    base = f"{runner_id()}-{slug(d.kernel.release)}-py{python_version(python)}-{tkbox_digest()}"
    kvm = "kvm" if os.access("/dev/kvm", os.R_OK | os.W_OK) else "nokvm"
    memory = slug(os.environ.get("INPUT_MEMORY") or "2048")
    workspace = Path(os.environ.get("INPUT_WORKSPACE") or os.environ.get("GITHUB_WORKSPACE")
                     or ".")
    devcontainer = workspace / ".devcontainer" / "devcontainer.json"
    image = os.environ.get("INPUT_IMAGE", "").strip()
    image_what = hashlib.sha256(
        f"image={image}\n".encode() if image else
         b"default\n" + (devcontainer.read_bytes() if devcontainer.is_file() else b"")
    ).hexdigest()[:12]
    agent = (os.environ.get("INPUT_AGENT") or "claude-code").strip()
    code = tree_digest(src / "agents", src / "image")
    output(home=home, release=d.kernel.release, kernel=str(d.kernel.image),
           guest_key=f"tkbox-guest-v1-{base}",
           templates_key=f"tkbox-templates-v1-{base}-qemu{slug(qemu_version())}-{kvm}-"
                         f"cpu{cpu_digest()}-{memory}M",
           images_key=f"tkbox-images-v1-{runner_id()}-{image_what}-{code}",
           tools_key="" if agent == "command" else
           f"tkbox-tools-v1-{runner_id()}-{slug(agent)}-{tree_digest(src / 'agents')}")
    print(f"tkbox: caches under {home}; the guest's key is tkbox-guest-v1-{base}", flush=True)
    mark("keyed")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["prepare"]:
        return prepare(argv[1:])
    if argv[:1] == ["settle"]:
        return settle(argv[1:])
    if argv[:1] == ["mark"] and len(argv) == 2 and re.fullmatch(r"[a-z-]+", argv[1]):
        mark(argv[1])
        return 0
    print("usage: steps.py prepare [--may-sudo] | settle | mark NAME", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
