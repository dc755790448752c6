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

And the **pure cores** (the ```pure block of docs/design.md) import no I/O, nor
does anything of tkbox's they import: see the section below.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
ONLY = {"guest": {"protocol", "_tasks", "errors"}, "verify": {"formats", "errors", "_exit"}}
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
            deps |= imported(name, path, node, mods)
        edges[name] = {d for d in deps if d in mods and d != name}
    return edges


def imported(name: str, path: Path, node: ast.AST, mods: Mapping[str, Path]) -> set[str]:
    """The tkbox modules one import statement of module `name` names."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in mods}
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.level:
        base = name.split(".")
        if path.name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    deps: set[str] = set()
    for a in node.names:
        sub = f"{target}.{a.name}"
        deps.add(sub if sub in mods else target)
    return {d for d in deps if d in mods}


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


# ---- pure cores -------------------------------------------------------------
#
# The modules listed in docs/design.md's ```pure block are sans-IO: given the
# same inputs they do the same thing, and they reach no file, socket, process,
# thread, event loop, clock, entropy or terminal. The rule, checked on the
# source with `ast` over the module and every tkbox module it imports at run
# time (transitively; `if TYPE_CHECKING:` imports never run and are not
# followed; imports inside functions are):
#
# - every import from outside tkbox is of a module in `PURE_IMPORTS`; one in
#   `IO_IMPORTS` is the failure this check is for, and one in neither is a
#   failure too (decide which set it belongs in, so the sets cannot go stale);
# - `pathlib` only for its pure classes (`PurePath`, ...): `Path` may be named
#   in annotations (under `TYPE_CHECKING`), never imported to run;
# - no call of a builtin that does I/O or imports by name (`FORBIDDEN_CALLS`),
#   nor of a method named as a `Path` method that reaches the file system
#   (`PATH_IO_METHODS`: a core handed a `Path` must not read it). By name, so
#   deliberately coarse; `replace`, `rename` and `group` are left out (`str`
#   and `re` use them).
#
# A package's `__init__` that Python runs on the way to a module is not counted:
# `doors/changes`, `doors/network` and `doors/secrets` re-export their shells
# there, so importing a core of theirs loads its package's shell, though the
# core's own code reaches none of it.

IO_IMPORTS = frozenset({
    "asyncio", "socket", "ssl", "select", "selectors", "os", "posix", "io", "shutil",
    "tempfile", "glob", "fcntl", "mmap", "ctypes", "resource", "pwd", "grp", "termios",
    "subprocess", "multiprocessing", "signal", "pty", "threading", "_thread",
    "concurrent", "queue", "sqlite3", "time", "secrets", "random", "logging", "sys",
    "importlib", "http", "urllib.request", "webbrowser", "getpass", "atexit", "gc",
    "contextvars", "httpx", "psycopg", "rich", "typer", "click", "qemu", "pip",
    "cedarpy",
})
PURE_IMPORTS = frozenset({
    "__future__", "abc", "base64", "binascii", "bisect", "codecs", "collections",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib", "enum", "errno",
    "fnmatch", "functools", "hashlib", "heapq", "hmac", "html", "ipaddress",
    "itertools", "json", "math", "operator", "re", "shlex", "stat", "string", "struct",
    "textwrap", "types", "typing", "unicodedata", "urllib.parse", "zlib",
    "cryptography", "h11", "h2", "hyperframe", "idna", "msgpack",
})
PURE_PATHLIB = frozenset({"PurePath", "PurePosixPath", "PureWindowsPath"})
FORBIDDEN_CALLS = frozenset({"open", "print", "input", "breakpoint", "__import__",
                             "exec", "eval", "compile"})
PATH_IO_METHODS = frozenset({
    "read_text", "read_bytes", "write_text", "write_bytes", "open", "iterdir", "glob",
    "rglob", "walk", "exists", "is_file", "is_dir", "is_symlink", "stat", "lstat",
    "mkdir", "rmdir", "unlink", "touch", "chmod", "lchmod", "symlink_to",
    "hardlink_to", "readlink", "resolve", "absolute", "expanduser", "samefile",
    "cwd", "home",
})


def pure_list(design: Path = REPO / "docs" / "design.md") -> list[str]:
    """The ```pure block: one tkbox module a line."""
    m = re.search(r"^```pure\n(.*?)^```", design.read_text(), re.M | re.S)
    assert m, "docs/design.md has no ```pure block"
    return [line.split()[0] for line in m.group(1).splitlines() if line.strip()]


def _runtime_nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:` (which never runs)."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and (
                    (isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING")
                    or (isinstance(child.test, ast.Attribute)
                        and child.test.attr == "TYPE_CHECKING")):
                todo += child.orelse
                continue
            todo.append(child)


def _outside(name: str) -> str:
    """The entry of IO_IMPORTS or PURE_IMPORTS an import of `name` falls under."""
    for key in (".".join(name.split(".")[:2]), name.split(".")[0]):
        if key in IO_IMPORTS or key in PURE_IMPORTS:
            return key
    return name


def _impure_lines(name: str, path: Path, mods: Mapping[str, Path]) -> tuple[list[str], set[str]]:
    """What in module `name` itself breaks the rule, and the tkbox modules it runs."""
    bad: list[str] = []
    deps: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "pathlib":
                bad += [f"{name}:{node.lineno} imports pathlib.{a.name} (only "
                        f"{sorted(PURE_PATHLIB)} run in a pure core)"
                        for a in node.names if a.name not in PURE_PATHLIB]
            else:
                names = [node.module]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in FORBIDDEN_CALLS):
            bad.append(f"{name}:{node.lineno} calls {node.func.id}()")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in PATH_IO_METHODS):
            bad.append(f"{name}:{node.lineno} calls .{node.func.attr}() (a file-system method)")
        for n in names:
            if n == "tkbox" or n.startswith("tkbox."):
                continue
            key = _outside(n)
            if key == "pathlib" or key in IO_IMPORTS:
                bad.append(f"{name}:{getattr(node, 'lineno', 0)} imports {n} (I/O)")
            elif key not in PURE_IMPORTS:
                bad.append(f"{name}:{getattr(node, 'lineno', 0)} imports {n}, in neither "
                           "IO_IMPORTS nor PURE_IMPORTS: say which it is")
        deps |= imported(name, path, node, mods)
    return bad, {d for d in deps if d != name and d != "tkbox"}


def impurities(roots: Iterable[str], mods: Mapping[str, Path]) -> list[str]:
    """Every break of the rule in `roots` and what they import from tkbox, with the
    chain of imports that reaches it."""
    bad: list[str] = []
    for root in roots:
        if root not in mods:
            bad.append(f"{root}: listed as pure, but there is no such module")
            continue
        via = {root: [root]}
        todo = [root]
        while todo:
            m = todo.pop()
            found, deps = _impure_lines(m, mods[m], mods)
            chain = " -> ".join(via[m])
            bad += [f"{root}: {f}" + (f" (via {chain})" if m != root else "") for f in found]
            for d in sorted(deps - via.keys()):
                via[d] = via[m] + [d]
                todo.append(d)
    return sorted(set(bad))


def test_every_pure_core_imports_no_io() -> None:
    listed = pure_list()
    assert listed, "the ```pure block lists no module"
    assert impurities(listed, modules()) == []


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


def test_an_io_import_in_a_pure_core_or_below_it_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "tkbox" / "a"
    pkg.mkdir(parents=True)
    (tmp_path / "tkbox" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text("import struct\nfrom tkbox.a import helper\n"
                                 "from typing import TYPE_CHECKING\n"
                                 "if TYPE_CHECKING:\n    from pathlib import Path\n"
                                 "    from tkbox.a import shell\n")
    (pkg / "helper.py").write_text("def f(p):\n    import asyncio.subprocess\n"
                                   "    return open('x'), p.read_text()\n")
    (pkg / "shell.py").write_text("import socket\n")
    (pkg / "paths.py").write_text("from pathlib import Path, PurePosixPath\nimport weird\n")
    mods = modules(tmp_path)
    assert impurities(["tkbox.a.core", "tkbox.a.paths", "tkbox.a.gone"], mods) == [
        "tkbox.a.core: tkbox.a.helper:2 imports asyncio.subprocess (I/O) "
        "(via tkbox.a.core -> tkbox.a.helper)",
        "tkbox.a.core: tkbox.a.helper:3 calls .read_text() (a file-system method) "
        "(via tkbox.a.core -> tkbox.a.helper)",
        "tkbox.a.core: tkbox.a.helper:3 calls open() (via tkbox.a.core -> tkbox.a.helper)",
        "tkbox.a.gone: listed as pure, but there is no such module",
        "tkbox.a.paths: tkbox.a.paths:1 imports pathlib.Path (only "
        "['PurePath', 'PurePosixPath', 'PureWindowsPath'] run in a pure core)",
        "tkbox.a.paths: tkbox.a.paths:2 imports weird, in neither IO_IMPORTS nor "
        "PURE_IMPORTS: say which it is",
    ]
    (pkg / "helper.py").write_text("import json\n")
    assert impurities(["tkbox.a.core"], mods) == []
