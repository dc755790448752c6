"""Which VMM runs a box, and which transport carries its ports, and why.

`tkbox daemon --vmm qemu|firecracker` picks the VMM (default qemu). The
transport follows from the VMM and the host, decided from facts:

| VMM         | transport      | when                                           |
| ----------- | -------------- | ---------------------------------------------- |
| firecracker | hybrid vsock   | always: its vsock device is a Unix socket      |
| qemu        | vhost vsock    | `/dev/vhost-vsock` opens and Python has AF_VSOCK |
| qemu        | serial mux     | otherwise (software emulation included)        |

`TKBOX_TRANSPORT=serial-mux` keeps QEMU on the serial mux where vhost vsock
would work (to compare, or to work around a host's vsock); asking for
`vhost-vsock` where the host lacks it is refused with what to do.

`tkbox doctor` prints the same decision (`describe`), and the daemon refuses
to start, in one line naming what to install, when the VMM it was told to use
cannot run here (`check_vmm`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from tkbox.errors import HostError, UserError
from tkbox.protocol.vsock import vhost_vsock_problem
from tkbox.vm.firecracker import firecracker_problem

VMMS = ("qemu", "firecracker")
SERIAL_MUX, VHOST_VSOCK, HYBRID_VSOCK = "serial-mux", "vhost-vsock", "hybrid-vsock"
TRANSPORTS = (SERIAL_MUX, VHOST_VSOCK, HYBRID_VSOCK)
QEMU = "qemu-system-x86_64"


@dataclass(frozen=True)
class Transport:
    kind: str  # one of TRANSPORTS
    reason: str  # why, for a person


def check_vmm_name(vmm: str) -> str:
    if vmm not in VMMS:
        raise UserError(f"unknown VMM {vmm!r}; use one of: {', '.join(VMMS)}")
    return vmm


def vmm_problem(vmm: str) -> str | None:
    """Why `vmm` cannot run VMs on this host (one line, what to install), or None."""
    check_vmm_name(vmm)
    if vmm == "firecracker":
        return firecracker_problem()
    if not shutil.which(QEMU):
        return f"{QEMU} is not installed; run 'sudo apt-get install qemu-system-x86'"
    return None


def check_vmm(vmm: str) -> None:
    """Refuse, at daemon start, a VMM that cannot run here."""
    problem = vmm_problem(vmm)
    if problem is not None:
        raise HostError(f"--vmm {vmm}: {problem}")


def transport_for(vmm: str, forced: str | None = None) -> Transport:
    """The transport `vmm`'s boxes get on this host, and why.

    `forced` (default: `TKBOX_TRANSPORT`) asks for one; a transport the VMM or
    the host cannot give is a UserError saying what to do.
    """
    check_vmm_name(vmm)
    want = forced if forced is not None else os.environ.get("TKBOX_TRANSPORT") or None
    if want is not None and want not in TRANSPORTS:
        raise UserError(f"TKBOX_TRANSPORT={want!r} is not a transport; use one of: "
                        f"{', '.join(TRANSPORTS)}")
    if vmm == "firecracker":
        if want not in (None, HYBRID_VSOCK):
            raise UserError(f"Firecracker carries ports over hybrid vsock only, not {want}; "
                            "unset TKBOX_TRANSPORT")
        return Transport(HYBRID_VSOCK, "Firecracker's vsock device, a Unix socket in the "
                                       "VM's private directory")
    if want == HYBRID_VSOCK:
        raise UserError("hybrid vsock is Firecracker's; QEMU uses vhost-vsock or serial-mux")
    if want == SERIAL_MUX:
        return Transport(SERIAL_MUX, "TKBOX_TRANSPORT=serial-mux: one virtio-serial port "
                                     "carries the ports")
    problem = vhost_vsock_problem()
    if problem is None:
        return Transport(VHOST_VSOCK, "/dev/vhost-vsock opens: AF_VSOCK, one CID per box "
                                      "claimed from the kernel")
    if want == VHOST_VSOCK:
        raise UserError(f"TKBOX_TRANSPORT=vhost-vsock, but {problem}")
    return Transport(SERIAL_MUX, f"{problem}: one virtio-serial port carries the ports")


def describe(vmm: str) -> dict[str, str]:
    """What `tkbox doctor` shows: the VMM a box would get, its transport, and why."""
    problem = vmm_problem(vmm)
    try:
        transport = transport_for(vmm)
        kind, why = transport.kind, transport.reason
    except UserError as exc:
        kind, why = "none", str(exc)
    return {"vmm": vmm, "ok": "yes" if problem is None else "no",
            "vmm_detail": problem or "ready", "transport": kind, "transport_reason": why}
