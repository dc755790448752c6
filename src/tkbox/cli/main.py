"""The `tkbox` command. Output for people by default, `--json` for programs.

Every verb that touches boxes is a client of the daemon's API; `image`,
`guest`, `doctor`, `presets`, `verify`, `signer` and `witness` work without it.
Errors are one line (`tkbox: error: …`) with an exit status by kind: every
verb's, every sub-app's and click's usage errors are said by `tkbox._exit.exit_with`
(`status_of` below routes them there; docs/exit-status.md lists every status).

One idea: the table of `tkbox` verbs (about 1,000 lines), each a thin
function that parses its options and calls the SDK; what a verb does lives in
the SDK, the daemon or its own module (`cli/logs.py`, `cli/terminal.py`,
`cli/doctor.py`, `image/cli.py`, `signer/cli.py`, `verify/cli.py`). Split by
verb, the shared options and the one error handler would be imported back
into every part.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tkbox import __version__
from tkbox._exit import exit_with
from tkbox.errors import GuestError, HostError, Refused, TkboxError, UserError

app = typer.Typer(name="tkbox", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False,
                  help="Run each AI-agent job in its own micro-VM with no network card.")
guest_app = typer.Typer(help="The guest kernel and initramfs built from this host.",
                        no_args_is_help=True)
egress_app = typer.Typer(help="What the network door would decide.", no_args_is_help=True)
app.add_typer(guest_app, name="guest")
app.add_typer(egress_app, name="egress")
tools_app = typer.Typer(help="Agents' programs as read-only disks (docs/agents.md).",
                        no_args_is_help=True)
app.add_typer(tools_app, name="tools")

out = Console(soft_wrap=not sys.stdout.isatty())
err = Console(stderr=True, soft_wrap=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="output for programs")]


def _client() -> Any:
    from tkbox.sdk import Client

    return Client()


def _emit(data: Any, as_json: bool, human: Any = None) -> None:
    if as_json:
        print(json.dumps(data, indent=1, sort_keys=True, default=str))
    elif human is not None:
        human(data)


def waiting_since(since: object, now: float) -> str:
    """A wall-clock time (seconds since the epoch) as a person reads it: the local
    time, with the date unless it is today, and how long ago (`14:03:07 (12 s ago)`).
    Anything but a finite number is shown as `?` (`--json` keeps the raw value)."""
    import math
    import time

    if isinstance(since, bool) or not isinstance(since, int | float) \
            or not math.isfinite(since) or abs(since) > 1e11:
        return "?"
    at, today = time.localtime(since), time.localtime(now)
    clock = time.strftime("%H:%M:%S" if at[:3] == today[:3] else "%Y-%m-%d %H:%M:%S", at)
    ago = now - since
    if ago < 0:
        return f"{clock} (in the future: check the clocks)" if ago < -5 else f"{clock} (now)"
    # each unit until 120 (or 48 hours) of it have passed, then the next one
    for unit, size, until in (("s", 1, 120), ("min", 60, 7200), ("h", 3600, 172800)):
        if ago < until:
            return f"{clock} ({int(ago // size)} {unit} ago)"
    return f"{clock} ({int(ago // 86400)} days ago)"


def _box_line(b: dict[str, Any]) -> str:
    e = f" — {b['error']}" if b.get("error") else ""
    return f"{b.get('display_name', b['name'])}: {b['state']}{e}"


@app.command()
def daemon(
    unrecorded: Annotated[bool, typer.Option(
        help="UNSAFE: no signer; only to debug tkbox")] = False,
    egress_block: Annotated[list[str], typer.Option(help="CIDR no box may reach")] = [],  # noqa: B006
    egress_permit: Annotated[list[str], typer.Option(help="CIDR boxes may reach on purpose")] = [],  # noqa: B006
    egress_hosts: Annotated[Path | None, typer.Option(help="hosts file: names for mirrors")] = None,
    ca_cert: Annotated[list[Path], typer.Option(help="extra CA certificate for boxes")] = [],  # noqa: B006
    approval_wait: Annotated[int, typer.Option(help="seconds a connection waits for "
                                                 "'tkbox approve'")] = 120,
    tunnel_idle: Annotated[float, typer.Option(
        help="seconds an egress tunnel may carry no bytes before it is closed")] = 300.0,
    tunnel_total: Annotated[float, typer.Option(
        help="seconds an egress tunnel may stay open at all")] = 4 * 3600.0,
    max_connections: Annotated[int, typer.Option(
        help="egress connections daemon-wide (0: from the open-file limit)")] = 0,
    socket_path: Annotated[Path | None, typer.Option("--socket", help="API socket")] = None,
    signer_socket: Annotated[Path | None, typer.Option(help="the signer's socket")] = None,
    signer: Annotated[str, typer.Option(
        "--signer", help="tkbox (default), https://HOST:PORT (a remote signer, "
        "docs/signer.md) or tracekit[:SOCKET] (docs/tracekit.md)")] = "tkbox",
    signer_ca: Annotated[Path | None, typer.Option(
        help="--signer https://…: the CA that vouches for the signer (pinned)")] = None,
    signer_cert: Annotated[Path | None, typer.Option(
        help="--signer https://…: this daemon's client certificate (mutual TLS)")] = None,
    signer_key: Annotated[Path | None, typer.Option(
        help="--signer https://…: its private key")] = None,
    signer_token: Annotated[str | None, typer.Option(
        help="--signer https://…: a workload token: github:AUDIENCE, file:PATH or env:VAR")
    ] = None,
    vmm: Annotated[str, typer.Option(
        "--vmm", help="qemu (default) or firecracker (docs/vmm.md)")] = "qemu",
    registry_mirror: Annotated[list[str], typer.Option(
        help="REGISTRY=URL: ask this mirror first for REGISTRY's images (repeatable, in "
             "order), e.g. docker.io=https://mirror.internal (docs/images.md)")] = [],  # noqa: B006
    registry_mirror_only: Annotated[bool, typer.Option(
        help="never ask a registry that has a mirror; only its mirrors")] = False,
    registry_config: Annotated[Path | None, typer.Option(
        help="a containerd hosts directory (DIR/HOST/hosts.toml) or Docker's daemon.json "
             "(its registry-mirrors)")] = None,
    vmm_jail: Annotated[str, typer.Option(
        help="each VMM in a cell of its own: auto (where the host allows), on (refuse to "
             "start without every part), off (docs/vmm.md)")] = "auto",
    vmm_uids: Annotated[str, typer.Option(
        help="the uids VMMs run as, FIRST-LAST, used by nothing else on the host")]
        = "61000-61183",
    vmm_cgroup: Annotated[Path | None, typer.Option(
        help="a cgroup v2 directory delegated to the daemon for the VMMs' cgroups")] = None,
    vmm_memory_overhead: Annotated[int | None, typer.Option(
        help="MiB a VMM may use beyond its guest's RAM (default: 256 with KVM, 640 "
             "under software emulation)")] = None,
    vmm_pids: Annotated[int, typer.Option(
        help="processes and threads a VMM may have")] = 256,
) -> None:
    """Run the daemon (the VMs and the doors) in the foreground."""
    from tkbox.daemon.manager import Options
    from tkbox.daemon.server import main
    from tkbox.image.mirrors import load, settings_of

    registries = settings_of(registry_mirror, registry_mirror_only, registry_config)
    load(registries)  # a bad flag or file: one line, before anything starts
    from tkbox.vm.jail import JailConfig, check_mode, parse_uids

    pems = []
    for p in ca_cert:
        try:
            pems.append(p.read_text())
        except OSError as exc:
            raise UserError(f"cannot read --ca-cert {p}: {exc.strerror}") from None
    if egress_hosts is not None and not egress_hosts.is_file():
        raise UserError(f"--egress-hosts {egress_hosts} does not exist")
    if not 1 <= approval_wait <= 3600:
        raise UserError("--approval-wait must be between 1 and 3600 seconds")
    if not 1 <= tunnel_idle <= 86400 or not 1 <= tunnel_total <= 7 * 86400:
        raise UserError("--tunnel-idle must be 1 to 86400 seconds and --tunnel-total 1 to "
                        "604800 seconds")
    if max_connections < 0:
        raise UserError("--max-connections must be 0 (from the open-file limit) or more")
    remote = None
    if signer.startswith("https://"):
        from tkbox.record.remote import RemoteSignerClient, token_source

        remote = RemoteSignerClient(signer, ca=signer_ca, cert=signer_cert, key=signer_key,
                                    token=token_source(signer_token) if signer_token else None)
    elif signer != "tkbox" and signer != "tracekit" and not signer.startswith("tracekit:"):
        raise UserError(f"--signer {signer!r}: use tkbox, https://HOST:PORT or "
                        "tracekit[:SOCKET]")
    elif signer_ca or signer_cert or signer_key or signer_token:
        raise UserError("--signer-ca, --signer-cert, --signer-key and --signer-token are for "
                        "--signer https://HOST:PORT")
    if vmm not in ("qemu", "firecracker"):
        raise UserError(f"--vmm {vmm!r}: use qemu or firecracker")
    if vmm_memory_overhead is not None and not 0 <= vmm_memory_overhead <= 65536:
        raise UserError("--vmm-memory-overhead must be 0 to 65536 MiB")
    if not 4 <= vmm_pids <= 65536:
        raise UserError("--vmm-pids must be 4 to 65536")
    jail = JailConfig(mode=check_mode(vmm_jail), uids=parse_uids(vmm_uids),
                      cgroup=vmm_cgroup, overhead_mib=vmm_memory_overhead, pids=vmm_pids)
    main(Options(unrecorded=unrecorded, egress_block=egress_block, egress_permit=egress_permit,
                 egress_hosts=str(egress_hosts) if egress_hosts else None, ca_certs=pems,
                 approval_wait=approval_wait, tunnel_idle=tunnel_idle,
                 tunnel_total=tunnel_total, max_connections=max_connections,
                 registry_mirrors=list(registries.mirrors),
                 registry_mirror_only=registries.mirror_only,
                 registry_config=registries.config),
         socket_path=socket_path, signer_socket=signer_socket, signer_backend=signer, vmm=vmm,
         remote_signer=remote, jail=jail)


@app.command()
def run(
    name: Annotated[str, typer.Option("--name", help="the box's name (default: one is "
                                      "picked and printed)")] = "",
    workspace: Annotated[Path, typer.Option(help="the checkout to copy in")] = Path("."),
    image: Annotated[str, typer.Option(help="image reference")] = "tkbox/default",
    allow: Annotated[list[str], typer.Option(
        help="host, host:port or preset; rules after a space: 'HOST GET HEAD /**; "
             "ask DELETE /x/**' (docs/network.md)")] = [],  # noqa: B006
    env: Annotated[list[str], typer.Option(help="NAME=VALUE for every command")] = [],  # noqa: B006
    memory: Annotated[int, typer.Option(help="MiB")] = 1024,
    cpus: Annotated[int, typer.Option(help="virtual CPUs")] = 1,
    disk: Annotated[int, typer.Option(help="MiB the box may write to /workspace")] = 4096,
    secret: Annotated[list[str], typer.Option(
        help="NAME=env:VAR@host[:port][,host][;header=H] or NAME=file:PATH@host: the box gets a "
             "placeholder in $NAME; the door swaps the value in for those hosts only")] = [],  # noqa: B006
    inspect: Annotated[str, typer.Option(
        help="'all': read every allowed host's TLS, not only bound ones "
             "(clients that pin certificates break)")] = "",
    model_host: Annotated[list[str], typer.Option(
        help="also record requests to this allowed host as model calls (read like "
             "the anthropic and openai presets' hosts)")] = [],  # noqa: B006
    timeout: Annotated[str | None, typer.Option(
        help="stop the box by itself after this long: 90, 90s, 15m, 2h")] = None,
    workspace_owner: Annotated[str | None, typer.Option(
        help="UID:GID owning the workspace's files in the box (default: the image's "
             "user, else root)")] = None,
    tools: Annotated[str, typer.Option(
        help="an agent's program as a read-only disk at /opt/tkbox/tools, first on PATH: "
             "AGENT[@VERSION][:glibc|musl], e.g. claude-code")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Create and boot a box; returns when it is ready."""
    from tkbox.sdk import secret_values

    secret_values(secret)  # read here, in the user's shell: a bad --secret fails first
    if inspect == "all":
        err.print("tkbox: WARNING: --inspect all: every allowed host's TLS is read by the "
                  "door; clients that pin certificates will fail")
    envs = _env_pairs(env)
    timeout_s = parse_duration(timeout) if timeout is not None else None
    owner = parse_owner(workspace_owner) if workspace_owner is not None else None
    _pull_first(image, as_json)
    with err.status(f"booting {name or 'a box'}…") if not as_json and sys.stderr.isatty() \
            else contextlib.nullcontext():
        b = _client().run(name=name or None, workspace=workspace, image=image, allow=allow,
                          env=envs, memory_mib=memory, vcpus=cpus, secrets=secret,
                          inspect=inspect, model_hosts=model_host,
                          timeout_s=timeout_s, disk_mib=disk,
                          workspace_owner=owner, tools=tools).info.raw
    _emit(b, as_json, lambda b: out.print(
        f"{b['display_name']}: running ({b['accel']}, ready in {b.get('boot_seconds', '?')}s, "
        f"image {b['image_digest'][:19]})"
        + (f"\n  {b['start']['reason']}" if isinstance(b.get("start"), dict)
           and b["start"].get("reason") else "")
        + (f"\n  vmm isolation: {b['start']['isolation']}" if isinstance(b.get("start"), dict)
           and b["start"].get("isolation") else "")))


