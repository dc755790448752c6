"""What a guest can make its QEMU send the host is bounded: QEMU's own output
(its stdout and stderr) on the host's disk, and QMP events in the daemon's memory.

QEMU reports a guest's device faults on its stderr, one line each, as often as
the guest makes them: a box whose root loads a kernel module that resets the
virtio-rng device and offers it a ring entry past the ring's end, in a loop,
made QEMU write `qemu-system-x86_64: Guest says index 5 is available` 400,000
times (20,800,000 bytes of qemu.log in seconds, on a real box). A stand-in
plays QEMU here: it takes its chardevs' descriptors as QEMU does (`fd=N`), serves
QMP on the `qmp` one, and writes or sends what such a guest makes QEMU
write or send. No VM is booted. QEMU is started with an empty environment, so
the stand-in reads what to play from `settings.json` beside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tkbox.vm import qemu
from tkbox.vm.base import MAX_LAST_WORDS, VMSpec
from tkbox.vm.errors import VMExitedAtStart

pytestmark = pytest.mark.integration

LINE = b"qemu-system-x86_64: Guest says index 5 is available\n"
#: what ends a capped log (tkbox.vm.DROPPED)
DROPPED = b"\n[tkbox: output past this point was dropped]\n"

STAND_IN = r"""
import json, os, socket, sys, time
args = sys.argv[1:]
chardevs = {}
for i, a in enumerate(args):
    if a == "-chardev":  # socket,id=NAME,fd=N: QEMU's end of a socketpair
        opts = dict(kv.split("=", 1) for kv in args[i + 1].split(",")[1:] if "=" in kv)
        chardevs[opts["id"]] = socket.socket(fileno=int(opts["fd"]))
env = json.load(open(os.path.join(os.path.dirname(__file__), "settings.json")))
line, count = env["FLOOD_LINE"].encode(), int(env["FLOOD_COUNT"])
for _ in range(count):
    os.write(2, line)
os.write(1, b"stdout too\n")
open(env["FLOOD_DONE"], "w").close()  # every write returned: QEMU never blocked
conn = chardevs["qmp"]
def send(obj):
    conn.sendall(json.dumps(obj).encode() + b"\r\n")
def commands():  # QMP is a stream of JSON objects, not of lines
    buf, dec = "", json.JSONDecoder()
    while data := conn.recv(65536):
        buf += data.decode()
        while buf.strip():
            try:
                obj, end = dec.raw_decode(buf.lstrip())
            except ValueError:
                break
            buf = buf.lstrip()[end:]
            yield obj
send({"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": ""},
              "capabilities": []}})
event = json.loads(env["QMP_EVENT"])
for cmd in commands():
    if cmd["execute"] != "qmp_capabilities":
        # What a guest made QEMU send since the last command.
        for _ in range(int(env["QMP_EVENTS"])):
            send(event)
    reply = {"return": {"status": "running", "running": True}
             if cmd["execute"] == "query-status" else {}}
    if "id" in cmd:
        reply["id"] = cmd["id"]
    send(reply)
time.sleep(600)
"""

#: What QEMU sends for each write a guest issues to a read-only disk (not rate-limited).
BLOCK_IO_ERROR = {"event": "BLOCK_IO_ERROR", "timestamp": {"seconds": 1796280000,
                                                           "microseconds": 1},
                  "data": {"device": "", "node-name": "#block123", "operation": "write",
                           "action": "report", "nospace": False,
                           "reason": "Permission denied"}}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths are short: the VM directory must be too.
    d = Path(tempfile.mkdtemp(prefix="tkq-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def stand_in(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[VMSpec]:
    """A stand-in `qemu-system-x86_64` first on PATH; the spec of a VM it plays."""
    bindir = short_dir / "bin"
    bindir.mkdir()
    script = bindir / "stand_in.py"
    script.write_text(STAND_IN)
    binary = bindir / qemu.QEMU
    binary.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    binary.chmod(0o755)
    for name in ("vmlinux", "initramfs"):
        (short_dir / name).write_bytes(b"x")
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    play(short_dir, FLOOD_LINE=LINE.decode(), FLOOD_COUNT="0",
         FLOOD_DONE=str(short_dir / "done"), QMP_EVENT=json.dumps(BLOCK_IO_ERROR),
         QMP_EVENTS="0")
    yield VMSpec(name="flood", kernel=short_dir / "vmlinux",
                 initramfs=short_dir / "initramfs", workdir=short_dir / "vm")


def play(short_dir: Path, **settings: str) -> None:
    """Set what the stand-in plays (it reads them when it starts)."""
    path = short_dir / "bin" / "settings.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**old, **settings}))


def launcher() -> qemu.QemuLauncher:
    return qemu.QemuLauncher(qemu.AccelDecision("tcg", "test"), templates=None)


def test_guest_flooding_qemus_stderr_cannot_grow_qemu_log_past_its_cap(
        stand_in: VMSpec, short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: a guest kernel makes QEMU report a device fault in a loop, so that
    qemu.log (written by QEMU itself) fills the host's disk. The host keeps at most
    QEMU_LOG_CAP bytes of QEMU's output and reads the rest, so QEMU never blocks."""
    done = short_dir / "done"
    cap, count = 4096, 2000  # 2000 lines: 104,000 bytes, 25 times the cap
    monkeypatch.setattr(qemu, "QEMU_LOG_CAP", cap, raising=False)  # absent before the bound
    play(short_dir, FLOOD_COUNT=str(count))

    async def main() -> None:
        vm = await launcher().start(stand_in)
        try:
            async with asyncio.timeout(60):  # a guard: the stand-in writes at once
                while not done.exists():
                    await asyncio.sleep(0.02)
        finally:
            await vm.kill()

    asyncio.run(main())
    log = (stand_in.workdir / "qemu.log").read_bytes()
    assert len(log) <= cap + len(DROPPED), len(log)
    assert log.startswith(LINE)
    assert log.endswith(DROPPED)


