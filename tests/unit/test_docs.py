"""The docs name only what exists: every module, file and `tkbox` command they mention.

Read from README.md and docs/*.md:

- a dotted name `tkbox.X.Y` in a code span whose `X` is one of tkbox's own modules or
  packages is imported (module) or looked up (attribute); record kinds such as
  `tkbox.gap` are not modules and are left alone;
- a path in a code span under `src/`, `tkbox/`, `tests/`, `benchmarks/`, `scripts/`,
  `action/` or `docs/` exists (globs allowed);
- every `tkbox VERB [SUB]` in a code span or a shell block is a command the CLI has
  (`tkbox image pull`, not `tkbox image fetch`);
- every code snippet is right: a ```python block compiles and every tkbox name it
  uses exists, a ```sh block's `tkbox` commands and their options exist (see "code
  snippets" below; `<!-- not-run -->` before a fence lets an illustrative one off).
"""

from __future__ import annotations

import ast
import collections.abc
import contextlib
import functools
import importlib
import importlib.util
import inspect
import pkgutil
import re
import shlex
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

import tkbox

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = {m.name for m in pkgutil.iter_modules(tkbox.__path__)}

SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^tkbox(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")
PATH = re.compile(r"^(?:src/|tkbox/|tests/|benchmarks/|scripts/|action/|docs/)[\w./*-]+"
                  r"(?:\.(?:py|md|sh|yml|yaml|json|toml|c|cjs)|/)$")
BLOCK = re.compile(r"```(?:sh|bash|shell|console)?\n(.*?)```", re.S)
VERB = re.compile(r"(?:^|&& |; |\| |\$\(|^\$ )tkbox ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", re.M)
#: spans that look like this repository's paths or commands and are not: another
#: project's file, an example path inside a checkout, a message quoted from tkbox
NOT_OURS = {
    "docs/vsock.md",  # Firecracker's, firecracker.md summarises it
    "docs/UIDS-GIDS.md",  # systemd's, vmm.md cites it
    "scripts/pc.sh", "setup.py",  # files of a checkout in changes.md's examples
    "tkbox does", "tkbox uses", "tkbox reads",  # tkbox's own sentences, quoted
}


def spans() -> list[tuple[Path, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        out += [(doc, s.strip()) for s in SPAN.findall(text)]
    return out


def cli_commands() -> dict[str, set[str]]:
    from tkbox.cli.main import _mount_optional, app

    _mount_optional()
    cmd = typer.main.get_command(app)
    return {name: set(getattr(c, "commands", {}) or {})
            for name, c in cmd.commands.items()}  # type: ignore[attr-defined]


def resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_tkbox_module_the_docs_name_exists() -> None:
    missing = sorted({f"{doc.name}: {s}" for doc, s in spans()
                      if DOTTED.match(s) and s.split(".")[1] in TOP and not resolves(s)})
    assert not missing


def test_every_file_the_docs_name_exists() -> None:
    missing = []
    for doc, s in spans():
        if not PATH.match(s) or s in NOT_OURS:
            continue
        rel = s.removeprefix("tkbox/")
        base = ROOT / "src" / "tkbox" if s.startswith("tkbox/") else ROOT
        if not list(base.glob(rel)):
            missing.append(f"{doc.name}: {s}")
    assert not sorted(set(missing))


BARE = re.compile(r"^[\w-]+\.py$")


def test_every_python_file_the_docs_name_by_its_name_alone_exists() -> None:
    """`tasks.py` (a module named by its file alone) is somewhere in the repository."""
    names = {p.name for d in ("src", "tests", "benchmarks", "scripts", "action")
             for p in (ROOT / d).rglob("*.py")}
    missing = sorted({f"{doc.name}: {s}" for doc, s in spans()
                      if BARE.match(s) and s not in names and s not in NOT_OURS})
    assert not missing


def test_every_command_the_docs_name_is_the_clis() -> None:
    commands = cli_commands()
    bad = set()
    for doc in DOCS:
        text = doc.read_text()
        places = [*SPAN.findall(text), *BLOCK.findall(text)]
        for place in places:
            for m in VERB.finditer(place):
                verb, sub = m.group(1), m.group(2)
                if f"tkbox {verb}" in NOT_OURS:
                    continue
                if verb not in commands:
                    bad.add(f"{doc.name}: tkbox {verb}")
                elif commands[verb] and sub is not None and sub not in commands[verb]:
                    bad.add(f"{doc.name}: tkbox {verb} {sub}")
    assert not sorted(bad)


@pytest.mark.parametrize("text, found", [
    ("`tkbox.image.tools`", True), ("`tkbox.image.nonesuch`", False),
    ("`tkbox.gap`", None), ("`tkbox.sdk.BoxInfo`", True), ("`tkbox.sdk.NoSuch`", False),
])
def test_the_module_check_can_fail(text: str, found: bool | None) -> None:
    """The checks above can fail: a name that is gone is caught, a record kind is not a
    module."""
    s = SPAN.findall(text)[0]
    if found is None:
        assert s.split(".")[1] not in TOP
    else:
        assert resolves(s) is found


def test_the_command_check_can_fail() -> None:
    commands = cli_commands()
    assert "fetch" not in commands["image"] and "pull" in commands["image"]
    m = VERB.search(SPAN.findall("run `tkbox image fetch x` first")[0])
    assert m is not None and (m.group(1), m.group(2)) == ("image", "fetch")


# --- code snippets ----------------------------------------------------------------------
#
# Every fenced ```python block compiles (top-level `await` allowed: the docs show calls
# made inside a coroutine) and every name it takes from tkbox exists: what it imports,
# the attributes it reads off those names, and, where a name is bound to an instance of
# a tkbox class (`door = EgressDoor(...)`, `with Client() as c`, `box = c.run(...)`, by
# the return annotations), the methods and attributes it uses on that instance. The
# snippets need a daemon or a signer to run, so none is run here.
#
# Every ```sh / ```bash / ```shell / ```console block: each `tkbox ...` command names a
# command the CLI has, and each option it passes exists on that command; each
# `python -m tkbox.X` names a module that exists. A block is skipped only when the line
# before its fence is `<!-- not-run -->` (illustrative: pseudo-syntax); that set is kept
# small (MAX_NOT_RUN). An unlabelled block with a line starting `tkbox ` must say it is
# shell, so that it is checked.

NOT_RUN = "<!-- not-run -->"
MAX_NOT_RUN = 3
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
SHELL = {"sh", "bash", "shell", "console"}


@dataclass(frozen=True)
class Snippet:
    doc: Path
    line: int
    lang: str
    text: str
    not_run: bool

    def where(self) -> str:
        return f"{self.doc.name}:{self.line}"


def snippets(docs: list[Path] = DOCS) -> list[Snippet]:
    out = []
    for doc in docs:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            before = text[:m.start()].rstrip().rsplit("\n", 1)[-1].strip()
            out.append(Snippet(doc, text.count("\n", 0, m.start()) + 1, m.group(1),
                               m.group(2), before == NOT_RUN))
    return out


@functools.cache
def cli_root() -> Any:
    """The CLI as click commands (typer carries its own click: looked at by duck type,
    `commands` on a group, `params` with `opts` on a command)."""
    from tkbox.cli.main import app

    return typer.main.get_command(app)


# -- python ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Obj:
    """A name bound to a tkbox object itself (module, class, function)."""

    value: object
    name: str


@dataclass(frozen=True)
class Inst:
    """A name bound to an instance of a tkbox class."""

    cls: type


@dataclass(frozen=True)
class Items:
    """What iterating gives: the element type hint."""

    hint: object


Kind = Obj | Inst | Items


def _hints(obj: object) -> dict[str, Any]:
    try:
        return typing.get_type_hints(obj)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: not followed
        return {}


def _kind_of_hint(hint: object) -> Kind | None:
    if isinstance(hint, type) and hint.__module__.startswith("tkbox"):
        return Inst(hint)
    origin = typing.get_origin(hint)
    if origin in (collections.abc.Iterator, collections.abc.Iterable,
                  collections.abc.AsyncIterator, collections.abc.AsyncIterable,
                  collections.abc.Generator, collections.abc.AsyncGenerator, list):
        args = typing.get_args(hint)
        return Items(args[0]) if args else None
    return None


def _instance_has(cls: type, attr: str) -> bool:
    if hasattr(cls, attr):
        return True
    for k in cls.__mro__:
        if attr in getattr(k, "__slots__", ()) or attr in getattr(k, "__annotations__", {}):
            return True
        if k.__module__.startswith("tkbox"):
            with contextlib.suppress(OSError, TypeError):
                if re.search(rf"self\.{attr}\b\s*(?::[^=\n]*)?=", inspect.getsource(k)):
                    return True
    return False


class _Names(ast.NodeVisitor):
    """Walks a snippet in order, binding names to tkbox kinds, noting every name that
    does not exist."""

    def __init__(self) -> None:
        self.env: dict[str, Kind] = {}
        self.problems: list[str] = []

    def _bad(self, what: str) -> None:
        if what not in self.problems:
            self.problems.append(what)

    def _bind(self, target: ast.expr, kind: Kind | None) -> None:
        if isinstance(target, ast.Name):
            if kind is None:
                self.env.pop(target.id, None)
            else:
                self.env[target.id] = kind
        else:
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    self.env.pop(n.id, None)

    # imports
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            try:
                importlib.import_module(alias.name)
            except ImportError:
                self._bad(f"import {alias.name}: no such module")
                continue
            top = alias.name.split(".")[0]
            bound = alias.asname or top
            mod = importlib.import_module(alias.name if alias.asname else top)
            if top == "tkbox":
                self.env[bound] = Obj(mod, alias.name if alias.asname else top)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or node.module is None:
            self._bad("relative import")
            return
        try:
            mod = importlib.import_module(node.module)
        except ImportError:
            self._bad(f"from {node.module} import ...: no such module")
            return
        for alias in node.names:
            if not hasattr(mod, alias.name):
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    self._bad(f"{node.module}.{alias.name} does not exist")
                    continue
            if node.module.split(".")[0] == "tkbox":
                self.env[alias.asname or alias.name] = Obj(getattr(mod, alias.name),
                                                           f"{node.module}.{alias.name}")

    # what an expression is
    def kind(self, node: ast.expr) -> Kind | None:
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.Await):
            return self.kind(node.value)
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.Call):
            f = self.kind(node.func)
            if isinstance(f, Obj):
                if isinstance(f.value, type):
                    return Inst(f.value)
                if callable(f.value):
                    return _kind_of_hint(_hints(f.value).get("return"))
        return None

    def _attribute(self, node: ast.Attribute) -> Kind | None:
        base, attr = self.kind(node.value), node.attr
        if isinstance(base, Obj):
            if not hasattr(base.value, attr):
                if inspect.ismodule(base.value):
                    with contextlib.suppress(ImportError):
                        return Obj(importlib.import_module(f"{base.name}.{attr}"),
                                   f"{base.name}.{attr}")
                self._bad(f"{base.name}.{attr} does not exist")
                return None
            return Obj(getattr(base.value, attr), f"{base.name}.{attr}")
        if isinstance(base, Inst):
            cls = base.cls
            if not _instance_has(cls, attr):
                self._bad(f"{cls.__module__}.{cls.__qualname__} has no attribute {attr!r}")
                return None
            member = inspect.getattr_static(cls, attr, None)
            if isinstance(member, property):
                return _kind_of_hint(_hints(member.fget).get("return"))
            if callable(member) and not isinstance(member, type):
                return Obj(getattr(cls, attr), f"{cls.__qualname__}.{attr}")
            return _kind_of_hint(_hints(cls).get(attr))
        return None

    def _items(self, node: ast.expr) -> Kind | None:
        k = self.kind(node)
        if isinstance(k, Inst):
            for dunder in ("__iter__", "__aiter__"):
                method = getattr(k.cls, dunder, None)
                if method is not None:
                    k = _kind_of_hint(_hints(method).get("return"))
                    break
        return _kind_of_hint(k.hint) if isinstance(k, Items) else None

    # statements that bind
    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.kind(node)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self._bind(target, self.kind(node.value))

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            self._bind(node.target, self.kind(node.value))

    def _with(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self._bind(item.optional_vars, self.kind(item.context_expr))
        for stmt in node.body:
            self.visit(stmt)

    visit_With = visit_AsyncWith = _with

    def _for(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self._bind(node.target, self._items(node.iter))
        for stmt in [*node.body, *node.orelse]:
            self.visit(stmt)

    visit_For = visit_AsyncFor = _for

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        caught = self.kind(node.type) if node.type is not None else None
        if node.name is not None:
            if isinstance(caught, Obj) and isinstance(caught.value, type):
                self.env[node.name] = Inst(caught.value)
            else:
                self.env.pop(node.name, None)
        for stmt in node.body:
            self.visit(stmt)

    def _def(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
            self.env.pop(arg.arg, None)
        for stmt in node.body:
            self.visit(stmt)

    visit_FunctionDef = visit_AsyncFunctionDef = _def


def python_problems(text: str) -> list[str]:
    """What is wrong with a python snippet: it does not compile, or names a tkbox name
    that does not exist."""
    try:
        tree = ast.parse(text)
        compile(tree, "<snippet>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as exc:
        return [f"does not compile: {exc.msg} (snippet line {exc.lineno})"]
    names = _Names()
    names.visit(tree)
    return names.problems


# -- shell ----------------------------------------------------------------------------

SUBST = re.compile(r"\$\(([^()]*)\)")
SEPARATORS = {";", "&", "&&", "|", "||", "(", ")"}


def _tokens(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
    lex.whitespace_split = True
    lex.commenters = "#"
    return list(lex)


def shell_commands(text: str, console: bool = False) -> list[list[str]]:
    """The simple commands of a shell snippet, each its words. A line ending in `\\`,
    or an indented line starting with `-` (an option laid out under its command),
    continues the command before it; `$(...)` is a command of its own. In a console
    transcript only the lines after a `$ ` prompt (and their continuations) are."""
    lines: list[list[str]] = []
    joined = False
    for raw in text.splitlines():
        if console and not joined and not raw.startswith("$ "):
            continue
        line = raw.removeprefix("$ ")
        inner = SUBST.findall(line)
        line = SUBST.sub("SUBST", line)
        cont = line.rstrip().endswith("\\")
        words = _tokens(line.rstrip().removesuffix("\\"))
        if lines and (joined or (raw[:1].isspace() and words and words[0].startswith("-"))):
            lines[-1] += words
        else:
            lines.append(words)
        lines += [_tokens(c) for c in inner]
        joined = cont
    commands = []
    for words in lines:
        current: list[str] = []
        skip = False
        for w in [*words, ";"]:
            if skip:
                skip = False
            elif w in SEPARATORS:
                if current:
                    commands.append(current)
                current = []
            elif w in {"<", ">", ">>", "2>"}:
                skip = True  # a redirection's target
            else:
                current.append(w)
    return commands


def command_problems(words: list[str]) -> list[str]:
    """What is wrong with one command line if it is `tkbox ...` or `python -m tkbox.X`."""
    while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])  # VAR=value
                     or words[0] in {"sudo", "env", "nohup", "time", "exec"}):
        words = words[1:]
    if words[:2] == ["python", "-m"] and len(words) > 2 and words[2].startswith("tkbox"):
        if importlib.util.find_spec(words[2]) is None:
            return [f"python -m {words[2]}: no such module"]
        return []
    if not words or words[0] != "tkbox":
        return []
    cmd = cli_root()
    path, args = ["tkbox"], words[1:]
    while hasattr(cmd, "commands") and args and args[0] in cmd.commands:
        cmd = cmd.commands[args[0]]
        path.append(args.pop(0))
    if hasattr(cmd, "commands") and args and not args[0].startswith("-"):
        return [f"{' '.join(path)} has no command {args[0]!r}"]
    known = {"--help"} | {o for p in cmd.params if p.param_type_name == "option"
                          for o in (*p.opts, *p.secondary_opts)}
    problems = []
    for w in args:
        if w == "--":
            break
        opt = w.strip("[]").split("=", 1)[0]
        if re.match(r"^--?[A-Za-z]", opt) and opt not in known:
            problems.append(f"{' '.join(path)} has no option {opt}")
    return problems


def snippet_problems(s: Snippet) -> list[str]:
    if s.lang == "python":
        return python_problems(s.text)
    if s.lang in SHELL:
        try:
            commands = shell_commands(s.text, console=s.lang == "console")
        except ValueError as exc:
            return [f"does not parse as shell: {exc}"]
        return [p for c in commands for p in command_problems(c)]
    return []


def test_every_code_snippet_in_the_docs_is_right() -> None:
    bad = [f"{s.where()}: {p}" for s in snippets() if not s.not_run
           for p in snippet_problems(s)]
    assert not bad, "\n".join(bad)


def test_the_snippets_checked_are_the_docs_own() -> None:
    """The check above has something to check, and few snippets are let off it."""
    found = snippets()
    assert sum(s.lang == "python" for s in found) >= 5
    assert sum(s.lang in SHELL for s in found) >= 10
    let_off = [s.where() for s in found if s.not_run]
    assert len(let_off) <= MAX_NOT_RUN, f"too many {NOT_RUN} snippets: {let_off}"


def test_a_block_of_tkbox_commands_says_it_is_shell() -> None:
    unlabelled = [s.where() for s in snippets() if s.lang == "" and not s.not_run
                  and re.search(r"(?m)^\$? ?tkbox ", s.text)]
    assert not unlabelled, f"label these ```sh so they are checked: {unlabelled}"


PLANTED = '''\
# A page

```python
from tkbox.sdk import Client, NoSuchClient
```

```python
from tkbox.sdk import Client

with Client() as c:
    box = c.run(workspace=".")
    box.exec_stream(["true"])
    box.launch_rockets()
```

```python
from tkbox.errors import UserError

try:
    pass
except UserError as e:
    print(e.exit_code, e.no_such_field)
```

```python
from tkbox.protocol import streams

streams.MemoryStream().receive
streams.no_such_function()
```

```sh
tkbox image pull python:3.12-slim      # fine
tkbox image pull --no-such-option x
tkbox run --name demo \\
    --no-such-flag
tkbox daemon --vmm firecracker
    --gone-option
echo "$(tkbox image fetch x)"
python -m tkbox.no_such_module
```

```console
$ sudo tkbox doctor --no-such-switch
tkbox --this-is-output-not-a-command
```

```python
def broken(:
```

<!-- not-run -->
```python
from tkbox.sdk import Gone
```
'''


def test_the_snippet_check_can_fail(tmp_path: Path) -> None:
    """A planted doc: a snippet importing a name that is gone, using a method or an
    exception's attribute that is gone; a command option, a subcommand, a module that
    is gone (a console transcript's output lines are not commands); a snippet that
    does not compile. The one marked not-run is let off."""
    doc = tmp_path / "planted.md"
    doc.write_text(PLANTED)
    found = {s.where(): snippet_problems(s) for s in snippets([doc]) if not s.not_run}
    assert found == {
        "planted.md:3": ["tkbox.sdk.NoSuchClient does not exist"],
        "planted.md:7": ["tkbox.sdk.Box has no attribute 'launch_rockets'"],
        "planted.md:16": ["tkbox.errors.UserError has no attribute 'no_such_field'"],
        "planted.md:25": ["tkbox.protocol.streams.no_such_function does not exist"],
        "planted.md:32": ["tkbox image pull has no option --no-such-option",
                          "tkbox run has no option --no-such-flag",
                          "tkbox daemon has no option --gone-option",
                          "tkbox image has no command 'fetch'",
                          "python -m tkbox.no_such_module: no such module"],
        "planted.md:43": ["tkbox doctor has no option --no-such-switch"],
        "planted.md:48": ["does not compile: invalid syntax (snippet line 1)"],
    }
    assert [s.not_run for s in snippets([doc])] == [False] * 7 + [True]