def parse_owner(text: str) -> tuple[int, int]:
    """(uid, gid) from `UID:GID` (a one-line error otherwise)."""
    uid, sep, gid = text.partition(":")
    if not (sep and uid.isascii() and uid.isdigit() and gid.isascii() and gid.isdigit()
            and int(uid) < 2**32 - 1 and int(gid) < 2**32 - 1):
        raise UserError(f"--workspace-owner {text[:40]!r} must be UID:GID, two numbers")
    return int(uid), int(gid)


def parse_duration(text: str) -> int:
    """Seconds from `90`, `90s`, `15m` or `2h` (a one-line error otherwise)."""
    units = {"s": 1, "m": 60, "h": 3600}
    t = text.strip().lower()
    mult = units.get(t[-1:], 0)
    digits = t[:-1] if mult else t
    if not digits.isdigit() or len(digits) > 9 or int(digits) == 0:
        raise UserError(f"--timeout {text!r}: give a positive duration such as 90, 90s, 15m "
                        "or 2h")
    return int(digits) * (mult or 1)


def _env_pairs(items: list[str]) -> dict[str, str]:
    """--env NAME=VALUE options as a mapping; one that is not NAME=VALUE is refused."""
    envs: dict[str, str] = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq:
            raise UserError(f"--env {item!r} must be NAME=VALUE")
        envs[k] = v
    return envs


