"""The Action decides which kernel boots the guest from facts about the runner's
kernels, with the code `tkbox guest build` runs, and installs a kernel package only
when no kernel on the runner will do (`action/guest_kernel.py`).

Each runner here is a folder: `/boot` with bzImages made here (a real setup header;
an XZ payload holding an ELF, or an LZ4/ZSTD payload tkbox cannot unpack), their
configs, and `/lib/modules/<release>` with modules.dep and modules.builtin.
"""

from __future__ import annotations

import lzma
import struct
from pathlib import Path

import pytest
import zstandard
from action import guest_kernel as gk

ALL = ["kernel/drivers/virtio/virtio.ko", "kernel/drivers/virtio/virtio_ring.ko",
       "kernel/drivers/virtio/virtio_mmio.ko", "kernel/drivers/block/virtio_blk.ko",
       "kernel/drivers/char/virtio_console.ko", "kernel/fs/squashfs/squashfs.ko",
       "kernel/fs/overlayfs/overlay.ko", "kernel/fs/ext4/ext4.ko.xz"]


def bzimage(payload: bytes) -> bytes:
    """A bzImage's first sectors: setup_sects 1, "HdrS", payload_offset 16."""
    img = bytearray(1024 + 16)
    img[0x1F1] = 1
    img[0x202:0x206] = b"HdrS"
    struct.pack_into("<I", img, 0x248, 16)
    return bytes(img) + payload


ELF = b"\x7fELF" + b"\0" * 60
XZ_ELF = bzimage(lzma.compress(ELF, format=lzma.FORMAT_XZ))
# Ubuntu's kernels: LZ4's legacy frame (one block of literals) and ZSTD
LZ4_ELF = bzimage(b"\x02\x21\x4c\x18" + struct.pack("<I", 2 + len(ELF))
                  + bytes([0xF0, len(ELF) - 15]) + ELF)
ZSTD_ELF = bzimage(zstandard.ZstdCompressor().compress(ELF))
# a compression tkbox does not unpack, and an LZ4 payload that is not a kernel
LZO = bzimage(b"\x89LZO" + b"\0" * 64)
LZ4_JUNK = bzimage(b"\x02\x21\x4c\x18" + b"\0" * 64)


def add_kernel(root: Path, release: str, image: bytes, *, modules: list[str] = ALL,
               builtin: list[str] = (), pvh: bool | None = True) -> Path:
    boot = root / "boot"
    boot.mkdir(parents=True, exist_ok=True)
    (boot / f"vmlinuz-{release}").write_bytes(image)
    if pvh is not None:
        (boot / f"config-{release}").write_text(
            "CONFIG_PVH=y\n" if pvh else "# CONFIG_PVH is not set\n")
    mods = root / "modules" / release
    mods.mkdir(parents=True)
    (mods / "modules.dep").write_text("".join(f"{m}:\n" for m in modules))
    (mods / "modules.builtin").write_text("".join(f"{m}\n" for m in builtin))
    return boot / f"vmlinuz-{release}"


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TKBOX_MODULES_ROOT", str(tmp_path / "modules"))
    monkeypatch.delenv("TKBOX_KERNEL", raising=False)
    return tmp_path


def decide(root: Path, release: str = "6.8.0-1-azure", **kw: object) -> gk.Decision:
    kw.setdefault("package", "linux-image-generic")
    kw.setdefault("is_installed", lambda p: False)
    return gk.decide(boot=root / "boot", release=release, **kw)  # type: ignore[arg-type]


def test_the_running_kernel_is_used_when_it_boots_the_guest(runner: Path):
    image = add_kernel(runner, "6.8.0-1-azure", XZ_ELF)
    add_kernel(runner, "6.9.0-2-generic", XZ_ELF)  # newer, installed: not the one chosen
    d = decide(runner)
    assert d.kernel is not None and d.kernel.image == image and d.package == ""
    assert d.lines == [f"tkbox: guest kernel 6.8.0-1-azure ({image}): the runner's own "
                       "running kernel, so no kernel package is installed: its image "
                       "unpacks to an ELF kernel, PVH boot (CONFIG_PVH=y), its modules "
                       "(virtio, virtio_ring, virtio_mmio, virtio_blk, virtio_console, "
                       f"squashfs, overlay, ext4) are in {runner}/modules/6.8.0-1-azure"]


def test_built_in_drivers_count_as_present(runner: Path):
    add_kernel(runner, "6.8.0-1-azure", XZ_ELF, modules=ALL[5:], builtin=ALL[:5])
    assert decide(runner).kernel is not None


