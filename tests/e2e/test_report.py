"""`tkbox report` on a real run, read in a real browser (headless Chromium): the page says
VERIFIED for the bundle a box produced, shows what the box did, loads nothing, and says
FAILED for the same bundle with one byte changed."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from e2e_stack import TKBOX, Box

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                                "(scripts/setup.sh installs it)")


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.refs: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._skip += tag in ("style", "title", "script")
        self.refs += [f"{tag}[{k}]" for k, _ in attrs if k in ("src", "href", "action")]
        self.refs += [tag for _ in [0] if tag in ("script", "link", "iframe", "img", "object")]

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("style", "title", "script")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def browse(page: Path, shot: Path) -> tuple[str, list[str]]:
    """The DOM Chromium built from the page (its visible text, and anything it would load),
    and a screenshot of it."""
    base = [CHROMIUM or "chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
            "--no-first-run", "--user-data-dir=" + str(page.parent / "chromium-profile"),
            "--window-size=1200,2000"]
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    subprocess.run([*base, f"--screenshot={shot}", page.as_uri()], capture_output=True,
                   timeout=120, check=True)
    p = _Text()
    p.feed(dom)
    return " ".join(" ".join(p.parts).split()), p.refs


def test_the_report_of_a_real_run_reads_as_what_the_box_did(box: Box, tmp_path: Path) -> None:
    """Also `tkbox logs`: the same run, live (-f) and afterwards, for a person."""
    follower = subprocess.Popen([*TKBOX, "logs", box.name, "-f"], env=box.stack.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    box.sh("cd /workspace && echo fixed > src/app.py && mkdir -p .github/workflows && "
           "echo 'on: push' > .github/workflows/evil.yml")
    assert box.sh("exit 3", check=False).returncode == 3
    box.sh("curl -sS -m 30 http://169.254.169.254/latest/meta-data/ >/dev/null", check=False)
    misplaced = box.stack.tk("exec", box.name, "--env", "X=1", "--", "true", check=False)
    assert misplaced.returncode == 2 and "options go before" in misplaced.stderr
    refused = box.stack.tk("exec", "--env", "LD_PRELOAD=/x.so", box.name, "--", "true",
                           check=False)
    assert refused.returncode == 5, refused.stderr
    # exit statuses a script can use (docs/exit-status.md)
    assert box.stack.tk("egress", "check", box.name, "169.254.169.254:80",
                        check=False).returncode == 5
    assert box.stack.tk("egress", "check", box.name, "unlisted.example:443",
                        check=False).returncode == 6  # would wait for a person
    box.stack.tk("stop", box.name)
    live, _ = follower.communicate(timeout=60)  # -f ends when the box has stopped
    assert follower.returncode == 0
    assert "exec      sh -c 'exit 3' → allowed" in live
    assert "exit      sh -c 'exit 3' → exit 3" in live
    assert "refused   169.254.169.254:80" in live
    assert "LD_PRELOAD" in live and "REFUSED" in live, live
    assert box.stack.tk("apply", box.name, check=False).returncode == 6  # held back
    after = box.stack.tk("logs", box.name).stdout
    assert "written   src/app.py" in after and live.splitlines()[0] == after.splitlines()[0]
    as_json = [json.loads(x) for x in box.stack.tk("logs", box.name, "--json").stdout.split("\n")
               if x]
    assert {e["op"] for e in as_json} >= {"open", "decide", "complete", "event"}
    bundle, trust = tmp_path / "job.tkb", tmp_path / "job.trust.json"
    box.stack.tk("export", box.name, "-o", str(bundle))

    page, shot = tmp_path / "report.html", tmp_path / "report.png"
    box.stack.tk("report", str(bundle), "--trust", str(trust), "-o", str(page))
    text, refs = browse(page, shot)
    assert refs == []  # nothing to load: no script, link, image or frame
    assert text.startswith("Integrity: VERIFIED.")
    assert "exit 3" in text and "sh -c 'exit 3'" in text
    assert "169.254.169.254:80" in text and "refused" in text
    assert "LD_PRELOAD" in text
    assert "src/app.py written" in text
    assert ".github/workflows/evil.yml held back" in text
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    data = bytearray(bundle.read_bytes())
    i = data.index(b"extra ") + 30
    data[i] ^= 1
    bad = tmp_path / "bad.tkb"
    bad.write_bytes(bytes(data))
    r = box.stack.tk("report", str(bad), "--trust", str(trust), "-o", str(tmp_path / "bad.html"),
                     check=False)
    assert r.returncode == 4 and "Integrity: FAILED." in r.stderr
    text, _ = browse(tmp_path / "bad.html", tmp_path / "bad.png")
    assert text.startswith("Integrity: FAILED.")
    assert "exit 3" not in text and "src/app.py" not in text