def _pull_first(image: str, as_json: bool) -> None:
    """Pull a registry image into the (shared, content-addressed) store here, where a
    person sees a bar per layer; the daemon then finds it cached. Layout references
    (`oci:`, `oci-archive:`) are left to the daemon."""
    import asyncio

    from tkbox.image.progress import auto_progress
    from tkbox.image.reference import RegistryRef, parse_reference
    from tkbox.image.store import ImageStore

    if not isinstance(parse_reference(image), RegistryRef):
        return
    with ImageStore(registries=_daemon_registries(required=True)) as store:
        asyncio.run(store.resolve(image, progress=auto_progress(json_events=as_json)))


def _daemon_registries(required: bool = False) -> Any:
    """The running daemon's registry settings, loaded (`tkbox.image.mirrors`), so a pull
    made here goes where the daemon's own would; None if no daemon answers and none is
    `required`."""
    from tkbox.image.mirrors import Settings, load
    from tkbox.sdk import Client

    try:
        with Client(timeout=30) as c:
            info = c.info()
    except TkboxError:
        if required:
            raise
        return None
    return load(Settings.from_json(info.get("registries")))


@app.command(name="exec", context_settings={"allow_interspersed_args": False})
def exec_(
    name: Annotated[str, typer.Argument(help="the box")],
    argv: Annotated[list[str], typer.Argument(help="the command, after --")],
    cwd: Annotated[str | None, typer.Option(help="working directory in the box")] = None,
    env: Annotated[list[str], typer.Option(help="NAME=VALUE for this command")] = [],  # noqa: B006
    stdin: Annotated[bool, typer.Option(
        "--stdin", "-i", help="pass this terminal's stdin")] = False,
    tty: Annotated[bool, typer.Option(
        "--tty", "-t", help="a terminal in the box (keys, Ctrl-C, window size)")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a command in a box; output streams as it comes; exits with its status."""
    envs = {}
    for item in env:
        k, eq, v = item.partition("=")
        if not eq:
            raise UserError(f"--env {item!r} must be NAME=VALUE")
        envs[k] = v
    if argv and argv[0] == "--":
        argv = argv[1:]
    elif argv and argv[0].startswith("-") and "--" in argv:
        # `tkbox exec NAME --env X -- cmd`: everything after NAME is the command, so this
        # would run a program called "--env". Say where the options go instead.
        raise UserError(f"options go before the box's name: tkbox exec {argv[0]} … {name} "
                        "-- COMMAND")
    if not argv:
        raise UserError(f"give a command after '--', e.g. tkbox exec {name} -- ls")
    body: dict[str, Any] = {"argv": argv, "cwd": cwd, "env": envs}
    if tty:
        if stdin or as_json:
            raise UserError("-t is a terminal for a person: it takes neither -i nor --json")
        from tkbox.cli.terminal import run_tty

        raise typer.Exit(run_tty(_client, name, body))
    if stdin:
        body["stdin_b64"] = base64.b64encode(sys.stdin.buffer.read()).decode()
    client = _client()
    state: dict[str, Any] = {"exec_id": None, "interrupts": 0}

    def on_sigint(signum: int, frame: Any) -> None:
        state["interrupts"] += 1
        if state["exec_id"] is None or state["interrupts"] > 1:
            raise KeyboardInterrupt
        threading.Thread(target=lambda: _send_signal(name, state["exec_id"], 2),
                         daemon=True).start()

    old = signal.signal(signal.SIGINT, on_sigint)
    code = 0
    try:
        for ev in client.stream("POST", f"/v1/boxes/{name}/exec", json=body):
            if as_json:
                print(json.dumps(ev), flush=True)
            kind = ev.get("ev")
            if kind == "started":
                state["exec_id"] = ev.get("exec_id")
            elif kind == "out" and not as_json:
                stream = sys.stdout.buffer if ev.get("fd") == 1 else sys.stderr.buffer
                stream.write(base64.b64decode(ev.get("data", "")))
                stream.flush()
            elif kind == "exit":
                code = int(ev.get("status", 1))
                if ev.get("error") and not as_json:
                    print(f"tkbox: {ev['error']}", file=sys.stderr, flush=True)
            elif kind == "error":
                raise TkboxError(str(ev.get("message")))
    except KeyboardInterrupt:
        code = 130
    finally:
        signal.signal(signal.SIGINT, old)
    raise typer.Exit(code)


@app.command()
def shell(
    name: Annotated[str, typer.Argument(help="the box")],
    cwd: Annotated[str | None, typer.Option(help="working directory in the box")] = None,
) -> None:
    """An interactive shell in the box (bash where the image has it): one recorded
    command, like 'tkbox exec -t NAME -- sh -i'."""
    from tkbox.cli.terminal import SHELL, run_tty

    raise typer.Exit(run_tty(_client, name, {"argv": SHELL, "cwd": cwd, "env": {}}))


def _send_signal(name: str, exec_id: str, sig: int) -> None:
    try:
        _client().call("POST", f"/v1/boxes/{name}/exec/{exec_id}/signal", json={"sig": sig})
    except TkboxError:
        pass


@app.command()
def stop(name: str, as_json: JsonOpt = False) -> None:
    """Stop a box: egress closes at once, the workspace patch is saved, the VM ends."""
    b = _client().box(name, fetch=False).stop().raw
    p = b.get("patch") or {}

    def human(b: dict[str, Any]) -> None:
        what = "a PARTIAL patch saved" if p.get("partial") else "patch saved"
        out.print(Text(f"{b['display_name']}: stopped; {what} ({p.get('bytes', 0)} bytes, "
                       f"sha256 {str(p.get('sha256', ''))[:16]}…). Next: 'tkbox apply {name}'"))
        _say_apart(p)

    _emit(b, as_json, human)
    if p.get("partial"):
        raise GuestError(f"box {name}: the patch is partial, it holds only the files that "
                         f"arrived whole: {str(p.get('error', ''))[:300]}")


def _say_apart(p: dict[str, Any]) -> None:
    """What the box's patch left out, on stderr: a line per change (the first 20)."""
    from tkbox.daemon.patches import apart_lines

    lines = apart_lines(p)
    if lines:
        err.print(Text(f"tkbox: set apart, not in the patch ({len(lines)} shown):",
                       style="yellow"))
        for line in lines:
            err.print(Text(f"  {line}", style="yellow"))


@app.command()
def patch(name: str) -> None:
    """Print the patch saved when the box stopped (what it left out goes to stderr)."""
    box = _client().box(name)
    p = box.info.raw.get("patch") or {}
    sys.stdout.buffer.write(box.patch())
    sys.stdout.buffer.flush()
    if p.get("partial"):
        err.print(Text(f"tkbox: this patch is partial: {str(p.get('error', ''))[:300]}",
                       style="yellow"))
    _say_apart(p)


@app.command()
def apply(
    name: str,
    checkout: Annotated[Path | None, typer.Option(help="default: the box's workspace")] = None,
    allow_sensitive: Annotated[bool, typer.Option(
        help="UNSAFE: also write held-back files")] = False,
    dry_run: Annotated[bool, typer.Option(help="decide and show, write nothing")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Apply a stopped box's patch to the checkout, file by file, as the signer allows."""
    if allow_sensitive:
        err.print("tkbox: WARNING: --allow-sensitive: held-back files (CI, hooks, credentials) "
                  "will be written too", style="bold red")
    report = _client().box(name, fetch=False).apply(
        checkout=checkout, allow_sensitive=allow_sensitive, dry_run=dry_run).raw
    if as_json:
        _emit(report, True)
    else:
        from tkbox.doors.changes.report import ApplyReport, FileResult, render_report

        render_report(ApplyReport(
            checkout=report["checkout"], patch_sha256=report["patch_sha256"],
            dry_run=report["dry_run"], allow_sensitive=report["allow_sensitive"],
            files=tuple(FileResult(**f) for f in report["files"]),
            notes=tuple(report.get("notes", ()))), out)
    raise typer.Exit(apply_status(report))


#: exit statuses a script can act on (docs/exit-status.md): a person must look
EXIT_NEEDS_PERSON = 6


def apply_status(report: dict[str, Any]) -> int:
    """0 when every file was written (or would be, with --dry-run); 5 when any was
    refused; 6 when some were held back and none refused."""
    statuses = {f.get("status") for f in report.get("files", [])}
    if "refused" in statuses:
        return Refused.exit_code
    if "held back" in statuses:
        return EXIT_NEEDS_PERSON
    return 0


@app.command()
def export(
    name: str,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="NAME.tkb")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Close the box's run and write its bundle and trust file."""
    r = _client().export(name, output or Path(f"{name}.tkb"))
    _emit({"bundle": str(r.bundle), "trust": str(r.trust)}, as_json, lambda d: out.print(
        f"wrote {d['bundle']} and {d['trust']}. Check it: "
        f"tkbox verify {d['bundle']} --trust {d['trust']}"))


@app.command()
def cp(
    source: Annotated[str, typer.Argument(help="LOCAL or BOX:PATH", show_default=False)],
    target: Annotated[str, typer.Argument(help="BOX:PATH or LOCAL", show_default=False)],
    as_json: JsonOpt = False,
) -> None:
    """Copy one file into a running box (LOCAL BOX:PATH) or out of it (BOX:PATH LOCAL).
    Each copy is a crossing: decided and recorded with its path, size and hash. Code
    changes still return only through 'tkbox apply'."""
    from tkbox._fs import write_atomic

    def split(arg: str) -> tuple[str, str] | None:
        box, colon, path = arg.partition(":")
        return (box, path) if colon and "/" not in box and box else None

    src, dst = split(source), split(target)
    if (src is None) == (dst is None):
        raise UserError("give one side as BOX:PATH and the other as a local path, e.g. "
                        "tkbox cp notes.txt demo:/workspace/notes.txt")
    if dst is not None:
        local = Path(source)
        if not local.is_file():
            raise UserError(f"{source} is not a file (tkbox cp copies one file at a time)")
        size = local.stat().st_size
        if size > 64 << 20:
            raise UserError(f"{source} is larger than 64 MiB; put it in the workspace before "
                            "the box starts instead")
        data = local.read_bytes()
        r = _client().call("POST", f"/v1/boxes/{dst[0]}/cp-in", json={
            "path": dst[1], "data_b64": base64.b64encode(data).decode(),
            "mode": local.stat().st_mode & 0o777, "host_path": str(local.resolve())})
        _emit(r, as_json, lambda r: out.print(
            f"copied {source} to {dst[0]}:{r['path']} ({r['size']} bytes, sha256 "
            f"{r['sha256'][:16]}…)", markup=False, highlight=False))
        return
    assert src is not None
    dest = Path(target)
    if dest.is_dir():
        dest = dest / Path(src[1]).name
    if not dest.parent.is_dir():
        raise UserError(f"directory {dest.parent} does not exist")
    r = _client().call("POST", f"/v1/boxes/{src[0]}/cp-out",
                       json={"path": src[1], "host_path": str(dest.resolve())})
    write_atomic(dest, base64.b64decode(r["data_b64"]), mode=0o600)
    _emit({"path": r["path"], "size": r["size"], "local": str(dest)}, as_json, lambda r: out.print(
        f"copied {src[0]}:{r['path']} to {r['local']} ({r['size']} bytes)", markup=False,
        highlight=False))


@app.command()
def logs(
    name: str,
    follow: Annotated[bool, typer.Option("--follow", "-f",
                                         help="keep printing until the box ends")] = False,
    as_json: JsonOpt = False,
) -> None:
    """What the box has had recorded, as it happens: commands and exits, connections
    allowed, waiting and refused, secret uses and leaks, model calls."""
    from tkbox.cli.logs import Formatter

    fmt = Formatter()
    try:
        for entry in _client().stream("GET", f"/v1/boxes/{name}/logs",
                                      params={"follow": follow}):
            if as_json:
                print(json.dumps(entry, sort_keys=True), flush=True)
            elif (line := fmt.line(entry)) is not None:
                print(line, flush=True)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@app.command()
def ls(as_json: JsonOpt = False) -> None:
    """List boxes."""
    boxes = [b.raw for b in _client().boxes()]

    def human(bs: list[dict[str, Any]]) -> None:
        if not bs:
            out.print("no boxes; start one with 'tkbox run --name NAME'")
            return
        t = Table("NAME", "STATE", "IMAGE", "ACCEL", "RUN")
        for b in bs:
            t.add_row(b["display_name"], b["state"], b["image"], b.get("accel", ""), b["run_id"])
        out.print(t)

    _emit(boxes, as_json, human)


@app.command()
def inspect(name: str, as_json: JsonOpt = False) -> None:
    """Everything known about a box."""
    b = _client().box(name).info.raw
    _emit(b, as_json, lambda b: out.print_json(json.dumps(b, default=str)))


@app.command()
def rm(name: str, force: Annotated[bool, typer.Option(help="kill it if live")] = False) -> None:
    """Remove a box and its disks."""
    _client().box(name, fetch=False).rm(force)
    out.print(f"removed {name}")


@app.command()
def approvals(as_json: JsonOpt = False) -> None:
    """Connections waiting for a person's answer."""
    items = _client().approvals()

    def human(items: list[dict[str, Any]]) -> None:
        if not items:
            out.print("nothing waits for approval")
            return
        import time

        now = time.time()
        t = Table("BOX", "ID", "HOST", "PORT", "REQUEST", "WAITING SINCE")
        for i in items:
            # an `ask` rule holds one request: its method and path (bounded, escaped)
            req = f"{i.get('method')} {i.get('path')}" if i.get("method") else "(connection)"
            t.add_row(str(i.get("box")), str(i.get("id")), str(i.get("host")),
                      str(i.get("port")), escape(req), waiting_since(i.get("since"), now))
        out.print(t)

    _emit(items, as_json, human)


@app.command()
def approve(box: str, approval_id: int, as_json: JsonOpt = False) -> None:
    """Let one waiting connection through."""
    r = _client().answer(box, approval_id, True, via="cli")
    _emit(r, as_json, lambda r: out.print(f"approved {box} #{approval_id}"))


@app.command()
def deny(box: str, approval_id: int, as_json: JsonOpt = False) -> None:
    """Refuse one waiting connection."""
    r = _client().answer(box, approval_id, False, via="cli")
    _emit(r, as_json, lambda r: out.print(f"denied {box} #{approval_id}"))


@app.command()
def presets(as_json: JsonOpt = False) -> None:
    """What each allowlist preset means on this host (registry hosts read at run time)."""
    from tkbox.doors.network.presets import PINNING_NOTE, RETARGET, describe_presets

    d = describe_presets()

    def human(d: dict[str, list[str]]) -> None:
        t = Table("PRESET", "ENTRIES (HOST [RULES])")
        for k, v in d.items():
            t.add_row(k, "\n".join(v) or "(none found on this host)")
        out.print(t)
        for k, rules in RETARGET.items():
            out.print(f"{k}@HOST[:PORT]: HOST {rules}")
        out.print(f"Note: {PINNING_NOTE}.")

    _emit(d, as_json, human)


@egress_app.command("check")
def egress_check(box: str, target: str, as_json: JsonOpt = False) -> None:
    """What the box's door would decide for HOST[:PORT], and why (nothing is dialed)."""
    host, _, port = target.rpartition(":") if target.count(":") == 1 else (target, "", "443")
    if not port.isdigit():
        raise UserError(f"{target!r}: give HOST or HOST:PORT")
    r = _client().call("GET", f"/v1/boxes/{box}/egress-check",
                       params={"host": host or target, "port": int(port)})
    _emit(r, as_json, lambda r: out.print_json(json.dumps(r, default=str)))
    # 0: it would pass; 6: it would wait for a person; 5: it would be refused
    raise typer.Exit({"allow": 0, "ask": EXIT_NEEDS_PERSON}.get(str(r.get("verdict")),
                                                              Refused.exit_code))


@tools_app.command("pull")
def tools_pull(
    ref: Annotated[str, typer.Argument(metavar="AGENT[@VERSION]",
                                       help="claude-code, codex or gemini")],
    build: Annotated[str, typer.Option(
        help="glibc or musl (a tool with one static build, Codex, has only that)")] = "glibc",
    as_json: JsonOpt = False,
) -> None:
    """Fetch an agent's program from its own registry package, check it against the
    registry's integrity hash and keep it as a disk (before a first job, or in CI)."""
    from tkbox.image.tools import ToolRef, ensure

    parsed = ToolRef.parse(ref)
    disk = ensure(parsed, build, log=lambda m: err.print(f"tkbox: {m}", markup=False))
    _emit(disk.facts(), as_json, lambda d: out.print(
        f"{d['name']} {d['version']} ({d['variant']}): {d['disk']} "
        f"(from {d['package']}, {d['integrity'][:23]}…)", markup=False))


@tools_app.command("ls")
def tools_ls(as_json: JsonOpt = False) -> None:
    """The agents' program disks kept on this host."""
    from tkbox.image.tools import stored

    disks = [d.facts() for d in stored()]

    def human(ds: list[dict[str, Any]]) -> None:
        if not ds:
            out.print("no tool disks; fetch one with 'tkbox tools pull claude-code'")
            return
        t = Table("AGENT", "VERSION", "BUILD", "DISK", "PACKAGE")
        for d in ds:
            t.add_row(d["name"], d["version"], d["variant"], d["disk"][:19], d["package"])
        out.print(t)

    _emit(disks, as_json, human)


@guest_app.command("build")
def guest_build(force: Annotated[bool, typer.Option(help="rebuild")] = False,
                as_json: JsonOpt = False) -> None:
    """Build (or reuse) the guest initramfs and extract the kernel's vmlinux."""
    from tkbox import paths
    from tkbox.image.initramfs import build

    b = build(paths.private_dir(paths.guest_build()), force=force)
    d = {"kernel": str(b.kernel), "initramfs": str(b.initramfs), "version": b.kernel_version,
         "digest": b.digest, "bytes": b.initramfs.stat().st_size}
    _emit(d, as_json, lambda d: out.print(
        f"guest for kernel {d['version']}: {d['initramfs']} ({d['bytes'] // 1024} KiB)"))


@app.command()
def doctor(as_json: JsonOpt = False) -> None:
    """What this host can do, and the exact command for anything missing."""
    from tkbox.cli.doctor import checks

    results = checks()

    def human(rs: list[dict[str, Any]]) -> None:
        for r in rs:
            mark = "[green]ok[/]" if r["ok"] else ("[yellow]--[/]" if r.get("optional")
                                                   else "[red]missing[/]")
            out.print(f"{mark}  {r['what']}: {r['detail']}")
            if not r["ok"] and r.get("fix"):
                out.print(f"      fix: {r['fix']}", markup=False)

    _emit(results, as_json, human)
    if any(not r["ok"] and not r.get("optional") for r in results):
        raise typer.Exit(3)


@app.command()
def agent(
    agent_name: Annotated[str, typer.Argument(
        metavar="AGENT", help="claude-code, codex, gemini, or command (with --agent-command)")],
    prompt: Annotated[str, typer.Option(help="the task, as the agent is told it")] = "",
    agent_command: Annotated[str | None, typer.Option(
        help="shell command line to run instead (prompt in $TKBOX_PROMPT and stdin)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds the agent may run")] = 1800,
    workspace: Annotated[Path, typer.Option(help="the checkout to copy in")] = Path("."),
    image: Annotated[str | None, typer.Option(
        help="image (default: the one the checkout's .devcontainer names, else "
             "python:3.12-slim); the agent's program comes on its own disk")] = None,
    agent_version: Annotated[str | None, typer.Option(
        help="the agent's package version (default: the one tkbox pins)")] = None,
    agent_build: Annotated[str, typer.Option(
        help="the agent's build: auto (from the image's C library), glibc or musl (Codex "
             "has one static build for any image; Gemini CLI, glibc only)")] = "auto",
    allow: Annotated[list[str], typer.Option(
        help="host, host:port or preset; rules after a space: 'HOST GET HEAD /**; "
             "ask DELETE /x/**' (docs/network.md)")] = [],  # noqa: B006
    env: Annotated[list[str], typer.Option(help="NAME=VALUE for the box")] = [],  # noqa: B006
    secret: Annotated[list[str], typer.Option(
        help="NAME=env:VAR@host[:port][,host][;header=H]")] = [],  # noqa: B006
    name: Annotated[str | None, typer.Option(help="the box's name")] = None,
    memory: Annotated[int, typer.Option(help="MiB")] = 2048,
    cpus: Annotated[int, typer.Option(help="virtual CPUs")] = 1,
    model_host: Annotated[str, typer.Option(
        help="the model API: HOST[:PORT][/PATH] of a compatible endpoint (default: the "
             "agent's own: api.anthropic.com, api.openai.com, "
             "generativelanguage.googleapis.com)")] = "",
    output_dir: Annotated[Path, typer.Option(help="where NAME.patch and NAME.tkb go")] = Path("."),
    rebuild_image: Annotated[bool, typer.Option(
        help="build the baked image tkbox/claude-code again (with --image "
             "tkbox/claude-code)")] = False,
    apply: Annotated[bool, typer.Option(
        "--apply", help="once the agent succeeds, decide and write its patch into the "
        "workspace through the changes door (sensitive files held back); NAME.applied.patch "
        "holds what was written")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a coding agent headless in a box on a prompt; keep its patch and its bundle."""
    from tkbox.agents.job import AgentSpec, check, run_job

    envs = _env_pairs(env)
    spec = AgentSpec(agent=agent_name, prompt=prompt, command=agent_command,
                     workspace=workspace.resolve(), image=image, allow=allow, env=envs,
                     secrets=secret, name=name, memory_mib=memory, vcpus=cpus,
                     timeout=timeout, out_dir=output_dir.resolve(), model_host=model_host,
                     apply=apply, agent_version=agent_version, agent_build=agent_build)
    check(spec)
    client = _client()
    client.info()  # no daemon: say so before building anything
    if agent_name == "claude-code" and image == "tkbox/claude-code":
        from tkbox.agents.image import ensure_image

        ensure_image(client, rebuild=rebuild_image,
                     log=lambda m: print(f"tkbox: {m}", file=sys.stderr, flush=True))

    def echo(data: bytes) -> None:
        if not as_json:
            sys.stderr.buffer.write(data)
            sys.stderr.buffer.flush()

    outcome = run_job(client, spec, echo=echo)
    def human(o: dict[str, Any]) -> None:
        if o["error"]:
            return
        applied = "" if o["applied"] is None else "; applied: " + (", ".join(
            f"{v} {k}" for k, v in o["applied"].items()) or "nothing to apply") + \
            f" ({o['applied_patch']})"
        out.print(f"{o['box']}: agent done (exit {o['status']}); patch {o['patch']} "
                  f"({o['patch_bytes']} bytes){applied}; bundle {o['bundle']}. Check it: "
                  f"tkbox verify {o['bundle']} --trust {o['trust']}", markup=False)
        for h in o["held_back"]:
            out.print(Text(f"held back: {h['path']} ({h['reason']})" if h["path"]
                           else f"held back: {h['reason']}", style="yellow"))

    _emit(outcome.to_json(), as_json, human)
    outcome.raise_for_error()


@app.command()
def mcp(socket_path: Annotated[Path | None, typer.Option(
        "--socket", help="the daemon's API socket")] = None,
        answer_approvals: Annotated[bool, typer.Option(
            "--answer-approvals", help="also offer the approve tool: the agent driving "
            "tkbox may then answer the approvals that otherwise wait for a person (its "
            "answers are recorded as an agent's)")] = False,
        allow: Annotated[list[str], typer.Option(
            help="a host, host:port or preset every box may reach; the agent may pick a "
                 "subset, never more")] = [],  # noqa: B006
        secret: Annotated[list[str], typer.Option(
            help="NAME=env:VAR@host: a secret bound for every box (the agent may name a "
                 "subset)")] = [],  # noqa: B006
        model_host: Annotated[list[str], typer.Option(
            help="an allowed host whose requests are recorded as model calls")] = [],  # noqa: B006
        workspace_root: Annotated[Path | None, typer.Option(
            help="the folder every path a tool names must be inside (default: the "
                 "current folder)")] = None,
        agent_may_allow: Annotated[bool, typer.Option(
            "--agent-may-allow", help="UNSAFE: the agent may add hosts to a box's "
            "allowlist (a box's output can ask it to)")] = False,
        agent_may_bind_secrets: Annotated[bool, typer.Option(
            "--agent-may-bind-secrets", help="UNSAFE: the agent may bind a secret of "
            "this process's environment to any host (a box's output can ask it to)")] = False,
) -> None:
    """Serve the MCP tools (run, exec, stop, patch, apply, export, approvals) on stdio."""
    from tkbox.mcp import Operator, serve_stdio

    root = (workspace_root or Path.cwd()).expanduser()
    if not root.is_dir():
        raise UserError(f"--workspace-root {root} is not a directory")
    operator = Operator(root.resolve(), allow=tuple(allow), secrets=tuple(secret),
                        model_hosts=tuple(model_host), agent_may_allow=agent_may_allow,
                        agent_may_bind=agent_may_bind_secrets)
    for flag in operator.unsafe:
        err.print(f"tkbox: WARNING: {flag}: the agent driving tkbox mcp, which reads what "
                  "boxes print, may widen what boxes reach; each use is recorded",
                  style="bold red")
    serve_stdio(str(socket_path) if socket_path else None, answer_approvals=answer_approvals,
                operator=operator)


@app.command()
def report(
    bundle: Annotated[Path, typer.Argument(help="the .tkb bundle", show_default=False)],
    trust: Annotated[Path, typer.Option("--trust", help="the .trust.json trust file",
                                        show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", help="the HTML page to write",
                                         show_default=False)],
) -> None:
    """Verify a bundle, then write it as one self-contained HTML page: VERIFIED or FAILED at
    the top, then the run as a timeline. Exits 4 (the page still written) when it fails."""
    from tkbox._fs import write_atomic
    from tkbox.formats.bundle import MAX_TRUST
    from tkbox.report import build_report, render_html
    from tkbox.verify.cli import MAX_READ, read_input

    data = [read_input(bundle, "bundle", MAX_READ), read_input(trust, "trust file", MAX_TRUST)]
    if not output.parent.is_dir():
        raise UserError(f"directory {output.parent} does not exist")
    outcome = build_report(data[0], data[1])
    write_atomic(output, render_html(outcome, bundle.name).encode())
    if outcome.error is not None:
        e = outcome.error
        err.print(f"Integrity: FAILED. {e.where + ': ' if e.where else ''}{e.what} ({e.code}); "
                  f"wrote {output}", markup=False, highlight=False)
        raise typer.Exit(e.exit_code)
    assert outcome.timeline is not None
    out.print(f"Integrity: VERIFIED. {outcome.timeline.report.records} records; wrote {output}",
              markup=False, highlight=False)


@app.command()
def version() -> None:
    """Print tkbox's version."""
    out.print(__version__)


def _mount_optional(target: typer.Typer | None = None,
                    load: Callable[[str], Any] = importlib.import_module) -> None:
    """The verbs whose code lives in other packages (`image`, `signer`, `witness`,
    `verify`). One that cannot be imported is a broken install: its verb is still there,
    and says which module is missing and how to mend it, never "No such command"."""
    target = target or app
    try:
        image_cli = load("tkbox.image.cli")
        image_cli.daemon_registries = _daemon_registries
        target.add_typer(image_cli.image_app, name="image")
    except ImportError as exc:
        _broken(target, "image", exc)
    try:
        signer_cli = load("tkbox.signer.cli")
        target.add_typer(signer_cli.signer_app, name="signer")
        target.add_typer(signer_cli.witness_app, name="witness")
    except ImportError as exc:
        _broken(target, "signer", exc)
        _broken(target, "witness", exc)
    try:
        target.command("verify")(load("tkbox.verify.cli").verify_command)
    except ImportError as exc:
        _broken(target, "verify", exc)


def _broken(target: typer.Typer, name: str, exc: ImportError) -> None:
    """`tkbox NAME …`, whatever follows, as one error naming what to mend."""
    why = (f"tkbox {name} cannot run: {exc.name or 'a module'} cannot be imported ({exc}); "
           "the install is broken: reinstall tkbox (pip install tkbox, or "
           "'bash scripts/setup.sh' in a checkout)")

    def fail(ctx: typer.Context) -> None:
        raise HostError(why)

    target.command(name, help=f"UNAVAILABLE: {why}", add_help_option=False,
                   context_settings={"allow_extra_args": True,
                                     "ignore_unknown_options": True})(fail)


_mount_optional()


#: click's error base (a bad option, a missing argument), as this typer ships it: its
#: own vendored copy since typer 0.29, click's before; found from a public subclass
ClickError: type[Exception] = next(c for c in typer.BadParameter.__mro__
                                   if c.__name__ == "ClickException")


def usage_error(exc: Exception) -> UserError:
    """A usage error click found (an unknown option, a missing argument, a bad value)
    as the `UserError` every other bad request is: one line, naming the help to read."""
    ctx = getattr(exc, "ctx", None)
    where = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
    format_message = getattr(exc, "format_message", lambda: str(exc))
    return UserError(f"{str(format_message()).rstrip('.')}{where}")


def status_of(argv: list[str] | None = None) -> int:
    """`tkbox ARGV…` to its exit status. Every error of every verb and sub-app, and
    every usage error, ends here in `tkbox._exit.exit_with`: one line on stderr,
    and the status of its class (docs/exit-status.md)."""
    try:
        status = app(args=argv, prog_name="tkbox", standalone_mode=False)
    except TkboxError as exc:
        exit_with(exc)
    except ClickError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # as typer tells it apart
            return 2  # the help is printed already; click's status for it
        exit_with(usage_error(exc))
    except (KeyboardInterrupt, typer.Abort):
        return 130
    return status if isinstance(status, int) else 0


def main() -> None:
    try:
        sys.exit(status_of())
    except BrokenPipeError:
        os._exit(0)
