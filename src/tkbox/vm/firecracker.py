"""The Firecracker launcher: configured over its REST API, ports over hybrid vsock.

    firecracker --api-sock <workdir>/fc.sock --id <name>
      PUT  /machine-config     vcpu_count, mem_size_mib
      PUT  /boot-source        the ELF vmlinux, the initramfs, the command line
      PUT  /drives/disk<N>     one per disk, in order (the guest's vda, vdb, ...)
      PUT  /vsock              guest CID 3, <workdir>/v.sock
      PUT  /actions            InstanceStart
      PATCH /vm                Paused / Resumed

The requests are built by a pure function (`build_requests`) so that tests can
check each one against Firecracker's OpenAPI description without a binary:
no registry this project uses packages Firecracker, so CI cannot boot it
(see docs/firecracker.md for running it for real).

The VMM process: a private 0700 working directory as its cwd, an empty
environment (the daemon's may hold secret values), no inherited descriptors,
its own session and process group, `PR_SET_PDEATHSIG` so that it cannot
outlive the daemon, stdin from /dev/null. Its stdout (the guest's serial
console, which the guest controls) and stderr go through pipes into
`console.log` and `firecracker.log`, each capped at `LOG_CAP` bytes: a guest
printing without end cannot fill the host's disk. Kill is SIGKILL to the
process group; the process is reaped however it ends, and its sockets are
removed.

The guest's ports are `HybridVsockHostPorts` on `<workdir>/v.sock`: no
network device is ever configured.

Why one module (about 510 lines): the pure request builder, the host checks
and the process are one launcher, and the builder is kept beside what sends
it so that the OpenAPI-checked requests are exactly the ones sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from tkbox._process import pdeathsig
from tkbox._tasks import TaskOwner
from tkbox.errors import HostError, InternalError, UserError
from tkbox.paths import private_dir, vms
from tkbox.protocol.vsock import (
    DEFAULT_GUEST_CID,
    MAX_U32,
    MAX_UNIX_PATH,
    HybridVsockHostPorts,
    listener_path,
)
from tkbox.vm import base
from tkbox.vm.base import BeforeBoot, Launcher, ProcessVM, VMSpec, drain_to_file, last_words
from tkbox.vm.cgroup import (
    CPU_PERIOD_US,
    SUBTREE,
    BoxCgroup,
    CgroupRoot,
    Limits,
    Verdict,
    find_root,
    jailer_cgroup,
)
from tkbox.vm.errors import VMEnded, VMError, VMExitedAtStart
from tkbox.vm.jail import JailConfig, UidLease, check_range, lease_uid, readable_by_all

FIRECRACKER = "firecracker"
JAILER = "jailer"
API_SOCKET = "fc.sock"
VSOCK_SOCKET = "v.sock"
CONSOLE_LOG = "console.log"
VMM_LOG = "firecracker.log"
#: Firecracker's own kernel command line for a microVM with no PCI and no keyboard.
BOOT_ARGS = "console=ttyS0 reboot=k panic=1 pci=off"
#: Tells the guest agent its ports are AF_VSOCK, not the serial mux.
VSOCK_ARG = "tkbox.ports=vsock"
#: Bytes kept of each of the VMM's output streams; the rest is read and dropped.
LOG_CAP = base.LOG_CAP
#: Bytes read of an API response body (Firecracker's are a few hundred).
MAX_API_BODY = 64 << 10
#: Characters of a fault message put into an error.
MAX_FAULT = 300
#: Seconds for Firecracker to answer on its API socket after it starts.
API_READY_TIMEOUT = 5.0
#: Seconds for one API request.
API_TIMEOUT = 10.0
#: Firecracker's limits on `vcpu_count` (machine-config).
MAX_VCPUS = 32
ELF_MAGIC = b"\x7fELF"


class ApiCall(NamedTuple):
    """One request to Firecracker's API: method, path, JSON body."""

    method: str
    path: str
    body: dict[str, Any]


# --- pure: what to ask Firecracker -------------------------------------------------


def boot_args(spec: VMSpec) -> str:
    """The kernel command line. Firecracker gives a drive no serial the guest can
    read, so the disks' roles go by order: `tkbox.disks=root,lower,upper` names
    vda, vdb, vdc (the guest agent finds a disk by role through it)."""
    roles = ",".join(disk.role for disk in spec.disks)
    disks = f" tkbox.disks={roles}" if roles else ""
    return f"{BOOT_ARGS} {VSOCK_ARG}{disks} {spec.cmdline}".strip()