def test_qmp_events_a_guest_provokes_are_not_kept_in_the_daemon(
        stand_in: VMSpec, short_dir: Path) -> None:
    """Attack: a guest kernel writes to its read-only root disk in a loop; QEMU refuses
    each write and sends a BLOCK_IO_ERROR event (not rate-limited) to the daemon's QMP
    client, connected for the box's life once it has paused, resumed or restored the
    VM. A client that kept every event (qemu.qmp's default listener queues each one and
    keeps a history of all) grew the daemon by about 2 KiB per write: 20,000 writes
    from one box, 33 MiB. No event is kept: the daemon never reads them."""
    events = 5000
    play(short_dir, QMP_EVENTS=str(events))

    async def main() -> int:
        vm = await launcher().start(stand_in)
        try:
            assert await vm.status() == "running"  # connects QMP; the first events come
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                for _ in range(2):  # each answer comes after its batch of events
                    assert await vm.status() == "running"
                kept = tracemalloc.get_traced_memory()[0] - base
            finally:
                tracemalloc.stop()
        finally:
            await vm.kill()
        return kept

    kept = asyncio.run(main())
    # 10,000 events of about 300 bytes of JSON each arrived; far less than one
    # event's worth per event may stay.
    assert kept < 512 * 1024, f"{kept} bytes kept after {2 * events} QMP events"


def qemu_script(short_dir: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """A `qemu-system-x86_64` first on PATH that runs `script` (sh)."""
    bindir = short_dir / "bin"
    bindir.mkdir()
    binary = bindir / qemu.QEMU
    binary.write_text("#!/bin/sh\n" + script)
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")


def test_qemu_that_exits_at_start_is_quoted_in_one_bounded_printable_line(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A QEMU that refuses its command line (a build without seccomp refuses
    `-sandbox`; a user without access to /dev/kvm is refused too) says why on its
    stderr: the error says it too, instead of only naming qemu.log; bounded, and
    without its control characters."""
    qemu_script(short_dir, monkeypatch,
                "echo 'qemu-system-x86_64: starting' >&2\n"
                "printf 'qemu-system-x86_64: -sandbox on: There is no option group "
                "\\033[31msandbox\\033[0m %0500d\\n' 7 >&2\nexit 1\n")
    for name in ("vmlinux", "initramfs"):
        (short_dir / name).write_bytes(b"x")
    spec = VMSpec(name="refused", kernel=short_dir / "vmlinux",
                  initramfs=short_dir / "initramfs", workdir=short_dir / "vm")

    async def main() -> str:
        with pytest.raises(VMExitedAtStart) as caught:
            await launcher().start(spec)
        return str(caught.value)

    message = asyncio.run(main())
    said = message.split(": ", 1)[1].rsplit("; see ", 1)[0]
    assert said.startswith("qemu-system-x86_64: -sandbox on: There is no option group")
    assert "sandbox" in said and "\x1b" not in said
    assert len(said) == MAX_LAST_WORDS
    assert message.endswith(f"; see {spec.workdir / 'qemu.log'}")


def test_doctor_says_when_qemu_cannot_run_in_its_sandbox(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every box's QEMU runs under `-sandbox on`; a QEMU built without seccomp refuses
    the option, and every box would fail. `tkbox doctor` asks QEMU itself, and says
    so in QEMU's words; the host's own QEMU (Debian's) has it."""
    from tkbox.cli.doctor import vmm_checks

    def row() -> dict[str, object]:
        rows = [r for r in vmm_checks() if r["what"] == "QEMU seccomp sandbox"]
        assert len(rows) == 1
        return rows[0]

    real = row()
    assert real["ok"] is True, real
    qemu_script(short_dir, monkeypatch,
                "case \"$*\" in *-sandbox*) echo \"qemu-system-x86_64: -sandbox $2: There is "
                "no option group 'sandbox'\" >&2; exit 1;; esac\n"
                "echo 'QEMU emulator version 7.2.0'\n")
    refused = row()
    assert refused["ok"] is False
    assert "There is no option group 'sandbox'" in str(refused["detail"])
    assert "seccomp" in str(refused["fix"])
