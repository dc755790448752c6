"""A fake `firecracker` binary for the launcher's process tests.

    fake_firecracker.py --api-sock PATH --id ID

It does what the launcher relies on, and checks what the launcher sends:

- records the process facts the launcher promises (open descriptors, cwd,
  process group, session, environment names) in `fake-proc.json` in its cwd;
- serves the API over HTTP/1.1 on the Unix socket PATH; every request is
  checked against Firecracker's OpenAPI description (`fc_openapi`), recorded
  in `fake-requests.jsonl`, and answered 204, or 400 with a `fault_message`
  as Firecracker does; pre-boot calls after InstanceStart are refused;
- at InstanceStart, checks the kernel is ELF and the files exist, then plays
  the vsock device: listens on `uds_path` and answers `CONNECT <port>\\n` the
  way Firecracker reads it; the fake guest listens on port 1024 only, with a
  line protocol: `echo TEXT`, `dial PORT TEXT` (connects to
  `<uds_path>_<PORT>`, as Firecracker does for a guest's connect, sends TEXT
  and returns the reply), `console N` (writes N bytes to stdout, the serial
  console), `exit N` (the VMM exits with status N);
- the ID chooses misbehaviour: `exit-at-start` exits at once with a message
  on stderr; `fault-boot-source` refuses PUT /boot-source; `agent` makes the
  fake guest boot as tkbox's agent does: at InstanceStart it dials port 1026
  (`<uds_path>_1026`), says hello, and when the host ends that stream (or
  nothing listens) the guest powers off: the VMM exits with status 0.
  `--behave WORDS` adds such words to the ID (a jailed VM's ID is the jailer's);
- started by a jailer (`--start-time-us` given, `fake_jailer.py`), it is in its
  chroot directory (its cwd) and every path it is given is resolved there, as a
  chrooted Firecracker resolves it.

Test helper only (not shipped).
"""

from __future__ import annotations

import os
import sys

# Recorded before anything else opens a file.
_FDS = []
for _fd in range(1024):
    try:
        os.fstat(_fd)
    except OSError:
        continue
    _FDS.append(_fd)

import argparse  # noqa: E402
import http.server  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import socketserver  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import fc_openapi  # noqa: E402  (beside this script: sys.path[0])

PRE_BOOT = {"/machine-config", "/boot-source", "/vsock"}
#: Started by a jailer: paths are inside the chroot, which is the cwd.
JAILED = [False]


def here(path: str) -> str:
    """`path` as a chrooted Firecracker would open it."""
    return path.lstrip("/") if JAILED[0] else path
lock = threading.Lock()
state: dict[str, Any] = {"started": False, "vm": "Not started", "config": {}}
next_host_port = [1 << 30]