def drive_id(index: int) -> str:
    return f"disk{index}"


def api_socket(spec: VMSpec) -> Path:
    return spec.workdir.absolute() / API_SOCKET


def vsock_socket(spec: VMSpec) -> Path:
    return spec.workdir.absolute() / VSOCK_SOCKET


def vmm_id(name: str) -> str:
    """Firecracker's `--id`: 1 to 64 of [A-Za-z0-9-]."""
    return (re.sub(r"[^A-Za-z0-9-]", "-", name)[:64]) or "tkbox"


def check_spec(spec: VMSpec) -> None:
    """Refuse, with what to do, a spec Firecracker would refuse or mishandle."""
    if type(spec.vcpus) is not int or not 1 <= spec.vcpus <= MAX_VCPUS:
        raise UserError(f"Firecracker runs 1 to {MAX_VCPUS} vCPUs, not {spec.vcpus!r}")
    if type(spec.memory_mib) is not int or spec.memory_mib < 1:
        raise UserError(f"memory must be a positive number of MiB, not {spec.memory_mib!r}")
    for path in (api_socket(spec), listener_path(vsock_socket(spec), MAX_U32)):
        if len(os.fsencode(path)) > MAX_UNIX_PATH:
            raise HostError(
                f"the VM directory {spec.workdir} is too long for Unix socket paths "
                f"(at most {MAX_UNIX_PATH} bytes); set TKBOX_HOME to a shorter path"
            )
    if "\n" in spec.cmdline or "\x00" in spec.cmdline:
        raise UserError("the kernel command line must be one line")
    for disk in spec.disks:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", disk.role):
            raise InternalError(f"disk role {disk.role!r} cannot go on the kernel command line")


#: Inside a jailed Firecracker's chroot (`docs/jailer.md`): where tkbox puts the
#: kernel, the initramfs and each disk, and where Firecracker makes its sockets.
JAIL_KERNEL, JAIL_INITRD, JAIL_API, JAIL_VSOCK = "/vmlinux", "/initrd", "/fc.sock", "/v.sock"


def jail_disk(index: int) -> str:
    return f"/disk{index}"


def build_requests(spec: VMSpec, *, jailed: bool = False) -> list[ApiCall]:
    """Every API request that configures and boots `spec`, in order (pure).

    `jailed`: Firecracker runs under its jailer, chrooted: every path is the file's
    name inside the chroot (`JAIL_*`), where the launcher placed it."""
    check_spec(spec)
    kernel = JAIL_KERNEL if jailed else str(spec.kernel.absolute())
    initrd = JAIL_INITRD if jailed else str(spec.initramfs.absolute())
    uds = JAIL_VSOCK if jailed else str(vsock_socket(spec))
    calls = [
        ApiCall(
            "PUT",
            "/machine-config",
            {"vcpu_count": spec.vcpus, "mem_size_mib": spec.memory_mib},
        ),
        ApiCall(
            "PUT",
            "/boot-source",
            {
                "kernel_image_path": kernel,
                "initrd_path": initrd,
                "boot_args": boot_args(spec),
            },
        ),
    ]
    for index, disk in enumerate(spec.disks):
        calls.append(
            ApiCall(
                "PUT",
                f"/drives/{drive_id(index)}",
                {
                    "drive_id": drive_id(index),
                    "path_on_host": jail_disk(index) if jailed else str(disk.path.absolute()),
                    "is_root_device": False,
                    "is_read_only": disk.read_only,
                },
            )
        )
    calls.append(
        ApiCall(
            "PUT",
            "/vsock",
            {"guest_cid": DEFAULT_GUEST_CID, "uds_path": uds},
        )
    )
    calls.append(ApiCall("PUT", "/actions", {"action_type": "InstanceStart"}))
    return calls


