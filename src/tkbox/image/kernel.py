"""The guest kernel: find it, extract its ELF `vmlinux`, list the modules to load.

Debian's kernel is an XZ-compressed bzImage with `CONFIG_PVH=y`; Ubuntu's are LZ4
or ZSTD. Booting the ELF `vmlinux` through PVH is more than twice as fast under
emulation, and Firecracker needs the ELF anyway, so we extract it once (the
payload the bzImage's setup header points at, unpacked) and cache it by the
bzImage's digest.

Written by hand: no packaged tool extracts vmlinux (the kernel's own
`scripts/extract-vmlinux` is a shell script not shipped in Debian's packages),
and the standard library has no LZ4 (`lz4_legacy`).
"""

from __future__ import annotations

import bz2
import hashlib
import lzma
import os
import re
import struct
import zlib
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
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if path.name.endswith(".gz"):
        import gzip

        return gzip.decompress(data)
    return data


#: a bzImage payload's first bytes, by compression (the kernel's Makefile.lib suffixes)
PAYLOADS = (
    (XZ_MAGIC, "XZ"),
    (b"\x28\xb5\x2f\xfd", "ZSTD"),
    (b"\x02\x21\x4c\x18", "LZ4"),
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\x89LZO", "LZO"),
    (b"\x5d\x00\x00", "LZMA"),
)
#: the largest kernel tkbox unpacks (a distribution's is 30-80 MB)
MAX_VMLINUX = 512 << 20


def payload(bzimage: bytes) -> tuple[str, bytes] | None:
    """A bzImage's compressed kernel and its compression, from its setup header
    (Linux Documentation/arch/x86/boot.rst: `setup_sects` at 0x1f1, "HdrS" at 0x202,
    `payload_offset` at 0x248 and `payload_length` at 0x24c, from the protected-mode
    code at (setup_sects + 1) * 512; boot protocol 2.08 and later)."""
    if len(bzimage) < 0x250 or bzimage[0x202:0x206] != b"HdrS":
        return None
    setup_sects = bzimage[0x1F1] or 4
    offset, length = struct.unpack_from("<II", bzimage, 0x248)
    start = (setup_sects + 1) * 512 + offset
    # payload_length when the header gives it, else the rest of the image
    data = bzimage[start:start + length] if length else bzimage[start:]
    if not data or (length and len(data) != length):
        return None
    for magic, name in PAYLOADS:
        if data.startswith(magic):
            return name, data
    return f"unknown ({data[:4].hex()})", data


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The ELF kernel inside a bzImage (or the input, if already ELF): its payload
    unpacked whatever the distribution compressed it with (Debian: XZ; Ubuntu: LZ4 or
    ZSTD; others gzip, bzip2, LZMA). Old images without `payload_offset` are searched
    for an XZ stream."""
    if bzimage.startswith(ELF_MAGIC):
        return bzimage
    found = payload(bzimage)
    if found is not None:
        kind, data = found
        try:
            out = _unpack(kind, data)
        except (lzma.LZMAError, OSError, EOFError, ValueError) as exc:
            raise HostError(f"the kernel's {kind} payload does not unpack ({exc}); set "
                            "TKBOX_KERNEL to another kernel or an ELF vmlinux") from None
        if out is None:
            raise HostError(f"the kernel's payload is {kind}-compressed, which tkbox does not "
                            "unpack; set TKBOX_KERNEL to a kernel compressed with XZ, ZSTD, "
                            "LZ4, gzip, bzip2 or LZMA, or to an ELF vmlinux")
        if not out.startswith(ELF_MAGIC):
            raise HostError(f"the kernel's {kind} payload is not an ELF kernel; set "
                            "TKBOX_KERNEL to an ELF vmlinux")
        return out
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


def _unpack(kind: str, data: bytes) -> bytes | None:
    if kind == "XZ":
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data, MAX_VMLINUX)
    if kind == "LZMA":
        return lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(data, MAX_VMLINUX)
    if kind == "ZSTD":
        try:
            import zstandard
        except ImportError:  # the Action decides the kernel before tkbox is installed
            import subprocess

            zstd = subprocess.run(["zstd", "-dc"], input=data, capture_output=True,
                                  check=False)
            if zstd.returncode != 0 and not zstd.stdout.startswith(ELF_MAGIC):
                raise OSError("zstd could not unpack it") from None
            return zstd.stdout[:MAX_VMLINUX]
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)[:MAX_VMLINUX]
    if kind == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, MAX_VMLINUX)
    if kind == "bzip2":
        return bz2.BZ2Decompressor().decompress(data, MAX_VMLINUX)
    if kind == "LZ4":
        return lz4_legacy(data, MAX_VMLINUX)
    return None


LZ4_LEGACY_MAGIC = 0x184C2102
_LZ4_LEGACY_BLOCK = 8 << 20  # each block decompresses to at most 8 MiB


def lz4_legacy(data: bytes, limit: int) -> bytes:
    """LZ4's legacy frame (what the kernel's `lz4 -l` writes): the magic 0x184C2102,
    then blocks, each a 4-byte little-endian compressed size and an LZ4 block
    (lz4/doc/lz4_Frame_format.md, "Legacy frame"; lz4_Block_format.md), until the
    data or a size that is the magic again (a concatenated frame) ends it. Written by
    hand: the standard library has no LZ4, and one unpack per kernel, cached, does
    not need a compiled decoder. Raises ValueError on anything malformed."""
    if len(data) < 4 or struct.unpack_from("<I", data)[0] != LZ4_LEGACY_MAGIC:
        raise ValueError("not an LZ4 legacy frame")
    out = bytearray()
    pos = 4
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, pos)
        if size == LZ4_LEGACY_MAGIC:
            pos += 4
            continue
        pos += 4
        if size == 0 or pos + size > len(data):
            break  # what follows the kernel's frame (its size field, padding)
        out += _lz4_block(data, pos, pos + size, _LZ4_LEGACY_BLOCK)
        pos += size
        if len(out) > limit:
            raise ValueError(f"more than {limit} bytes")
    return bytes(out)


def _lz4_block(src: bytes, i: int, end: int, limit: int) -> bytearray:
    """One LZ4 block, `src[i:end]`, decompressed (at most `limit` bytes)."""
    out = bytearray()
    while i < end:
        token = src[i]
        i += 1
        n = token >> 4
        if n == 15:
            while True:
                if i >= end:
                    raise ValueError("a literal length past the block")
                b = src[i]
                i += 1
                n += b
                if b != 255:
                    break
        if i + n > end:
            raise ValueError("literals past the block")
        out += src[i:i + n]
        i += n
        if i >= end:
            break  # the last sequence: literals only
        if i + 2 > end:
            raise ValueError("an offset past the block")
        offset = src[i] | src[i + 1] << 8
        i += 2
        m = (token & 15) + 4
        if token & 15 == 15:
            while True:
                if i >= end:
                    raise ValueError("a match length past the block")
                b = src[i]
                i += 1
                m += b
                if b != 255:
                    break
        if offset == 0 or offset > len(out):
            raise ValueError("a match before the block's start")
        if len(out) + m > limit:
            raise ValueError("a block larger than its limit")
        start = len(out) - offset
        if offset >= m:
            out += out[start:start + m]
        else:  # overlapping: the last `offset` bytes repeat
            pattern = out[start:]
            out += (pattern * (m // offset + 1))[:m]
    return out


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
