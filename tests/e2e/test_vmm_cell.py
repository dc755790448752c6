"""Each box's QEMU in a cell of its own (`tkbox.vm.jail`), on real VMs.

What a guest that escapes QEMU through a device-model bug lands in is asked the way
it would ask: `vmm_probe.c` (beside this file) is run exactly as the jailer runs a
box's QEMU (through the launcher's own code, at QEMU's own path in the cell, with
QEMU's uid, namespaces, root, cgroup and descriptors), and as the daemon. The
daemon reaches everything it names; the cell reaches none of it. Then, through the
real CLI and daemon: a VMM past its memory limit is killed by the kernel, its box is
contained and its run says why, and the other box, restored from the same template
under another uid, runs on over its mux.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_stack import Stack, export_verified, fresh_name, make_home, stack_env

from tkbox import paths
from tkbox.image.initramfs import build
from tkbox.image.kernel import find_kernel
from tkbox.vm.base import Disk, VMSpec
from tkbox.vm.jail import (
    DEFAULT_UIDS,
    Jail,
    JailConfig,
    RootPlan,
    chroot_problem,
    decide,
    qemu_plan,
    resolve,
)
from tkbox.vm.qemu import QemuLauncher, _Handles, _spawn, decide_accel, qemu_binary

PROBE_SRC = Path(__file__).with_name("vmm_probe.c")


def require_jail() -> Jail:
    """This host's cell for a VMM, as `tkbox daemon` decides it (root mode here)."""
    jail = decide(JailConfig(), qemu_binary(), paths.private_dir(paths.guest_build()))
    if jail.mode != "root":
        if os.environ.get("CI") and chroot_problem() is None:
            pytest.fail(f"CI runs as root, but no root-mode cell here: {jail.summary()}")
        pytest.skip(f"a VMM cannot be given a uid of its own here: {jail.summary()}")
    return jail


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the probe")
    out = tmp_path_factory.mktemp("probe") / "vmm_probe"
    subprocess.run([cc, "-O2", "-Wall", "-Werror", "-o", str(out), str(PROBE_SRC)], check=True)
    out.chmod(0o755)
    return out


def vmm_of(vm_dir: Path) -> tuple[int, int]:
    """(jailer, QEMU) of the VM whose directory is `vm_dir`: the jailer's cwd is it."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if Path(os.readlink(d / "cwd")) == vm_dir.resolve():
                kids = (d / "task" / d.name / "children").read_text().split()
                if kids:
                    return int(d.name), int(kids[0])
    raise AssertionError(f"no jailed VMM runs in {vm_dir}")


def status(pid: int) -> dict[str, str]:
    return dict(line.split(":", 1) for line in
                Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)


def host_address() -> str | None:
    """This host's address on its default route (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") else addr


