"""`tkbox doctor`: what this host can do, and the exact command for what is missing."""

from __future__ import annotations

import os
import shutil
from typing import Any

from tkbox import paths
from tkbox.errors import TkboxError

APT = "sudo apt-get install -y"


def _tool(name: str, package: str, what: str, optional: bool = False) -> dict[str, Any]:
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}")
                                  else None)
    return {"what": what, "ok": path is not None, "detail": path or f"{name} not found",
            "fix": f"{APT} {package}", "optional": optional}


def checks() -> list[dict[str, Any]]:
    from tkbox.vm.qemu import TCG_TRADEOFF, decide_accel

    out = [
        _tool("tar2sqfs", "squashfs-tools-ng", "squashfs builder (tar2sqfs)"),
        _tool("mkfs.ext4", "e2fsprogs", "ext4 tools"),
        _tool("git", "git", "git (patch checks)"),
        _tool("mmdebstrap", "mmdebstrap", "default image builder", optional=True),
    ]
    try:
        from tkbox.image.kernel import find_kernel

        k = find_kernel()
        out.append({"what": "guest kernel", "ok": True, "detail": f"{k.version} ({k.image})"})
        d = decide_accel(k.version)
        out.append({"what": "acceleration", "ok": True,
                    "detail": f"KVM: {d.reason}" if d.accel == "kvm" else
                              f"software emulation (TCG): {d.reason}; {TCG_TRADEOFF}"})
    except TkboxError as exc:
        out.append({"what": "guest kernel", "ok": False, "detail": str(exc),
                    "fix": f"{APT} linux-image-amd64"})
    out.extend(vmm_checks())
    builds = sorted(paths.guest_build().glob("initramfs-*.cpio")) \
        if paths.guest_build().is_dir() else []
    out.append({"what": "guest build", "ok": bool(builds), "optional": True,
                "detail": str(builds[-1]) if builds else "not built yet (built at first run)",
                "fix": "tkbox guest build"})
    sock = paths.daemon_socket()
    out.append({"what": "daemon", "ok": sock.exists(), "optional": True,
                "detail": f"socket {sock}" if sock.exists() else "not running",
                "fix": "tkbox daemon &"})
    ssock = paths.signer_socket()
    out.append({"what": "signer", "ok": ssock.exists(), "optional": True,
                "detail": f"socket {ssock}" if ssock.exists() else "not running",
                "fix": "tkbox signer init --dev && tkbox signer serve &"})
    if sock.exists():
        out.extend(_daemon_in_use())
    return out


