"""A real daemon API (`tkbox.daemon.api.make_app`, uvicorn, a Unix socket) whose
boxes are fake VMs: the `BoxManager` runs for real, with real disks built from a
real checkout; only the VM is replaced, at the launcher interface, by a guest
coroutine behind a real serial mux. The signer is the in-memory `FakeSigner`.

The guest runs nothing: `exec` answers with its argv on stdout, and with exit
status 3 for `false` (7 when an argument is `tkbox-test-fail`); `sleep` (or an
argument `tkbox-test-hang`) waits until it is signalled. A named agent's command
(`claude`, `codex`, `gemini` after the `sh -c AS_AGENT tkbox-agent` prefix) also
prints that agent's own report, as the agent prints it: a success, or, when an
argument holds `tkbox-test-agent-error`, the error it reports while exiting 0.
That is enough to check every client (SDK, CLI, MCP) against the real wire.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import uvicorn

from tkbox.daemon.api import PeerCheckedH11, make_app
from tkbox.daemon.manager import BoxManager, Options
from tkbox.daemon.roles import ImageSource, ToolSource
from tkbox.daemon.testing import FakeBuild, FakeBuilder, FakeImages
from tkbox.doors.network import ApprovalBoard, SystemClock
from tkbox.guest.testing import answer_diff
from tkbox.protocol.framing import FramedStream
from tkbox.protocol.mux import MuxPorts
from tkbox.protocol.ports import PORT_BOOT, PORT_RPC
from tkbox.protocol.streams import ByteStream
from tkbox.record.testing import FakeSigner
from tkbox.vm.base import VMSpec
from tkbox.vm.fake import FakeLauncher

PATCH = (b"diff --git a/hello.txt b/hello.txt\nnew file mode 100644\n"
         b"index 0000000000000000000000000000000000000000.."
         b"ce013625030ba8dba906f756967f9e9ca394464a\n"
         b"--- /dev/null\n+++ b/hello.txt\n@@ -0,0 +1 @@\n+hello\n")
#: what the box's patch adds after an exec that names `tkbox-test-sensitive`: a workflow
WORKFLOW = (b"diff --git a/.github/workflows/x.yml b/.github/workflows/x.yml\n"
            b"new file mode 100644\nindex 0000000000000000000000000000000000000000.."
            b"b83836ed8c80558d4e40ea4ac5d69f4405334799\n--- /dev/null\n"
            b"+++ b/.github/workflows/x.yml\n@@ -0,0 +1 @@\n+on: push\n")


#: what a guest's patch left out (`tkbox-test-set-apart`): a tool too large for the patch
#: whose name a Markdown summary would render, and a file the checkout ignores
SET_APART = [
    {"path": b".tools/**claude** [x](https://evil.example/)", "change": "added",
     "size": 373_019_152, "sha256": "ab" * 32, "why": "file-too-large"},
    {"path": b"node_modules/x.js", "change": "added", "size": 12, "sha256": "cd" * 32,
     "why": "ignored"},
]


def agent_report(argv: list[str]) -> bytes:
    """What a named agent prints on stdout at its end (each in its own format)."""
    prog = argv[4] if len(argv) > 4 and argv[:2] == ["sh", "-c"] else ""
    bad = any("tkbox-test-agent-error" in a for a in argv)
    if prog == "claude":
        return json.dumps({"type": "result", "subtype": "error_during_execution" if bad
                           else "success", "is_error": bad, "num_turns": 3,
                           "result": "done"}).encode() + b"\n"
    if prog == "codex":
        events: list[dict[str, object]] = [{"type": "thread.started", "thread_id": "t1"},
                                           {"type": "turn.started"}]
        if bad:
            events.append({"type": "turn.failed",
                           "error": {"message": "stand-in model: refused\nsecond line"}})
        else:
            events += [{"type": "item.completed", "item": {
                "id": "item_0", "type": "agent_message", "text": "The test passes now."}},
                {"type": "turn.completed", "usage": {"input_tokens": 1728,
                                                     "output_tokens": 260}}]
        return b"".join(json.dumps(e).encode() + b"\n" for e in events)
    if prog == "gemini":
        out: dict[str, object] = {"session_id": "s1"}
        if bad:
            out["error"] = {"type": "Error", "message": "stand-in model: refused", "code": 1}
        else:
            out["response"] = "The test passes now."
            out["stats"] = {"models": {"gemini-x": {"tokens": {"prompt": 654,
                                                                "candidates": 43}}}}
        return json.dumps(out, indent=2).encode() + b"\n"
    return b""


async def scripted_guest(ports: MuxPorts, spec: VMSpec) -> None:
    fs = FramedStream(await ports.connect(PORT_BOOT))
    await fs.receive()
    await fs.send({"ev": "ready", "uptime": 0.01})
    await fs.aclose()
    done = asyncio.Event()
    patch = bytearray(PATCH)
    apart: list[dict[str, object]] = []

    async def rpc(stream: ByteStream) -> None:
        fs = FramedStream(stream)
        req = await fs.receive()
        if req is None:
            return
        op = req.get("op")
        if op == "exec":
            argv = [str(a) for a in req["argv"]]
            await fs.send({"ev": "started", "pid": 2})
            if argv[0] == "sleep" or any("tkbox-test-hang" in a for a in argv):
                while (m := await fs.receive()) is not None:
                    if m.get("op") == "signal":
                        sig = int(m.get("sig", 15))
                        await fs.send({"ev": "exit", "status": 128 + sig, "signal": sig})
                        return
                return
            await fs.send({"ev": "out", "fd": 1, "data": " ".join(argv).encode() + b"\n"})
            if report := agent_report(argv):
                await fs.send({"ev": "out", "fd": 1, "data": report})
            await fs.send({"ev": "out", "fd": 2, "data": b"to stderr\n"})
            failing = any("tkbox-test-fail" in a for a in argv)
            if any("tkbox-test-sensitive" in a for a in argv) and WORKFLOW not in patch:
                patch[:0] = WORKFLOW
            if any("tkbox-test-set-apart" in a for a in argv) and not apart:
                apart.extend(SET_APART)
            if any("tkbox-test-unreadable-patch" in a for a in argv):
                # a line the door quotes when it refuses the patch, as Markdown would
                # render it in a CI job's summary: an image, a link, bold text
                patch.extend(b"diff --git a/x b/x\n![x](https://evil.example/p.png) "
                             b"**approve [PR 9](https://evil.example/)**\n")
            status = 3 if argv[0] == "false" else 7 if failing else 0
            await fs.send({"ev": "exit", "status": status, "signal": 0})
        elif op == "diff":
            await answer_diff(fs, req, bytes(patch), apart=apart)
        elif op == "shutdown":
            await fs.send({"ev": "ok"})
            done.set()
        else:
            await fs.send({"ev": "ok", "uptime": 1.0})

    ports.serve(PORT_RPC, rpc)
    await done.wait()


class SdkDaemon:
    """The API served on `socket` from a thread with its own event loop."""

    def __init__(self, tmp: Path, *, images: ImageSource | None = None,
                 tools: ToolSource | None = None) -> None:
        self.images, self.tools = images, tools
        self.home = tmp / "home"
        self.socket = tmp / "run" / "daemon.sock"
        self.socket.parent.mkdir(parents=True, mode=0o700)
        self.signer = FakeSigner()
        # the network door's approvals (no door: tests open approvals on it themselves)
        self.approvals = ApprovalBoard(self.signer, SystemClock())
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tmp = tmp
        self._server: uvicorn.Server | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        build = FakeBuild(self._tmp / "vmlinux", self._tmp / "initramfs")
        manager = BoxManager(launcher=FakeLauncher(scripted_guest), signer=self.signer,
                             options=Options(), images=self.images or FakeImages(self._tmp),
                             guest_build=FakeBuilder(build), home=self.home,
                             approvals=self.approvals, tools=self.tools)
        app = make_app(manager, {"version": "test", "network_door": False})
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.socket))
        sock.listen(16)
        config = uvicorn.Config(app, http=PeerCheckedH11, lifespan="off", log_level="warning",
                                access_log=False)
        self._server = uvicorn.Server(config)
        try:
            await self._server.serve(sockets=[sock])
        finally:
            sock.close()
            for name in list(manager.boxes):
                await manager.rm(name, force=True)

    def start(self) -> SdkDaemon:
        self._thread.start()
        deadline = time.monotonic() + 20
        while self._server is None or not self._server.started:
            if self._error is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the test daemon did not start: {self._error!r}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(20)


def checkout(root: Path) -> Path:
    ws = root / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    return ws
