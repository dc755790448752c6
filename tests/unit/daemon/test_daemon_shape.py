"""The daemon's own rules, read from its source: no state is compared as a string
outside the lifecycle table, and only the state record writes one. Each check is
shown to fail on the code it forbids. (Task ownership and cancellation hold for
the whole tree: tests/unit/test_shape.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tkbox.daemon
from tkbox.daemon.lifecycle import State

DAEMON = Path(tkbox.daemon.__file__).parent
SOURCES = sorted(DAEMON.glob("*.py"))
STATE_WORDS = {s.value for s in State}


def state_string_comparisons(source: str) -> list[int]:
    """Comparisons with a state's name as a string (`x == "running"`, `x in ("held",)`)."""
    def is_state_word(e: ast.expr) -> bool:
        if isinstance(e, ast.Constant):
            return e.value in STATE_WORDS
        if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
            return any(is_state_word(x) for x in e.elts)
        return False

    return [n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Compare)
            and any(is_state_word(e) for e in [n.left, *n.comparators])]


def state_writes(source: str) -> list[int]:
    """Assignments to a box's state (`x.state = ...`, `x._state = ...`)."""
    return [n.lineno for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
            and n.attr in ("state", "_state")]


@pytest.mark.parametrize("path", [p for p in SOURCES if p.name != "lifecycle.py"],
                         ids=lambda p: p.name)
def test_no_state_is_compared_as_a_string_outside_the_table(path: Path) -> None:
    assert state_string_comparisons(path.read_text()) == []


@pytest.mark.parametrize("path", [p for p in SOURCES if p.name != "boxstate.py"],
                         ids=lambda p: p.name)
def test_only_the_state_record_writes_a_state(path: Path) -> None:
    """`BoxState.move` (by the table) is the one writer of a box's state."""
    assert state_writes(path.read_text()) == []


def test_the_checks_catch_what_they_forbid() -> None:
    bad = """
async def f(box):
    if box.state == "running" or box.state in ("held", "stopping"):
        pass
    box.info._state = "failed"
"""
    assert state_string_comparisons(bad) == [3, 3]
    assert state_writes(bad) == [5]
