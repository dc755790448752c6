"""A scripted stand-in of Anthropic's Messages API, for tests and benchmarks of agents.

It serves what Claude Code asks of its model host (facts measured in the repository's
notes: `GET /api/claude_code/...` answered 404, `POST /v1/messages?beta=true`
streamed as server-sent events), over TLS on loopback with a test CA, and accepts a
request only with the real key in `x-api-key`. Each request is answered from a
script: a request with tools gets the turn's block (the turn is how many tool
results came back so far), a side request without tools a short text. Every request
is logged (method, path, whether the key was right, the turn, and which markers the
body held), so a test can judge the agent by what reached the model.

The stream is the one the Messages API documents: `message_start`, then per block
`content_block_start`, one `content_block_delta` (`text_delta` or
`input_json_delta`), `content_block_stop`, then `message_delta` (stop reason,
usage) and `message_stop`.
"""

from __future__ import annotations

import http.server
import json
import ssl
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tkbox.image.testing import ScratchCA

__all__ = ["MessagesStandIn", "failing_checkout", "fix_script", "sse"]

Block = dict[str, Any]


def sse(model: str, blocks: Sequence[Block], stop: str, *, input_tokens: int = 321,
        output_tokens: int = 57) -> bytes:
    """A Messages API stream: each block as start, one delta, stop."""
    evs: list[tuple[str, dict[str, Any]]] = [("message_start", {
        "type": "message_start", "message": {
            "id": "msg_standin", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1}}})]
    for i, b in enumerate(blocks):
        if b["type"] == "text":
            evs.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                "content_block": {"type": "text", "text": ""}}))
            evs.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                        "delta": {"type": "text_delta", "text": b["text"]}}))
        else:
            evs.append(("content_block_start", {"type": "content_block_start", "index": i,
                        "content_block": {"type": "tool_use", "id": b["id"],
                                          "name": b["name"], "input": {}}}))
            evs.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                        "delta": {"type": "input_json_delta",
                                  "partial_json": json.dumps(b["input"])}}))
        evs.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    evs.append(("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": stop, "stop_sequence": None},
                                  "usage": {"output_tokens": output_tokens}}))
    evs.append(("message_stop", {"type": "message_stop"}))
    return b"".join(f"event: {n}\ndata: {json.dumps(d)}\n\n".encode() for n, d in evs)


def failing_checkout(ws: Path) -> Path:
    """`ws` made the git checkout `fix_script` fixes: `add` subtracts, and the test of
    it (`python3 test_calc.py`) fails until it adds."""
    ws.mkdir(parents=True)
    (ws / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (ws / "test_calc.py").write_text(
        "from calc import add\n\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n")
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    return ws


def fix_script(bash: str) -> list[Block]:
    """The usual job: Read calc.py, Edit `a - b` into `a + b`, run `bash`, then say so."""
    return [
        {"type": "tool_use", "id": "toolu_read", "name": "Read",
         "input": {"file_path": "/workspace/calc.py"}},
        {"type": "tool_use", "id": "toolu_edit", "name": "Edit",
         "input": {"file_path": "/workspace/calc.py", "old_string": "return a - b",
                   "new_string": "return a + b"}},
        {"type": "tool_use", "id": "toolu_bash", "name": "Bash",
         "input": {"command": bash, "description": "run the test"}},
        {"type": "text", "text": "The test passes now."},
    ]


@dataclass
class MessagesStandIn:
    """The stand-in on 127.0.0.1 (`port` once started). `script()` gives the turns;
    `markers` are byte strings whose presence in a request body is logged."""

    ca: ScratchCA
    key: str
    script: Callable[[], list[Block]]
    markers: dict[str, bytes] = field(default_factory=dict)
    log: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    _server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> MessagesStandIn:
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                stand_in.log.append({"method": "GET", "path": self.path,
                                     "key_ok": self.headers.get("x-api-key") == stand_in.key})
                self._send(404, b'{"type":"error","error":{"type":"not_found_error",'
                                b'"message":"not here"}}')

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = self.headers.get("x-api-key")
                try:
                    req = json.loads(body)
                except ValueError:
                    req = {}
                entry: dict[str, Any] = {
                    "method": "POST", "path": self.path, "key_ok": key == stand_in.key,
                    "key_present": key is not None, "tools": len(req.get("tools") or []),
                    "model": req.get("model"), "stream": req.get("stream"),
                    **{name: m in body for name, m in stand_in.markers.items()}}
                stand_in.log.append(entry)
                if key != stand_in.key:
                    self._send(401, b'{"type":"error","error":{"type":"authentication_'
                                    b'error","message":"invalid x-api-key"}}')
                    return
                if not self.path.startswith("/v1/messages"):
                    self._send(404, b"{}")
                    return
                model = str(req.get("model") or "claude-standin")
                msgs = req.get("messages") or []
                if not req.get("tools"):
                    blocks: list[Block] = [{"type": "text", "text": "ok"}]
                    stop = "end_turn"
                else:
                    turn = sum(1 for m in msgs if m.get("role") == "user"
                               and isinstance(m.get("content"), list)
                               for c in m["content"]
                               if isinstance(c, dict) and c.get("type") == "tool_result")
                    steps = stand_in.script()
                    blocks = [steps[min(turn, len(steps) - 1)]]
                    stop = "tool_use" if blocks[0]["type"] == "tool_use" else "end_turn"
                    entry["turn"] = turn
                if req.get("stream"):
                    self._send(200, sse(model, blocks, stop), "text/event-stream")
                else:
                    self._send(200, json.dumps({
                        "id": "msg_standin", "type": "message", "role": "assistant",
                        "model": model, "content": blocks, "stop_reason": stop,
                        "stop_sequence": None,
                        "usage": {"input_tokens": 12, "output_tokens": 3}}).encode())

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.ca.cert_pem, self.ca.key_pem)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
