"""A small, strict evaluator of the part of GitHub's expression language an action uses.

What it knows (GitHub Docs, "Evaluate expressions in workflows and actions"):

- literals: `'string'` (a quote doubled inside), `true`, `false`, `null`, numbers;
- property paths: `inputs.agent-command`, `steps.run.outputs.bundle` (names are
  case-insensitive; `-` and `_` allowed inside them);
- operators, from tightest: `( )`, `!`, `==` `!=`, `&&`, `||`; `&&` and `||` give one of
  their operands (`a && b` is `b` when `a` is truthy, else `a`), as GitHub's do;
- `==`/`!=`: strings compare ignoring case; values of different types are compared as
  numbers (null 0, true 1, false 0, a string its JSON number or NaN, "" 0; an object
  NaN); NaN equals nothing;
- falsy: `false`, `0`, `-0`, `""`, `null`, NaN; everything else is truthy;
- the status functions `success()`, `always()`, `failure()`, `cancelled()`.

Anything else (another operator, an index `a['b']`, another function, a property a
strict context does not have) raises `ExpressionError`: a runner that guessed would
pass the very mistakes it is there to catch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

STATUS_FUNCTIONS = ("success", "always", "failure", "cancelled")


class ExpressionError(Exception):
    """An expression this evaluator does not accept, with the expression quoted."""


@dataclass(frozen=True)
class Token:
    kind: str  # "str", "num", "ident", "op", "end"
    text: str
    value: Any = None


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>'(?:[^']|'')*')
  | (?P<num>-?(?:0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)(?![\w-]))
  | (?P<op>&&|\|\||==|!=|<=|>=|[()!<>\[\],.*])
  | (?P<ident>[A-Za-z_][A-Za-z0-9_-]*)
""", re.X)


def tokenize(text: str) -> list[Token]:
    out: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ExpressionError(f"cannot read {text[pos:pos + 20]!r} in ${{{{ {text} }}}}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind == "ws":
            continue
        tok = m.group()
        if kind == "str":
            out.append(Token("str", tok, tok[1:-1].replace("''", "'")))
        elif kind == "num":
            out.append(Token("num", tok, float(int(tok, 16)) if "x" in tok.lower()
                             else float(tok)))
        else:
            out.append(Token(kind, tok))
    out.append(Token("end", ""))
    return out


class Strict(dict[str, Any]):
    """A context whose every property is known: asking for another is an error."""

    def __init__(self, what: str, values: Mapping[str, Any]) -> None:
        super().__init__(values)
        self.what = what


class Lenient(dict[str, Any]):
    """A context where a property nobody set is `null` (env, a step's outputs)."""


def _get(obj: Any, name: str, path: str) -> Any:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k.lower() == name.lower():
                return v
        if isinstance(obj, Strict):
            raise ExpressionError(f"{path}: {obj.what} has no {name!r} "
                                  f"(it has: {', '.join(sorted(obj)) or 'nothing'})")
        return None
    return None  # a property of a string, a number or null is null


def to_number(v: Any) -> float:
    if v is None:
        return 0.0
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, float):
        return v
    if isinstance(v, str):
        s = v.strip()
        if s == "":
            return 0.0
        try:
            n = json.loads(s)
        except ValueError:
            return math.nan
        return float(n) if isinstance(n, int | float) and not isinstance(n, bool) else math.nan
    return math.nan


def truthy(v: Any) -> bool:
    if v is None or v is False:
        return False
    if isinstance(v, float):
        return not (v == 0 or math.isnan(v))
    if isinstance(v, str):
        return v != ""
    return True


def equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.casefold() == b.casefold()
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return a is b
    if type(a) is type(b) and not isinstance(a, float):
        return bool(a == b)
    x, y = to_number(a), to_number(b)
    return not (math.isnan(x) or math.isnan(y)) and x == y


