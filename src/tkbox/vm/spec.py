"""What a VM is made of, as data: its disks and its spec (`VMSpec`).

Plain values with no behaviour, apart from `tkbox.vm.base` so that a pure
core (`tkbox.vm.qemuargv`, the QEMU command line) can take a spec without
importing the launcher interface's I/O. `tkbox.vm.base` re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True)
class Disk:
    """A block device given to the guest, in order (vda, vdb, ...)."""

    path: Path
    read_only: bool
    role: str  # "root", "lower", "upper": the guest learns roles from its boot config


@dataclass(frozen=True)
class VMSpec:
    name: str
    kernel: Path  # an ELF vmlinux (PVH) or a bzImage
    initramfs: Path
    workdir: Path  # private 0700 directory owned by this VM
    disks: tuple[Disk, ...] = ()
    memory_mib: int = 1024
    vcpus: int = 1
    cmdline: str = ""  # appended to the launcher's own kernel command line
    extra: dict[str, str] = field(default_factory=dict)
