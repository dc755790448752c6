"""Scripted stand-ins of the OpenAI Responses API and the Gemini API, for e2e tests of
Codex CLI and Gemini CLI in a real box. One handler serves both (by path), over TLS
on loopback; it checks the key in the header each API reads, logs every request
(never the key), and plays a script of tool calls: read the code, edit it, run the
test (which also writes the key's variable to a file and tries a host the box is
not allowed), then a last answer. The turn is how many tool results came back.

The answers are shaped as each API's reference documents them: the Responses API's
server-sent events (`response.created`, `response.output_item.added` / `.done`,
`response.completed` with `usage`), and Gemini's `streamGenerateContent?alt=sse`
chunks (`candidates`, `usageMetadata`, `modelVersion`) or one `generateContent`
object.

Codex's default tools are one "code mode" custom tool, `exec`, whose input is
JavaScript run by its code-mode host, calling its nested tools (`exec_command`,
`apply_patch`); the stand-in answers with `custom_tool_call` items, which is what
Codex runs by default, so the e2e runs that path.
"""

from __future__ import annotations

import http.server
import json
from typing import Any

RESPONSES_USAGE = {"input_tokens": 432, "input_tokens_details": {"cached_tokens": 0},
                   "output_tokens": 65, "output_tokens_details": {"reasoning_tokens": 0},
                   "total_tokens": 497}
GEMINI_USAGE = {"promptTokenCount": 654, "candidatesTokenCount": 43, "totalTokenCount": 697}


def shell_step(key_env: str, port: int) -> str:
    """The test run, the key's variable as the box has it, and a host not allowed."""
    return ("python3 -B test_calc.py && echo TESTS-PASSED; "
            f"printf '%s\\n' \"${key_env}\" > key_seen.txt; "
            f"curl -sS -m 30 -o /dev/null https://other.test:{port}/ 2>&1 | head -c 300; true")


def codex_script(port: int) -> list[str]:
    """Codex's turns: JavaScript for its code-mode `exec` tool."""
    cmd = json.dumps(shell_step("OPENAI_API_KEY", port))  # a JSON string is a JS string
    patch = ("*** Begin Patch\\n*** Update File: calc.py\\n@@\\n def add(a, b):\\n"
             "-    return a - b\\n+    return a + b\\n*** End Patch\\n")
    return [
        "const r = await tools.exec_command({cmd: 'cat calc.py', yield_time_ms: 30000});\n"
        "text(r.output);",
        f"const r = await tools.apply_patch('{patch}');\ntext(JSON.stringify(r));",
        f"const r = await tools.exec_command({{cmd: {cmd}, yield_time_ms: 30000}});\n"
        "text(r.output);",
    ]


def gemini_script(port: int) -> list[dict[str, Any]]:
    return [
        {"name": "read_file", "args": {"file_path": "/workspace/calc.py"}},
        {"name": "replace", "args": {"file_path": "/workspace/calc.py",
                                     "old_string": "return a - b", "new_string": "return a + b",
                                     "instruction": "add must add"}},
        {"name": "run_shell_command", "args": {"command": shell_step("GEMINI_API_KEY", port),
                                               "description": "run the test"}},
    ]


def _sse(events: list[dict[str, Any]], eol: str = "\n") -> bytes:
    out = b""
    for e in events:
        name = f"event: {e['type']}{eol}" if "type" in e else ""
        out += f"{name}data: {json.dumps(e)}{eol}{eol}".encode()
    return out


