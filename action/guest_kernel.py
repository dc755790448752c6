"""Which kernel boots tkbox's guest on this runner, decided from facts, and why.

Run by the Action before tkbox is installed: it needs the runner's `python3`, the
standard library and `tkbox.image.kernel` from this checkout (stdlib only), so the
decision is made by the very code `tkbox guest build` runs (`find_kernel`,
`extract_vmlinux`, modules.dep), not by a copy of its rules.

The facts about one kernel release R (all read, nothing guessed from the OS name):

- its image, `/boot/vmlinuz-R` (or `TKBOX_KERNEL`), exists and is readable; Ubuntu
  installs it readable by root only, so with `--may-sudo` that one file is made
  readable (`sudo -n chmod 0644`), as the install step may change the runner;
- tkbox can unpack it: `extract_vmlinux` finds the ELF kernel (an ELF image, or a
  bzImage whose payload is XZ, ZSTD, LZ4, gzip, bzip2 or LZMA); otherwise the
  payload's compression, read from the bzImage's setup header, is named with why;
- it boots through PVH, as tkbox boots the ELF kernel: `/boot/config-R` says
  `CONFIG_PVH=y` (no config file: not known, not refused);
- its modules directory has `modules.dep`, and each of `REQUIRED` is there as a
  module or listed in `modules.builtin`.

The decision (`plan` before the apt transaction, `settle` after it):

1. `TKBOX_KERNEL` set: that kernel, or an error naming the fact that fails (the
   operator chose it; nothing is installed in its place);
2. else the running kernel (`uname -r`) when every fact holds: no kernel package;
3. else the distribution's kernel package (`linux-image-generic` on Ubuntu,
   `linux-image-amd64` elsewhere): `plan` asks for it when it is not installed, and
   `settle` takes the newest kernel in /boot whose facts hold.

`settle` writes `TKBOX_KERNEL=<image>` to `GITHUB_ENV`, so tkbox boots exactly the
kernel decided here (its own rule, the newest in /boot, could pick another), and
`release`/`kernel` to `GITHUB_OUTPUT` for the cache keys. Every line it prints says
which kernel and why; a runner with no usable kernel is one `::error::` line naming
the fix.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tkbox.errors import TkboxError  # noqa: E402
from tkbox.image.kernel import (  # noqa: E402
    ELF_MAGIC,
    _mod_name,
    extract_vmlinux,
    find_kernel,
    payload,
)

#: what the guest cannot start without: the virtio-mmio transport and its core, the
#: disks, the serial ports (the mux), the image's squashfs, the overlays and ext4
REQUIRED = ("virtio", "virtio_ring", "virtio_mmio", "virtio_blk", "virtio_console",
            "squashfs", "overlay", "ext4")
def payload_compression(image: bytes) -> str:
    """The compression of a bzImage's payload, as `tkbox.image.kernel.payload` reads it
    from the setup header (the same magic table the unpacking uses)."""
    if image.startswith(ELF_MAGIC):
        return "none (an ELF kernel)"
    found = payload(image)
    if found is None:
        return "unknown (not a bzImage)"
    return found[0]


@dataclass
class Facts:
    """What was found about one kernel; `problems` empty means tkbox boots it."""

    release: str
    image: Path
    modules: Path | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def why(self) -> str:
        return "; ".join(self.problems) if self.problems else ", ".join(self.notes)


def names_in(path: Path) -> set[str]:
    """Module names listed in modules.dep (before each colon) or modules.builtin."""
    if not path.is_file():
        return set()
    text = path.read_text(errors="replace")
    if path.name == "modules.dep":
        return {_mod_name(line.split(":", 1)[0]) for line in text.splitlines() if ":" in line}
    return {_mod_name(x) for x in text.split()}


def examine(image: Path, may_sudo: bool = False,
            make_readable: Callable[[Path], bool] | None = None) -> Facts:
    """Every fact above about the kernel whose image is `image`."""
    m = re.search(r"vmlinu[xz]-(.+)$", image.name)
    facts = Facts(m.group(1) if m else image.name, image)
    if not image.is_file():
        facts.problems.append(f"{image} does not exist")
        return facts
    if not os.access(image, os.R_OK):
        if may_sudo and (make_readable or sudo_chmod)(image) and os.access(image, os.R_OK):
            facts.notes.append(f"{image} made readable (sudo chmod 0644)")
        else:
            facts.problems.append(f"{image} is readable by root only" + (
                "" if may_sudo else " (the install step makes it readable)"))
            return facts
    raw = image.read_bytes()
    try:
        extract_vmlinux(raw)
        facts.notes.append("its image unpacks to an ELF kernel")
    except TkboxError as exc:
        facts.problems.append(f"its image ({payload_compression(raw)}) does not unpack: "
                              f"{str(exc).split(';')[0]}")
    config = image.parent / f"config-{facts.release}"
    if config.is_file():
        if re.search(r"^CONFIG_PVH=y$", config.read_text(errors="replace"), re.M):
            facts.notes.append("PVH boot (CONFIG_PVH=y)")
        else:
            facts.problems.append(f"it cannot boot through PVH ({config} has no CONFIG_PVH=y)")
    try:
        kernel = find_kernel(str(image))  # tkbox's own rule: version, modules dir
    except TkboxError as exc:
        facts.problems.append(str(exc).split(";")[0])
        return facts
    facts.modules = kernel.modules_dir
    have = names_in(kernel.modules_dir / "modules.dep") | \
        names_in(kernel.modules_dir / "modules.builtin")
    missing = [m for m in REQUIRED if m not in have]
    if missing:
        facts.problems.append(f"{kernel.modules_dir} has neither module nor built-in "
                              f"{', '.join(missing)}")
    else:
        facts.notes.append(f"its modules ({', '.join(REQUIRED)}) are in {kernel.modules_dir}")
    return facts


def sudo_chmod(image: Path) -> bool:
    argv = ["chmod", "0644", str(image)]
    if os.geteuid() != 0:
        argv = ["sudo", "-n", *argv]
    try:
        return subprocess.run(argv, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def distribution_package(os_release: Path = Path("/etc/os-release")) -> str:
    """The distribution's own kernel package (the one scripts/setup.sh installs)."""
    text = os_release.read_text() if os_release.is_file() else ""
    ids = re.search(r"^ID=\"?([^\"\n]*)", text, re.M)
    return "linux-image-generic" if ids and ids.group(1) == "ubuntu" else "linux-image-amd64"