def to_text(v: Any) -> str:
    """A value as `${{ }}` puts it into text."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)
    if isinstance(v, str):
        return v
    raise ExpressionError(f"an object cannot be put into text (use toJSON, which this "
                          f"runner does not model): {v!r:.80}")


class _Parser:
    def __init__(self, text: str, contexts: Mapping[str, Any],
                 functions: Mapping[str, Callable[[], bool]]) -> None:
        self.text = text
        self.toks = tokenize(text)
        self.i = 0
        self.contexts = contexts
        self.functions = functions

    def peek(self) -> Token:
        return self.toks[self.i]

    def take(self, text: str | None = None) -> Token:
        t = self.toks[self.i]
        if text is not None and t.text != text:
            raise ExpressionError(f"expected {text!r}, found {t.text or 'the end'!r} in "
                                  f"${{{{ {self.text} }}}}")
        self.i += 1
        return t

    def parse(self) -> Any:
        v = self.or_()
        if self.peek().kind != "end":
            raise self.unknown(self.peek())
        return v

    def unknown(self, t: Token) -> ExpressionError:
        return ExpressionError(f"{t.text!r} is not part of the expression language this "
                               f"runner models, in ${{{{ {self.text} }}}}")

    def or_(self) -> Any:
        v = self.and_()
        while self.peek().text == "||":
            self.take()
            rhs = self.and_()
            v = v if truthy(v) else rhs
        return v

    def and_(self) -> Any:
        v = self.cmp()
        while self.peek().text == "&&":
            self.take()
            rhs = self.cmp()
            v = rhs if truthy(v) else v
        return v

    def cmp(self) -> Any:
        v = self.unary()
        while self.peek().text in ("==", "!="):
            op = self.take().text
            rhs = self.unary()
            v = equal(v, rhs) if op == "==" else not equal(v, rhs)
        return v

    def unary(self) -> Any:
        if self.peek().text == "!":
            self.take()
            return not truthy(self.unary())
        return self.primary()

    def primary(self) -> Any:
        t = self.take()
        if t.kind in ("str", "num"):
            return t.value
        if t.text == "(":
            v = self.or_()
            self.take(")")
            return v
        if t.kind != "ident":
            raise self.unknown(t)
        low = t.text.lower()
        if low in ("true", "false"):
            return low == "true"
        if low == "null":
            return None
        if self.peek().text == "(":
            fn = self.functions.get(low)
            if fn is None:
                raise ExpressionError(f"{t.text}() is not a function this runner models "
                                      f"({', '.join(f + '()' for f in self.functions)}), "
                                      f"in ${{{{ {self.text} }}}}")
            self.take("(")
            self.take(")")
            return fn()
        path = t.text
        if low not in {k.lower() for k in self.contexts}:
            raise ExpressionError(f"no context named {t.text!r} here (there are: "
                                  f"{', '.join(sorted(self.contexts))}), in "
                                  f"${{{{ {self.text} }}}}")
        v = _get(self.contexts, t.text, path)
        while self.peek().text == ".":
            self.take()
            name = self.take()
            if name.kind != "ident":
                raise self.unknown(name)
            path += "." + name.text
            v = _get(v, name.text, path)
        if self.peek().text == "[":
            raise self.unknown(self.peek())
        return v


def evaluate(text: str, contexts: Mapping[str, Any],
             functions: Mapping[str, Callable[[], bool]] | None = None) -> Any:
    """The value of one expression (the text between `${{` and `}}`)."""
    return _Parser(text, contexts, functions or {}).parse()


def uses_status_function(text: str) -> bool:
    return any(t.kind == "ident" and t.text.lower() in STATUS_FUNCTIONS
               for t in tokenize(text))


_TEMPLATE = re.compile(r"\$\{\{(.*?)\}\}", re.S)


def substitute(text: str, contexts: Mapping[str, Any],
               functions: Mapping[str, Callable[[], bool]] | None = None) -> str:
    """`text` with each `${{ expr }}` replaced by its value as text; an unclosed `${{`
    is an error."""
    if "${{" in _TEMPLATE.sub("", text):
        raise ExpressionError(f"an unclosed ${{{{ in {text[:80]!r}")
    return _TEMPLATE.sub(lambda m: to_text(evaluate(m.group(1), contexts, functions)), text)


def condition(text: str | bool, contexts: Mapping[str, Any],
              functions: Mapping[str, Callable[[], bool]]) -> bool:
    """An `if:` as GitHub reads it: a bare expression or one whole `${{ }}`; without a
    status function it means `success() && (expr)`. Text around a `${{ }}` would make
    the condition a non-empty string, always true: refused."""
    if isinstance(text, bool):
        expr = "true" if text else "false"
    else:
        expr = text.strip()
        m = _TEMPLATE.fullmatch(expr)
        if m:
            expr = m.group(1).strip()
        elif "${{" in expr:
            raise ExpressionError(f"if: {text!r} mixes text and ${{{{ }}}}: GitHub reads it "
                                  "as a non-empty string, which is always true")
    if not uses_status_function(expr):
        expr = f"success() && ({expr})"
    return truthy(evaluate(expr, contexts, functions))
