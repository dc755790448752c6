"""The model-call reader's throughput on model API streams, beside two baselines, in one run.

Each body (about `--mib` MiB) is fed to a `ModelUsage` in 64 KiB reads, as the
secrets door feeds a model host's answer, then finished. Bodies, shaped as each
API streams them (`tests/unit/doors/secrets/test_secrets_model_usage.py` has the shapes):

- `responses-sse`: the OpenAI Responses API, `response.output_text.delta` events
  of a few words each, then `response.completed` with its usage;
- `anthropic-sse`: the Messages API, `content_block_delta` events;
- `gemini-sse`: `streamGenerateContent?alt=sse` chunks (CRLF), each with its
  `usageMetadata` and `modelVersion`;
- `chat-sse`: Chat Completions chunks, then the usage chunk and `[DONE]`;
- `json-big`: one Responses API object whose output text is the whole body (one
  long string, escapes in it).

Baselines, on the same bytes in the same run: the reader it replaced (a regular
expression over the last 512 bytes and each read, matching member names
anywhere), and the response redactor the door runs on the same bytes
(`tkbox.doors.secrets.leaks.Redactor`, one secret). Printed: MiB/s of each, best
of `--repeat`, and the ratios reader / old reader and reader / redactor. Only
ratios are results; the machine's other load is not controlled.

    .venv/bin/python benchmarks/model_usage.py [--mib 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from typing import Any

from tkbox.doors.secrets.leaks import Redactor, patterns
from tkbox.doors.secrets.model import ModelUsage

READ = 65536
VALUE = b"ghp_BenchmarkSecretValue0123456789"  # not a secret: a fixed benchmark string
WORDS = ["the", "test", "passes", "now", "caf\u00e9", 'say "hi"', "line\nbreak", "usage",
         "model", "tokens"]


def _words(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(4))


def _sse(events: list[dict[str, Any]], eol: str = "\n", named: bool = True) -> bytes:
    out = []
    for e in events:
        head = f"event: {e['type']}{eol}" if named and "type" in e else ""
        out.append(f"{head}data: {json.dumps(e)}{eol}{eol}")
    return "".join(out).encode()


def bodies(size: int) -> dict[str, bytes]:
    n = max(1, size // 160)
    usage = {"input_tokens": 328, "output_tokens": 52, "total_tokens": 380,
             "input_tokens_details": {"cached_tokens": 64},
             "output_tokens_details": {"reasoning_tokens": 16}}
    resp: dict[str, Any] = {"id": "resp_1", "object": "response", "model": "gpt-x",
                            "status": "in_progress", "output": [], "usage": None}
    responses = _sse([{"type": "response.created", "response": resp}] + [
        {"type": "response.output_text.delta", "sequence_number": i, "item_id": "msg_1",
         "output_index": 0, "content_index": 0, "delta": _words(i)} for i in range(n)] + [
        {"type": "response.completed", "response": {**resp, "status": "completed",
                                                    "usage": usage}}])
    anthropic = _sse([{"type": "message_start", "message": {
        "id": "m", "type": "message", "model": "claude-x", "usage": {"input_tokens": 9}}}] + [
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": _words(i)}} for i in range(n)] + [
        {"type": "message_delta", "usage": {"output_tokens": 77}}])
    gemini = _sse([{"candidates": [{"content": {"role": "model", "parts": [
        {"text": _words(i)}]}, "index": 0}],
        "usageMetadata": {"promptTokenCount": 654, "candidatesTokenCount": i,
                          "totalTokenCount": 654 + i},
        "modelVersion": "gemini-x", "responseId": "r1"} for i in range(n // 2)], "\r\n")
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "gpt-x"}
    chat = _sse([{**chunk, "choices": [{"index": 0, "delta": {"content": _words(i)}}],
                  "usage": None} for i in range(n)] + [
        {**chunk, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}],
        named=False) + b"data: [DONE]\n\n"
    big = json.dumps({**resp, "status": "completed", "usage": usage, "output": [{
        "type": "message", "content": [{"type": "output_text",
                                        "text": " ".join(_words(i) for i in range(n))}]}]})
    return {"responses-sse": responses, "anthropic-sse": anthropic, "gemini-sse": gemini,
            "chat-sse": chat, "json-big": big.encode()}


_OLD = re.compile(
    rb'"(model|input_tokens|output_tokens|prompt_tokens|completion_tokens|'
    rb'cache_creation_input_tokens|cache_read_input_tokens)"\s{0,8}:\s{0,8}'
    rb'(?:"([\x20-\x21\x23-\x5b\x5d-\x7e]{1,128})"|([0-9]{1,12})(?=[^0-9]))')


def old_reader(body: bytes) -> None:
    """The reader `ModelUsage` replaced: a regex over a 512-byte window and each read."""
    tail = b""
    found: dict[bytes, bytes] = {}
    for i in range(0, len(body), READ):
        window = tail + body[i:i + READ]
        for m in _OLD.finditer(window):
            found[m.group(1)] = m.group(2) or m.group(3)
        tail = window[-512:]


def new_reader(body: bytes) -> None:
    m = ModelUsage()
    for i in range(0, len(body), READ):
        m.feed(body[i:i + READ])
    m.finish()
    assert m.fields()["api"] != "unknown"


def redactor(body: bytes) -> None:
    r = Redactor(patterns([("GH", "value", VALUE)]))
    for i in range(0, len(body), READ):
        r.feed(body[i:i + READ])
    r.feed(b"", final=True)


def best(fn: Callable[[bytes], None], body: bytes, repeat: int) -> float:
    """MiB/s, the best of `repeat` runs."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(body)
        times.append(time.perf_counter() - t0)
    return len(body) / (1 << 20) / min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'body':<14} {'MiB':>5} {'reader':>9} {'old':>9} {'redactor':>9} "
          f"{'/old':>6} {'/redactor':>9}")
    for name, body in bodies(args.mib << 20).items():
        new = best(new_reader, body, args.repeat)
        old = best(old_reader, body, args.repeat)
        red = best(redactor, body, args.repeat)
        print(f"{name:<14} {len(body) / (1 << 20):5.1f} {new:9.1f} {old:9.1f} {red:9.1f} "
              f"{new / old:6.2f} {new / red:9.2f}")


if __name__ == "__main__":
    main()