def installed(package: str) -> bool:
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "install ok installed" in r.stdout


def _version_key(name: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


@dataclass
class Decision:
    kernel: Facts | None  # the kernel tkbox boots, or None: none yet
    package: str  # the kernel package to install ("" for none)
    lines: list[str]  # for the log: which kernel and why
    error: str = ""  # no kernel, and nothing to install would give one


def decide(*, boot: Path = Path("/boot"), release: str | None = None,
           explicit: str | None = None, may_sudo: bool = False, after_install: bool = False,
           package: str | None = None, is_installed: Callable[[str], bool] = installed,
           make_readable: Callable[[Path], bool] | None = None) -> Decision:
    """The decision above. `after_install`: the apt transaction is done (`settle`)."""
    release = release or os.uname().release
    package = package or distribution_package()

    def look(image: Path) -> Facts:
        return examine(image, may_sudo, make_readable)

    if explicit:
        f = look(Path(explicit))
        if f.ok:
            return Decision(f, "", [f"tkbox: guest kernel {f.release} ({f.image}): the one "
                                    f"TKBOX_KERNEL names; {f.why()}"])
        return Decision(None, "", [], f"TKBOX_KERNEL={explicit} cannot boot tkbox's guest: "
                                      f"{f.why()}; point it at another kernel or unset it")
    running = look(boot / f"vmlinuz-{release}")
    if running.ok:
        return Decision(running, "", [
            f"tkbox: guest kernel {release} ({running.image}): the runner's own running "
            f"kernel, so no kernel package is installed: {running.why()}"])
    lines = [f"tkbox: the running kernel {release} cannot boot tkbox's guest: {running.why()}"]
    others = sorted((p for p in boot.glob("vmlinuz-*") if p != running.image),
                    key=lambda p: _version_key(p.name), reverse=True)
    tried: list[Facts] = []
    for image in others:
        f = look(image)
        if f.ok:
            return Decision(f, "", [*lines, f"tkbox: guest kernel {f.release} ({f.image}), "
                                            f"installed already: {f.why()}"])
        tried.append(f)
    lines += [f"tkbox: kernel {f.release} ({f.image}) cannot either: {f.why()}" for f in tried]
    if not after_install and not is_installed(package):
        return Decision(None, package, [*lines, f"tkbox: installing the distribution's kernel "
                                                f"package {package} for the guest"])
    return Decision(None, "", lines, (
        f"no kernel on this runner boots tkbox's guest (the running {release}: "
        f"{running.why()}" + "".join(f"; {f.release}: {f.why()}" for f in tried) +
        "); set TKBOX_KERNEL to an ELF vmlinux or a bzImage whose payload is XZ, ZSTD, "
        "LZ4, gzip, bzip2 or LZMA (Debian's and Ubuntu's are) and its modules in "
        "/lib/modules"))


def command_data(text: str) -> str:
    """`text` as a workflow command's message: one line, GitHub's escapes."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _append(var: str, text: str) -> None:
    path = os.environ.get(var)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("plan", "settle"):
        print("usage: guest_kernel.py plan|settle [--may-sudo]", file=sys.stderr)
        return 2
    d = decide(explicit=os.environ.get("TKBOX_KERNEL") or None, may_sudo="--may-sudo" in argv,
               after_install=argv[0] == "settle")
    for line in d.lines:
        print(line, flush=True)
    if d.error:
        print(f"::error title=tkbox guest kernel::{command_data(d.error)}", flush=True)
        return 1
    if argv[0] == "plan":
        _append("GITHUB_OUTPUT", f"package={d.package}\n")
        return 0
    if d.kernel is None:  # settle: every way out without a kernel is an error above
        return 1
    _append("GITHUB_ENV", f"TKBOX_KERNEL={d.kernel.image}\n")
    _append("GITHUB_OUTPUT", f"release={d.kernel.release}\nkernel={d.kernel.image}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
