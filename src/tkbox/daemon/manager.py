"""Boxes: create, boot, stop, apply, export, rm; `BoxManager` puts every verb together.

One `BoxManager` per daemon: the core (`core.ManagerCore`: boxes, records,
containment, the signer's pushes) with the command verbs (`commands`) and the
copy verbs (`copies`), and here the box's own life: create and boot, the
watchers of its VM and transport, stop, apply, export and rm. Each box's state is on disk
(`$TKBOX_HOME/boxes/NAME/box.json`, written atomically), so `ls` and
`inspect` survive a restart; a box found in a live state at start has lost
its VM, is marked failed, and the loss is recorded as `tkbox.gap`.

Fail closed: a command needs an allowed `Bash` decision before it starts; a
signer that does not answer refuses it. An event that cannot be recorded stops
the box and is queued as a gap, recorded as soon as the signer takes it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import re
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from tkbox._tasks import cancel_and_wait
from tkbox._threads import run_through
from tkbox.daemon import lifecycle
from tkbox.daemon.bootconfig import boot_answer_ok, boot_config, image_config_facts, image_user
from tkbox.daemon.box import Box
from tkbox.daemon.boxstate import BoxState
from tkbox.daemon.commands import CommandVerbs
from tkbox.daemon.copies import CopyVerbs
from tkbox.daemon.core import BoxSpec, Options
from tkbox.daemon.guest_client import (
    GuestClient,
    IgnoredCheck,
    PatchProgress,
    guest_text,
    seconds,
)
from tkbox.daemon.lifecycle import Event, State
from tkbox.daemon.patches import box_apart, patch_info, patch_record
from tkbox.daemon.roles import GuestBuildInfo, ResolvedImage, ToolDiskInfo
from tkbox.daemon.workspace import build_lower, build_upper
from tkbox.doors.secrets import prestart
from tkbox.errors import (
    GuestError,
    HostError,
    InternalError,
    SignerUnavailable,
    TkboxError,
    UserError,
)
from tkbox.image.runconfig import RunUser
from tkbox.image.tools import MOUNT as TOOLS_MOUNT
from tkbox.protocol.framing import GUEST_FRAMES, FramedStream, FrameError
from tkbox.protocol.ports import PORT_BOOT, PORT_EGRESS, Ports
from tkbox.protocol.streams import ByteStream, StreamClosed
from tkbox.vm.base import VM, Disk, VMSpec

__all__ = ["Box", "BoxManager", "BoxSpec", "Options"]

log = logging.getLogger("tkbox.daemon")

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
BOOT_TIMEOUT = float(os.environ.get("TKBOX_BOOT_TIMEOUT", "180"))
#: seconds the guest has, from the start of `tkbox stop`, to send its whole patch
STOP_DEADLINE = float(os.environ.get("TKBOX_STOP_DEADLINE", "120"))
#: the longest --timeout a box may have (a week)
MAX_TIMEOUT_S = 7 * 24 * 3600


class BoxManager(CommandVerbs, CopyVerbs):
    """The daemon's boxes and every verb on them (the API's one collaborator)."""

    # ---- shutdown ------------------------------------------------------------

    async def shutdown(self) -> None:
        """SIGTERM: stop every live box cleanly (patch saved), kill what will not stop."""
        live = [b for b in self.boxes.values() if lifecycle.can(b.state, Event.STOP)]
        async with asyncio.TaskGroup() as tg:
            for b in live:
                tg.create_task(self._stop_quietly(b), name=f"stop {b.name}")
        for b in self.boxes.values():
            if b.vm is not None:
                await b.vm.kill()
        # Every task ends with its owner: each box's, then the daemon's own.
        async with asyncio.TaskGroup() as tg:
            for b in self.boxes.values():
                tg.create_task(b.tasks.aclose(), name=f"close {b.name}'s tasks")
        await self.tasks.aclose()

    async def _stop_quietly(self, box: Box) -> None:
        try:
            await asyncio.wait_for(self.stop(box.name), 60)
        except Exception as exc:  # noqa: BLE001 - shutting down: kill and go on
            log.warning("stopping %s at shutdown failed: %s", box.name, exc)
            if box.vm is not None:
                await box.vm.kill()

    # ---- create ------------------------------------------------------------------

    async def create(self, spec: BoxSpec) -> Box:
        if not spec.name:
            spec.name = self._fresh_name()
        if spec.timeout_s is not None and not 1 <= spec.timeout_s <= MAX_TIMEOUT_S:
            raise UserError(f"--timeout must be 1 s to {MAX_TIMEOUT_S // 3600} h")
        if not NAME_RE.match(spec.name):
            raise UserError(f"box name {spec.name!r} is not valid: use lowercase letters, "
                            "digits, '.', '_' and '-', starting with a letter or digit")
        if spec.name in self.boxes:
            raise UserError(f"a box named {spec.name!r} exists already; pick another --name "
                            f"or remove it with 'tkbox rm {spec.name}'")
        ws = Path(spec.workspace).expanduser()
        if not ws.is_dir():
            raise UserError(f"workspace {spec.workspace} does not exist or is not a directory")
        if not 128 <= spec.memory_mib <= 65536 or not 1 <= spec.vcpus <= 64:
            raise UserError("memory must be 128-65536 MiB and vcpus 1-64")
        for k in spec.env:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                raise UserError(f"environment name {k!r} is not valid")
        loaded = prestart.load_secrets(spec.secrets, spec.secret_values, spec.inspect)
        for k, v in spec.env.items():
            prestart.refuse_values(loaded, v.encode("utf-8", "surrogateescape"),
                                   f"--env {k}")
        await asyncio.to_thread(prestart.check_workspace, loaded, ws)
        t0 = time.monotonic()
        image = await self.images.resolve(spec.image)  # UserError if unknown
        timings = {"image": round(time.monotonic() - t0, 3)}
        t0 = time.monotonic()
        tool = await self.tools.resolve(spec.tools, image) if spec.tools else None
        if tool is not None:
            timings["tools"] = round(time.monotonic() - t0, 3)
        run_user = await asyncio.to_thread(image_user, image)
        t0 = time.monotonic()
        build = await asyncio.to_thread(self.guest_build)
        timings["guest"] = round(time.monotonic() - t0, 3)
        run_id = f"{spec.name}-{secrets.token_hex(6)}"
        staging = self.root / f".creating-{run_id}"
        staging.mkdir(mode=0o700)
        box = Box(self.root / spec.name, BoxState(
            name=spec.name, run_id=run_id, _state=State.CREATING, created=time.time(),
            updated=time.time(), image=spec.image, image_digest=image.digest,
            workspace=str(ws.resolve()), allow=list(spec.allow),
            env_names=sorted(spec.env), limits={"memory_mib": spec.memory_mib,
                                                "vcpus": spec.vcpus, "disk_mib": spec.disk_mib},
            unrecorded=self.opts.unrecorded, accel="", kernel=build.kernel_version,
            guest_build=build.digest[:16],
            secrets=[dict(s.spec.describe()) for s in loaded],
            inspect=spec.inspect or "bound", model_hosts=list(spec.model_hosts),
            image_config=image_config_facts(image, run_user), timeout_s=spec.timeout_s))
        box.secrets = loaded
        box.dir = staging
        facts: dict[str, Any] = {
                 "box": spec.name, "image": spec.image, "image_digest": image.digest,
                 # the mirror or registry that answered the image's reference, and with what
                 "image_pulled_from": image.pulled_from,
                 "workspace": box.info.workspace, "allowlist": list(spec.allow),
                 "limits": {**box.info.limits, "timeout_s": spec.timeout_s},
                 "env_names": sorted(spec.env),
                 "operator": {**(self.operator_facts or {
                     "egress_block": self.opts.egress_block,
                     "egress_permit": self.opts.egress_permit,
                     "egress_hosts": self.opts.egress_hosts}),
                     "extra_ca_certs": len(self.opts.ca_certs)},
                 "guest": {"kernel": build.kernel_version, "initramfs": build.digest},
                 "secrets": box.info.secrets, "inspect": box.info.inspect,
                 "model_hosts": box.info.model_hosts,
                 "image_config": box.info.image_config}
        if spec.workspace_owner is not None:
            facts["workspace_owner"] = list(spec.workspace_owner)
        if tool is not None:
            facts["tools"] = {**tool.facts(), "mount": TOOLS_MOUNT}
            box.info.tools = facts["tools"]
        if spec.via == "mcp":
            # what an agent driving tkbox chose, and the operator's opt-ins that let it
            facts["client"] = {"via": spec.via, "agent_chose": sorted(set(spec.agent_chose)),
                               "unsafe": sorted(set(spec.unsafe))}
        opened = False
        try:
            if self.door_factory is not None:
                box.door = self.door_factory(box)  # a bad --allow entry is refused here
            if not self.opts.unrecorded:
                await self.signer.open_run(run_id, facts)
                opened = True
            owner = (spec.workspace_owner[0], spec.workspace_owner[1]) \
                if spec.workspace_owner else (run_user.uid, run_user.gid) if run_user \
                else (0, 0)
            # The disks are built in threads that write into `staging`: a cancellation
            # (the daemon stopping) stops the copy and waits for them before removing it.
            t0 = time.monotonic()
            stats = await run_through(build_lower, ws, staging / "lower.sqfs", owner,
                                      stop=threading.Event())
            box.info.workspace_copy = stats
            await run_through(build_upper, staging / "upper.ext4", spec.disk_mib, owner)
            timings["workspace"] = round(time.monotonic() - t0, 3)
            box.info.timings = timings
            box.save()
            final = self.root / spec.name
            if final.exists():
                raise UserError(f"a box named {spec.name!r} exists already")
            os.rename(staging, final)
            box.dir = final
            box.save()
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if opened:
                await self._unmade(box, exc)
            raise
        self.boxes[spec.name] = box
        try:
            await self._boot(box, spec, image, build, run_user, tool)
            if spec.timeout_s is not None:
                box.expiry = box.tasks.spawn(self._expire(box, spec.timeout_s),
                                             name="--timeout")
        except BaseException as exc:
            box.info.error = str(exc) if isinstance(exc, TkboxError) else \
                f"{exc.__class__.__name__}: {exc}"
            if box.vm is not None:
                await box.vm.kill()
            box.vm = None
            if lifecycle.can(box.state, Event.BOOT_FAILED):
                box.move(Event.BOOT_FAILED)
            await self.record(box, "tkbox.box.failed", {"reason": box.info.error[:500]})
            raise
        return box

    async def _unmade(self, box: Box, exc: BaseException) -> None:
        """A run opened for a box that was never made: its record says why, and it is
        closed, as nothing is left to export it from. A signer that does not answer
        gets it as a gap at its next flush (the run then stays open)."""
        if isinstance(exc, asyncio.CancelledError):
            why = "cancelled while the box was created (the daemon stopping)"
        else:
            why = str(exc) if isinstance(exc, TkboxError) else f"{exc.__class__.__name__}: {exc}"
        try:
            await self.signer.event(box.run_id, "tkbox.box.failed",
                                    {"reason": why[:500], "stage": "create"})
            await self.signer.close_run(box.run_id)
        except TkboxError as err:
            log.warning("the run of box %s, which was not created, is not closed: %s",
                        box.name, err)
            self._gap(box, {"reason": f"not created: {why[:300]}"})

    def _fresh_name(self) -> str:
        """A name for a box run without --name: short, unused, printed by `tkbox run`."""
        while True:
            name = f"box-{secrets.token_hex(3)}"
            if name not in self.boxes and not (self.root / name).exists():
                return name

    async def _expire(self, box: Box, after_s: int) -> None:
        """`--timeout`: the box stops by itself, like `tkbox stop`, and the record says why.

        Counted from when the box was ready; a box already stopping or stopped is left be.
        """
        await asyncio.sleep(after_s)
        box.expiry = None  # it fired: a stop from here must not cancel this very task
        if not lifecycle.can(box.state, Event.STOP):
            return
        log.warning("box %s reached its --timeout of %d s; stopping it", box.name, after_s)
        await self.record(box, "tkbox.timeout", {"after_s": after_s})
        box.info.error = f"stopped: it reached its --timeout of {after_s} s"
        try:
            await self.stop(box.name)
        except TkboxError as exc:
            log.warning("stopping %s at its timeout failed: %s", box.name, exc)

    async def _boot(self, box: Box, spec: BoxSpec, image: ResolvedImage, build: GuestBuildInfo,
                    run_user: RunUser | None = None, tool: ToolDiskInfo | None = None) -> None:
        vm_dir = self.vms_root / box.run_id
        disks: tuple[Disk, ...] = (Disk(Path(image.rootfs), True, "root"),
                 Disk(box.dir / "lower.sqfs", True, "lower"),
                 Disk(box.dir / "upper.ext4", False, "upper"))
        if tool is not None:
            disks += (Disk(tool.path, True, "tools"),)
        vm_spec = VMSpec(
            name=box.name, kernel=build.kernel, initramfs=build.initramfs, workdir=vm_dir,
            disks=disks, memory_mib=spec.memory_mib, vcpus=spec.vcpus)
        loop = asyncio.get_running_loop()
        box.ready = loop.create_future()
        config = boot_config(box, spec, self.opts, image, run_user,
                             tools=TOOLS_MOUNT if tool is not None else None)
        t0 = time.monotonic()

        def serve_ports(ports: Ports) -> None:  # before the guest can open a stream
            ports.serve(PORT_BOOT, lambda s: self._serve_boot(box, s, config))
            ports.serve(PORT_EGRESS, lambda s: self._serve_egress(box, s))

        vm = await self.launcher.start(vm_spec, before_boot=serve_ports)
        box.vm = vm  # set first: whatever happens next, the create's failure path kills it
        if box.tasks.closed:
            raise UserError(f"box {box.name} was removed (rm --force) while it was created")
        box.info.accel = vm.accel
        box.info.start = {"kind": vm.start_kind, "reason": vm.start_reason,
                          "isolation": vm.isolation}
        box.guest = GuestClient(vm.ports, box.name)
        box.tasks.spawn(self._watch_vm(box), name="VM watcher")
        box.tasks.spawn(self._watch_transport(box, vm), name="transport watcher")
        try:
            msg = await asyncio.wait_for(asyncio.shield(box.ready), BOOT_TIMEOUT)
        except TimeoutError:
            raise HostError(f"box {box.name} did not boot within {BOOT_TIMEOUT:.0f}s; see "
                            f"{vm_dir / 'console.log'} (TKBOX_GUEST_DEBUG=1 for kernel output)"
                            ) from None
        box.info.boot_seconds = round(time.monotonic() - t0, 3)
        if box.info.timings is not None:
            box.info.timings["boot"] = box.info.boot_seconds
        box.move(Event.BOOTED)
        up = seconds(msg.get("uptime"))  # guest-supplied: checked, never trusted
        await self.record(box, "tkbox.box.ready", {
            "boot_ms": int(box.info.boot_seconds * 1000), "accel": vm.accel,
            "start": vm.start_kind, "start_reason": vm.start_reason[:300],
            "vmm_isolation": vm.isolation[:500],
            "guest_uptime_ms": int(up * 1000) if up is not None else None})

    async def _serve_boot(self, box: Box, stream: ByteStream, config: dict[str, Any]) -> None:
        """Port 1026: the boot config, served once; the guest answers ready on it."""
        if box.boot_served:
            return  # served once: later streams are closed unanswered
        box.boot_served = True
        fs = FramedStream(stream, limits=GUEST_FRAMES, budget=box.budget())
        try:
            await fs.send(config)
            msg = await asyncio.wait_for(fs.receive(), BOOT_TIMEOUT)
        except (FrameError, StreamClosed, EOFError, TimeoutError) as exc:
            msg = {"ev": "error", "message": f"boot stream broke: {exc.__class__.__name__}"}
        if isinstance(msg, dict) and not boot_answer_ok(msg):
            msg = {"ev": "error", "message": "the boot answer is not {ev: ready, uptime} or "
                                             "{ev: error, message} (unknown keys are refused)"}
        if box.ready is None or box.ready.done():
            return
        if not isinstance(msg, dict) or msg.get("ev") != "ready":
            text = msg.get("message") if isinstance(msg, dict) else None
            box.ready.set_exception(GuestError(
                f"box {box.name}: the guest failed to start: "
                f"{guest_text(text, 300) if text else 'no ready answer'}"))
        else:
            box.ready.set_result(msg)

    async def _serve_egress(self, box: Box, stream: ByteStream) -> None:
        """Port 1025: one proxied connection, through the network door."""
        if box.door is None or not lifecycle.takes_crossings(box.state):
            await _refuse_http(stream, "egress is closed: this box has no network door "
                                       "open (it is stopping, or the door is not wired)")
            return
        await box.door.handle(stream)

    async def _watch_vm(self, box: Box) -> None:
        vm = box.vm
        if vm is None:
            return
        code = await vm.wait()
        box.info.vm_exit = code
        if box.ready is not None and not box.ready.done():
            box.ready.set_exception(GuestError(
                f"box {box.name}: the VM ended during boot (status {code}); see "
                f"{self.vms_root / box.run_id / 'console.log'}"))
        if box.expiry is not None:
            box.expiry.cancel()  # the VM is gone: there is nothing left to stop in time
            box.expiry = None
        if lifecycle.vm_end_is_unexpected(box.state):
            # The host's kernel ending the VMM at one of its cell's limits is said as such.
            box.info.error = (f"the VM ended: {vm.end_reason} (status {code})" if vm.end_reason
                              else f"the VM ended unexpectedly (status {code})")
            box.move(Event.VM_DIED)
            await self.record(box, "tkbox.containment", {
                "reason": box.info.error[:500],
                **({"vmm_limit": vm.end_limit} if vm.end_limit else {})})
        if box.door is not None and not lifecycle.stop_began(box.state):
            # The door's open connections end, and its last refusal summary is recorded.
            with contextlib.suppress(Exception):
                await box.door.close()
        if box.dir.is_dir():  # `rm --force` may have removed it while the VM ended
            box.save()

    async def _watch_transport(self, box: Box, vm: VM) -> None:
        """A guest that breaks the transport (a protocol violation) loses its VM."""
        why = await vm.ports.wait_closed()
        # A VM that ended (QEMU killed, the guest powered off) closes the link too: that
        # is the VM watcher's to report, not the guest's fault. A guest that broke the
        # protocol leaves its VM running.
        ended = box.tasks.spawn(vm.wait(), name="VM end", awaited=True)
        done, _ = await asyncio.wait({ended}, timeout=1.0)
        if done:
            return
        await cancel_and_wait(ended)
        if box.vm is vm and lifecycle.guest_keeps_transport(box.state):
            box.info.error = f"the guest broke its transport ({why}); the VM was killed"
            if box.ready is not None and not box.ready.done():
                box.ready.set_exception(GuestError(f"box {box.name}: {box.info.error}"))
            if lifecycle.can(box.state, Event.VM_DIED):
                box.move(Event.VM_DIED)
            await vm.kill()
            await self.record(box, "tkbox.containment", {"reason": box.info.error[:500]})

    # ---- stop ---------------------------------------------------------------

    async def stop(self, name: str) -> Box:
        box = self.get(name)
        async with box.lock:
            was = box.state
            box.move(Event.STOP)
            # Egress closes the moment the stop begins.
            if box.door is not None:
                with contextlib.suppress(Exception):
                    await box.door.close()
            if self.approvals is not None:
                with contextlib.suppress(Exception):
                    await self.approvals.stop_box(box.name)
            vm, guest = box.vm, box.guest
            if vm is None or guest is None:
                raise InternalError(f"box {name} has no VM while {box.state}")
            if lifecycle.can(was, Event.RELEASE):
                with contextlib.suppress(Exception):
                    await vm.resume()  # a held box must run to give its patch
            patch_path = box.dir / "patch.diff"
            tmp = box.dir / ".patch.diff.tmp"
            # The whole diff has one deadline (a guest trickling its patch cannot hold
            # `stop`), and travels on a reserved stream (a guest holding every stream
            # cannot keep the host from asking for it). Whatever ends it, the whole
            # files that arrived are kept: a partial patch, said so, never nothing.
            deadline = asyncio.get_running_loop().time() + STOP_DEADLINE
            progress = PatchProgress()
            cut: str | None = None
            try:
                with open(tmp, "wb") as f:
                    try:
                        await guest.diff(f, progress, kill=True, deadline=deadline,
                                         timeout=min(300.0, STOP_DEADLINE),
                                         ignored=self._ignored_in(box))
                    except TkboxError as exc:
                        cut = str(exc)
                    f.truncate(progress.marked)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, patch_path)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                box.info.error = f"the patch could not be saved: {exc}"
                await vm.kill()
                box.move(Event.STOP_FAILED)
                await self.record(box, "tkbox.containment", {"reason": box.info.error[:500]})
                # The run has lost the box's changes: that is a gap in what it shows.
                self._gap(box, {"reason": "patch lost at stop", "error": str(exc)[:500]})
                await self.flush_gaps()
                raise HostError(f"box {name}: {box.info.error}") from exc
            data = patch_path.read_bytes()
            patch_sha256 = hashlib.sha256(data).hexdigest()
            box.info.patch = patch_info(data, progress, cut)
            if cut is None:
                with contextlib.suppress(TkboxError):
                    await guest.shutdown()
            else:
                box.info.error = f"the patch is partial: {cut[:500]}"
                await vm.kill()  # a guest that could not finish its patch is not asked more
            ended = box.tasks.spawn(vm.wait(), name="VM end", awaited=True)  # never cut short
            try:
                await asyncio.wait_for(asyncio.shield(ended), 20)
            except TimeoutError:
                await vm.kill()
            box.vm = None
            box.guest = None
            box.move(Event.STOPPED)
            if box.expiry is not None:
                box.expiry.cancel()  # stopped before its --timeout
                box.expiry = None
        await self.record(box, "tkbox.patch", patch_record(box.info.patch))
        await self.record(box, "tkbox.box.stop", {"patch_sha256": patch_sha256,
                                                  "patch_bytes": len(data),
                                                  "partial": cut is not None})
        shutil.rmtree(self.vms_root / box.run_id, ignore_errors=True)
        return box

    def _ignored_in(self, box: Box) -> IgnoredCheck:
        """Which changed paths the box's checkout's git ignores, as `tkbox apply` decides
        it; nothing when that cannot be told (the box's patch then carries them, and
        apply sets them apart)."""
        async def check(paths: list[bytes]) -> set[bytes]:
            from tkbox.doors.changes import ignored_paths

            checkout = Path(box.info.workspace)
            try:
                return await ignored_paths(checkout, paths)
            except (TkboxError, OSError) as exc:
                log.warning("box %s: cannot ask %s's git what it ignores: %s", box.name,
                            checkout, str(exc)[:300])
                return set()
        return check

    def patch(self, name: str) -> bytes:
        box = self.get(name)
        p = box.dir / "patch.diff"
        if not lifecycle.has_patch(box.state) or not p.is_file():
            raise UserError(f"box {name} has no saved patch: it is {box.state}; "
                            f"{lifecycle.HINTS.get(box.state, '')}")
        return p.read_bytes()

    # ---- apply --------------------------------------------------------------------

    async def apply(self, name: str, checkout: str | None, allow_sensitive: bool,
                    dry_run: bool, *, with_patch: bool = False) -> dict[str, Any]:
        """Decide (and unless `dry_run`, write) the box's patch into `checkout`; the
        report as JSON, with `patch_b64` (the applied files' sections) if `with_patch`."""
        from tkbox.doors.changes import apply_patch

        box = self.get(name)
        if not lifecycle.can(box.state, Event.APPLY):
            raise UserError(f"cannot apply box {name}: it is {box.state}; apply works only on "
                            "a stopped box before export")
        data = await asyncio.to_thread(self.patch, name)  # up to the patch limit: off the loop
        target = Path(checkout or box.info.workspace).expanduser()
        if not target.is_dir():
            raise UserError(f"checkout {target} does not exist or is not a directory")
        if allow_sensitive and not box.unrecorded:
            await self.record(box, "tkbox.unsafe", {"flag": "--allow-sensitive"})
        report = await apply_patch(data, target, self.signer, box.run_id,
                                   allow_sensitive=allow_sensitive, dry_run=dry_run)
        result: dict[str, Any] = report.to_json()
        box_apart(result, box.info.patch)
        if with_patch:
            result["patch_b64"] = base64.b64encode(report.patch).decode()
        if not dry_run:
            await self.record(box, "tkbox.apply", _apply_record(result))
            box.info.applied.append({"checkout": str(target), "time": time.time()})
            box.save()
        return result

    # ---- export / rm ---------------------------------------------------------------

    async def export(self, name: str) -> tuple[bytes, bytes]:
        box = self.get(name)
        if box.unrecorded:
            raise UserError(f"box {name} was started by a daemon run with --unrecorded: "
                            "nothing was recorded, so there is nothing to export")
        lifecycle.next_state(box.state, Event.EXPORT, f"box {name}")  # refused before the signer
        await self.flush_gaps()
        if any(r == box.run_id for r, _ in self.gaps):
            raise SignerUnavailable("the signer does not answer, so this run's gaps cannot be "
                                    "recorded yet; start the signer and export again")
        try:
            await self.signer.close_run(box.run_id)
        except SignerUnavailable:
            raise
        except TkboxError:
            pass  # already closed by an earlier export attempt
        exp = await self.signer.export(box.run_id)
        box.move(Event.EXPORT)
        return exp.bundle, exp.trust

    async def rm(self, name: str, force: bool = False) -> None:
        box = self.get(name)
        if lifecycle.is_live(box.state):
            if not force:
                raise UserError(f"box {name} is {box.state}; stop it first or use --force")
            if box.vm is not None:
                await box.vm.kill()
            box.info.error = "removed with --force while live"
            self._gap(box, {"reason": "removed with --force while live"})
            await self.flush_gaps()
        await box.tasks.aclose()
        shutil.rmtree(self.vms_root / box.run_id, ignore_errors=True)
        shutil.rmtree(box.dir, ignore_errors=True)
        del self.boxes[name]


async def _refuse_http(stream: ByteStream, reason: str) -> None:
    body = (reason + "\n").encode()
    head = (f"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}"
            "\r\nConnection: close\r\nX-Tkbox-Refused: 1\r\n\r\n").encode()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(stream.receive(65536), 2)
        await stream.send_all(head + body)
    with contextlib.suppress(Exception):
        await stream.aclose()


#: files listed by name in a `tkbox.apply` record; beyond, only counted
MAX_APPLY_LISTED = 200
MAX_APPLY_NOTES = 16  # the door's notes in a `tkbox.apply` record


def _apply_record(result: dict[str, Any]) -> dict[str, Any]:
    """What an apply did, for the record: counts, and the files not written by name.

    Written files are in the record already (one `Write` decision each); the ones
    held back never reached the signer, so this is where a reader learns of them.
    Paths come from the guest's patch: each is cut to 256 characters, and at most
    `MAX_APPLY_LISTED` are named. The notes are the door's own sentences (an
    earlier apply into the checkout cut short and put right first, whose Write
    decisions have no completion: this says why), a few, each cut to 300.
    """
    def listed(status: str) -> list[dict[str, str]]:
        return [{"path": str(f["path"])[:256], "reason": str(f.get("reason", ""))[:200]}
                for f in result["files"] if f["status"] == status][:MAX_APPLY_LISTED]

    return {"patch_sha256": result["patch_sha256"], "counts": dict(result["counts"]),
            "allow_sensitive": bool(result["allow_sensitive"]),
            "held_back": listed("held back"), "refused": listed("refused"),
            "notes": [str(n)[:300] for n in result.get("notes", ())][:MAX_APPLY_NOTES]}
