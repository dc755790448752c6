"""`tkbox exec -t` and `tkbox shell`: a terminal in the box.

The local terminal goes raw, so every key (Ctrl-C and Ctrl-D included) travels
as a byte to the pty in the box, whose line discipline turns it into a signal
or an end of file, exactly as on a local terminal. A thread reads the keys and
posts them to the daemon (`…/exec/ID/input`); SIGWINCH posts the new size
(`…/resize`); the command's output streams back on the exec response. The
local terminal is restored however the command ends.

Each terminal session is one `Bash` decision like any exec (its context says
`tty`); its keystrokes are not recorded (docs/limits.md).
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import sys
import termios
import threading
import tty
from collections.abc import Callable
from typing import Any

from tkbox.errors import TkboxError, UserError

#: the shell `tkbox shell` starts: bash where the image has it, else sh
SHELL = ["/bin/sh", "-c", "command -v bash >/dev/null 2>&1 && exec bash -i || exec sh -i"]


def run_tty(client: Callable[[], Any], name: str, body: dict[str, Any]) -> int:
    """Run `body` (an exec request) on a terminal; the command's exit status."""
    fd = sys.stdin.fileno()
    if not os.isatty(fd) or not os.isatty(sys.stdout.fileno()):
        raise UserError("-t needs a terminal on stdin and stdout; without one, drop -t "
                        "(and pass input with -i)")
    size = os.get_terminal_size(sys.stdout.fileno())
    body = {**body, "tty": {"rows": max(1, min(size.lines, 1000)),
                            "cols": max(1, min(size.columns, 1000))}}
    env = dict(body.get("env") or {})
    env.setdefault("TERM", os.environ.get("TERM", "xterm-256color"))
    body["env"] = env
    state: dict[str, Any] = {"exec_id": None}
    started = threading.Event()

    def post(path: str, payload: dict[str, Any]) -> None:
        with contextlib.suppress(TkboxError):
            client().call("POST", f"/v1/boxes/{name}/exec/{state['exec_id']}/{path}",
                          json=payload)

    def keys() -> None:
        started.wait()
        sender = client()
        while True:
            try:
                data = os.read(fd, 4096)
            except OSError:
                return
            if not data:
                return
            try:
                sender.call("POST", f"/v1/boxes/{name}/exec/{state['exec_id']}/input",
                            json={"data_b64": base64.b64encode(data).decode()})
            except TkboxError:
                return  # the command has ended

    def on_winch(signum: int, frame: Any) -> None:
        if state["exec_id"] is None:
            return
        s = os.get_terminal_size(sys.stdout.fileno())
        threading.Thread(target=post, args=("resize", {"rows": max(1, min(s.lines, 1000)),
                                                       "cols": max(1, min(s.columns, 1000))}),
                         daemon=True).start()

    saved = termios.tcgetattr(fd)
    old_winch = signal.signal(signal.SIGWINCH, on_winch)
    code = 1
    try:
        tty.setraw(fd)
        threading.Thread(target=keys, daemon=True).start()
        out = sys.stdout.buffer
        for ev in client().stream("POST", f"/v1/boxes/{name}/exec", json=body):
            kind = ev.get("ev")
            if kind == "started":
                state["exec_id"] = ev.get("exec_id")
                started.set()
            elif kind == "out":
                out.write(base64.b64decode(ev.get("data", "")))
                out.flush()
            elif kind == "exit":
                code = int(ev.get("status", 1))
                if ev.get("error"):
                    termios.tcsetattr(fd, termios.TCSADRAIN, saved)
                    print(f"tkbox: {ev['error']}", file=sys.stderr, flush=True)
            elif kind == "error":
                raise TkboxError(str(ev.get("message")))
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, old_winch)
    return code
