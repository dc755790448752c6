"""The daemon's own rules, read from its source: every task has an owner, no
cancellation is swallowed, and no state is compared as a string outside the
lifecycle table. Each check is shown to fail on the code it forbids."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tkbox.daemon
from tkbox.daemon.lifecycle import State

DAEMON = Path(tkbox.daemon.__file__).parent
SOURCES = sorted(DAEMON.glob("*.py"))
STATE_WORDS = {s.value for s in State}
#: where a task may be started outside a TaskOwner, and why
OWNED_ELSEWHERE = {
    "tasks.py": "TaskOwner itself",
}


def _calls(tree: ast.AST, names: set[str]) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr in names]


def unowned_tasks(source: str) -> list[int]:
    """Lines that start a task by hand (create_task, ensure_future)."""
    return _calls(ast.parse(source), {"create_task", "ensure_future"})


def swallowed_cancellations(source: str) -> list[int]:
    """`suppress(BaseException)`, and `except BaseException` (or bare `except:`) whose
    handler does not end by raising again."""
    tree = ast.parse(source)
    lines = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "suppress"
             and any(isinstance(a, ast.Name) and a.id in ("BaseException", "CancelledError")
                     or isinstance(a, ast.Attribute) and a.attr == "CancelledError"
                     for a in n.args)]
    for n in ast.walk(tree):
        if isinstance(n, ast.ExceptHandler):
            broad = n.type is None or isinstance(n.type, ast.Name) and n.type.id == "BaseException"
            if broad and not isinstance(n.body[-1], ast.Raise):
                lines.append(n.lineno)
    return lines


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


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_every_task_has_an_owner(path: Path) -> None:
    if path.name in OWNED_ELSEWHERE:
        return
    assert unowned_tasks(path.read_text()) == [], f"{path.name}: start it with a TaskOwner"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_cancellation_is_swallowed(path: Path) -> None:
    assert swallowed_cancellations(path.read_text()) == []


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
import asyncio, contextlib
async def f(box, t):
    asyncio.ensure_future(t)
    asyncio.get_running_loop().create_task(t)
    with contextlib.suppress(BaseException):
        await t
    try:
        await t
    except BaseException:
        pass
    if box.state == "running" or box.state in ("held", "stopping"):
        pass
    box.info._state = "failed"
"""
    assert unowned_tasks(bad) == [4, 5]
    assert swallowed_cancellations(bad) == [6, 10]
    assert state_string_comparisons(bad) == [12, 12]
    assert state_writes(bad) == [14]
    ok = """
async def f(box):
    try:
        await box
    except BaseException:
        cleanup()
        raise
"""
    assert swallowed_cancellations(ok) == []