@pytest.mark.parametrize(("image", "kw", "why"), [
    (LZO, {}, "its image (LZO) does not unpack: the kernel's payload is LZO-compressed, "
              "which tkbox does not unpack"),
    (LZ4_JUNK, {}, "its image (LZ4) does not unpack: the kernel's LZ4 payload is not an "
                   "ELF kernel"),
    (XZ_ELF, {"pvh": False}, "cannot boot through PVH"),
    (XZ_ELF, {"modules": ALL[:3] + ALL[5:]}, "has neither module nor built-in "
                                             "virtio_blk, virtio_console"),
])
def test_a_running_kernel_that_cannot_boot_the_guest_brings_the_package(
        runner: Path, image: bytes, kw: dict[str, object], why: str):
    add_kernel(runner, "6.8.0-1-azure", image, **kw)  # type: ignore[arg-type]
    d = decide(runner)
    assert d.kernel is None and d.package == "linux-image-generic" and not d.error
    assert why in d.lines[0] and d.lines[0].startswith("tkbox: the running kernel 6.8.0-1-azure")
    assert d.lines[-1] == ("tkbox: installing the distribution's kernel package "
                           "linux-image-generic for the guest")
    # after the apt transaction, the package's kernel is taken
    image = add_kernel(runner, "6.8.0-51-generic", XZ_ELF)
    d = decide(runner, after_install=True)
    assert d.kernel is not None and d.kernel.image == image and not d.package


def test_no_config_file_is_not_known_and_not_refused(runner: Path):
    add_kernel(runner, "6.8.0-1-azure", XZ_ELF, pvh=None)
    d = decide(runner)
    assert d.kernel is not None and "PVH" not in d.lines[0]


def test_an_unreadable_image_is_made_readable_only_when_the_step_may(
        runner: Path, monkeypatch: pytest.MonkeyPatch):
    image = add_kernel(runner, "6.8.0-1-azure", XZ_ELF)
    readable: set[Path] = set()
    real_access = gk.os.access
    monkeypatch.setattr(gk.os, "access", lambda p, m: Path(p) in readable
                        if Path(p) == image else real_access(p, m))

    def chmod(p: Path) -> bool:
        readable.add(p)
        return True

    d = decide(runner, make_readable=chmod)
    assert d.kernel is None and "readable by root only (the install step makes it " \
        "readable)" in d.lines[0]
    d = decide(runner, may_sudo=True, make_readable=chmod)
    assert d.kernel is not None and "made readable (sudo chmod 0644)" in d.lines[0]


@pytest.mark.parametrize("image", [LZ4_ELF, ZSTD_ELF], ids=["lz4", "zstd"])
def test_ubuntus_lz4_and_zstd_kernels_boot_the_guest_with_no_package(runner: Path,
                                                                    image: bytes):
    add_kernel(runner, "6.8.0-1-azure", image)
    d = decide(runner)
    assert d.kernel is not None and not d.package
    assert "its image unpacks to an ELF kernel" in d.lines[0]


def test_no_kernel_after_the_install_is_one_error_naming_the_fix(runner: Path):
    add_kernel(runner, "6.8.0-1-azure", LZO)
    add_kernel(runner, "6.8.0-51-generic", LZO)
    d = decide(runner, after_install=True)
    assert d.kernel is None and "\n" not in d.error
    assert d.error.startswith("no kernel on this runner boots tkbox's guest (the running "
                              "6.8.0-1-azure: its image (LZO) does not unpack")
    assert "6.8.0-51-generic: its image (LZO) does not unpack" in d.error
    assert d.error.endswith("set TKBOX_KERNEL to an ELF vmlinux or a bzImage whose payload "
                            "is XZ, ZSTD, LZ4, gzip, bzip2 or LZMA (Debian's and Ubuntu's "
                            "are) and its modules in /lib/modules")
    # the package is installed already and does not help: said before any apt run
    d = decide(runner, is_installed=lambda p: True)
    assert d.error and not d.package


def test_tkbox_kernel_is_the_operators_choice(runner: Path):
    good = add_kernel(runner, "6.1.0-57-amd64", XZ_ELF)
    add_kernel(runner, "6.8.0-1-azure", XZ_ELF)
    d = decide(runner, explicit=str(good))
    assert d.kernel is not None and d.kernel.image == good
    assert "the one TKBOX_KERNEL names" in d.lines[0]
    bad = add_kernel(runner, "6.9.0-1-lzo", LZO)
    d = decide(runner, explicit=str(bad))
    assert d.kernel is None and not d.package, "nothing is installed in its place"
    assert d.error.startswith(f"TKBOX_KERNEL={bad} cannot boot tkbox's guest: its image "
                              "(LZO) does not unpack")


def test_the_payload_compression_is_read_from_the_setup_header():
    assert gk.payload_compression(XZ_ELF) == "XZ"
    assert gk.payload_compression(LZ4_ELF) == "LZ4"
    assert gk.payload_compression(ZSTD_ELF) == "ZSTD"
    assert gk.payload_compression(b"\x7fELF...") == "none (an ELF kernel)"
    assert gk.payload_compression(b"junk") == "unknown (not a bzImage)"
