"""No two exception classes in `src/tkbox` share a name.

Two classes of one name (there were two `OriginError`s: the API mapped one to 502 and
the other fell through) make `except X` and a reader's "X is raised here" mean two
things. The classes are read from the source with `ast`, private ones and ones nested
in a function included; a class is an exception when one of its bases is a built-in
exception, another exception class of the tree, or a third-party class that imports as
an exception (`httpx.HTTPError`, `h2.exceptions.ProtocolError`).
"""

from __future__ import annotations

import ast
import builtins
import importlib
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "tkbox"
BUILTIN = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
           and issubclass(getattr(builtins, n), BaseException)}


def _imported(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted path it was imported as (`import a.b as c`, `from a import b`)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                    a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _foreign_exception(dotted: str) -> bool:
    """A class outside tkbox, by its import path: is it an exception?"""
    if dotted.startswith("tkbox.") or "." not in dotted:
        return False
    module, _, attr = dotted.rpartition(".")
    parts = attr.split(".")
    while True:
        try:
            obj: object = importlib.import_module(module)
            break
        except ImportError:
            if "." not in module:
                return False
            module, _, head = module.rpartition(".")
            parts.insert(0, head)
    for p in parts:
        obj = getattr(obj, p, None)
    return isinstance(obj, type) and issubclass(obj, BaseException)


def exception_classes(src: Path = SRC) -> dict[str, list[str]]:
    """Exception class name -> where each class of that name is defined (`path:line`)."""
    defs: list[tuple[str, str, list[str]]] = []  # (name, where, bases as dotted paths)
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        imported = _imported(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = []
            for b in node.bases:
                text = ast.unparse(b)
                head, _, rest = text.partition(".")
                bases.append(imported.get(head, head) + (f".{rest}" if rest else ""))
            defs.append((node.name, f"{path.relative_to(src.parent)}:{node.lineno}", bases))
    ours = {name for name, _, _ in defs}
    exceptions: set[int] = set()  # indices into `defs`: a name may be a class twice
    changed = True
    while changed:  # to a fixed point: a subclass of a subclass of an exception
        changed = False
        named = {defs[i][0] for i in exceptions}
        for i, (_, _, bases) in enumerate(defs):
            if i in exceptions:
                continue
            for b in bases:
                last = b.rpartition(".")[2]
                if (b in BUILTIN or last in named and (b.startswith("tkbox.") or b == last)
                        or (last not in ours and _foreign_exception(b))):
                    exceptions.add(i)
                    changed = True
                    break
    where: dict[str, list[str]] = defaultdict(list)
    for i in sorted(exceptions):
        where[defs[i][0]].append(defs[i][1])
    return dict(where)


def shared(src: Path = SRC) -> dict[str, list[str]]:
    return {n: w for n, w in exception_classes(src).items() if len(w) > 1}


def test_no_two_exception_classes_share_a_name() -> None:
    found = exception_classes()
    assert {"TkboxError", "OriginError", "FormatError", "WireError"} <= set(found)
    assert shared() == {}, shared()


def test_the_check_finds_a_planted_pair(tmp_path: Path) -> None:
    """Two `BoxGone`s (one through a subclass of a tree exception, one a third-party
    exception's subclass, one nested in a function) are found; a plain class of the
    same name as an exception is not an exception."""
    pkg = tmp_path / "tkbox"
    (pkg / "a").mkdir(parents=True)
    (pkg / "errors.py").write_text("class TkboxError(Exception):\n    pass\n"
                                   "class UserError(TkboxError):\n    pass\n")
    (pkg / "a" / "one.py").write_text("from tkbox.errors import UserError\n\n"
                                      "class BoxGone(UserError):\n    pass\n"
                                      "class _Stopped:\n    pass\n")
    (pkg / "a" / "two.py").write_text("import httpx\n\ndef f():\n"
                                      "    class BoxGone(httpx.HTTPError):\n        pass\n"
                                      "class _Stopped(RuntimeError):\n    pass\n")
    found = shared(pkg)
    assert set(found) == {"BoxGone"}, found
    assert sorted(found["BoxGone"]) == ["tkbox/a/one.py:3", "tkbox/a/two.py:4"]
