"""The response redactor's throughput on bulk bodies, beside a plain search, in one run.

Each body (`--mib` MiB) is fed to a `Redactor` in 64 KiB reads, as the secrets
door feeds an origin's body, and then finished (`final`). Bodies:

- `zeros`: NUL bytes (what `benchmarks/mitm.py` sends);
- `random`: random bytes (`%`, `&` and `\\` about once in 85 bytes, a few real
  escapes per read);
- `json`: JSON records full of `\\"`, `\\n`, `\\u00e9`, `\\/` escapes, `%XX` and
  `&amp;`-style entities (escapes at both levels);
- `html`: HTML with named and numeric entities and an inline script;
- `json+value`: `json` with the value reflected once per read, escaped a
  different way each time (a match to map back to the window's bytes);
- `sse`: a model's server-sent events, fed one event (about 120 bytes) a read,
  as a streaming answer arrives (the cost of each read, not of each byte).

Baseline, on the same bytes in the same run: each read case-folded and every
redaction form searched for as sent (`bytes.lower` and `bytes.find`), what a
redactor that decodes nothing costs. Printed: MiB/s of each, best of
`--repeat`, and the ratio redactor / baseline. Only ratios are results; the
machine's other load is not controlled (`--cpu` times the process's CPU, not
the wall clock, which a host shared with other jobs disturbs less).

`--against FILE` also times another version of `leaks.py` (say the last
release's, from `git show REV:src/tkbox/doors/secrets/leaks.py`), loaded as a
module of its own, on the same bodies, in turn with this one: its MiB/s and the
ratio now / then.

    .venv/bin/python benchmarks/redact.py [--mib 32] [--repeat 3] [--cpu] [--against FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from tkbox.doors.secrets import leaks

VALUE = b"ghp_BenchmarkSecretValue0123456789"  # not a secret: a fixed benchmark string
READ = 65536


def _json(size: int, rnd: random.Random) -> bytes:
    words = ["hello", "caf\u00e9", "line\nbreak", 'say "hi"', "a/b/c", "tab\there",
             "x&y<z>", "na\u00efve", "12345", "ghp_notTheValue"]
    parts, n = [], 0
    while n < size:
        rec = {"id": rnd.randrange(10**6), "text": " ".join(rnd.choice(words) for _ in range(12)),
               "html": "&amp; &lt;b&gt;bold&lt;/b&gt; &#39;q&#39; &quot;z&quot;",
               "url": "https://example.com/p%20q?a=1&b=%2F"}
        s = json.dumps(rec).encode().replace(b"/", b"\\/") + b",\n"
        parts.append(s)
        n += len(s)
    return b"".join(parts)[:size]


def _html(size: int) -> bytes:
    s = (b'<div class="row"><a href="/path/to/x?y=1&amp;z=2">Link &raquo; here</a> '
         b"<p>Some text &mdash; with &nbsp; entities &#8212; and &#x27;quotes&#x27;.</p>\n"
         b'<script>var s = "a\\u00e9\\/b";</script>\n')
    return (s * (size // len(s) + 1))[:size]


def _with_value(body: bytes) -> bytes:
    forms = [VALUE, VALUE.hex().encode(), b"".join(b"\\u%04x" % c for c in VALUE),
             b"-".join(bytes([c]) for c in VALUE), b"".join(b"%%%02x" % c for c in VALUE),
             b"".join(b"&#%d;" % c if i % 2 else bytes([c]) for i, c in enumerate(VALUE))]
    out = bytearray(body)
    for k, at in enumerate(range(READ // 3, len(out), READ)):
        f = forms[k % len(forms)]
        out[at:at + len(f)] = f
    return bytes(out[:len(body)])


def _sse(size: int) -> bytes:
    out, n, i = [], 0, 0
    while n < size:
        e = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
             b'"delta":{"type":"text_delta","text":"token %d, caf\\u00e9\\n"}}\n\n' % i)
        out.append(e)
        n, i = n + len(e), i + 1
    return b"".join(out)


def bodies(size: int) -> dict[str, bytes]:
    rnd = random.Random(1)
    js = _json(size, rnd)
    return {"zeros": bytes(size), "random": os.urandom(size), "json": js, "html": _html(size),
            "json+value": _with_value(js), "sse": _sse(size // 16)}


def _reads(name: str, body: bytes) -> list[bytes]:
    if name == "sse":  # one event a read
        return [e + b"\n\n" for e in body.split(b"\n\n") if e]
    return [body[i:i + READ] for i in range(0, len(body), READ)]


def redactor(module: ModuleType) -> Callable[[list[bytes]], int]:
    def redact(reads: list[bytes]) -> int:
        r = module.Redactor(module.patterns([("GH", "value", VALUE)], for_redaction=True))
        n = 0
        for data in reads:
            n += len(r.feed(data))
        n += len(r.feed(b"", final=True))
        assert n == sum(map(len, reads))
        return int(r.count)
    return redact


def baseline(reads: list[bytes]) -> int:
    needles = [p.needle for p in leaks.patterns([("GH", "value", VALUE)], for_redaction=True)]
    found = 0
    for data in reads:
        low = data.lower()
        found += sum(low.find(nd) != -1 for nd in needles)
    return found


def best(fns: list[Callable[[list[bytes]], int]], reads: list[bytes], repeat: int,
         clock: Callable[[], float]) -> list[float]:
    """MiB/s of each of `fns` on `reads`, the best of `repeat` runs taken in turn (so a
    change in the machine's load falls on all of them)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times, strict=True):
            t = clock()
            fn(reads)
            ts.append(clock() - t)
    return [sum(map(len, reads)) / (1 << 20) / min(ts) for ts in times]


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("scan_against", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu", action="store_true", help="time the process's CPU")
    ap.add_argument("--against", type=Path, help="another leaks.py to time in turn")
    a = ap.parse_args()
    clock = time.process_time if a.cpu else time.perf_counter
    fns = [redactor(leaks), baseline] + ([redactor(load(a.against))] if a.against else [])
    print(f"{a.mib} MiB in {READ // 1024} KiB reads (sse: {a.mib * 64} KiB, an event a read), "
          f"best of {a.repeat}, {'CPU' if a.cpu else 'wall'} time")
    print(f"{'body':12} {'redactor MiB/s':>15} {'baseline MiB/s':>15} {'ratio':>7} "
          f"{'redactions':>11}" + (f" {'against MiB/s':>14} {'now/then':>9}" if a.against else ""))
    for name, body in bodies(a.mib << 20).items():
        reads = _reads(name, body)
        got = best(fns, reads, a.repeat, clock)
        red, base = got[0], got[1]
        line = (f"{name:12} {red:15.1f} {base:15.1f} {red / base:6.2f}x "
                f"{fns[0](reads):11d}")
        if a.against:
            line += f" {got[2]:14.1f} {red / got[2]:8.2f}x"
        print(line, flush=True)
    print("baseline: each read case-folded and every form searched for as sent (nothing decoded)")


if __name__ == "__main__":
    main()