@dataclass(frozen=True)
class FirecrackerJailer:
    """Firecracker's own jailer, as its documentation describes it (`docs/jailer.md`,
    pinned at v1.16.1 in tests/testdata/firecracker/): a uid and gid of the VM's own,
    a chroot (pivot_root in a new mount namespace) holding only what tkbox places
    there, cgroup limits, resource limits. Run as root; it execs Firecracker in its
    own place (no `--new-pid-ns`, no `--daemonize`: tkbox keeps the process it
    started, reaps it and reads its output)."""

    binary: Path
    chroot_base: Path
    uids: tuple[int, int]
    cgroup_version: int = 2
    parent_cgroup: str = SUBTREE
    overhead_mib: int = 256
    pids: int = 256
    no_file: int = 2048

    def chroot(self, firecracker: str, vm_id: str) -> Path:
        """docs/jailer.md: `<chroot_base>/<exec_file_name>/<id>/root`."""
        return self.chroot_base / Path(firecracker).name / vm_id / "root"

    def limits(self, spec: VMSpec) -> Limits:
        return Limits(spec.memory_mib + self.overhead_mib, self.pids, spec.vcpus + 1)


def jail_id(uid: int) -> str:
    """The jailer's `--id` for a VM whose VMM runs as `uid`: unique on the host while
    it runs (the uid is leased), short enough for the chroot's socket paths."""
    return f"tkbox-{uid}"


def jailer_argv(jailer: FirecrackerJailer, firecracker: str, uid: int, spec: VMSpec) -> list[str]:
    """The jailer's command line for `spec` (pure; checked against docs/jailer.md).

    Firecracker's own arguments follow `--`; the jailer passes `--id` itself."""
    limits = jailer.limits(spec)
    mem = limits.memory_mib << 20
    if jailer.cgroup_version == 2:
        cgroups = [f"memory.max={mem}", f"pids.max={limits.pids}",
                   f"cpu.max={limits.cpus * CPU_PERIOD_US} {CPU_PERIOD_US}"]
    else:
        cgroups = [f"memory.limit_in_bytes={mem}", f"pids.max={limits.pids}",
                   f"cpu.cfs_quota_us={limits.cpus * CPU_PERIOD_US}"]
    argv = [str(jailer.binary), "--id", jail_id(uid), "--exec-file", firecracker,
            "--uid", str(uid), "--gid", str(uid),
            "--chroot-base-dir", str(jailer.chroot_base),
            "--cgroup-version", str(jailer.cgroup_version)]
    for c in cgroups:
        argv += ["--cgroup", c]
    argv += ["--parent-cgroup", jailer.parent_cgroup,
             "--resource-limit", f"no-file={jailer.no_file}",
             "--", "--api-sock", JAIL_API]
    return argv


@dataclass
class _FirecrackerCell:
    """What a jailed Firecracker was given: its uid's lease, its chroot, the owners of
    the files tkbox lent it (restored when it ends), its cgroup."""

    lease: UidLease
    root: Path
    lent: list[tuple[Path, int, int]]
    cgroup: BoxCgroup | None

    def close(self) -> Verdict:
        verdict = self.cgroup.verdict() if self.cgroup is not None else Verdict("", "")
        shutil.rmtree(self.root.parent, ignore_errors=True)  # <base>/<exec>/<id>
        for path, uid, gid in self.lent:
            with contextlib.suppress(OSError):
                os.chown(path, uid, gid)
        if self.cgroup is not None:
            self.cgroup.remove()
        self.lease.close()
        return verdict


def _place(src: Path, dst: Path, writable: bool) -> None:
    """`src` at `dst` in the chroot: a hard link where they share a file system (no
    copy), else a copy, for a file that is only read. A writable disk must be the
    box's own file: where it cannot be linked, the start is refused."""
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        if writable:
            raise HostError(f"cannot link {src} into the jailer's chroot {dst.parent} "
                            f"({exc.strerror}): keep TKBOX_HOME on one file system") from None
        shutil.copyfile(src, dst)