def probe_as_daemon(probe: Path, checks: list[str]) -> dict[str, str]:
    out = subprocess.run([str(probe), *checks], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return parse(out)


def parse(out: str) -> dict[str, str]:
    got = {}
    for line in out.splitlines():
        check, _, rest = line.partition(" ")
        got[check] = rest
    return got


async def probe_in_cell(jail: Jail, probe: Path, checks: list[str],
                        work: Path) -> tuple[dict[str, str], dict[str, object]]:
    """Run the probe as the launcher runs a box's QEMU: the same `_cell` (a uid leased,
    a cgroup with the box's limits, the kernel and initramfs bound), the same root
    plan with the probe bound at QEMU's path, the same descriptors (`_Handles`: the
    chardevs' socketpairs, a disk of its own) and the same `_spawn`. Returns what it
    printed, and what the host sees of it while it runs."""
    kernel = find_kernel()
    cache = paths.private_dir(paths.guest_build())
    guest = build(cache, kernel=kernel)
    launcher = QemuLauncher(decide_accel(kernel.version, cache), templates=None, jail=jail)
    disk = work / "own.img"
    disk.write_bytes(bytes(1 << 20))
    spec = VMSpec(name="probe", kernel=guest.kernel, initramfs=guest.initramfs,
                  workdir=work / "vm", disks=(Disk(disk, False, "upper"),), memory_mib=512)
    paths.private_dir(spec.workdir)
    qemu = qemu_binary()
    real = resolve(qemu, {})
    plan = qemu_plan(qemu)
    assert (real, real) in plan.binds
    cell = launcher._cell(spec)
    cell.plan = RootPlan(tuple((str(probe) if dst == real else src, dst)
                               for src, dst in plan.binds), plan.links)
    handles = _Handles(spec, cell)
    own = [f"fd:{fd}" for fd in handles.wiring.fds()]
    proc = await _spawn([qemu, *checks, *own, "whoami", "procs", "sleep:3"], spec.workdir,
                        handles, cell)
    facts: dict[str, object] = {"uid": cell.uid}
    try:
        assert proc.stdout is not None
        out = b""
        while b"procs " not in out:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line, f"the probe ended early: {out!r}"
            out += line
        jailer = proc.pid
        pid = int(Path(f"/proc/{jailer}/task/{jailer}/children").read_text().split()[0])
        facts["status"] = status(pid)
        facts["cgroup"] = Path(f"/proc/{pid}/cgroup").read_text()
        facts["ns"] = {ns: os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
                       for ns in ("mnt", "pid", "net", "ipc", "uts", "cgroup")}
        facts["root"] = sorted(os.listdir(f"/proc/{pid}/root"))
        out += await asyncio.wait_for(proc.stdout.read(), 60)
        assert await proc.wait() == 0, out
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        handles.close()
        cell.close()
    return parse(out.decode()), facts


def test_an_escaped_vmm_reaches_nothing_of_the_daemon_other_boxes_or_the_host(
        stack: Stack, workspace: Path, probe: Path, tmp_path: Path) -> None:
    """Attack: a guest escapes its QEMU through a device-emulation bug. Landing with the
    daemon's uid, in the daemon's namespaces, it could read the daemon's state, another
    box's disk, reach its VMM and sockets, the signer's socket and the host's network.
    In its cell it reaches none of them, while the same probe run as the daemon reaches
    every one (so each check can fail); what the cell was handed it still has."""
    jail = require_jail()
    name = fresh_name("cell")
    stack.tk("run", "--name", name, "--workspace", str(workspace))
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        run_id = str(stack.tkjson("inspect", name)["run_id"])  # type: ignore[index]
        vm_dir = paths.vms(stack.home) / run_id
        _, qemu_a = vmm_of(vm_dir)
        sockets = [fd for fd in os.listdir(f"/proc/{qemu_a}/fd")
                   if os.readlink(f"/proc/{qemu_a}/fd/{fd}").startswith("socket:")]
        assert sockets, "the other box's QEMU holds no socket"
        server.bind(("0.0.0.0", 0))  # noqa: S104 - reached over loopback and the host's address
        server.listen(16)
        port = server.getsockname()[1]
        targets = {
            "the daemon's state directory": f"open:{stack.home}",
            "another box's record": f"open:{stack.home / 'boxes' / name / 'box.json'}",
            "another box's disk": f"open:{stack.home / 'boxes' / name / 'upper.ext4'}",
            "another box's VM directory": f"open:{vm_dir / 'console.log'}",
            "another box's sockets": f"stat:/proc/{qemu_a}/fd/{sockets[0]}",
            "another box's VMM": f"kill:{qemu_a}",
            "the daemon": f"kill:{stack.procs['daemon'].pid}",
            "the daemon's API socket": f"unix:{stack.home / 'run' / 'daemon.sock'}",
            "the signer's socket": f"unix:{stack.home / 'run' / 'signer.sock'}",
            "the host's loopback": f"tcp:127.0.0.1:{port}",
        }
        addr = host_address()
        if addr is not None:
            targets["the host's network"] = f"tcp:{addr}:{port}"
        checks = list(targets.values())
        as_daemon = probe_as_daemon(probe, checks)
        for what, check in targets.items():
            assert as_daemon[check] == "ok", f"as the daemon, {what} is out of reach: " \
                                              f"{check} {as_daemon[check]}"
        in_cell, facts = asyncio.run(probe_in_cell(jail, probe, checks, tmp_path))
        for what, check in targets.items():
            assert in_cell[check].startswith("err "), f"from the cell, {what} is reachable"
        # It still has what it was handed (its own disk and sockets), and nothing else
        # of the host's processes: only itself, as PID 1 of its own namespace.
        assert [v for k, v in in_cell.items() if k.startswith("fd:")] == ["ok"] * 4
        assert in_cell["procs"] == "1"
        uid = int(str(facts["uid"]))
        assert DEFAULT_UIDS[0] <= uid <= DEFAULT_UIDS[1]
        assert in_cell["whoami"] == f"{uid} {uid}"
        st = facts["status"]
        assert isinstance(st, dict)
        assert st["Uid"].split() == [str(uid)] * 4 and st["Gid"].split() == [str(uid)] * 4
        assert st["CapEff"].strip() == st["CapBnd"].strip() == "0000000000000000"
        assert st["NoNewPrivs"].strip() == "1"
        assert st["NSpid"].split()[-1] == "1"
        assert facts["ns"] == dict.fromkeys(("mnt", "pid", "net", "ipc", "uts", "cgroup"), True)
        assert f"tkbox-vmm/vmm-{uid}" in str(facts["cgroup"])
        assert facts["root"] == ["dev", "etc", "lib", "lib64", "proc", "usr", "vm"]
    finally:
        server.close()
        stack.tk("rm", "--force", name, check=False)


def _wait_template(s: Stack, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any((m.parent / "state").is_file()
               for m in (s.home / "guest" / "templates").glob("*/meta.json")):
            return
        time.sleep(1)
    raise AssertionError(f"no template was built: {s.log_tail('daemon')}")


@pytest.fixture
def tight_stack(tmp_path: Path) -> Iterator[Stack]:
    """A signer and a daemon whose VMMs may use no memory beyond their guest's RAM."""
    home = make_home(tmp_path)
    s = Stack(home, stack_env(home))
    s.start_signer()
    s.start_daemon("--vmm-memory-overhead", "0")
    yield s
    for name in list(s.procs):
        s.stop(name)


def test_a_vmm_past_its_memory_limit_is_killed_contained_and_recorded_others_run_on(
        tight_stack: Stack, workspace: Path, tmp_path: Path) -> None:
    """Attack: a guest makes its VMM grow without bound (a leak a guest drives, or its
    memory touched to the last page) to starve the host and the other boxes. The
    kernel kills that VMM at its cgroup's limit; its box is contained, and its run
    says why. The other box, restored from the same template in a cell of its own
    under another uid, answers over its mux as before."""
    require_jail()
    s = tight_stack
    warm = fresh_name("warm")
    s.tk("run", "--name", warm, "--workspace", str(workspace), "--memory", "512")
    _wait_template(s)
    s.tk("rm", "--force", warm)
    hog, calm = fresh_name("hog"), fresh_name("calm")
    uids = {}
    for name in (hog, calm):
        out = s.tk("run", "--name", name, "--workspace", str(workspace), "--memory", "512")
        assert "restored from template" in out.stdout, out.stdout
        m = re.search(r"vmm isolation: jailed uid (\d+), namespaces, cgroup", out.stdout)
        assert m, out.stdout
        uids[name] = int(m.group(1))
        info = s.tkjson("inspect", name)
        assert isinstance(info, dict) and info["start"]["kind"] == "template"
        _, qemu = vmm_of(paths.vms(s.home) / str(info["run_id"]))
        assert status(qemu)["Uid"].split()[0] == str(uids[name])
    assert uids[hog] != uids[calm]
    # 350 MiB held, then the guest's page cache filled: every page of the guest's
    # 512 MiB touched, and QEMU's own memory above that.
    r = s.tk("exec", hog, "--", "python3", "-c",
             "import os\ns = b'x' * (350 << 20)\n"
             "os.system('find / -xdev -type f 2>/dev/null | xargs cat > /dev/null 2>&1')\n"
             "print('survived')", check=False, timeout=600)
    assert "survived" not in r.stdout
    deadline = time.monotonic() + 30
    while (info := s.tkjson("inspect", hog))["state"] != "failed":  # type: ignore[index]
        assert time.monotonic() < deadline, info
        time.sleep(0.2)
    assert isinstance(info, dict)
    assert "the kernel killed the VMM: it reached its memory limit of 512 MiB" in info["error"]
    assert s.tk("exec", calm, "--", "echo", "still here").stdout == "still here\n"
    s.tk("stop", calm)
    recs = export_verified(s, hog, tmp_path)
    ready = [r["body"] for r in recs if r["kind"] == "tkbox.box.ready"]
    assert ready[0]["vmm_isolation"] == f"jailed uid {uids[hog]}, namespaces, cgroup"
    cont = [r["body"] for r in recs if r["kind"] == "tkbox.containment"]
    assert cont and cont[0]["vmm_limit"] == "memory", cont
    assert "memory limit of 512 MiB" in cont[0]["reason"]