def vmm_checks() -> list[dict[str, Any]]:
    """Per VMM: whether it runs here, and which transport its boxes would get, and why.

    QEMU is the default (`tkbox daemon`); Firecracker is `tkbox daemon --vmm
    firecracker`, optional. The transport line says why vhost vsock is or is
    not used, and how to get it.
    """
    from tkbox.vm.choice import VHOST_VSOCK, describe

    out: list[dict[str, Any]] = []
    for vmm in ("qemu", "firecracker"):
        d = describe(vmm)
        flag = "" if vmm == "qemu" else " --vmm firecracker"
        ready = d["ok"] == "yes"
        out.append({
            "what": f"VMM {vmm}" + (" (default)" if vmm == "qemu" else ""),
            "ok": ready, "optional": vmm != "qemu",
            "detail": (f"ready (tkbox daemon{flag}); " if ready else f"{d['vmm_detail']}; ")
                      + f"a box's ports: {d['transport']} ({d['transport_reason']})",
            "fix": ("put a Firecracker release binary on PATH (docs/firecracker.md)"
                    if vmm == "firecracker" else f"{APT} qemu-system-x86"),
            "vmm": vmm, "transport": d["transport"],
        })
        if vmm == "qemu" and ready:
            from tkbox.vm.qemu import qemu_binary, sandbox_refusal

            refusal = sandbox_refusal(qemu_binary())
            out.append({"what": "QEMU seccomp sandbox", "ok": refusal is None,
                        "detail": "each box's QEMU runs in it (no exec, fork or setuid)"
                                  if refusal is None else
                                  f"this QEMU refuses it, so every box would fail: {refusal}",
                        "fix": f"a QEMU built with seccomp ({APT} qemu-system-x86: "
                               "Debian's and Ubuntu's are)"})
        if vmm == "qemu" and ready:
            out.append(isolation_check())
        if vmm == "firecracker" and ready:
            from tkbox.vm.firecracker import firecracker_jail
            from tkbox.vm.jail import JailConfig

            try:
                jailer, said = firecracker_jail(JailConfig())
            except TkboxError as exc:
                jailer, said = None, str(exc)
            out.append({"what": "Firecracker isolation", "ok": jailer is not None,
                        "optional": True, "detail": said,
                        "fix": "run the daemon as root with Firecracker's `jailer` beside "
                               "`firecracker` (docs/firecracker.md)"})
        if vmm == "qemu" and d["transport"] != VHOST_VSOCK:
            out.append({"what": "vhost vsock for QEMU", "ok": False, "optional": True,
                        "detail": f"not used: {d['transport_reason']}",
                        "fix": "sudo modprobe vhost_vsock (and access to /dev/vhost-vsock)"})
    return out


def isolation_check() -> dict[str, Any]:
    """What a box's QEMU gets here beyond its seccomp sandbox (`tkbox.vm.jail.decide`,
    as `tkbox daemon --vmm-jail auto` decides it): a uid of its own, namespaces and a
    root of its own, a cgroup; and what it does not get, and why."""
    from tkbox.vm.jail import JailConfig, decide
    from tkbox.vm.qemu import qemu_binary

    try:
        jail = decide(JailConfig(), qemu_binary(), paths.private_dir(paths.guest_build()))
        detail, whole = jail.summary(), jail.mode == "root" and not jail.missing
    except TkboxError as exc:
        detail, whole = str(exc), False
    return {"what": "VMM isolation", "ok": whole, "optional": True, "detail": detail,
            "fix": "run the daemon as root (each VMM then gets a uid, namespaces and a "
                   "cgroup of its own), or give it a delegated cgroup v2 directory "
                   "(--vmm-cgroup); docs/vmm.md"}


def _daemon_in_use() -> list[dict[str, Any]]:
    """Which signer the running daemon records with (tkbox's or Tracekit's), and
    which VMM and transport its boxes get."""
    try:
        from tkbox.sdk import Client

        with Client(timeout=5.0) as client:
            info = client.call("GET", "/v1/info")
        s = info.get("signer") or {}
    except (TkboxError, AttributeError, OSError) as exc:
        return [{"what": "signer in use", "ok": False, "optional": True, "detail": str(exc),
                 "fix": "tkbox daemon &"}]
    backend = s.get("backend", "?")
    what = {"tkbox": "tkbox's signer (tkbox verify)",
            "tracekit": "a Tracekit signer (tracekit verify; docs/tracekit.md)",
            "none": "none: --unrecorded"}.get(backend, backend)
    out: list[dict[str, Any]] = []
    if info.get("vmm"):
        out.append({"what": "VMM in use", "ok": True, "optional": True,
                    "detail": f"{info['vmm']}, ports over {info.get('transport', '?')}: "
                              f"{info.get('transport_reason', '')}"})
    if info.get("vmm_isolation"):
        out.append({"what": "VMM isolation in use", "ok": True, "optional": True,
                    "detail": str(info["vmm_isolation"])})
    return [*out, {"what": "signer in use", "ok": backend != "none", "optional": True,
            "detail": f"{what}, key {s.get('key', '?')}, isolation {s.get('isolation', '?')}"
            if backend != "none" else what, "fix": "restart the daemon with a signer"}]
