"""QEMU's own output (its stdout and stderr) cannot fill the host's disk.

QEMU reports a guest's device faults on its stderr, one line each, as often as
the guest makes them: a box whose root loads a kernel module that resets the
virtio-rng device and offers it a ring entry past the ring's end, in a loop,
made QEMU write `qemu-system-x86_64: Guest says index 5 is available` 400,000
times (20,800,000 bytes of qemu.log in seconds, on a real box). A stand-in
plays QEMU here: it connects to the chardev sockets as QEMU does (`server=off`),
then writes what such a guest makes QEMU write. No VM is booted.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tkbox.vm import qemu
from tkbox.vm.base import VMSpec

pytestmark = pytest.mark.integration

LINE = b"qemu-system-x86_64: Guest says index 5 is available\n"
#: what ends a capped log (tkbox.vm.DROPPED)
DROPPED = b"\n[tkbox: output past this point was dropped]\n"

STAND_IN = r"""
import os, socket, sys
args = sys.argv[1:]
for i, a in enumerate(args):
    if a == "-chardev":
        opts = dict(kv.split("=", 1) for kv in args[i + 1].split(",")[1:] if "=" in kv)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(opts["path"])
        globals().setdefault("keep", []).append(s)
line, count = os.environ["FLOOD_LINE"].encode(), int(os.environ["FLOOD_COUNT"])
for _ in range(count):
    os.write(2, line)
os.write(1, b"stdout too\n")
open(os.environ["FLOOD_DONE"], "w").close()  # every write returned: QEMU never blocked
sys.stdin.read()  # /dev/null: EOF at once
import time
time.sleep(600)
"""


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths are short: the VM directory must be too.
    d = Path(tempfile.mkdtemp(prefix="tkq-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_guest_flooding_qemus_stderr_cannot_grow_qemu_log_past_its_cap(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: a guest kernel makes QEMU report a device fault in a loop, so that
    qemu.log (written by QEMU itself) fills the host's disk. The host keeps at most
    QEMU_LOG_CAP bytes of QEMU's output and reads the rest, so QEMU never blocks."""
    bindir = short_dir / "bin"
    bindir.mkdir()
    script = bindir / "stand_in.py"
    script.write_text(STAND_IN)
    binary = bindir / qemu.QEMU
    binary.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    binary.chmod(0o755)
    for name in ("vmlinux", "initramfs"):
        (short_dir / name).write_bytes(b"x")
    done = short_dir / "done"
    cap, count = 4096, 2000  # 2000 lines: 104,000 bytes, 25 times the cap
    monkeypatch.setattr(qemu, "QEMU_LOG_CAP", cap, raising=False)  # absent before the bound
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FLOOD_LINE", LINE.decode())
    monkeypatch.setenv("FLOOD_COUNT", str(count))
    monkeypatch.setenv("FLOOD_DONE", str(done))
    spec = VMSpec(name="flood", kernel=short_dir / "vmlinux",
                  initramfs=short_dir / "initramfs", workdir=short_dir / "vm")
    launcher = qemu.QemuLauncher(qemu.AccelDecision("tcg", "test"), templates=None)

    async def main() -> None:
        vm = await launcher.start(spec)
        try:
            async with asyncio.timeout(60):  # a guard: the stand-in writes at once
                while not done.exists():
                    await asyncio.sleep(0.02)
        finally:
            await vm.kill()

    asyncio.run(main())
    log = (spec.workdir / "qemu.log").read_bytes()
    assert len(log) <= cap + len(DROPPED), len(log)
    assert log.startswith(LINE)
    assert log.endswith(DROPPED)
