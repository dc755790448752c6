"""`tkbox daemon`: one asyncio process holding the VMs and the doors.

Start-up fails closed: unless `--unrecorded`, the daemon exits at once when no
signer answers. SIGTERM or SIGINT stops every box cleanly (patches saved),
kills any VM that will not stop, then exits; VMs also carry PR_SET_PDEATHSIG,
so none outlives the daemon even if it is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import uvicorn

from tkbox import __version__, paths
from tkbox._exit import exit_with
from tkbox._process import not_dumpable, undumpable
from tkbox._tasks import TaskOwner
from tkbox.daemon.api import PeerCheckedH11, make_app
from tkbox.daemon.manager import BoxManager, Options
from tkbox.errors import HostError, SignerUnavailable, UserError
from tkbox.record.client import SignerClient
from tkbox.record.unrecorded import UnrecordedSigner
from tkbox.vm.jail import JailConfig

log = logging.getLogger("tkbox.daemon")


def _bind(path: Path) -> socket.socket:
    paths.private_dir(path.parent)
    if path.exists() or path.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # stale socket of a daemon that died
        else:
            raise UserError(f"a tkbox daemon is already running on {path}; stop it first")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_exit: Any) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._on_exit()


async def serve(opts: Options, *, socket_path: Path | None = None,
                signer_socket: Path | None = None, signer_backend: str = "tkbox",
                vmm: str = "qemu", remote_signer: SignerClient | None = None,
                jail: JailConfig | None = None) -> None:
    from tkbox.image.initramfs import GuestBuild, build
    from tkbox.image.kernel import find_kernel
    from tkbox.image.mirrors import Settings, load
    from tkbox.image.store import ImageStore
    from tkbox.vm.base import Launcher
    from tkbox.vm.choice import check_vmm, transport_for
    from tkbox.vm.firecracker import FirecrackerLauncher, firecracker_jail
    from tkbox.vm.jail import decide
    from tkbox.vm.qemu import (
        TCG_TRADEOFF,
        AccelDecision,
        QemuLauncher,
        decide_accel,
        qemu_binary,
    )

    # Where images are pulled from: every file named is read now, so a mistake stops here.
    registries = load(Settings(tuple(opts.registry_mirrors), opts.registry_mirror_only,
                               opts.registry_config))
    for line in registries.describe():
        print(f"tkbox: registry {line}", file=sys.stderr)
    check_vmm(vmm)  # a VMM that cannot run here: one line naming what to install
    transport = transport_for(vmm)
    kernel = find_kernel()
    launcher: Launcher
    guest_dir = paths.private_dir(paths.guest_build())
    if vmm == "firecracker":
        accel = AccelDecision("kvm", "Firecracker runs guests on KVM only")
        fc_jailer, isolation = firecracker_jail(jail or JailConfig())
        launcher = FirecrackerLauncher(jailer=fc_jailer)
    else:
        accel = decide_accel(kernel.version, guest_dir)
        cell = await asyncio.to_thread(decide, jail or JailConfig(), qemu_binary(), guest_dir)
        launcher = QemuLauncher(accel, transport=transport.kind, jail=cell)
        isolation = cell.summary()
    if accel.accel != "kvm":
        print(f"tkbox: notice: software emulation (TCG): {accel.reason}. Boxes are still "
              f"separate kernels behind a VMM, but much slower; {TCG_TRADEOFF}.",
              file=sys.stderr)
    print(f"tkbox: VMM {vmm}, ports over {transport.kind}: {transport.reason}",
          file=sys.stderr)
    print(f"tkbox: VMM isolation: {isolation}", file=sys.stderr)
    signer: SignerClient
    if opts.unrecorded:
        print("tkbox: WARNING: --unrecorded: nothing is decided or recorded by a signer. "
              "Use only to debug tkbox itself; every box says [UNRECORDED].", file=sys.stderr)
        signer = UnrecordedSigner()
    elif remote_signer is not None:  # --signer https://…: a signer on another host
        signer = remote_signer
        try:
            who = await signer.ping()
        except SignerUnavailable as exc:
            raise SignerUnavailable(f"the remote signer {signer_backend} does not take this "
                                    f"daemon: {exc}") from None
        log.info("signer: %s", who)
    elif signer_backend.startswith("tracekit"):
        from tkbox.record.tracekit import client_for

        signer, who = await client_for(signer_backend, signer_socket)
    else:
        from tkbox.record.unix import UnixSignerClient

        spath = signer_socket or paths.signer_socket()
        signer = UnixSignerClient(spath)
        try:
            who = await signer.ping()
        except SignerUnavailable as exc:
            raise SignerUnavailable(
                f"no signer answers on {spath} ({exc}); start one with 'tkbox signer init "
                "--dev && tkbox signer serve &' (or pass --unrecorded to debug tkbox)") from None
        log.info("signer: %s", who)

    from tkbox.record.journal import JournalingSigner, Journals

    journals = Journals(paths.home() / "journal")
    signer = JournalingSigner(signer, journals)  # `tkbox logs`: what the signer acknowledged
    cache: dict[str, GuestBuild] = {}

    def guest_build() -> GuestBuild:
        if "b" not in cache:
            cache["b"] = build(paths.private_dir(paths.guest_build()), kernel=kernel)
        return cache["b"]

    images = ImageStore(paths.images(), registries=registries)
    manager = BoxManager(launcher=launcher, signer=signer, options=opts,
                         images=images, guest_build=guest_build, accel_reason=accel.reason)
    manager.journals = journals
    from tkbox.daemon import egress

    await egress.install(manager, opts, signer)
    await manager.load()
    info = {"version": __version__, "pid": os.getpid(), "accel": accel.accel,
            "accel_reason": accel.reason, "unrecorded": opts.unrecorded,
            "vmm": vmm, "transport": transport.kind, "transport_reason": transport.reason,
            "vmm_isolation": isolation,
            "network_door": True, "undumpable": undumpable(),
            # the CLI's own pulls (`tkbox run`, `tkbox image pull`) load the same table
            "registries": registries.settings.to_json(),
            "signer": {"backend": "none"} if opts.unrecorded else
            {"backend": "tracekit" if signer_backend.startswith("tracekit") else "tkbox",
             "key": str(who.get("key", "")), "isolation": str(who.get("isolation", ""))}}
    app = make_app(manager, info)
    path = socket_path or paths.daemon_socket()
    sock = _bind(path)
    config = uvicorn.Config(app, http=PeerCheckedH11, lifespan="off", log_level="warning",
                            timeout_graceful_shutdown=5, access_log=False)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    server = _Server(config, lambda: loop.call_soon_threadsafe(stopping.set))
    manager.tasks.spawn(manager.watch_pushes(), name="signer pushes")
    own = TaskOwner("the daemon's server", log, quote=True)

    async def on_stop() -> None:
        await stopping.wait()
        print("tkbox: stopping every box…", file=sys.stderr)
        try:
            await manager.shutdown()
        finally:
            server.should_exit = True

    stopper = own.spawn(on_stop(), name="stop every box")
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    print(f"tkbox daemon {__version__} listening on {path}", file=sys.stderr, flush=True)
    try:
        await server.serve(sockets=[sock])
    finally:
        stopping.set()
        try:
            with contextlib.suppress(Exception):  # TimeoutError, or logged by its owner
                await asyncio.wait_for(stopper, 90)
        finally:  # cancelled or not, every task ends and every resource is released
            await own.aclose()
            await manager.tasks.aclose()
            with contextlib.suppress(Exception):
                await launcher.aclose()  # background template builds
            images.close()
            with contextlib.suppress(Exception):
                await signer.aclose()
            with contextlib.suppress(OSError):
                path.unlink()


def main(opts: Options, socket_path: Path | None = None,
         signer_socket: Path | None = None, signer_backend: str = "tkbox",
         vmm: str = "qemu", remote_signer: SignerClient | None = None,
         jail: JailConfig | None = None) -> None:
    logging.basicConfig(level=os.environ.get("TKBOX_LOG", "WARNING"),
                        format="tkbox: %(levelname)s %(message)s")
    not_dumpable("tkbox daemon")  # its environment holds the secrets door's values
    try:
        asyncio.run(serve(opts, socket_path=socket_path, signer_socket=signer_socket,
                          signer_backend=signer_backend, vmm=vmm,
                          remote_signer=remote_signer, jail=jail))
    except (HostError, UserError, SignerUnavailable) as exc:
        exit_with(exc)
