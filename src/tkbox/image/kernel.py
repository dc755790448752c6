"""The guest kernel: find it, extract its ELF `vmlinux`, list the modules to load.

Debian's kernel is an XZ-compressed bzImage with `CONFIG_PVH=y`. Booting the
ELF `vmlinux` through PVH is more than twice as fast under emulation, and
Firecracker needs the ELF anyway, so we extract it once (find the XZ stream in
the bzImage, decompress it) and cache it by the bzImage's digest.

Written by hand: no packaged tool extracts vmlinux (the kernel's own
`scripts/extract-vmlinux` is a shell script not shipped in Debian's packages).
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tkbox._fs import write_atomic
from tkbox.errors import HostError, UserError

XZ_MAGIC = b"\xfd7zXZ\x00"
ELF_MAGIC = b"\x7fELF"

#: what the guest needs, by module name; dependencies are added from modules.dep
GUEST_MODULES = (
    "virtio_mmio",
    "virtio_blk",
    "virtio_console",
    "virtio_rng",
    "squashfs",
    "overlay",
    "crc32c_generic",  # ext4 asks the crypto API for crc32c at mount; no modprobe here
    "ext4",
    "vmw_vsock_virtio_transport",
)


@dataclass(frozen=True)
class Kernel:
    version: str
    image: Path  # the bzImage as installed
    modules_dir: Path  # /lib/modules/<version>

    def module_paths(self) -> list[Path]:
        """The guest's modules and their dependencies, dependencies first."""
        return resolve_modules(self.modules_dir, GUEST_MODULES)


def find_kernel(explicit: str | None = None) -> Kernel:
    """The kernel to boot: `TKBOX_KERNEL`/explicit path, else the newest in /boot."""
    explicit = explicit or os.environ.get("TKBOX_KERNEL")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise UserError(f"kernel {path} does not exist; install one with "
                            "'apt-get install linux-image-amd64' or unset TKBOX_KERNEL")
        m = re.search(r"vmlinu[xz]-(.+)$", path.name)
        version = m.group(1) if m else ""
    else:
        candidates = sorted(Path("/boot").glob("vmlinuz-*"), key=lambda p: _version_key(p.name))
        if not candidates:
            raise HostError("no guest kernel found in /boot; install one with "
                            "'sudo apt-get install linux-image-amd64'")
        path = candidates[-1]
        version = path.name.removeprefix("vmlinuz-")
    mods = Path(os.environ.get("TKBOX_MODULES_ROOT", "/lib/modules")) / version
    if not (mods / "modules.dep").is_file():
        raise HostError(f"kernel modules for {version} are missing ({mods}/modules.dep); "
                        f"reinstall the kernel package: 'sudo apt-get install --reinstall "
                        f"linux-image-{version}'")
    return Kernel(version, path, mods)


def _version_key(name: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def resolve_modules(modules_dir: Path, wanted: tuple[str, ...]) -> list[Path]:
    """Modules named in `wanted` that exist (as modules) plus their dependencies,
    in an order where every module comes after what it depends on."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        if ":" not in line:
            continue
        mod, _, rest = line.partition(":")
        deps[mod] = rest.split()
        by_name[_mod_name(mod)] = mod
    builtin = set()
    bi = modules_dir / "modules.builtin"
    if bi.is_file():
        builtin = {_mod_name(x) for x in bi.read_text().split()}
    order: list[str] = []
    seen: set[str] = set()

    def visit(mod: str) -> None:
        if mod in seen:
            return
        seen.add(mod)
        for dep in deps.get(mod, []):
            visit(dep)
        order.append(mod)

    for name in wanted:
        found = by_name.get(name)
        if found is None:
            if name in builtin:
                continue
            continue  # absent from this kernel: the guest copes (e.g. no vsock)
        visit(found)
    return [modules_dir / m for m in order]


def _mod_name(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    for suffix in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.replace("-", "_")


def read_module(path: Path) -> bytes:
    """A module's ELF bytes, decompressed if the distribution compressed it."""
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith(".zst"):
        import subprocess

        return subprocess.run(["zstd", "-dc", str(path)], check=True, capture_output=True).stdout
    if path.name.endswith(".gz"):
        import gzip

        return gzip.decompress(data)
    return data


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The ELF kernel inside an XZ-compressed bzImage (or the input, if already ELF)."""
    if bzimage.startswith(ELF_MAGIC):
        return bzimage
    start = 0
    while True:
        i = bzimage.find(XZ_MAGIC, start)
        if i < 0:
            raise HostError("could not find an XZ-compressed kernel inside the bzImage; "
                            "set TKBOX_KERNEL to an ELF vmlinux")
        try:
            out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(bzimage[i:])
        except lzma.LZMAError:
            start = i + 1
            continue
        if out.startswith(ELF_MAGIC):
            return out
        start = i + 1


def cached_vmlinux(kernel: Kernel, cache: Path) -> Path:
    """Extract once per bzImage digest; returns the path of the ELF vmlinux."""
    raw = kernel.image.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()[:16]
    out = cache / f"vmlinux-{kernel.version}-{digest}"
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    write_atomic(out, extract_vmlinux(raw))
    return out
