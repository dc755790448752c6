"""The import graph of `src/tkbox`: no cycles, and nothing runs up the layers.

The layers are the fenced ```layers block in docs/design.md (§10), read here,
so the drawing and the rule cannot drift apart. Imports are read from the
source with `ast`, so imports behind `if TYPE_CHECKING:` and inside functions
count as much as those at the top: a cycle hidden from the interpreter is still
a cycle for a reader.

Two rules:

- **No cycle** between modules, nor between packages (at every depth: `doors`
  and `daemon`, `doors.network` and `doors.secrets`).
- **Down only**: a module in a package on one line of the drawing imports only
  its own package or packages on lines below; packages on the same line do not
  import each other. `guest` (it runs in the VM) imports only `protocol`, `_tasks` and `errors`, and
  `verify` only `formats` and `errors`.

`from tkbox import __version__` (the root package) is allowed anywhere; the
root's own lazy `tkbox.Client` re-export of the SDK is the one edge out of it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
ONLY = {"guest": {"protocol", "_tasks", "errors"}, "verify": {"formats", "errors"}}
ROOT_MAY_IMPORT = {"tkbox.sdk"}

Graph = Mapping[str, set[str]]


def modules(src: Path = SRC) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for p in sorted((src / "tkbox").rglob("*.py")):
        parts = list(p.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def graph(mods: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the tkbox modules it imports (a submodule, not its package,
    when `from package import submodule`)."""
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    if path.name != "__init__.py":
                        base = base[:-1]
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    deps.add(sub if sub in mods else target)
        edges[name] = {d for d in deps if d in mods and d != name}
    return edges


def cycles(edges: Graph) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in edges:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp: list[str] = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def collapse(edges: Graph, depth: int) -> dict[str, set[str]]:
    """The graph between packages `depth` names below `tkbox`."""
    def at(m: str) -> str:
        return ".".join(m.split(".")[: depth + 1])
    out: dict[str, set[str]] = {}
    for m, deps in edges.items():
        if m.count(".") < depth:
            continue  # a module above this depth is no package of it
        out.setdefault(at(m), set()).update(
            at(d) for d in deps if d.count(".") >= depth and at(d) != at(m))
    return out


def layers(design: Path = REPO / "docs" / "design.md") -> list[set[str]]:
    """The ```layers block, top line first."""
    m = re.search(r"^```layers\n(.*?)^```", design.read_text(), re.M | re.S)
    assert m, "docs/design.md has no ```layers block"
    return [set(line.split()) for line in m.group(1).splitlines() if line.strip()]


def violations(edges: Graph, drawn: list[set[str]]) -> list[str]:
    level = {pkg: len(drawn) - i for i, line in enumerate(drawn) for pkg in line}
    bad: list[str] = []
    for m, deps in sorted(edges.items()):
        if m == "tkbox":
            bad += [f"tkbox -> {d} (the root package may import only {sorted(ROOT_MAY_IMPORT)})"
                    for d in sorted(deps - ROOT_MAY_IMPORT)]
            continue
        src = m.split(".")[1]
        if src not in level:
            bad.append(f"{m}: package {src!r} is not drawn in docs/design.md's layers")
            continue
        for d in sorted(deps):
            if d == "tkbox":
                continue
            dst = d.split(".")[1]
            if dst == src:
                continue
            if src in ONLY and dst not in ONLY[src]:
                bad.append(f"{m} -> {d} ({src} imports only {sorted(ONLY[src])})")
            elif dst not in level:
                bad.append(f"{m} -> {d}: package {dst!r} is not drawn in the layers")
            elif level[dst] >= level[src]:
                bad.append(f"{m} -> {d} runs up or across the layers ({src} -> {dst})")
    return bad


def test_no_module_imports_another_in_a_cycle() -> None:
    assert cycles(graph(modules())) == []


@pytest.mark.parametrize("depth", [1, 2])
def test_no_package_imports_another_in_a_cycle(depth: int) -> None:
    assert cycles(collapse(graph(modules()), depth)) == []


def test_every_import_runs_down_the_layers_drawn_in_the_design() -> None:
    assert violations(graph(modules()), layers()) == []


def test_every_package_is_drawn() -> None:
    drawn = set().union(*layers())
    packages = {m.split(".")[1] for m in modules() if m != "tkbox"}
    assert packages <= drawn, f"not drawn in docs/design.md: {sorted(packages - drawn)}"


# The checks themselves, on planted graphs, so that an empty answer above means
# "no cycle" and not "a checker that finds nothing".

def test_a_cycle_hidden_behind_type_checking_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "tkbox" / "a"
    pkg.mkdir(parents=True)
    (tmp_path / "tkbox" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "x.py").write_text("from tkbox.a import y\n")
    (pkg / "y.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from tkbox.a.x import thing\n")
    (pkg / "z.py").write_text("def f():\n    from . import y\n")
    edges = graph(modules(tmp_path))
    assert edges["tkbox.a.z"] == {"tkbox.a.y"}
    assert cycles(edges) == [["tkbox.a.x", "tkbox.a.y"]]


def test_a_package_cycle_and_an_upward_import_are_found() -> None:
    edges = {"tkbox.low.a": {"tkbox.high.b"}, "tkbox.high.b": {"tkbox.low.c"},
             "tkbox.low.c": set(), "tkbox.guest.g": {"tkbox.low.c"}}
    assert cycles(edges) == []
    assert cycles(collapse(edges, 1)) == [["tkbox.high", "tkbox.low"]]
    bad = violations(edges, [{"high"}, {"low", "guest"}])
    assert bad == ["tkbox.guest.g -> tkbox.low.c "
                   "(guest imports only ['_tasks', 'errors', 'protocol'])",
                   "tkbox.low.a -> tkbox.high.b runs up or across the layers (low -> high)"]
