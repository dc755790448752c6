"""Read a shell command line the way a POSIX shell (and bash) would: a sans-IO reader.

`parse_seq(text)` turns a command line into a small tree (`Seq` of
`Pipeline`s of `Simple` commands and `Group`s, whose `Word`s are made of
literal text, parameter expansions and substitutions). It knows nothing of
what the commands do; `tkbox.signer.download_exec` reads the tree for the
download-exec policy pack.

The reader covers words (quotes, `$'…'`, escapes, `$(…)`, backquotes,
`${…}`, `$((…))`), process substitution, operators, redirections with file
descriptor numbers, here-documents and here-strings, subshells and groups,
function definitions, and the reserved words of compound commands (treated
as prefixes). What it cannot read raises `ShellSyntaxError`, and the caller
says so rather than guess.

Pure and bounded: at most `MAX_COMMAND` characters and `MAX_DEPTH` levels of
nesting (substitutions, `sh -c` strings).

One module of about 600 lines on purpose: the tree and the reader are one
recursive-descent grammar whose parts call each other (a word holds a
substitution, which holds a list, which holds words); cut in two, each half
would need the other's private state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tkbox.errors import UserError

MAX_COMMAND = 64 * 1024
MAX_DEPTH = 12


class ShellSyntaxError(UserError):
    """The command line is not something we can read (one line: what, and where)."""


# --- the tree --------------------------------------------------------------


@dataclass
class Lit:
    text: str


@dataclass
class Param:
    """A parameter expansion (`$x`, `${x:-y}`, `$1`): its value is not known here."""

    text: str


@dataclass
class Sub:
    """A command or process substitution: `$(…)`, `` `…` ``, `<(…)`, `>(…)`."""

    kind: str  # "$(", "`", "<(", ">("
    body: Seq


@dataclass
class Word:
    parts: list[Lit | Param | Sub] = field(default_factory=list)
    quoted: bool = False  # some of it was quoted or escaped (matters for here-documents)

    def literal(self) -> str | None:
        """The word's value when it holds no substitution."""
        parts = self.parts
        if len(parts) == 1 and isinstance(only := parts[0], Lit):  # most words: one run
            return only.text
        if any(not isinstance(p, Lit) for p in parts):
            return None
        return "".join(p.text for p in parts if isinstance(p, Lit))

    def subs(self) -> list[Sub]:
        return [p for p in self.parts if isinstance(p, Sub)]

    def show(self) -> str:
        return "".join(p.kind + "…)" if isinstance(p, Sub) else p.text for p in self.parts)


@dataclass
class Redir:
    op: str
    fd: int | None
    target: Word


@dataclass
class Simple:
    assigns: list[Word] = field(default_factory=list)
    words: list[Word] = field(default_factory=list)
    redirs: list[Redir] = field(default_factory=list)


@dataclass
class Group:
    body: Seq
    redirs: list[Redir] = field(default_factory=list)


Command = Simple | Group


@dataclass
class Pipeline:
    commands: list[Command] = field(default_factory=list)


@dataclass
class Seq:
    pipelines: list[Pipeline] = field(default_factory=list)


# --- the reader ------------------------------------------------------------

_OPERATORS = sorted(
    ["&&", "||", ";;&", ";;", ";&", "|&", "&>>", "&>", "<<<", "<<-", "<<", ">>", "<&", ">&",
     "<>", ">|", "|", "&", ";", "(", ")", "<", ">"],
    key=len, reverse=True,
)
_REDIRS = {"<", ">", ">>", "<&", ">&", "<>", ">|", "&>", "&>>", "<<", "<<-", "<<<"}
_SEPARATORS = {"&&", "||", ";", "&", "\n", ";;", ";;&", ";&"}
_META = set(" \t\n;&|()<>")
_RESERVED_PREFIX = {"if", "then", "elif", "else", "while", "until", "do", "!", "time", "{",
                    "coproc"}
_RESERVED_ALONE = {"fi", "done", "esac", "}"}
#: the characters an operator can start with (the rest go by `_OPERATORS` unread)
_OP_START = frozenset(op[0] for op in _OPERATORS)
#: a run of characters a word takes as they are: none of `_META`, no quote,
#: escape, `$` or backquote (each of those goes through its own branch of `_word`)
_PLAIN = re.compile(r"[^ \t\n;&|()<>\\'\"$`]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")


@dataclass
class _Tok:
    kind: str  # "word", "op", "io"
    value: str = ""
    word: Word | None = None


