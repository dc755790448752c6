"""A module over `LIMIT` lines says, in one sentence, why it is one idea.

Long modules are where two ideas hide in one file (the review of issue 36 found
the mux's core and shell, QEMU's command line and process). A module past the
limit either splits by idea or carries, in its docstring, a line starting
`One idea:` followed by the sentence that says what holds it together, for a
reader to judge. The sentence must say something: at least `MIN_WORDS` words.

`PENDING` lists the modules over the limit that another helper of issue 36 owns
this round (named beside each): the integrator drops each entry once its owner
has split the module or given it its sentence; the test fails on an entry that
is no longer needed, so the list cannot outlive its reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
LIMIT = 700
MIN_WORDS = 8
MARK = re.compile(r"^One idea: (.+?)(?:\n\n|\Z)", re.M | re.S)

PENDING = {
}


def reason(path: Path) -> str | None:
    """The module's `One idea:` sentence, or None."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    m = MARK.search(doc)
    return " ".join(m.group(1).split()) if m else None


def oversized(src: Path = SRC) -> dict[str, str]:
    """Every module over LIMIT lines without a `One idea:` sentence of MIN_WORDS words,
    with what is wrong."""
    bad: dict[str, str] = {}
    for p in sorted(src.rglob("*.py")):
        lines = len(p.read_text().splitlines())
        if lines <= LIMIT:
            continue
        why = reason(p)
        if why is None:
            bad[p.relative_to(src).as_posix()] = f"{lines} lines and no 'One idea:' line"
        elif len(why.split()) < MIN_WORDS:
            bad[p.relative_to(src).as_posix()] = f"{lines} lines; 'One idea: {why}' says too little"
    return bad


def test_every_long_module_says_why_it_is_one_idea() -> None:
    bad = {m: why for m, why in oversized().items() if m not in PENDING}
    assert bad == {}, "split each by idea, or say in its docstring 'One idea: ...'"


def test_every_pending_module_is_still_pending() -> None:
    bad = oversized()
    done = {f"{m} ({owner})" for m, owner in PENDING.items() if m not in bad}
    assert done == set(), "no longer over the limit without a reason: drop from PENDING"


def test_a_long_module_without_its_sentence_is_found(tmp_path: Path) -> None:
    body = "x = 1\n" * LIMIT
    (tmp_path / "short.py").write_text('"""Short."""\n' + "x = 1\n" * (LIMIT - 1))
    (tmp_path / "silent.py").write_text('"""Long."""\n' + body)
    (tmp_path / "terse.py").write_text('"""Long.\n\nOne idea: it is.\n"""\n' + body)
    (tmp_path / "said.py").write_text(
        '"""Long.\n\nOne idea: the reader and the writer of one format share its\n'
        'private representation.\n\nMore.\n"""\n' + body)
    (tmp_path / "elsewhere.py").write_text(
        '"""Long."""\n# One idea: a comment is not the docstring, whatever it says here\n'
        + body)
    assert oversized(tmp_path) == {
        "elsewhere.py": f"{LIMIT + 2} lines and no 'One idea:' line",
        "silent.py": f"{LIMIT + 1} lines and no 'One idea:' line",
        "terse.py": f"{LIMIT + 4} lines; 'One idea: it is.' says too little",
    }
    assert reason(tmp_path / "said.py") == ("the reader and the writer of one format share "
                                            "its private representation.")
