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
  different way each time (a match to map back to the window's bytes).

Baseline, on the same bytes in the same run: each read case-folded and every
redaction form searched for as sent (`bytes.lower` and `bytes.find`), what a
redactor that decodes nothing costs. Printed: MiB/s of each, best of
`--repeat`, and the ratio redactor / baseline. Only ratios are results; the
machine's other load is not controlled.

    .venv/bin/python benchmarks/redact.py [--mib 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Callable

from tkbox.doors.secrets.scan import Redactor, patterns

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


def bodies(size: int) -> dict[str, bytes]:
    rnd = random.Random(1)
    js = _json(size, rnd)
    return {"zeros": bytes(size), "random": os.urandom(size), "json": js, "html": _html(size),
            "json+value": _with_value(js)}


def redact(body: bytes) -> int:
    r = Redactor(patterns([("GH", "value", VALUE)], for_redaction=True))
    n = 0
    for i in range(0, len(body), READ):
        n += len(r.feed(body[i:i + READ]))
    n += len(r.feed(b"", final=True))
    assert n == len(body)
    return r.count


def baseline(body: bytes) -> int:
    needles = [p.needle for p in patterns([("GH", "value", VALUE)], for_redaction=True)]
    found = 0
    for i in range(0, len(body), READ):
        low = body[i:i + READ].lower()
        found += sum(low.find(nd) != -1 for nd in needles)
    return found


def best(fns: list[Callable[[bytes], int]], body: bytes, repeat: int) -> list[float]:
    """MiB/s of each of `fns` on `body`, the best of `repeat` runs taken in turn (so a
    change in the machine's load falls on all of them)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times, strict=True):
            t = time.perf_counter()
            fn(body)
            ts.append(time.perf_counter() - t)
    return [len(body) / (1 << 20) / min(ts) for ts in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"{a.mib} MiB in {READ // 1024} KiB reads, best of {a.repeat}")
    print(f"{'body':12} {'redactor MiB/s':>15} {'baseline MiB/s':>15} {'ratio':>7} "
          f"{'redactions':>11}")
    for name, body in bodies(a.mib << 20).items():
        red, base = best([redact, baseline], body, a.repeat)
        print(f"{name:12} {red:15.1f} {base:15.1f} {red / base:6.2f}x {redact(body):11d}",
              flush=True)
    print("baseline: each read case-folded and every form searched for as sent (nothing decoded)")


if __name__ == "__main__":
    main()
