"""The concurrency rule of the whole tree, read from its source with `ast`.

Over every module of `src/tkbox` (recursive):

- **Every task has an owner.** A task is started by `TaskOwner.spawn`
  (`tkbox/_tasks.py`, whose life is its object's: `aclose` cancels and awaits
  what is left), or by `tg.create_task` inside the one `async with
  asyncio.TaskGroup() as tg:` block that owns it. Nothing else starts a task:
  no `create_task` on a loop or on `asyncio`, no `ensure_future`, no
  `asyncio.Task(...)`, no `run_coroutine_threadsafe`; a `TaskGroup` is made
  only as an `async with` item, and its name is used in that block only to
  call `create_task` (stored on `self` or passed on, it escapes its block);
  `asyncio.shield` guards a task that has an owner, never a coroutine (it
  would start one nobody owns); `asyncio.gather` is awaited with
  `return_exceptions=True`, the one form that ends every child before it
  returns (without it, the first error returns while the others still run).
- **No cancellation is swallowed.** No `suppress(BaseException)` or
  `suppress(CancelledError)`; a handler that catches a cancellation (bare
  `except:`, `BaseException`, `CancelledError`, alone or in a tuple) ends by
  raising again, or asks `being_cancelled()` whether the cancellation is its
  own before it takes one that is not (a task it awaited was cancelled by its
  owner); no `return`, `break` or `continue` in a `finally` (each drops
  whatever was being raised, a cancellation too). This holds wherever a
  cancellation can arrive: in an `async def`, and in a generator (a context
  manager's `yield` is where the `async with` body's cancellation is thrown);
  plain sync code (PID 1's last-resort handler after `asyncio.run`) sees one
  only as another task's outcome.

Over every unit test (`tests/unit`, recursive):

- **No test sleeps to let time pass.** No `asyncio.sleep`/`time.sleep` with a
  non-zero argument unless its line says why: `# sleep-ok: <reason>`. A test
  that needs time to pass moves a `tkbox._clock.FakeClock`; one that needs
  something *not* to happen waits for a positive signal that the code reached
  the point, then asserts. `sleep(0)` (one turn of the loop) is fine.

Each check is shown to fail on planted code (`test_the_checks_catch_*`), so an
empty answer means "none", not a checker that finds nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "tkbox"
UNIT = REPO / "tests" / "unit"
MODULES = sorted(SRC.rglob("*.py"))
UNIT_TESTS = sorted(UNIT.rglob("*.py"))

#: the one module that starts tasks itself: TaskOwner
TASK_OWNER = "tkbox/_tasks.py"
#: "module:function" -> why a cancellation handler there that neither raises nor asks
#: `being_cancelled()` is not a swallow
CANCEL_EXEMPT = {
    "tkbox/_threads.py:through": "waits out a thread that cannot be stopped, then hands "
                                 "the cancellation to its caller, which raises it",
}

CANCEL_NAMES = {"BaseException", "CancelledError"}
STARTERS = {"create_task", "ensure_future", "run_coroutine_threadsafe"}


def _name(e: ast.expr) -> str | None:
    """`x` for `x` and for `a.b.x`."""
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Attribute):
        return e.attr
    return None


def _is_taskgroup(e: ast.expr) -> bool:
    return isinstance(e, ast.Call) and _name(e.func) == "TaskGroup"


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}


def unowned_tasks(source: str) -> list[int]:
    """Lines that start a task, or hold a TaskGroup, outside the rule above."""
    tree = ast.parse(source)
    up = _parents(tree)
    # names bound by `async with asyncio.TaskGroup() as tg:` -> the With nodes
    groups: dict[ast.AST, set[str]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.AsyncWith):
            names = {i.optional_vars.id for i in n.items if _is_taskgroup(i.context_expr)
                     and isinstance(i.optional_vars, ast.Name)}
            if names:
                groups[n] = names

    def in_group(node: ast.AST, name: str) -> bool:
        at: ast.AST | None = node
        while at is not None:
            parent = up.get(at)
            if parent in groups and name in groups[parent] and at in parent.body:  # type: ignore[attr-defined]
                return True
            at = parent
        return False

    lines: list[int] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            called = _name(n.func)
            if called == "create_task" and isinstance(n.func, ast.Attribute) \
                    and isinstance(n.func.value, ast.Name) and in_group(n, n.func.value.id):
                continue
            if called in STARTERS or called == "Task":
                lines.append(n.lineno)
            elif called == "TaskGroup":
                parent = up.get(n)
                if not (isinstance(parent, ast.withitem)
                        and isinstance(up.get(parent), ast.AsyncWith)):
                    lines.append(n.lineno)
            elif called == "shield" and n.args and isinstance(n.args[0], ast.Call):
                lines.append(n.lineno)
            elif called == "gather" and not any(
                    k.arg == "return_exceptions" and isinstance(k.value, ast.Constant)
                    and k.value.value is True for k in n.keywords):
                lines.append(n.lineno)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            # a group's name used for anything but `tg.create_task(...)` escapes its block
            if any(n.id in names and _within(n, w, up) for w, names in groups.items()):
                parent = up.get(n)
                if not (isinstance(parent, ast.Attribute) and parent.attr == "create_task"
                        and isinstance(up.get(parent), ast.Call)):
                    lines.append(n.lineno)
    return sorted(lines)


def _within(node: ast.AST, ancestor: ast.AST, up: dict[ast.AST, ast.AST]) -> bool:
    at: ast.AST | None = node
    while at is not None:
        if at is ancestor:
            return True
        at = up.get(at)
    return False


def _catches_cancellation(t: ast.expr | None) -> bool:
    if t is None:
        return True
    if isinstance(t, ast.Tuple):
        return any(_catches_cancellation(e) for e in t.elts)
    return _name(t) in CANCEL_NAMES


def _may_be_cancelled(tree: ast.AST) -> set[ast.AST]:
    """The nodes where a cancellation can arrive: in an `async def`, and in a generator
    (a context manager's `yield` gets what the `async with` body raised). Plain sync
    code sees a cancellation only as another task's outcome, never its own."""
    out: set[ast.AST] = set()

    def own(f: ast.AST) -> list[ast.AST]:
        nodes, todo = [], list(ast.iter_child_nodes(f))
        while todo:
            c = todo.pop()
            nodes.append(c)
            if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                todo += ast.iter_child_nodes(c)
        return nodes

    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = own(f)
            if isinstance(f, ast.AsyncFunctionDef) \
                    or any(isinstance(c, (ast.Yield, ast.YieldFrom)) for c in body):
                out.update(body)
    return out


def swallowed_cancellations(source: str) -> list[int]:
    """Lines that take a cancellation and do not pass it on (see the module's text)."""
    tree = ast.parse(source)
    live = _may_be_cancelled(tree)
    lines: list[int] = []
    for n in ast.walk(tree):
        if n not in live:
            continue
        if isinstance(n, ast.Call) and _name(n.func) == "suppress" \
                and any(_name(a) in CANCEL_NAMES for a in n.args):
            lines.append(n.lineno)
        elif isinstance(n, ast.ExceptHandler) and _catches_cancellation(n.type):
            asks = any(isinstance(c, ast.Call) and _name(c.func) == "being_cancelled"
                       for c in ast.walk(n))
            if not isinstance(n.body[-1], ast.Raise) and not asks:
                lines.append(n.lineno)
        elif isinstance(n, (ast.Try, ast.TryStar)):
            lines += [s.lineno for s in _jumps_out(n.finalbody)]
    return sorted(set(lines))  # a try in a finally is walked twice


def _jumps_out(body: list[ast.stmt], in_loop: bool = False) -> list[ast.stmt]:
    """`return` in a finally body, and `break`/`continue` of a loop around the try
    (not of a loop inside the finally); nested functions are their own."""
    out: list[ast.stmt] = []
    for s in body:
        if isinstance(s, ast.Return) or isinstance(s, (ast.Break, ast.Continue)) and not in_loop:
            out.append(s)
        elif isinstance(s, (ast.For, ast.AsyncFor, ast.While)):
            out += _jumps_out(s.body, True) + _jumps_out(s.orelse, in_loop)
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(s, field, []):
                    inner = child.body if isinstance(child, (ast.ExceptHandler, ast.match_case)) \
                        else [child]
                    out += _jumps_out(inner, in_loop)
    return out


SLEEP_OK = re.compile(r"#\s*sleep-ok:\s*\S")


def sleeps(source: str) -> list[int]:
    """Lines of `asyncio.sleep(d)`/`time.sleep(d)` (or a bare imported `sleep(d)`)
    with `d` not a literal 0, not marked `# sleep-ok: <reason>`."""
    text = source.splitlines()
    tree = ast.parse(source)
    local = {n.name for n in ast.walk(tree)
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    lines: list[int] = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        real = (isinstance(f, ast.Attribute) and f.attr == "sleep"
                and isinstance(f.value, ast.Name) and f.value.id in ("asyncio", "time")) \
            or (isinstance(f, ast.Name) and f.id == "sleep" and "sleep" not in local)
        if not real:
            continue
        arg = n.args[0] if n.args else next((k.value for k in n.keywords), None)
        if isinstance(arg, ast.Constant) and arg.value == 0:
            continue
        if not any(SLEEP_OK.search(text[i - 1])
                   for i in range(n.lineno, (n.end_lineno or n.lineno) + 1)):
            lines.append(n.lineno)
    return sorted(lines)


def _rel(p: Path) -> str:
    return str(p.relative_to(SRC.parent)) if p.is_relative_to(SRC) else str(p.relative_to(REPO))


def _function_at(tree: ast.AST, line: int) -> str:
    best = ""
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and n.lineno <= line <= (n.end_lineno or n.lineno):
            best = n.name  # ast.walk is breadth-first: the innermost comes last
    return best


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_every_task_has_an_owner(path: Path) -> None:
    rel = _rel(path)
    if rel == TASK_OWNER:
        return
    found = unowned_tasks(path.read_text())
    if found:
        raise AssertionError(f"{rel}:{found}: start it with a TaskOwner "
                             "(or inside one `async with asyncio.TaskGroup()` block)")


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_no_cancellation_is_swallowed(path: Path) -> None:
    rel = _rel(path)
    source = path.read_text()
    tree = ast.parse(source)
    found = [n for n in swallowed_cancellations(source)
             if f"{rel}:{_function_at(tree, n)}" not in CANCEL_EXEMPT]
    if found:
        raise AssertionError(f"{rel}:{found}: a cancellation is taken and not passed on")


@pytest.mark.parametrize("path", UNIT_TESTS, ids=_rel)
def test_no_unit_test_sleeps_for_time_to_pass(path: Path) -> None:
    rel = _rel(path)
    found = sleeps(path.read_text())
    if found:
        raise AssertionError(f"{rel}:{found}: move a FakeClock, or wait for a signal "
                             "(or say why: `# sleep-ok: <reason>`)")


def test_the_exemptions_are_still_needed() -> None:
    """An exemption whose code is gone or fixed is dropped, not kept for later."""
    for key in CANCEL_EXEMPT:
        module, function = key.split(":")
        source = (SRC.parent / module).read_text()
        tree = ast.parse(source)
        assert any(_function_at(tree, n) == function for n in swallowed_cancellations(source)), key


def test_the_checks_catch_hand_tracked_tasks() -> None:
    bad = """
import asyncio
async def f(t, loop, self):
    asyncio.ensure_future(t)
    asyncio.get_running_loop().create_task(t)
    asyncio.create_task(t)
    self.tasks.add(loop.create_task(t))
    asyncio.Task(t)
    asyncio.run_coroutine_threadsafe(t, loop)
    tg = asyncio.TaskGroup()
    async with asyncio.TaskGroup() as tg:
        self.tg = tg
        tg.create_task(t)
    tg.create_task(t)
    await asyncio.shield(t())
    await asyncio.gather(t(), t())
    await asyncio.gather(t(), t(), return_exceptions=False)
"""
    assert unowned_tasks(bad) == [4, 5, 6, 7, 8, 9, 10, 12, 14, 15, 16, 17]
    ok = """
import asyncio
async def f(owner, t, task):
    owner.spawn(t())
    async with asyncio.TaskGroup() as tg:
        tg.create_task(t())
        async with asyncio.timeout(1):
            w = tg.create_task(t())
        def later() -> None:
            tg.create_task(t())
    await asyncio.shield(task)
    await asyncio.gather(t(), t(), return_exceptions=True)
    x: asyncio.Task[None] | None = None
"""
    assert unowned_tasks(ok) == []


def test_the_checks_catch_swallowed_cancellations() -> None:
    bad = """
import asyncio, contextlib
async def f(t):
    with contextlib.suppress(BaseException):
        await t
    with contextlib.suppress(asyncio.CancelledError):
        await t
    try:
        await t
    except BaseException:
        pass
    try:
        await t
    except:
        log()
    try:
        await t
    except (OSError, asyncio.CancelledError):
        pass
    try:
        await t
    except asyncio.CancelledError:
        raise
    finally:
        return 1
    while True:
        try:
            await t
        finally:
            continue
"""
    assert swallowed_cancellations(bad) == [4, 6, 10, 14, 18, 25, 30]
    in_a_context_manager = """
import contextlib
@contextlib.contextmanager
def held(lock):
    try:
        yield lock
    except BaseException:
        pass
def main():
    try:
        asyncio.run(amain())
    except BaseException:
        power_off()
"""
    assert swallowed_cancellations(in_a_context_manager) == [7]
    ok = """
import asyncio
async def f(box, task):
    try:
        await box
    except BaseException:
        cleanup()
        raise
    try:
        await task
    except asyncio.CancelledError:
        if being_cancelled():
            raise
        error = "ended with its box"
    except Exception:
        pass
    try:
        await box
    finally:
        for x in box:
            if x:
                break
        def g():
            return 2
"""
    assert swallowed_cancellations(ok) == []


def test_the_checks_catch_sleeping_tests() -> None:
    bad = """
import asyncio, time
from asyncio import sleep
async def test_x(delay):
    await asyncio.sleep(0.01)
    time.sleep(1)
    await sleep(delay)
    await asyncio.sleep(
        0.5)
    await asyncio.sleep(0.1)  # sleep-ok:
"""
    assert sleeps(bad) == [5, 6, 7, 8, 10]
    ok = """
import asyncio
async def test_x(clock):
    await asyncio.sleep(0)
    await asyncio.sleep(0.0)
    await clock.sleep(10)
    await asyncio.sleep(0.2)  # sleep-ok: the child process must see real time pass
    script = "import time; time.sleep(60)"
"""
    assert sleeps(ok) == []
