"""Every exit status a `tkbox` command can end with is in docs/exit-status.md's table.

The statuses are read from the source with `ast`, not listed here: every
`typer.Exit(…)`, `sys.exit(…)`, `SystemExit(…)`, `os._exit(…)`, each error class's
`exit_code` (what `tkbox._exit.exit_with` exits with), and each `EXIT_…` constant.
An exit's argument counts with every integer it holds (`{"ask": 6}.get(v, 5)`), the
constants and `exit_code`s it names, and, when it is a variable or a call of a
function of the tree, the integers assigned to that variable or returned by that
function. A status passed through from elsewhere (a box's command's own status) has
no integer in the source and is described in the page's prose.

`guest/` is left out: it runs in the VM as its init, not as a `tkbox` command.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "src" / "tkbox"
PAGE = REPO / "docs" / "exit-status.md"
EXITS = {"Exit", "exit", "SystemExit", "_exit"}


def _ints(node: ast.AST) -> set[int]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
            and isinstance(n.value, int) and not isinstance(n.value, bool)}


def _name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else \
        func.id if isinstance(func, ast.Name) else ""


def _exit_arg(call: ast.Call) -> ast.AST | None:
    if _name(call.func) not in EXITS:
        return None
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg == "code"), None)


def statuses(src: Path = SRC) -> dict[int, list[str]]:
    """Each status -> where it comes from (`path:line`)."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(src.rglob("*.py"))
             if "guest" not in p.relative_to(src).parts}
    found: dict[int, list[str]] = {}

    def add(values: set[int], path: Path, node: ast.AST) -> None:
        for v in values:
            found.setdefault(v, []).append(
                f"{path.relative_to(src.parent)}:{getattr(node, 'lineno', 0)}")

    functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
    local: dict[Path, dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]] = {}
    constants: dict[str, set[int]] = {}
    for path, tree in trees.items():
        local[path] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.setdefault(node.name, []).append(node)
                local[path].setdefault(node.name, []).append(node)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                    t := node.targets[0], ast.Name):
                if t.id == "exit_code" or t.id.startswith("EXIT_"):
                    add(_ints(node.value), path, node)  # the error-class map; constants
                    constants[t.id] = _ints(node.value)

    def returned(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[int]:
        names = {r.value.id for r in ast.walk(fn) if isinstance(r, ast.Return)
                 and isinstance(r.value, ast.Name)}
        out = set().union(*(_ints(r.value) for r in ast.walk(fn)
                            if isinstance(r, ast.Return) and r.value is not None))
        return out | assigned(fn, names)

    def assigned(scope: ast.AST, names: set[str]) -> set[int]:
        return set().union(*(_ints(a.value) for a in ast.walk(scope)
                             if isinstance(a, ast.Assign | ast.AnnAssign) and a.value is not None
                             and any(isinstance(t, ast.Name) and t.id in names
                                     for t in (a.targets if isinstance(a, ast.Assign)
                                               else [a.target]))))

    def resolve(path: Path, name: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        """The functions a call by this name may reach: its own module's, else any."""
        return local[path].get(name) or functions.get(name, [])

    def values_of(arg: ast.AST, path: Path, scope: ast.AST | None) -> set[int]:
        out: set[int] = set()
        todo = [arg]
        while todo:
            n = todo.pop()
            if isinstance(n, ast.Constant) and isinstance(n.value, int) \
                    and not isinstance(n.value, bool):
                out.add(n.value)
            elif isinstance(n, ast.Name):
                out |= constants.get(n.id, set())
                if scope is not None:
                    out |= assigned(scope, {n.id})
            elif isinstance(n, ast.Call) and (fns := resolve(path, _name(n.func))):
                for fn in fns:  # what the function returns, not what it is given
                    out |= returned(fn)
                continue
            todo.extend(ast.iter_child_nodes(n))
        return out

    for path, tree in trees.items():
        owner: dict[ast.AST, ast.AST] = {}  # each call -> its innermost function
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                for n in ast.walk(fn):
                    owner[n] = fn  # walked outer first: an inner function overwrites
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and (arg := _exit_arg(call)) is not None:
                add(values_of(arg, path, owner.get(call)), path, call)
    return found


def documented(page: Path = PAGE) -> set[int]:
    """The statuses in the page's table: rows `| N | meaning | … |`."""
    return {int(m) for m in re.findall(r"^\|\s*(\d+)\s*\|", page.read_text(), re.M)}


def test_every_status_a_command_returns_is_in_the_table() -> None:
    found = statuses()
    missing = {s: found[s] for s in sorted(set(found) - documented())}
    assert not missing, f"exit statuses not in docs/exit-status.md: {missing}"


def test_the_table_lists_no_status_nothing_returns() -> None:
    assert documented() - set(statuses()) == set()


def test_the_reader_finds_statuses_of_every_shape(tmp_path: Path) -> None:
    """Planted: each way a status is written is found, so a new one cannot hide."""
    pkg = tmp_path / "tkbox"
    (pkg / "guest").mkdir(parents=True)
    (pkg / "errors.py").write_text("class E(Exception):\n    exit_code = 11\n")
    (pkg / "cmd.py").write_text(
        "import os, sys, typer\n"
        "EXIT_LATER = 12\n"
        "def status(x):\n    if x:\n        return 13\n    code = 14\n    return code\n"
        "def a():\n    raise typer.Exit(code=15)\n"
        "def b():\n    sys.exit(16)\n"
        "def c():\n    raise SystemExit({'x': 17}.get('y', EXIT_LATER))\n"
        "def d():\n    os._exit(18)\n"
        "def e():\n    raise typer.Exit(status(1))\n"
        "def f(ok):\n    n = 19 if ok else 20\n    raise typer.Exit(n)\n")
    (pkg / "guest" / "init.py").write_text("import sys\nsys.exit(99)\n")
    assert set(statuses(pkg)) == set(range(11, 21))
    page = tmp_path / "page.md"
    page.write_text("| status | meaning |\n| --- | --- |\n| 0 | ok |\n| 2 | bad |\n")
    assert documented(page) == {0, 2}