def make_handler(log: list[dict[str, Any]], port_box: list[int], keys: dict[str, str]
                 ) -> type[http.server.BaseHTTPRequestHandler]:
    """`keys`: the real key of each API ("openai", "gemini"), as the door swaps it in."""

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _entry(self, body: bytes) -> dict[str, Any]:
            api = "gemini" if self.path.startswith("/v1beta/") else "openai"
            key = keys[api]
            bound = self.headers.get("authorization") if api == "openai" \
                else self.headers.get("x-goog-api-key")
            want = f"Bearer {key}" if api == "openai" else key
            others = [v for k, v in self.headers.items()
                      if k.lower() not in ("authorization", "x-goog-api-key")]
            entry = {"api": api, "method": self.command, "path": self.path,
                     "key_ok": bound == want,
                     "key_elsewhere": key in self.path or key.encode() in body
                     or any(key in v for v in others)}
            log.append(entry)
            return entry

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            entry = self._entry(b"")
            entry["upgrade"] = self.headers.get("upgrade")
            self._send(404, b'{"error": {"message": "not here"}}')

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            entry = self._entry(body)
            try:
                req = json.loads(body)
            except ValueError:
                req = {}
            if not entry["key_ok"]:
                self._send(401, b'{"error": {"message": "invalid key", "code": 401}}')
                return
            if entry["api"] == "openai" and self.path.endswith("/responses"):
                self._responses(req, entry)
            elif entry["api"] == "gemini" and ":" in self.path:
                self._gemini(req, entry)
            else:
                self._send(404, b'{"error": {"message": "not here"}}')

        def _responses(self, req: dict[str, Any], entry: dict[str, Any]) -> None:
            outs = [i for i in req.get("input") or [] if isinstance(i, dict)
                    and str(i.get("type", "")).endswith("_call_output")]
            turn = len(outs)
            entry["turn"] = turn
            entry["tool_output"] = json.dumps(outs[-1].get("output"))[:2000] if outs else ""
            steps = codex_script(port_box[0])
            model = str(req.get("model") or "gpt-e2e")
            resp = {"id": f"resp_{turn}", "object": "response", "created_at": 1,
                    "status": "in_progress", "model": model, "output": [], "usage": None}
            if turn < len(steps):
                item: dict[str, Any] = {"type": "custom_tool_call", "id": f"ctc_{turn}",
                                        "call_id": f"call_{turn}", "name": "exec",
                                        "input": steps[turn], "status": "completed"}
            else:
                item = {"type": "message", "id": "msg_done", "role": "assistant",
                        "status": "completed", "content": [{
                            "type": "output_text", "text": "The test passes now.",
                            "annotations": []}]}
            events = [
                {"type": "response.created", "sequence_number": 0, "response": resp},
                {"type": "response.output_item.added", "sequence_number": 1,
                 "output_index": 0, "item": {**item, "status": "in_progress"}},
                {"type": "response.output_item.done", "sequence_number": 2,
                 "output_index": 0, "item": item},
                {"type": "response.completed", "sequence_number": 3, "response": {
                    **resp, "status": "completed", "output": [item],
                    "usage": RESPONSES_USAGE}},
            ]
            self._send(200, _sse(events), "text/event-stream")

        def _gemini(self, req: dict[str, Any], entry: dict[str, Any]) -> None:
            model = self.path.split("/models/", 1)[1].split(":", 1)[0]
            answers = [p["functionResponse"] for c in req.get("contents") or []
                       for p in c.get("parts") or [] if isinstance(p, dict)
                       and "functionResponse" in p]
            if not req.get("tools"):
                # a side call (its router's): one JSON answer
                text = json.dumps({"complexity_reasoning": "simple", "complexity_score": 10})
                self._send(200, json.dumps({
                    "candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                                    "finishReason": "STOP", "index": 0}],
                    "usageMetadata": GEMINI_USAGE, "modelVersion": model,
                    "responseId": "r-side"}).encode())
                return
            turn = len(answers)
            entry["turn"] = turn
            entry["tool_output"] = json.dumps(answers[-1])[:2000] if answers else ""
            steps = gemini_script(port_box[0])
            part = {"functionCall": steps[turn]} if turn < len(steps) \
                else {"text": "The test passes now."}
            chunks = [
                {"candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}],
                 "usageMetadata": {"promptTokenCount": 654, "totalTokenCount": 654},
                 "modelVersion": model, "responseId": f"r{turn}"},
                {"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]},
                                 "finishReason": "STOP", "index": 0}],
                 "usageMetadata": GEMINI_USAGE, "modelVersion": model,
                 "responseId": f"r{turn}"},
            ]
            self._send(200, _sse(chunks, "\r\n"), "text/event-stream")

    return H
