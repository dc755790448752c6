"""The guest kernel unpacked whatever its distribution compressed it with (Debian's XZ,
Ubuntu's LZ4 or ZSTD, gzip, bzip2, LZMA), from the payload the bzImage's setup header
names; anything malformed is one HostError line."""

from __future__ import annotations

import bz2
import gzip
import lzma
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tkbox.errors import HostError
from tkbox.image.kernel import LZ4_LEGACY_MAGIC, extract_vmlinux, lz4_legacy, payload

ELF = Path(shutil.which("true") or "/bin/true").read_bytes() * 3  # an ELF, some MiB-ish


def bzimage(data: bytes, setup_sects: int = 4) -> bytes:
    """A bzImage as the boot protocol lays one out: setup sectors whose header says
    "HdrS" and where the payload is, then the protected-mode code holding it."""
    setup = bytearray((setup_sects + 1) * 512)
    setup[0x1F1] = setup_sects
    setup[0x202:0x206] = b"HdrS"
    offset = 0x300  # the decompressor's own code would sit before it
    struct.pack_into("<II", setup, 0x248, offset, len(data))
    return bytes(setup) + b"\x90" * offset + data + b"\x00" * 64


def lz4_cli(data: bytes, tmp: Path) -> bytes:
    if shutil.which("lz4") is None:
        pytest.skip("lz4 is installed by scripts/setup.sh")
    src = tmp / "k"
    src.write_bytes(data)
    subprocess.run(["lz4", "-l", "-9", "-f", "-q", str(src), str(tmp / "k.lz4")], check=True)
    # the kernel's build appends the uncompressed size after the frame (Makefile.lib)
    return (tmp / "k.lz4").read_bytes() + struct.pack("<I", len(data))


@pytest.mark.parametrize("kind, pack", [
    ("XZ", lambda d, t: lzma.compress(d, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32)),
    ("ZSTD", lambda d, t: zstandard.ZstdCompressor().compress(d) + struct.pack("<I", len(d))),
    ("LZ4", lz4_cli),
    ("gzip", lambda d, t: gzip.compress(d)),
    ("bzip2", lambda d, t: bz2.compress(d)),
    ("LZMA", lambda d, t: lzma.compress(d, format=lzma.FORMAT_ALONE)),
])
def test_every_distribution_compression_unpacks_to_the_elf_kernel(
        kind: str, pack: object, tmp_path: Path) -> None:
    packed = pack(ELF, tmp_path)  # type: ignore[operator]
    image = bzimage(packed)
    assert payload(image) is not None and payload(image)[0] == kind  # type: ignore[index]
    assert extract_vmlinux(image) == ELF


def test_an_lz4_kernel_of_many_blocks_and_long_matches_round_trips(tmp_path: Path) -> None:
    """More than one 8 MiB block, runs far longer than 15 (overlapping matches)."""
    data = ELF + bytes(9 << 20) + b"abc" * 500_000 + ELF
    assert lz4_legacy(lz4_cli(data, tmp_path), 1 << 30) == data


@pytest.mark.parametrize("bad, why", [
    (struct.pack("<I", LZ4_LEGACY_MAGIC) + struct.pack("<I", 1) + b"\xf0",
     "a literal length past the block"),
    (struct.pack("<I", LZ4_LEGACY_MAGIC) + struct.pack("<I", 3) + b"\x1f\x00\x00",
     "an offset past the block"),
    (struct.pack("<I", LZ4_LEGACY_MAGIC) + struct.pack("<I", 4) + b"\x01a\x05\x00",
     "a match before the block's start"),
    (struct.pack("<I", LZ4_LEGACY_MAGIC) + struct.pack("<I", 4) + b"\x01a\x00\x00",
     "a match before the block's start"),
    (b"\x00\x00\x00\x00", "not an LZ4 legacy frame"),
])
def test_a_malformed_lz4_kernel_is_refused(bad: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        lz4_legacy(bad, 1 << 20)
    with pytest.raises(HostError) as e:
        extract_vmlinux(bzimage(bad if bad.startswith(b"\x02") else b"\x02\x21\x4c\x18" + bad))
    assert "\n" not in str(e.value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_lz4_bytes_unpack_or_are_refused_as_malformed(body: bytes) -> None:
    data = struct.pack("<I", LZ4_LEGACY_MAGIC) + struct.pack("<I", len(body)) + body
    try:
        out = lz4_legacy(data, 1 << 16)
    except ValueError:
        return
    assert len(out) <= (1 << 16) + (8 << 20)


def test_a_payload_that_is_not_elf_or_not_known_is_one_line() -> None:
    for image, why in ((bzimage(gzip.compress(b"not a kernel")), "is not an ELF kernel"),
                       (bzimage(b"\x89LZO" + b"\x00" * 32), "LZO-compressed, which tkbox")):
        with pytest.raises(HostError, match=why) as e:
            extract_vmlinux(image)
        assert "\n" not in str(e.value)
