"""What QEMU is handed instead of the daemon's paths (`tkbox.vm.qemu.Wiring`): its ends
of socketpairs for the console, the mux and QMP, and descriptors for its disks.

No socket file exists for a VM, so no other local process can connect to a box's
mux, console or monitor, before QEMU or after: there is nothing to connect to. A
stand-in process plays QEMU and reports what it was handed; no VM is booted here
(tests/conformance/test_launcher.py and tests/e2e boot real QEMU)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tkbox.vm import qemu
from tkbox.vm.base import Disk, VMSpec

pytestmark = pytest.mark.integration

#: Plays QEMU: reports each descriptor it was handed, then serves QMP until killed.
STAND_IN = r"""
import fcntl, json, os, socket, stat, struct, sys, time
args = sys.argv[1:]
def is_open(fd):
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
        return True
    except OSError:
        return False
seen = {"chardevs": {}, "fdsets": {}, "paths": [],
        "open": [fd for fd in range(3, 1024) if is_open(fd)]}
for i, a in enumerate(args):
    if a == "-chardev":
        opts = dict(kv.split("=", 1) for kv in args[i + 1].split(",")[1:] if "=" in kv)
        s = socket.socket(fileno=int(opts["fd"]))
        cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        seen["chardevs"][opts["id"]] = {"type": int(s.type),
                                        "peer_pid": struct.unpack("3i", cred)[0]}
        s.detach()
    if a == "-add-fd":
        opts = dict(kv.split("=", 1) for kv in args[i + 1].split(","))
        mode = os.stat(int(opts["fd"])).st_mode
        acc = fcntl.fcntl(int(opts["fd"]), fcntl.F_GETFL) & os.O_ACCMODE
        seen["fdsets"].setdefault(opts["set"], []).append(
            {"regular": stat.S_ISREG(mode), "access": acc})
    if a in ("-kernel", "-initrd"):
        seen["paths"].append(args[i + 1])
json.dump(seen, open(os.path.join(os.path.dirname(__file__), "seen.json"), "w"))
qmp = [a for a in args if a.startswith("socket,id=qmp,")][0]
conn = socket.socket(fileno=int(qmp.rsplit("fd=", 1)[1]))
conn.sendall(b'{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, '
             b'"package": ""}, "capabilities": []}}\r\n')
dec, buf = json.JSONDecoder(), ""
while data := conn.recv(65536):
    buf += data.decode()
    while buf.strip():
        try:
            obj, end = dec.raw_decode(buf.lstrip())
        except ValueError:
            break
        buf = buf.lstrip()[end:]
        reply = {"return": {"status": "running", "running": True}}
        if "id" in obj:
            reply["id"] = obj["id"]
        conn.sendall(json.dumps(reply).encode() + b"\r\n")
time.sleep(600)
"""


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tks-", dir="/tmp"))
    bindir = d / "bin"
    bindir.mkdir()
    (bindir / "stand_in.py").write_text(STAND_IN)
    binary = bindir / qemu.QEMU
    binary.write_text(f"#!/bin/sh\nexec {sys.executable} {bindir / 'stand_in.py'} \"$@\"\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_no_socket_of_a_vm_can_be_reached_by_another_process(stand_in: Path) -> None:
    """Attack: another local process connects to a box's mux socket (before QEMU does,
    or after), to pose as the box's guest or its VMM, or opens its QMP monitor. QEMU's
    chardevs are its ends of socketpairs whose other ends the daemon holds; the VM's
    directory holds no socket at all, and the disks are handed open, read-only where
    the disk is."""
    for name in ("vmlinux", "initramfs", "root.img", "upper.img"):
        (stand_in / name).write_bytes(b"x" * 4096)
    spec = VMSpec(name="wired", kernel=stand_in / "vmlinux", initramfs=stand_in / "initramfs",
                  workdir=stand_in / "vm", disks=(Disk(stand_in / "root.img", True, "root"),
                                                   Disk(stand_in / "upper.img", False, "upper")))
    launcher = qemu.QemuLauncher(qemu.AccelDecision("tcg", "test"), templates=None)

    async def main() -> list[str]:
        vm = await launcher.start(spec)
        try:
            assert await vm.status() == "running"
            return [p.name for p in spec.workdir.iterdir() if stat.S_ISSOCK(p.lstat().st_mode)]
        finally:
            await vm.kill()

    sockets = asyncio.run(main())
    assert sockets == []
    seen = json.loads((stand_in / "bin" / "seen.json").read_text())
    assert set(seen["chardevs"]) == {"con", "mux", "qmp"}
    for dev in seen["chardevs"].values():
        assert dev == {"type": socket.SOCK_STREAM, "peer_pid": os.getpid()}  # the daemon's end
    # Disk 1 (root): one read-only descriptor; disk 2 (upper): one read-write.
    assert seen["fdsets"] == {"1": [{"regular": True, "access": os.O_RDONLY}],
                              "2": [{"regular": True, "access": os.O_RDWR}]}
    assert seen["paths"] == [str(spec.kernel), str(spec.initramfs)]
    # Nothing else is inherited: three chardevs and two disk descriptors.
    assert len(seen["open"]) == 5, seen["open"]