def _make_cell(jailer: FirecrackerJailer, firecracker: str, spec: VMSpec) -> _FirecrackerCell:
    """Lease a uid, build the chroot with the VM's files in it, readable (and the
    writable disk writable) by that uid only where tkbox can say so (docs/jailer.md:
    the user Firecracker runs as must be able to read them, and write a read-write
    disk)."""
    lease = lease_uid(jailer.uids, unused=True)
    root = jailer.chroot(firecracker, jail_id(lease.uid))
    cell = _FirecrackerCell(lease, root, [], None)
    try:
        shutil.rmtree(root.parent, ignore_errors=True)  # a leftover of a daemon that died
        root.mkdir(parents=True, mode=0o700)
        files = [(spec.kernel, JAIL_KERNEL, False), (spec.initramfs, JAIL_INITRD, False),
                 *((d.path, jail_disk(i), not d.read_only) for i, d in enumerate(spec.disks))]
        for src, name, writable in files:
            dst = root / name.lstrip("/")
            _place(src, dst, writable)
            st = dst.stat()
            if writable:  # the box's own file (linked): given back when the VM ends
                cell.lent.append((src, st.st_uid, st.st_gid))
                os.chown(dst, lease.uid, lease.uid)
            elif st.st_mode & 0o004 == 0:
                readable_by_all(dst)
        cell.cgroup = jailer_cgroup(jailer.cgroup_version, jailer.parent_cgroup,
                                    jail_id(lease.uid), jailer.limits(spec))
    except BaseException:
        cell.close()
        raise
    return cell


def firecracker_jail(config: JailConfig, binary: str | None = None) -> tuple[
        FirecrackerJailer | None, str]:
    """Firecracker's jailer for this daemon where it can run one, and what each VMM gets
    (or why it is not jailed), decided from facts: root, a `jailer` beside the
    `firecracker` binary or on PATH, a cgroup hierarchy with memory, pids and cpu.
    `--vmm-jail on` turns a missing part into a HostError."""
    if config.mode == "off":
        return None, "not jailed: --vmm-jail off"
    fc = binary or shutil.which(FIRECRACKER)
    beside = Path(fc).with_name(JAILER) if fc else None
    found = str(beside) if beside and os.access(beside, os.X_OK) else shutil.which(JAILER)
    cgroups = find_root(config.cgroup) if os.geteuid() == 0 else "not root"
    if os.geteuid() != 0:
        missing = "Firecracker's jailer runs as root only"
    elif not found:
        missing = (f"no Firecracker `{JAILER}` beside {fc or FIRECRACKER} or on PATH (install "
                   "the one from the same release)")
    elif isinstance(cgroups, str):
        missing = f"no cgroup for its limits: {cgroups}"
    else:
        missing = ""
    if missing:
        if config.mode == "on":
            raise HostError(f"--vmm-jail on, but {missing}")
        return None, f"not jailed: {missing}"
    assert found is not None and isinstance(cgroups, CgroupRoot)
    check_range(config.uids)
    jailer = FirecrackerJailer(Path(found), private_dir(vms().parent / "jail"), config.uids,
                               cgroups.version, overhead_mib=config.overhead_mib or 256,
                               pids=config.pids)
    first, last = config.uids
    return jailer, (f"jailed by Firecracker's jailer ({found}): a uid of its own from "
                    f"{first}-{last}, a chroot of its own (pivot_root in a new mount "
                    f"namespace), cgroup v{cgroups.version} limits; no PID or network "
                    "namespace (docs/firecracker.md)")


def vm_state_call(state: str) -> ApiCall:
    """`PATCH /vm` to `Paused` or `Resumed`."""
    if state not in ("Paused", "Resumed"):
        raise InternalError(f"no such Firecracker VM state: {state!r}")
    return ApiCall("PATCH", "/vm", {"state": state})


def fault_message(body: bytes) -> str:
    """The `fault_message` of an API error body, as one bounded line.

    Firecracker answers errors with `{"fault_message": "..."}`; anything else
    is described rather than quoted.
    """
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return f"an unreadable answer ({len(body)} bytes)"
    message = data.get("fault_message") if isinstance(data, dict) else None
    if not isinstance(message, str) or not message.strip():
        return "an error without a fault_message"
    line = " ".join(message.split())
    return line if len(line) <= MAX_FAULT else line[: MAX_FAULT - 3] + "..."


# --- the host: what it has ---------------------------------------------------------


def firecracker_problem(binary: Path | None = None) -> str | None:
    """Why Firecracker cannot run VMs here (a line with what to do), or None."""
    found = str(binary) if binary else shutil.which(FIRECRACKER)
    if not found or not os.access(found, os.X_OK):
        return (
            "firecracker is not on PATH; install a release binary from the Firecracker "
            "project (docs/firecracker.md), or use --vmm qemu"
        )
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return (
            f"/dev/kvm is not usable ({exc.strerror}); Firecracker needs KVM: enable "
            "virtualisation, or add this user to the 'kvm' group"
        )
    os.close(fd)
    return None