def record(entry: dict[str, Any]) -> None:
    with lock, open("fake-requests.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


# --- the vsock device ----------------------------------------------------------


def read_command(conn: socket.socket) -> bytes | None:
    """As Firecracker: 10 bytes, then one at a time to a newline or 32 bytes."""
    conn.settimeout(2)
    try:
        data = conn.recv(10, socket.MSG_WAITALL)
        while len(data) == len(data.rstrip(b"\n")) and len(data) < 32:
            byte = conn.recv(1)
            if not byte:
                return None
            data += byte
    except OSError:
        return None
    return data if len(data) >= 10 else None


def guest_rpc(conn: socket.socket, uds_path: str) -> None:
    """The fake guest agent on port 1024: one command line, one answer."""
    f = conn.makefile("rwb", buffering=0)
    line = f.readline(1 << 16).rstrip(b"\n")
    verb, _, rest = line.partition(b" ")
    if verb == b"echo":
        conn.sendall(rest)
    elif verb == b"dial":
        port, _, text = rest.partition(b" ")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as out:
            try:
                out.connect(f"{uds_path}_{int(port)}")
            except OSError as exc:
                conn.sendall(b"RST " + str(exc.errno).encode())
            else:
                out.sendall(text)
                out.shutdown(socket.SHUT_WR)
                reply = b""
                while chunk := out.recv(65536):
                    reply += chunk
                conn.sendall(reply)
    elif verb == b"console":
        sys.stdout.buffer.write(b"x" * int(rest))
        sys.stdout.buffer.flush()
        conn.sendall(b"written")
    elif verb == b"exit":
        conn.sendall(b"bye")
        conn.close()
        os._exit(int(rest))
    conn.shutdown(socket.SHUT_WR)


def vsock_client(conn: socket.socket, uds_path: str) -> None:
    with conn:
        command = read_command(conn)
        if command is None:
            return
        words = command.decode("utf-8", "replace").split()
        if len(words) < 2 or words[0].lower() != "connect" or not words[1].isdigit():
            return
        if int(words[1]) != 1024:
            return  # the guest sends RST: closed without OK
        with lock:
            host_port = next_host_port[0]
            next_host_port[0] += 1
        conn.settimeout(None)
        conn.sendall(b"OK %d\n" % host_port)
        guest_rpc(conn, uds_path)


def start_vsock(uds_path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(uds_path)  # fails if the path exists, as Firecracker's does
    listener.listen(16)

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=vsock_client, args=(conn, uds_path), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


# --- the API --------------------------------------------------------------------


def boot(config: dict[str, Any]) -> str | None:
    """What InstanceStart checks; a fault message, or None."""
    source = config.get("/boot-source")
    if source is None:
        return "Cannot start microvm without kernel configuration."
    try:
        with open(here(source["kernel_image_path"]), "rb") as f:
            if f.read(4) != b"\x7fELF":
                return "Kernel Loader: failed to load ELF kernel image"
        for key in ("initrd_path",):
            if key in source:
                os.stat(here(source[key]))
        for path, body in config.items():
            if path.startswith("/drives/"):
                os.stat(here(body["path_on_host"]))
    except OSError as exc:
        return f"Cannot open a boot file: {exc.strerror}"
    vsock = config.get("/vsock")
    if vsock is not None:
        try:
            start_vsock(here(vsock["uds_path"]))
        except OSError as exc:
            return f"Cannot create backend for vsock device: {exc.strerror}"
    return None


def handle(vmm_id: str, method: str, path: str, body: Any) -> tuple[int, str | None]:
    errors = fc_openapi.check_request(method, path, body)
    if errors:
        return 400, "; ".join(errors)
    if method == "GET":
        return 200, None
    if path.startswith("/drives/") and body["drive_id"] != path.removeprefix("/drives/"):
        return 400, "The id from the path does not match the id from the body!"
    if method == "PUT" and (path in PRE_BOOT or path.startswith("/drives/")):
        if state["started"]:
            return 400, "The requested operation is not supported after starting the microVM."
        if path == "/boot-source" and "fault-boot-source" in vmm_id:
            return 400, "The kernel file cannot be opened: No such file or directory (os error 2)"
        state["config"][path] = body
        return 204, None
    if path == "/actions" and body["action_type"] == "InstanceStart":
        if state["started"]:
            return 400, "The requested operation is not supported after starting the microVM."
        fault = boot(state["config"])
        if fault:
            return 400, fault
        state["started"] = True
        state["vm"] = "Running"
        if "agent" in vmm_id:
            state["boot_agent"] = here(state["config"]["/vsock"]["uds_path"])
        return 204, None
    if path == "/vm":
        if not state["started"]:
            return 400, "The requested operation is not supported before starting the microVM."
        state["vm"] = "Paused" if body["state"] == "Paused" else "Running"
        return 204, None
    return 400, f"the fake does not do {method} {path}"


def agent_boot(uds_path: str) -> None:
    """The guest's first act, as tkbox's agent: ask for its boot config on 1026."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(f"{uds_path}_1026")
            conn.sendall(b"hello from the guest\n")
            while conn.recv(65536):
                pass
        except OSError:
            pass
    sys.stdout.flush()
    os._exit(0)  # no config: the agent powers off, and Firecracker exits


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    vmm_id = "anonymous-instance"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        sys.stderr.write("fake firecracker: " + format % args + "\n")

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            status, fault, body = 400, "the body is not JSON", None
        else:
            with lock:
                status, fault = handle(self.vmm_id, self.command, self.path, body)
        record({"method": self.command, "path": self.path, "body": body, "status": status})
        if status == 200:
            payload = json.dumps(
                {"id": self.vmm_id, "state": state["vm"], "vmm_version": "0.0.0-fake",
                 "app_name": "Firecracker"}
            ).encode()
        elif status == 204:
            payload = b""
        else:
            payload = json.dumps({"fault_message": fault}).encode()
        self.send_response(status)
        if payload:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()
        with lock:
            uds = state.pop("boot_agent", None)
        if uds is not None:  # the guest boots once InstanceStart has been answered
            threading.Thread(target=agent_boot, args=(uds,), daemon=True).start()

    do_GET = do_PUT = do_PATCH = _answer


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api-sock", required=True)
    parser.add_argument("--id", default="anonymous-instance")
    parser.add_argument("--start-time-us")  # given by the jailer
    parser.add_argument("--start-time-cpu-us")
    parser.add_argument("--behave", default="")
    args = parser.parse_args()
    JAILED[0] = args.start_time_us is not None
    if args.behave:
        args.id = f"{args.id}-{args.behave}"
    Path("fake-proc.json").write_text(
        json.dumps(
            {
                "fds": _FDS,
                "cwd": os.getcwd(),
                "pid": os.getpid(),
                "pgid": os.getpgid(0),
                "sid": os.getsid(0),
                "env": sorted(os.environ),
                "argv": sys.argv[1:],
                "uid": os.getuid(),
                "gid": os.getgid(),
            }
        )
    )
    if "exit-at-start" in args.id:
        sys.stderr.write("Error: the fake was told to fail at start\n")
        sys.exit(1)
    sys.stdout.write("fake serial console: booting\n")
    sys.stdout.flush()
    Handler.vmm_id = args.id
    server = Server(here(args.api_sock), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
