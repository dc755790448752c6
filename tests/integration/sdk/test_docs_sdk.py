"""Every Python example in docs/sdk.md runs, as written, against the real API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sdk_daemon import SdkDaemon

DOC = Path(__file__).resolve().parents[3] / "docs" / "sdk.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
# what each example must print, in the page's order (the fake guest echoes argv)
SHOWS = ["['hello.txt']", "exit status 3", "refused: secret KEY", "ExecResult(status=0",
         "(True, ['app.py'])", "no box named 'no-such-box'"]


def test_the_page_has_examples():
    assert len(EXAMPLES) == len(SHOWS)


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_doc_example_runs(index: int, daemon: SdkDaemon, ws: Path,
                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("TKBOX_RUNTIME", str(daemon.socket.parent))
    monkeypatch.chdir(ws)
    exec(compile(EXAMPLES[index], f"docs/sdk.md example {index}", "exec"), {})
    out = capsys.readouterr().out
    assert SHOWS[index] in out