def firecracker_available(binary: Path | None = None) -> bool:
    """Whether a Firecracker binary is on PATH (or given) and /dev/kvm is usable."""
    return firecracker_problem(binary) is None


def check_kernel(path: Path) -> None:
    """Firecracker boots an uncompressed ELF kernel only; refuse anything else."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise HostError(
            f"cannot read the guest kernel {path}: {exc.strerror}; run 'tkbox guest build'"
        ) from None
    if magic != ELF_MAGIC:
        raise HostError(
            f"{path} is not an ELF vmlinux (a bzImage?); Firecracker boots only ELF "
            "kernels: use the vmlinux that 'tkbox guest build' extracts"
        )


def _check_readable(path: Path, what: str) -> None:
    try:
        st = path.stat()
    except OSError as exc:
        raise HostError(f"the {what} {path} is missing ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise HostError(f"the {what} {path} is not a regular file")


# --- the process ---------------------------------------------------------------------


class FirecrackerVM(ProcessVM):
    """A Firecracker process and the API client that drives it."""

    def __init__(self, proc: asyncio.subprocess.Process, spec: VMSpec,
                 cell: _FirecrackerCell | None = None) -> None:
        super().__init__()
        self.proc = proc
        self.spec = spec
        self.cell = cell
        if cell is None:
            self.api_socket, self.vsock_socket = api_socket(spec), vsock_socket(spec)
            self.isolation = "not jailed (no Firecracker jailer: docs/firecracker.md)"
        else:
            self.api_socket = cell.root / JAIL_API.lstrip("/")
            self.vsock_socket = cell.root / JAIL_VSOCK.lstrip("/")
            self.isolation = (f"jailed uid {cell.lease.uid} by Firecracker's jailer, chroot, "
                              + ("cgroup" if cell.cgroup is not None else "no cgroup"))
        self.ports: HybridVsockHostPorts = HybridVsockHostPorts(
            self.vsock_socket, vmm_uid=cell.lease.uid if cell is not None else None)
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(self.api_socket)),
            base_url="http://localhost",
            timeout=API_TIMEOUT,
        )
        # Owned by this VM: the reaper and both log drains; `wait` ends them all.
        self._tasks = TaskOwner(f"tkbox-firecracker-{spec.name}")
        self._ended = self._tasks.spawn(proc.wait())
        self._drains = [
            self._tasks.spawn(drain_to_file(proc.stdout, spec.workdir / CONSOLE_LOG, LOG_CAP)),
            self._tasks.spawn(drain_to_file(proc.stderr, spec.workdir / VMM_LOG, LOG_CAP)),
        ]

    @property
    def accel(self) -> str:
        return "kvm"

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    # the API ---------------------------------------------------------------------

    async def call(self, call: ApiCall) -> None:
        """Send one API request; a refusal or a dead VMM is a HostError."""
        what = f"{call.method} {call.path}"
        if not self.running:
            raise VMEnded(f"Firecracker is not running (it ended, status "
                          f"{self.proc.returncode}; for {what}); see {self._log_hint()}")
        try:
            async with self._client.stream(call.method, call.path, json=call.body) as response:
                body = b""
                async for chunk in response.aiter_bytes():
                    body += chunk[: MAX_API_BODY - len(body)]
                    if len(body) >= MAX_API_BODY:
                        break
                status = response.status_code
        except httpx.HTTPError as exc:
            kind = VMEnded if not self.running else VMError
            raise kind(
                f"Firecracker did not answer {what} ({type(exc).__name__}); see {self._log_hint()}"
            ) from None
        if not 200 <= status < 300:
            raise VMError(f"Firecracker refused {what} ({status}): {fault_message(body)}")

    async def wait_api_ready(self, timeout: float = API_READY_TIMEOUT) -> None:
        """Wait until Firecracker answers on its API socket (`GET /`)."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                await self._settle_logs()
                detail = last_words(self.spec.workdir / VMM_LOG) or last_words(
                    self.spec.workdir / CONSOLE_LOG
                )
                raise VMExitedAtStart("Firecracker", self.proc.returncode,
                                      str(self._log_hint()), detail)
            if self.api_socket.exists():
                try:
                    response = await self._client.get("/", timeout=1.0)
                except httpx.HTTPError:
                    pass
                else:
                    if response.status_code == 200:
                        return
            if time.monotonic() > deadline:
                raise VMError(
                    f"Firecracker did not answer on {self.api_socket} within {timeout:g} s; "
                    f"see {self._log_hint()}"
                )
            await asyncio.sleep(0.01)

    def _log_hint(self) -> Path:
        return self.spec.workdir / VMM_LOG

    # VM -------------------------------------------------------------------------------

    async def pause(self) -> None:
        await self.call(vm_state_call("Paused"))

    async def resume(self) -> None:
        await self.call(vm_state_call("Resumed"))

    async def _settle_logs(self) -> None:
        # The drains end at EOF, once the process and everything it started are gone.
        await asyncio.wait(self._drains)

    async def _cleanup(self) -> None:
        try:
            await self.ports.aclose()
            await self._client.aclose()
            await self._settle_logs()
        finally:
            await self._tasks.aclose()
        for path in (self.api_socket, self.vsock_socket):
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()
        if self.cell is not None:
            verdict = await asyncio.to_thread(self.cell.close)
            self.end_reason, self.end_limit = verdict.reason, verdict.limit


