"""FirecrackerLauncher under a stand-in of Firecracker's own jailer, end to end.

The stand-in (tests/unit/vm/fake_jailer.py) refuses any command line the
jailer's documentation does not allow, builds the chroot directory the doc names,
copies the binary in, drops to the VM's uid and execs it; the stand-in Firecracker
then serves its API and vsock device from that directory, as that uid. What the
launcher must do around it is checked here: the VM's files placed in the chroot for
that uid alone, the vsock listeners reachable by that uid alone, and everything
given back when the VM ends. Firecracker itself cannot run on this host
(docs/firecracker.md); these are the parts that do not need it.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tkbox.protocol.ports import PORT_BOOT, Ports
from tkbox.protocol.streams import ByteStream
from tkbox.vm.base import Disk, VMSpec
from tkbox.vm.firecracker import FirecrackerJailer, FirecrackerLauncher, FirecrackerVM, jail_id
from tkbox.vm.jail import DEFAULT_UIDS, LEASES

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parents[2] / "unit" / "vm"
SYSTEM_PYTHON = Path("/usr/bin/python3")


@pytest.fixture
def jailed(tmp_path: Path) -> Iterator[tuple[FirecrackerLauncher, VMSpec]]:
    if os.geteuid() != 0:
        pytest.skip("Firecracker's jailer runs as root")
    if not SYSTEM_PYTHON.exists() or os.system(f"{SYSTEM_PYTHON} -c 'import yaml'") != 0:  # noqa: S605
        pytest.skip(f"{SYSTEM_PYTHON} with yaml is needed for the stand-in under its own uid")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    binary = bindir / "firecracker"
    binary.write_text(f"#!/bin/sh\nexec {SYSTEM_PYTHON} {HERE / 'fake_firecracker.py'} "
                      "--behave agent \"$@\"\n")
    jailer = bindir / "jailer"
    jailer.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'fake_jailer.py'} \"$@\"\n")
    for p in (binary, jailer):
        p.chmod(0o755)
    files = tmp_path / "files"
    files.mkdir()
    (files / "vmlinux").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(57))
    (files / "initramfs").write_bytes(b"070701")
    for role in ("root", "upper"):
        (files / f"{role}.img").write_bytes(bytes(4096))
        (files / f"{role}.img").chmod(0o600)
    base = Path(f"/tmp/tkj-{os.getpid()}")
    spec = VMSpec(name="jailed", kernel=files / "vmlinux", initramfs=files / "initramfs",
                  workdir=base / "vm", disks=(Disk(files / "root.img", True, "root"),
                                              Disk(files / "upper.img", False, "upper")),
                  memory_mib=256)
    cell = FirecrackerJailer(jailer, base / "jail", DEFAULT_UIDS, cgroup_version=1)
    yield FirecrackerLauncher(binary, jailer=cell), spec
    import shutil

    shutil.rmtree(base, ignore_errors=True)


def leased(uid: int) -> bool:
    fd = os.open(LEASES / str(uid), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_jailed_firecracker_runs_as_its_own_uid_on_files_lent_to_it(
        jailed: tuple[FirecrackerLauncher, VMSpec]) -> None:
    launcher, spec = jailed
    upper = spec.disks[1].path

    async def main() -> None:
        reached = asyncio.Event()

        async def boot(stream: ByteStream) -> None:
            reached.set()
            await stream.aclose()

        def serve(ports: Ports) -> None:
            ports.serve(PORT_BOOT, boot)

        vm = await launcher.start(spec, before_boot=serve)
        assert isinstance(vm, FirecrackerVM) and vm.cell is not None
        uid, root = vm.cell.lease.uid, vm.cell.root
        try:
            await asyncio.wait_for(reached.wait(), 15)  # the guest reached port 1026
            assert DEFAULT_UIDS[0] <= uid <= DEFAULT_UIDS[1] and leased(uid)
            assert vm.isolation == f"jailed uid {uid} by Firecracker's jailer, chroot, cgroup"
            facts = json.loads((root / "fake-proc.json").read_text())
            assert (facts["uid"], facts["gid"]) == (uid, uid)
            assert facts["cwd"] == str(root)
            assert set(facts["env"]) <= {"PWD", "LC_CTYPE"}  # set by sh and Python themselves
            assert f"--id={jail_id(uid)}" in facts["argv"]
            asked = json.loads((launcher.jailer.chroot_base  # type: ignore[union-attr]
                                / f"fake-jailer-{jail_id(uid)}.json").read_text())
            assert asked["parent_cgroup"] == "tkbox-vmm"
            assert asked["cgroups"][0] == f"memory.limit_in_bytes={(256 + 256) << 20}"
            # The writable disk is the VM's uid's while it runs; the rest is only read.
            assert (root / "disk1").stat().st_uid == uid and upper.stat().st_uid == uid
            assert (root / "vmlinux").stat().st_mode & 0o004
            listener = root / "v.sock_1026"
            st = listener.lstat()
            assert stat.S_ISSOCK(st.st_mode) and st.st_uid == uid
            assert stat.S_IMODE(st.st_mode) == 0o600
        finally:
            await vm.kill()
        await vm.wait()
        assert not root.parent.exists()  # the chroot is gone
        assert upper.stat().st_uid == 0  # the disk is given back
        assert not leased(uid)

    asyncio.run(main())


def test_only_the_jailed_vmms_uid_reaches_its_vsock_listeners(
        jailed: tuple[FirecrackerLauncher, VMSpec]) -> None:
    """Attack: another local process connects to a jailed VM's port-1026 listener to
    pose as its guest. The listener takes connections from the VM's own uid only:
    root's (this test's) connection is closed unanswered, and its handler never runs."""
    launcher, spec = jailed

    async def main() -> None:
        served = []

        async def boot(stream: ByteStream) -> None:
            served.append(await stream.receive())
            await stream.aclose()

        release = asyncio.Event()

        async def hold(stream: ByteStream) -> None:
            await release.wait()
            await stream.aclose()

        def serve(ports: Ports) -> None:
            ports.serve(PORT_BOOT, hold)

        vm = await launcher.start(spec, before_boot=serve)
        try:
            assert vm.cell is not None  # type: ignore[attr-defined]
            path = vm.cell.root / "v.sock_1026"  # type: ignore[attr-defined]
            vm.ports.serve(1027, boot)
            other = vm.cell.root / "v.sock_1027"  # type: ignore[attr-defined]
            for listener in (path, other):
                # root may connect (the socket is 0600, the VM uid's); it is closed at once
                reader, writer = await asyncio.open_unix_connection(str(listener))
                try:
                    # closed before or after these bytes: either way, unanswered
                    writer.write(b"impostor\n")
                    got = await asyncio.wait_for(reader.read(100), 5)
                except (ConnectionResetError, BrokenPipeError):
                    got = b""
                assert got == b""
                writer.close()
            await asyncio.sleep(0.2)
            assert served == []
        finally:
            release.set()
            await vm.kill()
        await vm.wait()

    asyncio.run(main())
