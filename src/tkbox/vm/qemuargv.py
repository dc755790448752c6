"""The QEMU command line, from a VM's spec: pure (no process, no file, no clock).

`build_argv` is the exact `qemu-system-x86_64 -M microvm` command line of a
VM: no network card (`-nic none`, `-nodefaults`), QEMU's seccomp sandbox
(`SANDBOX`), the console, QMP and the serial mux on descriptors QEMU inherits
(`Wiring`: no path of the daemon's is on the line), one fdset per disk, the
TCG workarounds, and the template's and the restore's memory and `-incoming`.
What it needs of the host (the TSC rate, whether the guest kernel should
speak) it is given; `tkbox.vm.qemu` (the process: starting it, QMP,
stopping it) reads those and re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tkbox.errors import InternalError

if TYPE_CHECKING:
    from pathlib import Path

    from tkbox.vm.spec import VMSpec

QEMU = "qemu-system-x86_64"
TEMPLATE_CMDLINE = "tkbox.template=1"
#: Tells the guest agent its ports are AF_VSOCK, not the serial mux.
VSOCK_CMDLINE = "tkbox.ports=vsock"
#: QEMU's own seccomp filter: no exec or fork (`spawn`), no setuid (`elevateprivileges`),
#: no scheduler or priority calls (`resourcecontrol`), no obsolete syscalls. A guest
#: that exploits a device model runs inside it. Templates are saved and restored
#: through files the daemon opens and passes over QMP (`getfd`), not `exec:cat`.
SANDBOX = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

#: Under software emulation only, the guest kernel runs with user-space address
#: randomization off. TCG caches translated code by virtual address: with the
#: randomization on, every exec re-translated the loader and libc (`true` took
#: 80-130 ms, 27 ms without). The guest is the agent's own domain; nothing of
#: the host's depends on it (docs/threat-model.md). With KVM it stays on.
TCG_GUEST_CMDLINE = "norandmaps"
#: What that costs, in the words `tkbox doctor` and the daemon's notice use.
TCG_TRADEOFF = ("inside each box, programs run without address randomization "
                f"({TCG_GUEST_CMDLINE}, so that emulated execs are fast; with KVM they "
                "keep it): an exploit of a program in the box gains only what the agent "
                "already has (docs/threat-model.md)")


def qemu_value(path: Path | str) -> str:
    """`path` as one value in QEMU's option syntax (`key=value,key=value`): each comma
    doubled, so no part of it can become an option of its own."""
    return str(path).replace(",", ",,")


@dataclass(frozen=True)
class Wiring:
    """What QEMU is handed instead of the daemon's paths: descriptors it inherits.

    `console`, `qmp`, `mux`: its ends of socketpairs (chardevs with `fd=`: no socket
    file exists for anyone to reach). `disks`: for each disk, the descriptor of
    its fdset (set i+1, named `/dev/fdset/<i+1>`): read-only for a read-only disk,
    read-write for a writable one (whose drive has `auto-read-only=off`, so QEMU
    opens it read-write at once: a read-only open of it would need a second
    descriptor, whose lock a restored VM's read-write open then collides with).
    `ram`: the memory backend's file, `/proc/self/fd/N`. `kernel` and `initramfs`:
    paths as QEMU sees them (QEMU opens these two itself)."""

    console: int
    qmp: int
    mux: int | None
    disks: tuple[tuple[int, ...], ...]
    kernel: str
    initramfs: str
    ram: str | None = None

    def fds(self) -> tuple[int, ...]:
        own = (self.console, self.qmp) + ((self.mux,) if self.mux is not None else ())
        return own + tuple(fd for fds in self.disks for fd in fds)


def placeholder_wiring(spec: VMSpec, ram: bool = False, mux: bool = True) -> Wiring:
    """A wiring with fixed numbers and names: the command line's shape, for a template's
    key and for tests (descriptor numbers and paths shape nothing QEMU saves)."""
    disks = tuple((10 + i,) for i in range(len(spec.disks)))
    return Wiring(3, 4, 5 if mux else None, disks, "/KERNEL", "/INITRAMFS",
                  "/RAM" if ram else None)


def build_argv(spec: VMSpec, accel: str, qemu: str = QEMU, *, wiring: Wiring | None = None,
               template: bool = False, share_ram: bool = False,
               incoming: bool = False, vsock: tuple[int, int] | None = None,
               tsc_khz: int | None = None, guest_debug: bool = False) -> list[str]:
    """The exact QEMU command line for `spec`.

    `wiring`: the descriptors QEMU inherits (`placeholder_wiring` when not given).
    `template`: the guest parks before its disks and boot config (the machine a
    template is saved from and restored into). `wiring.ram`: guest memory is that
    file, written through (`share_ram`, the template being saved) or mapped private
    (a box restored from it: its writes are its own, the file is only read).
    `incoming`: wait for the state to load (`migrate-incoming` over QMP).
    `vsock`: (guest CID, vhost fd): the ports are a vhost-vsock device whose
    CID the fd already holds (`tkbox.vm.cid`), instead of the serial mux.
    No path of the daemon's reaches an option list: sockets and disks are
    descriptors; the kernel and initramfs are arguments of their own.
    `tsc_khz`: the host's constant TSC rate, given to a guest under TCG.
    `guest_debug`: keep the guest kernel's messages (`quiet loglevel=1` otherwise).
    """
    w = wiring or placeholder_wiring(spec, mux=vsock is None)
    if template:
        spec = replace(spec, cmdline=(spec.cmdline + " " + TEMPLATE_CMDLINE).strip())
    if vsock is not None:
        if template or incoming or w.ram is not None:
            raise InternalError("templates are parked over the serial mux, not vsock")
        spec = replace(spec, cmdline=(spec.cmdline + " " + VSOCK_CMDLINE).strip())
    if len(w.disks) != len(spec.disks) or (vsock is None) != (w.mux is not None):
        raise InternalError("the wiring does not match the VM's disks and transport")
    machine = "microvm,x-option-roms=off,pit=on,pic=on,rtc=on,isa-serial=on"
    cmdline = ("console=ttyS0 panic=-1 reboot=t random.trust_cpu=on "
               "i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd "
               + spec.cmdline).strip()
    if accel != "kvm":
        # Under TCG the guest's TSC is the host's, but calibrating it against the
        # emulated PIT fails at random when the host is busy; the kernel then
        # marks the TSC unusable, its clock never advances and boot stalls. Tell
        # it the host's TSC frequency instead, and skip the delay-loop
        # calibration (which needs timer interrupts) with a fixed loops-per-jiffy.
        if tsc_khz:
            cmdline += f" tsc_early_khz={tsc_khz} tsc=reliable"
        cmdline += " lpj=578048"
        cmdline += " " + TCG_GUEST_CMDLINE  # see TCG_GUEST_CMDLINE
    cmdline = cmdline if guest_debug else "quiet loglevel=1 " + cmdline
    argv = [
        # Named for its VM's directory (a box's run id): how a person (or `pgrep -f`)
        # tells which box a QEMU is, now that no path of the box's is on its line.
        qemu, "-name", f"guest={qemu_value(spec.workdir.name)}",
        "-M", machine, "-nodefaults", "-no-user-config", "-display", "none",
        "-sandbox", SANDBOX,
        "-no-reboot", "-nic", "none",
        "-accel", "kvm" if accel == "kvm" else "tcg",
        "-cpu", "host" if accel == "kvm" else "max",
        "-m", str(spec.memory_mib), "-smp", str(spec.vcpus),
        "-kernel", w.kernel, "-initrd", w.initramfs, "-append", cmdline,
        # The console goes to a socketpair the daemon drains into a capped log, so a
        # guest that floods its console cannot fill the host's disk.
        "-chardev", f"socket,id=con,fd={w.console}",
        "-serial", "chardev:con",
        "-device", "virtio-rng-device",
    ]
    if w.mux is not None:
        argv += [
            "-chardev", f"socket,id=mux,fd={w.mux}",
            "-device", "virtio-serial-device,max_ports=2",
            "-device", "virtserialport,chardev=mux,name=tkbox.mux",
        ]
    elif vsock is not None:
        cid, fd = vsock
        argv += ["-device", f"vhost-vsock-device,guest-cid={cid},vhostfd={fd}"]
    argv += [
        # QMP on a chardev of its own, on a socketpair: one session, the daemon's.
        "-chardev", f"socket,id=qmp,fd={w.qmp}",
        "-mon", "chardev=qmp,mode=control",
    ]
    for i, (disk, fds) in enumerate(zip(spec.disks, w.disks, strict=True)):
        for fd in fds:
            argv += ["-add-fd", f"fd={fd},set={i + 1}"]
        argv += ["-drive", f"id=d{i},file=/dev/fdset/{i + 1},format=raw,if=none,"
                           "auto-read-only=off,cache=unsafe"
                 if not disk.read_only else
                 f"id=d{i},file=/dev/fdset/{i + 1},format=raw,if=none,readonly=on",
                 "-device", f"virtio-blk-device,drive=d{i},serial={disk.role}"]
    if w.ram is not None:
        argv += ["-object", f"memory-backend-file,id=ram,size={spec.memory_mib}M,"
                            f"mem-path={qemu_value(w.ram)},share={'on' if share_ram else 'off'}",
                 "-machine", "memory-backend=ram"]
    if incoming:
        argv += ["-incoming", "defer"]
    return argv