class _Reader:
    def __init__(self, s: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ShellSyntaxError("nested too deeply")
        self.s = s
        self.i = 0
        self.depth = depth
        self.heredocs: list[tuple[str, bool, bool, Word]] = []  # delim, strip tabs, quoted, into
        self._peeked: _Tok | None = None

    # characters

    def _at(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def _skip_blanks(self) -> None:
        while True:
            c = self._at()
            if c in (" ", "\t"):
                self.i += 1
            elif c == "\\" and self._at(1) == "\n":
                self.i += 2
            elif c == "#":
                while self._at() not in ("", "\n"):
                    self.i += 1
            else:
                return

    # tokens

    def peek(self) -> _Tok | None:
        if self._peeked is None:
            self._peeked = self._next()
        return self._peeked

    def take(self) -> _Tok | None:
        t = self.peek()
        self._peeked = None
        return t

    def _next(self) -> _Tok | None:
        self._skip_blanks()
        c = self._at()
        if c == "":
            return None
        if c == "\n":
            self.i += 1
            self._read_heredocs()
            return _Tok("op", "\n")
        if c in "<>" and self._at(1) == "(":
            return _Tok("word", word=self._word())
        if self.s.startswith("((", self.i):
            self.i = self._matching(self.i + 2, "(", ")", depth=2)
            return _Tok("arith")
        if c in _OP_START:
            for op in _OPERATORS:
                if self.s.startswith(op, self.i):
                    self.i += len(op)
                    return _Tok("op", op)
        start = self.i
        w = self._word()
        lit = w.literal()
        if lit is not None and lit.isdigit() and self.i == start + len(lit) and \
                self._at() in ("<", ">"):
            return _Tok("io", lit)
        return _Tok("word", word=w)

    def _word(self) -> Word:
        w = Word()
        buf: list[str] = []

        def flush() -> None:
            if buf:
                w.parts.append(Lit("".join(buf)))
                buf.clear()

        while True:
            c = self._at()
            if c in "<>" and c and self._at(1) == "(" and not buf and not w.parts:
                kind = c + "("  # process substitution, at the start of a word
                self.i += 2
                w.parts.append(Sub(kind, self._nested_seq()))
                continue
            if c == "" or c in _META:
                break
            if c == "\\":
                w.quoted = True
                nxt = self._at(1)
                self.i += 2
                if nxt != "\n":
                    buf.append(nxt)
                continue
            if c == "'":
                w.quoted = True
                end = self.s.find("'", self.i + 1)
                if end < 0:
                    raise ShellSyntaxError("a single quote is not closed")
                buf.append(self.s[self.i + 1 : end])
                self.i = end + 1
                continue
            if c == "$" and self._at(1) == "'":
                w.quoted = True
                self.i += 2
                buf.append(self._ansi_c())
                continue
            if c == '"':
                w.quoted = True
                self.i += 1
                self._double_quoted(w, buf, flush)
                continue
            if c == "$" or c == "`":
                self._dollar(w, buf, flush)
                continue
            plain = _PLAIN.match(self.s, self.i)  # c and the ordinary characters after it
            assert plain is not None
            buf.append(plain.group())
            self.i = plain.end()
        flush()
        if not w.parts:
            if w.quoted:
                w.parts.append(Lit(""))
            else:
                raise ShellSyntaxError(f"an empty word at {self.i}")
        return w

    def _ansi_c(self) -> str:
        out: list[str] = []
        simple = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b",
                  "E": "\x1b", "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
        while True:
            c = self._at()
            if c == "":
                raise ShellSyntaxError("a $'…' quote is not closed")
            self.i += 1
            if c == "'":
                return "".join(out)
            if c != "\\":
                out.append(c)
                continue
            e = self._at()
            self.i += 1
            if e == "":
                raise ShellSyntaxError("a $'…' quote is not closed")
            if e in simple:
                out.append(simple[e])
            elif e in "xuU":
                n = {"x": 2, "u": 4, "U": 8}[e]
                m = re.match(f"[0-9A-Fa-f]{{1,{n}}}", self.s[self.i :])
                if not m:
                    out.append("\\" + e)
                    continue
                self.i += m.end()
                code = int(m.group(), 16)
                out.append(chr(code) if code < 0x110000 else "\ufffd")
            elif e in "01234567":
                m = re.match(r"[0-7]{0,2}", self.s[self.i :])
                assert m
                self.i += m.end()
                out.append(chr(int(e + m.group(), 8) & 0xFF))
            else:
                out.append("\\" + e)

    def _double_quoted(self, w: Word, buf: list[str], flush: Any) -> None:
        while True:
            c = self._at()
            if c == "":
                raise ShellSyntaxError("a double quote is not closed")
            if c == '"':
                self.i += 1
                return
            if c == "\\" and self._at(1) in ("$", "`", '"', "\\", "\n"):
                if self._at(1) != "\n":
                    buf.append(self._at(1))
                self.i += 2
                continue
            if c == "$" or c == "`":
                self._dollar(w, buf, flush)
                continue
            buf.append(c)
            self.i += 1

    def _dollar(self, w: Word, buf: list[str], flush: Any) -> None:
        c = self._at()
        if c == "`":
            self.i += 1
            out: list[str] = []
            while True:
                d = self._at()
                if d == "":
                    raise ShellSyntaxError("a backquote is not closed")
                if d == "\\" and self._at(1) in ("$", "`", "\\"):
                    out.append(self._at(1))
                    self.i += 2
                    continue
                self.i += 1
                if d == "`":
                    break
                out.append(d)
            flush()
            w.parts.append(Sub("`", parse_seq("".join(out), self.depth + 1)))
            return
        # c == "$"
        if self.s.startswith("$((", self.i):
            end = self._matching(self.i + 3, "(", ")", depth=2)
            buf.append(self.s[self.i : end])
            self.i = end
            return
        if self._at(1) == "(":
            self.i += 2
            body = self._nested_seq()
            flush()
            w.parts.append(Sub("$(", body))
            return
        if self._at(1) == "{":
            start = self.i
            self.i += 2
            inner = Word()
            ibuf: list[str] = []

            def iflush() -> None:
                if ibuf:
                    inner.parts.append(Lit("".join(ibuf)))
                    ibuf.clear()

            while True:
                d = self._at()
                if d == "":
                    raise ShellSyntaxError("a ${ is not closed")
                if d == "}":
                    self.i += 1
                    break
                if d in "$`":
                    self._dollar(inner, ibuf, iflush)
                    continue
                if d == "\\":
                    ibuf.append(self._at(1))
                    self.i += 2
                    continue
                if d == "'":
                    end = self.s.find("'", self.i + 1)
                    if end < 0:
                        raise ShellSyntaxError("a single quote is not closed")
                    ibuf.append(self.s[self.i + 1 : end])
                    self.i = end + 1
                    continue
                if d == '"':
                    self.i += 1
                    self._double_quoted(inner, ibuf, iflush)
                    continue
                ibuf.append(d)
                self.i += 1
            iflush()
            flush()
            w.parts.append(Param(self.s[start : self.i]))
            w.parts.extend(inner.subs())
            return
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]", self.s[self.i + 1 :])
        if m:
            flush()
            w.parts.append(Param("$" + m.group()))
            self.i += 1 + m.end()
            return
        buf.append("$")
        self.i += 1

    def _matching(self, j: int, opener: str, closer: str, depth: int = 1) -> int:
        while j < len(self.s):
            if self.s.startswith(closer, j):
                depth -= 1
                j += len(closer)
                if depth == 0:
                    return j
                continue
            if self.s.startswith(opener, j):
                depth += 1
                j += len(opener)
                continue
            j += 1
        raise ShellSyntaxError(f"a {opener} is not closed")

    def _nested_seq(self) -> Seq:
        """Parse a list up to its closing ')', which is consumed."""
        if self.depth + 1 > MAX_DEPTH:
            raise ShellSyntaxError("nested too deeply")
        self.depth += 1
        try:
            body = _parse_list(self, stop=")")
        finally:
            self.depth -= 1
        t = self.take()
        if t is None or t.kind != "op" or t.value != ")":
            raise ShellSyntaxError("a ( is not closed")
        return body

    def _read_heredocs(self) -> None:
        pending, self.heredocs = self.heredocs, []
        for delim, strip, quoted, into in pending:
            lines: list[str] = []
            while True:
                if self.i >= len(self.s):
                    break  # bash warns and takes end of input as the delimiter
                end = self.s.find("\n", self.i)
                end = len(self.s) if end < 0 else end
                line = self.s[self.i : end]
                self.i = min(end + 1, len(self.s))
                check = line.lstrip("\t") if strip else line
                if check == delim:
                    break
                lines.append(check)
            text = "".join(line + "\n" for line in lines)
            if quoted:
                into.parts.append(Lit(text))
            else:
                sub = _Reader(text, self.depth + 1)
                w = Word()
                buf: list[str] = []

                def flush(w: Word = w, buf: list[str] = buf) -> None:
                    if buf:
                        w.parts.append(Lit("".join(buf)))
                        buf.clear()

                while sub.i < len(text):
                    c = sub._at()
                    if c in "$`":
                        sub._dollar(w, buf, flush)
                    elif c == "\\" and sub._at(1) in ("$", "`", "\\"):
                        buf.append(sub._at(1))
                        sub.i += 2
                    else:
                        buf.append(c)
                        sub.i += 1
                flush()
                into.parts.extend(w.parts)


def _parse_list(r: _Reader, stop: str | None = None) -> Seq:
    seq = Seq()
    while True:
        t = r.peek()
        if t is None:
            if stop is not None:
                raise ShellSyntaxError(f"a list ends before its {stop!r}")
            return seq
        if t.kind == "op" and t.value == stop:
            return seq
        if t.kind == "op" and t.value in _SEPARATORS:
            r.take()
            continue
        seq.pipelines.append(_parse_pipeline(r, stop))


def _parse_pipeline(r: _Reader, stop: str | None) -> Pipeline:
    p = Pipeline()
    while True:
        p.commands.append(_parse_command(r, stop))
        t = r.peek()
        if t is not None and t.kind == "op" and t.value in ("|", "|&"):
            r.take()
            while (n := r.peek()) is not None and n.kind == "op" and n.value == "\n":
                r.take()
            continue
        return p


def _parse_redir(r: _Reader, fd: int | None) -> Redir:
    t = r.take()
    assert t is not None
    target = r.take()
    if target is None or target.kind != "word" or target.word is None:
        raise ShellSyntaxError(f"the redirection {t.value} has no target")
    if t.value in ("<<", "<<-"):
        delim = target.word.literal()
        if delim is None:
            raise ShellSyntaxError("a here-document delimiter with a substitution")
        body = Word()
        r.heredocs.append((delim, t.value == "<<-", target.word.quoted, body))
        return Redir(t.value, fd, body)
    return Redir(t.value, fd, target.word)


def _parse_command(r: _Reader, stop: str | None) -> Command:
    t = r.peek()
    if t is None:
        raise ShellSyntaxError("a command is missing")
    if t.kind == "arith":  # (( … )): arithmetic, runs nothing
        r.take()
        return Simple()
    if t.kind == "op" and t.value == "(":
        r.take()
        body = r._nested_seq()
        g = Group(body)
        _trailing_redirs(r, g.redirs)
        return g
    cmd = Simple()
    while True:
        t = r.peek()
        if t is None:
            break
        if t.kind == "op":
            if t.value in _REDIRS:
                cmd.redirs.append(_parse_redir(r, None))
                continue
            if t.value == "(" and len(cmd.words) == 1 and not cmd.assigns:
                # name () compound-command: a function definition; read its body
                r.take()
                close = r.take()
                if close is None or close.value != ")":
                    raise ShellSyntaxError("a ( in the middle of a command")
                while (n := r.peek()) is not None and n.kind == "op" and n.value == "\n":
                    r.take()
                fn_body = _parse_command(r, stop)
                return Group(Seq([Pipeline([fn_body])]))
            break
        if t.kind == "arith":
            break
        if t.kind == "io":
            r.take()
            if (n := r.peek()) is None or n.kind != "op" or n.value not in _REDIRS:
                raise ShellSyntaxError("a file descriptor number without a redirection")
            cmd.redirs.append(_parse_redir(r, int(t.value)))
            continue
        r.take()
        assert t.word is not None
        lit = t.word.literal()
        if not cmd.words and lit is not None:
            if ASSIGN.match(lit) and not cmd.words:
                cmd.assigns.append(t.word)
                continue
            if lit in _RESERVED_PREFIX:
                continue
            if lit in _RESERVED_ALONE:
                continue
            if lit in ("for", "select", "case"):
                _skip_header(r, lit)
                continue
            if lit == "function":
                continue
        cmd.words.append(t.word)
    if not (cmd.words or cmd.assigns or cmd.redirs) and (t := r.peek()) is not None \
            and t.kind == "op" and t.value != stop and t.value not in _SEPARATORS:
        raise ShellSyntaxError(f"unexpected {t.value!r}")  # nothing read: never loop
    return cmd


def _skip_header(r: _Reader, word: str) -> None:
    """`for x in a b c`, `select …`, `case x in`: read past the header words."""
    while (t := r.peek()) is not None and t.kind == "word":
        r.take()
        assert t.word is not None
        if word == "case" and t.word.literal() == "in":
            raise ShellSyntaxError("case statements are not read")


def _trailing_redirs(r: _Reader, redirs: list[Redir]) -> None:
    while (t := r.peek()) is not None:
        if t.kind == "op" and t.value in _REDIRS:
            redirs.append(_parse_redir(r, None))
        elif t.kind == "io":
            r.take()
            redirs.append(_parse_redir(r, int(t.value)))
        else:
            return


def parse_seq(s: str, depth: int = 0) -> Seq:
    if len(s) > MAX_COMMAND:
        raise ShellSyntaxError(f"longer than {MAX_COMMAND} characters")
    r = _Reader(s, depth)
    seq = _parse_list(r)
    if r.peek() is not None:
        raise ShellSyntaxError(f"unexpected {r.peek().value!r}")  # type: ignore[union-attr]
    if r.heredocs:
        r._read_heredocs()
    return seq