class FirecrackerLauncher(Launcher):
    """Starts Firecracker microVMs; `binary` defaults to `firecracker` on PATH."""

    name = "firecracker"
    transport = "hybrid-vsock"

    def __init__(self, binary: Path | None = None,
                 jailer: FirecrackerJailer | None = None) -> None:
        self.binary = binary
        self.jailer = jailer

    def _binary(self) -> str:
        found = str(self.binary) if self.binary else shutil.which(FIRECRACKER)
        if not found or not os.access(found, os.X_OK):
            raise HostError(
                f"{self.binary or FIRECRACKER} is not an executable Firecracker binary; "
                "install a release from the Firecracker project, or use the qemu launcher"
            )
        return found

    async def _spawn(self, binary: str, spec: VMSpec,
                     cell: _FirecrackerCell | None = None) -> asyncio.subprocess.Process:
        if cell is not None and self.jailer is not None:
            argv = jailer_argv(self.jailer, binary, cell.lease.uid, spec)
        else:
            argv = [binary, "--api-sock", str(api_socket(spec)), "--id", vmm_id(spec.name)]
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=spec.workdir,
            env={},
            close_fds=True,
            pass_fds=(),
            start_new_session=True,
            preexec_fn=pdeathsig(),  # noqa: PLW1509 - one prctl, resolved before fork
        )

    async def start(
        self,
        spec: VMSpec,
        *,
        before_boot: BeforeBoot | None = None,
    ) -> FirecrackerVM:
        """Start and boot `spec`; returns once the guest's vCPUs run.

        `before_boot(ports)` runs after the vsock device exists and before
        InstanceStart: serve the guest → host ports there, so the guest's first
        connection (the boot config, port 1026) finds its listener.
        """
        calls = build_requests(spec, jailed=self.jailer is not None)  # a bad spec: refused
        binary = self._binary()
        check_kernel(spec.kernel)
        _check_readable(spec.initramfs, "initramfs")
        for disk in spec.disks:
            _check_readable(disk.path, f"{disk.role} disk")
        private_dir(spec.workdir)
        for name in (API_SOCKET, VSOCK_SOCKET):
            path = spec.workdir / name
            with contextlib.suppress(FileNotFoundError):
                if not stat.S_ISSOCK(path.lstat().st_mode):
                    raise HostError(f"{path} exists and is not a socket; remove it")
                path.unlink()  # stale, from a VMM that died with this directory
        cell = None
        if self.jailer is not None:
            cell = await asyncio.to_thread(_make_cell, self.jailer, binary, spec)
        try:
            proc = await self._spawn(binary, spec, cell)
        except OSError as exc:
            if cell is not None:
                cell.close()
            raise HostError(f"cannot run {binary}: {exc.strerror or exc}") from None
        except BaseException:
            if cell is not None:
                cell.close()
            raise
        vm = FirecrackerVM(proc, spec, cell)
        try:
            await vm.wait_api_ready()
            for call in calls:
                if call.path == "/actions" and before_boot is not None:
                    before_boot(vm.ports)
                await vm.call(call)
        except BaseException:
            await vm.kill()
            raise
        return vm
