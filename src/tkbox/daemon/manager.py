"""Boxes: create, exec, stop, apply, export, rm, and what the signer pushes.

One `BoxManager` per daemon. Each box's state is on disk
(`$TKBOX_HOME/boxes/NAME/box.json`, written atomically), so `ls` and
`inspect` survive a restart; a box found in a live state at start has lost
its VM, is marked failed, and the loss is recorded as `tkbox.gap`.

Fail closed: a command needs an allowed `Bash` decision before it starts; a
signer that does not answer refuses it. An event that cannot be recorded stops
the box and is queued as a gap, recorded as soon as the signer takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tkbox import paths
from tkbox.daemon import lifecycle
from tkbox.daemon.guest_client import ExecResult, GuestClient, _str, seconds
from tkbox.daemon.workspace import build_lower, build_upper
from tkbox.doors.commands.core import build_request
from tkbox.doors.secrets import prestart
from tkbox.errors import (
    GuestError,
    HostError,
    InternalError,
    Refused,
    SignerRefused,
    SignerUnavailable,
    TkboxError,
    UserError,
)
from tkbox.guest import rpc
from tkbox.image.runconfig import RunUser, image_env, user_of
from tkbox.protocol.framing import GUEST_FRAMES, FramedStream, FrameError
from tkbox.protocol.ports import PORT_BOOT, PORT_EGRESS, Ports
from tkbox.protocol.streams import ByteStream, StreamClosed
from tkbox.record.budget import RUN_BYTES, RUN_RECORDS, BudgetedSigner
from tkbox.record.client import SignerClient
from tkbox.record.journal import Journals
from tkbox.vm.base import VM, Disk, Launcher, VMSpec

log = logging.getLogger("tkbox.daemon")

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
BOOT_TIMEOUT = float(os.environ.get("TKBOX_BOOT_TIMEOUT", "180"))
#: seconds the guest has, from the start of `tkbox stop`, to send its whole patch
STOP_DEADLINE = float(os.environ.get("TKBOX_STOP_DEADLINE", "120"))
PROXY_URL = "http://127.0.0.1:3128"
#: the longest --timeout a box may have (a week)
MAX_TIMEOUT_S = 7 * 24 * 3600


@dataclass
class Options:
    """What the daemon was started with (the host's settings, never the box's)."""

    unrecorded: bool = False
    egress_block: list[str] = field(default_factory=list)
    egress_permit: list[str] = field(default_factory=list)
    egress_hosts: str | None = None
    ca_certs: list[str] = field(default_factory=list)  # PEM texts
    approval_wait: int = 120  # seconds a connection waits for a person
    run_records: int = RUN_RECORDS  # records a run may hold before its box is stopped
    run_bytes: int = RUN_BYTES  # estimated bundle bytes likewise
    tunnel_idle: float = 300.0  # seconds a tunnel may carry nothing either way
    tunnel_total: float = 4 * 3600.0  # seconds a tunnel may stay open at all
    max_connections: int = 0  # egress connections daemon-wide; 0: from RLIMIT_NOFILE


@dataclass
class BoxSpec:
    name: str
    image: str
    workspace: str
    allow: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    memory_mib: int = 1024
    vcpus: int = 1
    disk_mib: int = 4096
    # `--secret` spec strings; values the client read itself (name -> value), else
    # the daemon reads each source; `--inspect all`. Values live only in Box.secrets.
    secrets: list[str] = field(default_factory=list)
    secret_values: dict[str, str] = field(default_factory=dict, repr=False)
    inspect: str = ""
    model_hosts: list[str] = field(default_factory=list)  # recorded as model calls
    timeout_s: int | None = None  # the box stops by itself after this long (recorded)


class Box:
    """One box: its state on disk and, while it lives, its VM and doors."""

    def __init__(self, directory: Path, state: dict[str, Any]) -> None:
        self.dir = directory
        self.s = state
        self.vm: VM | None = None
        self.guest: GuestClient | None = None
        self.door: Any = None  # the network door, when one is wired
        self.tasks: set[asyncio.Task[Any]] = set()
        self.execs: dict[str, asyncio.Queue[int]] = {}
        self.lock = asyncio.Lock()
        self.ready: asyncio.Future[dict[str, Any]] | None = None
        self.boot_served = False
        self.secrets: list[Any] = []  # tkbox.doors.secrets.Secret: daemon memory only
        self.input_guards: dict[str, prestart.InputGuard] = {}  # per terminal command

    @property
    def name(self) -> str:
        return str(self.s["name"])

    @property
    def state(self) -> str:
        return str(self.s["state"])

    @property
    def run_id(self) -> str:
        return str(self.s["run_id"])

    def save(self) -> None:
        tmp = self.dir / f".box.json.{secrets.token_hex(4)}"
        tmp.write_text(json.dumps(self.s, indent=1, sort_keys=True))
        os.replace(tmp, self.dir / "box.json")

    def move(self, event: str) -> None:
        self.s["state"] = lifecycle.next_state(self.state, event, f"box {self.name}")
        self.s["updated"] = time.time()
        self.save()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        t: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)
        return t

    def public(self) -> dict[str, Any]:
        out = {k: v for k, v in self.s.items() if k not in ("env_values",)}
        out["display_name"] = self.name + (" [UNRECORDED]" if self.s.get("unrecorded") else "")
        ports = self.vm.ports if self.vm is not None else None
        budget = getattr(ports, "budget", None)
        if budget is not None:
            # How much the guest was slowed by its work budget and output/input bounds.
            out["guest_throttled_s"] = round(budget.throttled, 3)
            out["guest_reads_paused"] = int(getattr(ports, "paused_reads", 0))
        return out


class BoxManager:
    def __init__(self, *, launcher: Launcher, signer: SignerClient, options: Options,
                 images: Any, guest_build: Any, accel_reason: str = "",
                 home: Path | None = None, door_factory: Any = None,
                 approvals: Any = None) -> None:
        self.launcher = launcher
        # Every record goes through the per-run budget, so every run stays exportable.
        unbounded = options.unrecorded  # nothing is recorded, so there is nothing to bound
        self.signer = BudgetedSigner(signer,
                                     max_records=2**62 if unbounded else options.run_records,
                                     max_bytes=2**62 if unbounded else options.run_bytes,
                                     on_exhausted=self._budget_exhausted)
        self.opts = options
        self.images = images
        self.guest_build = guest_build  # () -> GuestBuild (cached)
        self.journals: Journals | None = None  # `tkbox logs` (set by the server)
        self.accel_reason = accel_reason
        self.root = paths.private_dir((home or paths.home()) / "boxes")
        self.vms_root = paths.private_dir(paths.vms(home))
        self.door_factory = door_factory
        self.approvals = approvals
        self.boxes: dict[str, Box] = {}
        self.gaps: list[tuple[str, dict[str, Any]]] = []
        self.operator_facts: dict[str, Any] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # ---- start-up and shutdown -------------------------------------------------

    async def load(self) -> None:
        """Read boxes from disk; a box that was live has lost its VM."""
        for d in sorted(self.root.iterdir()):
            f = d / "box.json"
            if not f.is_file():
                if d.name.startswith(".creating-"):
                    shutil.rmtree(d, ignore_errors=True)  # a create that never finished
                continue
            try:
                state = json.loads(f.read_text())
            except (OSError, ValueError):
                log.warning("box state %s is unreadable; left as is", f)
                continue
            box = Box(d, state)
            self.boxes[box.name] = box
            if box.state in lifecycle.LIVE:
                lost = box.state
                box.s["error"] = f"the daemon stopped while the box was {lost}; its VM is gone"
                box.move("daemon_lost")
                self._gap(box, {"reason": "daemon restart", "state": lost})
        await self.flush_gaps()

    def _gap(self, box: Box, body: dict[str, Any]) -> None:
        if not box.s.get("unrecorded"):
            self.gaps.append((box.run_id, {"box": box.name, **body,
                                           "time_ms": int(time.time() * 1000)}))

    async def flush_gaps(self) -> None:
        """Record the queued gaps in order. A signer that does not answer keeps them all
        for the next flush; a gap the signer refuses (its run was closed behind the
        daemon's back) is logged and dropped, so it cannot hold back other runs' gaps."""
        while self.gaps:
            run_id, body = self.gaps[0]
            try:
                await self.signer.event(run_id, "tkbox.gap", body)
            except SignerRefused as exc:
                log.warning("gap for %s refused by the signer: %s", run_id, exc)
            except SignerUnavailable:
                return
            except TkboxError as exc:
                log.warning("gap for %s not recordable: %s", run_id, exc)
            self.gaps.pop(0)

    async def shutdown(self) -> None:
        """SIGTERM: stop every live box cleanly (patch saved), kill what will not stop."""
        live = [b for b in self.boxes.values() if b.state in ("running", "held")]
        await asyncio.gather(*(self._stop_quietly(b) for b in live))
        for b in self.boxes.values():
            if b.vm is not None:
                await b.vm.kill()
        for t in list(self._tasks):
            t.cancel()

    async def _stop_quietly(self, box: Box) -> None:
        try:
            await asyncio.wait_for(self.stop(box.name), 60)
        except Exception as exc:  # noqa: BLE001 - shutting down: kill and go on
            log.warning("stopping %s at shutdown failed: %s", box.name, exc)
            if box.vm is not None:
                await box.vm.kill()

    # ---- records ---------------------------------------------------------------

    async def record(self, box: Box, kind: str, body: dict[str, Any]) -> None:
        """An event that must be kept; if it cannot be, the box stops (fail closed)."""
        if box.s.get("unrecorded"):
            return
        try:
            await self.signer.event(box.run_id, kind, body)
        except TkboxError as exc:
            self._gap(box, {"reason": f"event {kind} not recorded: {exc}", "event": kind})
            await self.contain(box, f"an event could not be recorded ({exc})")

    def _budget_exhausted(self, run_id: str, why: str) -> None:
        """A run reached its record budget: stop its box, and say so in the run."""
        box = next((b for b in self.boxes.values() if b.s.get("run_id") == run_id), None)
        if box is None:
            return

        async def stop_it() -> None:
            records, size = self.signer.usage(run_id)
            await self.record(box, "tkbox.containment", {
                "reason": why[:500], "budget": "records", "records": records,
                "estimated_bundle_bytes": size})
            await self.contain(box, why)

        t = asyncio.ensure_future(stop_it())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def contain(self, box: Box, why: str) -> None:
        """Stop a box at once because the record cannot be kept."""
        log.warning("box %s stopped: %s", box.name, why)
        if box.state in lifecycle.LIVE or not box.s.get("error"):
            box.s["error"] = f"stopped: {why}"  # the first cause, not what it then broke
        # The state moves first: the VM watcher must not see a "running" box die.
        if lifecycle.can(box.state, "vm_died"):
            box.move("vm_died")
        if box.door is not None:
            with contextlib.suppress(Exception):
                await box.door.close()
        if box.vm is not None:
            await box.vm.kill()

    async def watch_pushes(self) -> None:
        """Holds, releases and quarantines, as the signer pushes them."""
        while True:
            try:
                async for p in self.signer.pushes():
                    await self._on_push(p.kind, p.run_id, p.reason)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reconnect after a pause
                log.info("signer push channel: %s", exc)
            await asyncio.sleep(0.5)

    async def _on_push(self, kind: str, run_id: str, reason: str) -> None:
        box = next((b for b in self.boxes.values() if b.s.get("run_id") == run_id), None)
        if box is None:
            return
        if kind == "hold" and box.state == "running" and box.vm is not None:
            await box.vm.pause()
            box.move("hold")
        elif kind == "release" and box.state == "held" and box.vm is not None:
            await box.vm.resume()
            box.move("release")
        elif kind == "quarantine" and box.state in lifecycle.LIVE:
            box.s["error"] = f"quarantined by the signer: {reason}".rstrip(": ")
            box.move("quarantine")  # first, so the VM's end is not taken for a crash
            if box.door is not None:
                with contextlib.suppress(Exception):
                    await box.door.close()
            if box.vm is not None:
                await box.vm.kill()

    # ---- lookups -----------------------------------------------------------------

    def get(self, name: str) -> Box:
        box = self.boxes.get(name)
        if box is None:
            raise UserError(f"no box named {name!r}; see 'tkbox ls'")
        return box

    def list_boxes(self) -> list[dict[str, Any]]:
        return [b.public() for b in sorted(self.boxes.values(), key=lambda b: b.s["created"])]

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
        image = await self.images.resolve(spec.image)  # UserError if unknown
        run_user = await asyncio.to_thread(_image_user, image)
        build = await asyncio.to_thread(self.guest_build)
        run_id = f"{spec.name}-{secrets.token_hex(6)}"
        staging = self.root / f".creating-{run_id}"
        staging.mkdir(mode=0o700)
        box = Box(self.root / spec.name, {
            "name": spec.name, "run_id": run_id, "state": "creating", "created": time.time(),
            "updated": time.time(), "image": spec.image, "image_digest": image.digest,
            "workspace": str(ws.resolve()), "allow": list(spec.allow),
            "env_names": sorted(spec.env), "limits": {"memory_mib": spec.memory_mib,
            "vcpus": spec.vcpus, "disk_mib": spec.disk_mib},
            "unrecorded": self.opts.unrecorded, "accel": "", "kernel": build.kernel_version,
            "guest_build": build.digest[:16],
            "secrets": [s.spec.describe() for s in loaded], "inspect": spec.inspect or "bound",
            "model_hosts": list(spec.model_hosts),
            "image_config": _image_config_facts(image, run_user),
            "timeout_s": spec.timeout_s,
        })
        box.secrets = loaded
        box.dir = staging
        facts = {"box": spec.name, "image": spec.image, "image_digest": image.digest,
                 "workspace": box.s["workspace"], "allowlist": list(spec.allow),
                 "limits": {**box.s["limits"], "timeout_s": spec.timeout_s},
                 "env_names": sorted(spec.env),
                 "operator": {**(self.operator_facts or {
                     "egress_block": self.opts.egress_block,
                     "egress_permit": self.opts.egress_permit,
                     "egress_hosts": self.opts.egress_hosts}),
                     "extra_ca_certs": len(self.opts.ca_certs)},
                 "guest": {"kernel": build.kernel_version, "initramfs": build.digest},
                 "secrets": box.s["secrets"], "inspect": box.s["inspect"],
                 "model_hosts": box.s["model_hosts"],
                 "image_config": box.s["image_config"]}
        try:
            if self.door_factory is not None:
                box.door = self.door_factory(box)  # a bad --allow entry is refused here
            if not self.opts.unrecorded:
                await self.signer.open_run(run_id, facts)
            owner = (run_user.uid, run_user.gid) if run_user else (0, 0)
            stats = await asyncio.to_thread(build_lower, ws, staging / "lower.sqfs", owner)
            box.s["workspace_copy"] = stats
            await asyncio.to_thread(build_upper, staging / "upper.ext4", spec.disk_mib)
            box.save()
            final = self.root / spec.name
            if final.exists():
                raise UserError(f"a box named {spec.name!r} exists already")
            os.rename(staging, final)
            box.dir = final
            box.save()
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self.boxes[spec.name] = box
        try:
            await self._boot(box, spec, image, build, run_user)
            if spec.timeout_s is not None:
                box.spawn(self._expire(box, spec.timeout_s))
        except BaseException as exc:
            box.s["error"] = str(exc) if isinstance(exc, TkboxError) else \
                f"{exc.__class__.__name__}: {exc}"
            if box.vm is not None:
                await box.vm.kill()
            box.vm = None
            if lifecycle.can(box.state, "boot_failed"):
                box.move("boot_failed")
            await self.record(box, "tkbox.box.failed", {"reason": box.s["error"][:500]})
            raise
        return box

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
        if box.state not in ("running", "held"):
            return
        log.warning("box %s reached its --timeout of %d s; stopping it", box.name, after_s)
        await self.record(box, "tkbox.timeout", {"after_s": after_s})
        box.s["error"] = f"stopped: it reached its --timeout of {after_s} s"
        try:
            await self.stop(box.name)
        except TkboxError as exc:
            log.warning("stopping %s at its timeout failed: %s", box.name, exc)

    def _boot_config(self, box: Box, spec: BoxSpec, image: Any = None,
                     run_user: RunUser | None = None) -> dict[str, Any]:
        # Lowest first: tkbox's defaults, the image's Env, the doors' variables, --env
        # (tkbox.image.runconfig says why).
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": run_user.home if run_user else "/root", "LANG": "C.UTF-8",
               "TERM": "dumb",
               # Bytecode caches are files nobody commits; without this, running the
               # tests in the box put __pycache__/*.pyc into the patch and the checkout.
               "PYTHONDONTWRITEBYTECODE": "1"}
        config = getattr(image, "config", None)
        if config is not None:
            env.update(image_env(config.env))
        env.update({"HTTP_PROXY": PROXY_URL, "HTTPS_PROXY": PROXY_URL, "http_proxy": PROXY_URL,
                    "https_proxy": PROXY_URL, "NO_PROXY": "", "no_proxy": ""})
        pems = list(self.opts.ca_certs)
        if box.door is not None and getattr(box.door, "ca_pem", None):
            pems.insert(0, box.door.ca_pem)
        if pems:
            bundle = "/etc/ssl/certs/ca-certificates.crt"
            env.update({"SSL_CERT_FILE": bundle, "REQUESTS_CA_BUNDLE": bundle,
                        "CURL_CA_BUNDLE": bundle, "PIP_CERT": bundle, "GIT_SSL_CAINFO": bundle,
                        "NODE_EXTRA_CA_CERTS": "/etc/ssl/certs/tkbox-ca.pem"})
        env.update(spec.env)
        for sec in box.secrets:
            env[sec.name] = sec.placeholder.decode("ascii")
        host = spec.name + ("-unrecorded" if self.opts.unrecorded else "")
        # seed: host randomness the guest credits to its kernel and reseeds from
        # before anything else (a box restored from a template needs its own).
        cfg = {"v": 1, "time": time.time(), "seed": os.urandom(64), "hostname": host[:63],
               "env": env,
               "ca_pems": pems, "disks": {"root": "root", "lower": "lower", "upper": "upper"},
               "tmpfs_size": f"{max(64, spec.memory_mib // 2)}m"}
        if run_user is not None:
            cfg["user"] = {"uid": run_user.uid, "gid": run_user.gid,
                           "groups": list(run_user.groups)}
        return cfg

    async def _boot(self, box: Box, spec: BoxSpec, image: Any, build: Any,
                    run_user: RunUser | None = None) -> None:
        vm_dir = self.vms_root / box.run_id
        vm_spec = VMSpec(
            name=box.name, kernel=build.kernel, initramfs=build.initramfs, workdir=vm_dir,
            disks=(Disk(Path(image.rootfs), True, "root"),
                   Disk(box.dir / "lower.sqfs", True, "lower"),
                   Disk(box.dir / "upper.ext4", False, "upper")),
            memory_mib=spec.memory_mib, vcpus=spec.vcpus)
        loop = asyncio.get_running_loop()
        box.ready = loop.create_future()
        config = self._boot_config(box, spec, image, run_user)
        t0 = time.monotonic()

        def serve_ports(ports: Ports) -> None:  # before the guest can open a stream
            ports.serve(PORT_BOOT, lambda s: self._serve_boot(box, s, config))
            ports.serve(PORT_EGRESS, lambda s: self._serve_egress(box, s))

        vm = await self.launcher.start(vm_spec, before_boot=serve_ports)
        box.vm = vm
        box.s["accel"] = vm.accel
        box.s["start"] = {"kind": vm.start_kind, "reason": vm.start_reason}
        box.guest = GuestClient(vm.ports, box.name)
        box.spawn(self._watch_vm(box))
        box.spawn(self._watch_transport(box, vm))
        try:
            msg = await asyncio.wait_for(asyncio.shield(box.ready), BOOT_TIMEOUT)
        except TimeoutError:
            raise HostError(f"box {box.name} did not boot within {BOOT_TIMEOUT:.0f}s; see "
                            f"{vm_dir / 'console.log'} (TKBOX_GUEST_DEBUG=1 for kernel output)"
                            ) from None
        box.s["boot_seconds"] = round(time.monotonic() - t0, 3)
        box.move("booted")
        up = seconds(msg.get("uptime"))  # guest-supplied: checked, never trusted
        await self.record(box, "tkbox.box.ready", {
            "boot_ms": int(box.s["boot_seconds"] * 1000), "accel": vm.accel,
            "start": vm.start_kind, "start_reason": vm.start_reason[:300],
            "guest_uptime_ms": int(up * 1000) if up is not None else None})

    async def _serve_boot(self, box: Box, stream: ByteStream, config: dict[str, Any]) -> None:
        """Port 1026: the boot config, served once; the guest answers ready on it."""
        if box.boot_served:
            return  # served once: later streams are closed unanswered
        box.boot_served = True
        fs = FramedStream(stream, limits=GUEST_FRAMES, budget=stream_budget(box))
        try:
            await fs.send(config)
            msg = await asyncio.wait_for(fs.receive(), BOOT_TIMEOUT)
        except (FrameError, StreamClosed, EOFError, TimeoutError) as exc:
            msg = {"ev": "error", "message": f"boot stream broke: {exc.__class__.__name__}"}
        if isinstance(msg, dict) and not _boot_answer_ok(msg):
            msg = {"ev": "error", "message": "the boot answer is not {ev: ready, uptime} or "
                                             "{ev: error, message} (unknown keys are refused)"}
        if box.ready is None or box.ready.done():
            return
        if not isinstance(msg, dict) or msg.get("ev") != "ready":
            text = msg.get("message") if isinstance(msg, dict) else None
            box.ready.set_exception(GuestError(
                f"box {box.name}: the guest failed to start: "
                f"{_str(text, 300) if text else 'no ready answer'}"))
        else:
            box.ready.set_result(msg)

    async def _serve_egress(self, box: Box, stream: ByteStream) -> None:
        """Port 1025: one proxied connection, through the network door."""
        if box.door is None or box.state not in ("running",):
            await _refuse_http(stream, "egress is closed: this box has no network door "
                                       "open (it is stopping, or the door is not wired)")
            return
        await box.door.handle(stream)

    async def _watch_vm(self, box: Box) -> None:
        vm = box.vm
        if vm is None:
            return
        code = await vm.wait()
        box.s["vm_exit"] = code
        if box.ready is not None and not box.ready.done():
            box.ready.set_exception(GuestError(
                f"box {box.name}: the VM ended during boot (status {code}); see "
                f"{self.vms_root / box.run_id / 'console.log'}"))
        if box.state in ("running", "held"):
            box.s["error"] = f"the VM ended unexpectedly (status {code})"
            box.move("vm_died")
            await self.record(box, "tkbox.containment", {"reason": box.s["error"]})
        if box.door is not None and box.state not in ("stopping", "stopped"):
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
        ended = asyncio.ensure_future(vm.wait())
        done, _ = await asyncio.wait({ended}, timeout=1.0)
        if done:
            return
        ended.cancel()
        if box.vm is vm and box.state in ("creating", "running", "held"):
            box.s["error"] = f"the guest broke its transport ({why}); the VM was killed"
            if box.ready is not None and not box.ready.done():
                box.ready.set_exception(GuestError(f"box {box.name}: {box.s['error']}"))
            if lifecycle.can(box.state, "vm_died"):
                box.move("vm_died")
            await vm.kill()
            await self.record(box, "tkbox.containment", {"reason": box.s["error"][:500]})

    # ---- exec -------------------------------------------------------------------

    async def exec(self, name: str, argv: list[str], cwd: str | None, env: dict[str, str] | None,
                   stdin: bytes | None,
                   tty: dict[str, int] | None = None) -> AsyncIterator[dict[str, Any]]:
        """Run one command; yields events: started, out, exit (or error).

        With `tty` (rows, cols) the command gets a terminal; its keystrokes arrive by
        `exec_input` and size changes by `exec_resize`. The decision records that it was
        a terminal; the keystrokes themselves are not in the record (docs/limits.md).
        """
        box = self.get(name)
        if box.state != "running" or box.guest is None:
            raise UserError(f"cannot exec in box {name}: it is {box.state}; "
                            f"{lifecycle.HINTS.get(box.state, '')}")
        try:
            prestart.check_command(box.secrets, argv, env, stdin)
        except Refused as exc:
            # A secret's value in the command: the record names the secret, not the argv.
            await self.record(box, "tkbox.command.refused", {
                "reason": str(exc)[:500], "env_names": sorted(env or {})})
            raise
        try:
            req = build_request(argv, cwd, env, stdin)
        except Refused as exc:
            # Refused before the signer was asked: still part of the record.
            await self.record(box, "tkbox.command.refused", {
                "argv0": argv[0][:256] if argv else "", "reason": str(exc)[:500],
                "env_names": sorted(env or {})})
            raise
        decision_id = None
        if not box.s.get("unrecorded"):
            try:
                context = req.context()
                if tty is not None:
                    context["tty"] = True
                verdict = await self.signer.decide(box.run_id, "Bash", req.resource(),
                                                   context)
            except SignerUnavailable as exc:
                raise Refused(f"refused: the signer did not answer, so no command may run "
                              f"({exc}); start it with 'tkbox signer serve'") from None
            if not verdict.allowed:
                raise Refused(f"refused by the signer: {verdict.reason}")
            decision_id = verdict.decision_id
        exec_id = secrets.token_hex(4)
        signals: asyncio.Queue[Any] = asyncio.Queue(maxsize=64)
        box.execs[exec_id] = signals
        out_q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=8)
        counts = {1: 0, 2: 0}

        async def output(fd: int, data: bytes) -> None:
            counts[fd] += len(data)
            await out_q.put({"ev": "out", "fd": fd, "data": data})

        async def run() -> ExecResult:
            assert box.guest is not None
            try:
                return await box.guest.exec(list(req.argv), cwd=req.cwd, env=req.env,
                                            stdin=stdin, output=output, signals=signals,
                                            tty=tty)
            finally:
                await out_q.put(None)

        t0 = time.monotonic()
        task = box.spawn(run())
        result: ExecResult | None = None
        error: str | None = None
        try:
            yield {"ev": "started", "exec_id": exec_id, "command": req.command}
            while (item := await out_q.get()) is not None:
                yield item
            try:
                result = await task
            except GuestError as exc:
                error = str(exc)
            if result is not None:
                yield {"ev": "exit", "status": result.status, "signal": result.signal,
                       "error": result.error}
            else:
                yield {"ev": "error", "message": error or "the command did not finish"}
        finally:
            box.execs.pop(exec_id, None)
            box.input_guards.pop(exec_id, None)
            if not task.done():
                # The client went away (Ctrl-C): stop the command in the guest.
                with contextlib.suppress(asyncio.QueueFull):
                    signals.put_nowait(15)
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(task), 3)
                task.cancel()
            outcome = {"status": result.status if result else None,
                       "signal": result.signal if result else None,
                       "error": (error or (result.error if result else "client went away"))[:300],
                       "stdout_bytes": counts[1], "stderr_bytes": counts[2],
                       "duration_ms": int((time.monotonic() - t0) * 1000)}
            if decision_id is not None:
                try:
                    await self.signer.complete(box.run_id, decision_id, outcome)
                except TkboxError as exc:
                    self._gap(box, {"reason": f"completion not recorded: {exc}"})
                    await self.contain(box, f"a completion could not be recorded ({exc})")

    def _exec_queue(self, name: str, exec_id: str) -> asyncio.Queue[Any]:
        q = self.get(name).execs.get(exec_id)
        if q is None:
            raise UserError(f"no running command {exec_id} in box {name}")
        return q

    async def exec_input(self, name: str, exec_id: str, data: bytes) -> None:
        """Keystrokes for a command that has a terminal (bounded by the API's body)."""
        box = self.get(name)
        self._exec_queue(name, exec_id)
        guard = box.input_guards.setdefault(exec_id, prestart.InputGuard(box.secrets))
        try:
            data = guard.feed(data)  # no secret's value is typed into the box
        except Refused as exc:
            await self.record(box, "tkbox.command.refused", {"reason": str(exc)[:500]})
            raise
        if not data:
            return
        await asyncio.wait_for(self._exec_queue(name, exec_id).put(
            {"op": "stdin", "data": data}), 10)

    async def exec_resize(self, name: str, exec_id: str, rows: int, cols: int) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._exec_queue(name, exec_id).put_nowait({"op": "resize", "rows": rows,
                                                        "cols": cols})

    async def signal(self, name: str, exec_id: str, sig: int) -> None:
        box = self.get(name)
        q = box.execs.get(exec_id)
        if q is None:
            raise UserError(f"no running command {exec_id} in box {name}")
        if sig not in (1, 2, 3, 9, 15):
            raise UserError("signal must be one of HUP, INT, QUIT, KILL, TERM")
        with contextlib.suppress(asyncio.QueueFull):
            q.put_nowait(sig)

    # ---- stop ---------------------------------------------------------------

    async def stop(self, name: str) -> Box:
        box = self.get(name)
        async with box.lock:
            box.move("stop")
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
            if box.state == "stopping" and getattr(vm, "proc", None) is not None:
                with contextlib.suppress(Exception):
                    await vm.resume()  # a held box must run to give its patch
            patch_path = box.dir / "patch.diff"
            tmp = box.dir / ".patch.diff.tmp"
            # The whole diff has one deadline (a guest trickling its patch cannot hold
            # `stop`), and travels on a reserved stream (a guest holding every stream
            # cannot keep the host from asking for it).
            deadline = asyncio.get_running_loop().time() + STOP_DEADLINE
            try:
                with open(tmp, "wb") as f:
                    stats = await guest.diff(f, kill=True, deadline=deadline,
                                             timeout=min(300.0, STOP_DEADLINE))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, patch_path)
            except TkboxError as exc:
                tmp.unlink(missing_ok=True)
                box.s["error"] = f"the patch could not be saved: {exc}"
                await vm.kill()
                box.move("stop_failed")
                await self.record(box, "tkbox.containment", {"reason": box.s["error"][:500]})
                # The run has lost the box's changes: that is a gap in what it shows.
                self._gap(box, {"reason": "patch lost at stop", "error": str(exc)[:500]})
                await self.flush_gaps()
                raise
            data = patch_path.read_bytes()
            box.s["patch"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                              "stats": stats}
            with contextlib.suppress(TkboxError):
                await guest.shutdown()
            try:
                await asyncio.wait_for(asyncio.shield(vm.wait()), 20)
            except TimeoutError:
                await vm.kill()
            box.vm = None
            box.guest = None
            box.move("stopped")
        await self.record(box, "tkbox.box.stop", {"patch_sha256": box.s["patch"]["sha256"],
                                                  "patch_bytes": len(data)})
        shutil.rmtree(self.vms_root / box.run_id, ignore_errors=True)
        return box

    def patch(self, name: str) -> bytes:
        box = self.get(name)
        p = box.dir / "patch.diff"
        if box.state not in ("stopped", "exported") or not p.is_file():
            raise UserError(f"box {name} has no saved patch: it is {box.state}; "
                            f"{lifecycle.HINTS.get(box.state, '')}")
        return p.read_bytes()

    # ---- cp -----------------------------------------------------------------------

    def _running(self, name: str, verb: str) -> tuple[Box, GuestClient]:
        box = self.get(name)
        if box.state != "running" or box.guest is None:
            raise UserError(f"cannot {verb} box {name}: it is {box.state}; files cross only "
                            f"while a box runs. {lifecycle.HINTS.get(box.state, '')}")
        return box, box.guest

    async def _decide_copy(self, box: Box, direction: str, box_path: str, data: bytes,
                           mode: int, host_path: str) -> str | None:
        """One `Write` decision for a copy across the boundary (None when unrecorded)."""
        if box.s.get("unrecorded"):
            return None
        resource = {"path": box_path, "sha256": hashlib.sha256(data).hexdigest(),
                    "mode": f"{0o100000 | (mode & 0o777):o}"}
        context = {"copy": direction, "host_path": host_path[:4096], "size": len(data)}
        try:
            verdict = await self.signer.decide(box.run_id, "Write", resource, context)
        except SignerUnavailable as exc:
            raise Refused(f"refused: the signer did not answer, so nothing crosses ({exc}); "
                          "start it with 'tkbox signer serve'") from None
        if not verdict.allowed:
            raise Refused(f"refused by the signer: {verdict.reason}")
        return verdict.decision_id

    async def _complete_copy(self, box: Box, decision_id: str | None, ok: bool,
                             error: str = "") -> None:
        if decision_id is None:
            return
        try:
            await self.signer.complete(box.run_id, decision_id,
                                       {"written": ok, "error": error[:300]})
        except TkboxError as exc:
            self._gap(box, {"reason": f"completion not recorded: {exc}"})
            await self.contain(box, f"a completion could not be recorded ({exc})")

    async def copy_in(self, name: str, box_path: str, data: bytes, mode: int,
                      host_path: str) -> dict[str, Any]:
        """`tkbox cp LOCAL BOX:PATH`: a crossing into the box, decided and recorded."""
        box, guest = self._running(name, "copy into")
        path = box_path_of(box_path)
        if len(data) > rpc.MAX_FILE:
            raise UserError(f"{host_path} is larger than {rpc.MAX_FILE} bytes; copy it into the "
                            "workspace before the box starts instead")
        try:
            # The path first: the second message names it.
            prestart.refuse_values(box.secrets, path.encode("utf-8", "surrogateescape"),
                                   "the path copied to")
            prestart.refuse_values(box.secrets, data, f"the file copied to {path[:200]}")
        except Refused as exc:
            await self.record(box, "tkbox.command.refused", {"reason": str(exc)[:500]})
            raise
        decision = await self._decide_copy(box, "in", path, data, mode, host_path)
        try:
            await guest.write_file(path, data, mode=mode)
        except TkboxError as exc:
            await self._complete_copy(box, decision, False, str(exc))
            raise
        await self._complete_copy(box, decision, True)
        return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    async def copy_out(self, name: str, box_path: str, host_path: str) -> tuple[bytes, str]:
        """`tkbox cp BOX:PATH LOCAL`: the file is read whole, then decided and recorded
        (path, size, hash, where it goes) before a byte of it leaves the daemon.

        Code changes still return only through `tkbox apply`: a destination inside the
        box's own checkout is refused.
        """
        box, guest = self._running(name, "copy out of")
        path = box_path_of(box_path)
        ws = os.path.realpath(box.s["workspace"])
        dest = os.path.realpath(host_path)
        if dest == ws or dest.startswith(ws.rstrip("/") + "/"):
            raise UserError(f"{host_path} is inside the box's checkout; changes to it return "
                            f"only through 'tkbox stop {name}' and 'tkbox apply {name}'")
        buf = io.BytesIO()
        await guest.read_file(path, buf)
        data = buf.getvalue()
        decision = await self._decide_copy(box, "out", path, data, 0o644, dest)
        await self._complete_copy(box, decision, True)
        return data, path

    # ---- apply --------------------------------------------------------------------

    async def apply(self, name: str, checkout: str | None, allow_sensitive: bool,
                    dry_run: bool) -> dict[str, Any]:
        from tkbox.doors.changes import apply_patch

        box = self.get(name)
        if box.state != "stopped":
            raise UserError(f"cannot apply box {name}: it is {box.state}; apply works only on "
                            "a stopped box before export")
        data = await asyncio.to_thread(self.patch, name)  # up to the patch limit: off the loop
        target = Path(checkout or box.s["workspace"]).expanduser()
        if not target.is_dir():
            raise UserError(f"checkout {target} does not exist or is not a directory")
        if allow_sensitive and not box.s.get("unrecorded"):
            await self.record(box, "tkbox.unsafe", {"flag": "--allow-sensitive"})
        report = await apply_patch(data, target, self.signer, box.run_id,
                                   allow_sensitive=allow_sensitive, dry_run=dry_run)
        result: dict[str, Any] = report.to_json()
        if not dry_run:
            await self.record(box, "tkbox.apply", _apply_record(result))
            box.s.setdefault("applied", []).append({"checkout": str(target), "time": time.time()})
            box.save()
        return result

    # ---- export / rm ---------------------------------------------------------------

    async def export(self, name: str) -> tuple[bytes, bytes]:
        box = self.get(name)
        if box.s.get("unrecorded"):
            raise UserError(f"box {name} was started by a daemon run with --unrecorded: "
                            "nothing was recorded, so there is nothing to export")
        lifecycle.next_state(box.state, "export", f"box {name}")
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
        box.move("export")
        return exp.bundle, exp.trust

    async def rm(self, name: str, force: bool = False) -> None:
        box = self.get(name)
        if box.state in lifecycle.LIVE:
            if not force:
                raise UserError(f"box {name} is {box.state}; stop it first or use --force")
            if box.vm is not None:
                await box.vm.kill()
            box.s["error"] = "removed with --force while live"
            self._gap(box, {"reason": "removed with --force while live"})
            await self.flush_gaps()
        for t in list(box.tasks):
            t.cancel()
        shutil.rmtree(self.vms_root / box.run_id, ignore_errors=True)
        shutil.rmtree(box.dir, ignore_errors=True)
        del self.boxes[name]


def stream_budget(box: Box) -> Any:
    return box.vm.ports.budget if box.vm is not None else None


def _boot_answer_ok(msg: dict[str, Any]) -> bool:
    """The guest's one answer on port 1026: `ready` (uptime) or `error` (message), nothing else."""
    allowed = {"ready": {"uptime"}, "error": {"message"}}.get(msg.get("ev"))  # type: ignore[arg-type]
    return allowed is not None and set(msg) - {"ev"} <= allowed


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


def _apply_record(result: dict[str, Any]) -> dict[str, Any]:
    """What an apply did, for the record: counts, and the files not written by name.

    Written files are in the record already (one `Write` decision each); the ones
    held back never reached the signer, so this is where a reader learns of them.
    Paths come from the guest's patch: each is cut to 256 characters, and at most
    `MAX_APPLY_LISTED` are named.
    """
    def listed(status: str) -> list[dict[str, str]]:
        return [{"path": str(f["path"])[:256], "reason": str(f.get("reason", ""))[:200]}
                for f in result["files"] if f["status"] == status][:MAX_APPLY_LISTED]

    return {"patch_sha256": result["patch_sha256"], "counts": dict(result["counts"]),
            "allow_sensitive": bool(result["allow_sensitive"]),
            "held_back": listed("held back"), "refused": listed("refused")}


def _image_user(image: Any) -> RunUser | None:
    """The user the image names, resolved against its own root disk (None: root)."""
    config = getattr(image, "config", None)
    rootfs = getattr(image, "rootfs", None)
    if config is None or not config.user or rootfs is None:
        return None
    return user_of(Path(rootfs), config.user)


def _image_config_facts(image: Any, run_user: RunUser | None) -> dict[str, Any]:
    """What of the image's config the box applied, for its run's open record."""
    config = getattr(image, "config", None)
    if config is None:
        return {}
    return {"env_names": sorted(image_env(config.env)), "user": config.user[:256],
            "run_as": run_user.to_json() if run_user else None,
            "working_dir": config.working_dir[:4096]}


def box_path_of(path: str) -> str:
    """A path in the box as given to `tkbox cp`: absolute, or relative to /workspace;
    normalised, at most 4,096 bytes, no NUL."""
    if not path or "\x00" in path or len(path.encode()) > 4096:
        raise UserError(f"{path[:80]!r} is not a path in the box; give /abs/path or a path "
                        "relative to /workspace")
    full = path if path.startswith("/") else f"/workspace/{path}"
    norm = os.path.normpath(full)
    if norm == "/":
        raise UserError("give a file in the box, not its root directory")
    return norm
