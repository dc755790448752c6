"""Read a shell command line the way a POSIX shell (and bash) would, and say
whether it runs downloaded content without anyone reading it first.

This is a parser, not a pattern match: `curl … | sh`, `wget -qO- … | sudo
bash -s`, `python3 <(curl …)`, `sh -c "$(curl …)"`, `bash <<< "$(wget -O- …)"`,
`eval "$(curl …)"`, `bash -c 'curl … | sh'` and `curl … | tee x | sh` are all
the same finding: bytes from a downloader reach an interpreter as its program.
Downloading to a file and running it later is not (someone could read it).

The reader covers words (quotes, `$'…'`, escapes, `$(…)`, backquotes,
`${…}`, `$((…))`), process substitution, operators, redirections with file
descriptor numbers, here-documents and here-strings, subshells and groups,
function definitions, and the reserved words of compound commands (treated
as prefixes). What it cannot read it says so (`parsed: False`), and the
policy then refuses a command that mentions a downloader rather than guess.

Pure and bounded: at most `MAX_COMMAND` characters and `MAX_DEPTH` levels of
nesting (substitutions, `sh -c` strings).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MAX_COMMAND = 64 * 1024
MAX_DEPTH = 12


class ShellSyntaxError(Exception):
    """The command line is not something we can read."""


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
        if any(not isinstance(p, Lit) for p in self.parts):
            return None
        return "".join(p.text for p in self.parts if isinstance(p, Lit))

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
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")


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
            buf.append(c)
            self.i += 1
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
            if _ASSIGN.match(lit) and not cmd.words:
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


# --- the analysis ----------------------------------------------------------

#: Programs that fetch from the network. Any of them makes `mentions_downloader`;
#: `_to_stdout` says whether one writes what it fetched to its stdout.
DOWNLOADERS = frozenset({
    "curl", "curlie", "wget", "wget2", "fetch", "aria2c", "http", "https", "xh", "httpie",
    "lwp-request", "GET", "lynx", "w3m", "links", "elinks", "ftp", "tftp", "nc", "ncat",
    "netcat", "socat", "gh",
})


@dataclass(frozen=True)
class _Lang:
    """How an interpreter is told where its program is."""

    code: frozenset[str] = frozenset()  # the next word (or the rest of the word) is code
    value: frozenset[str] = frozenset()  # the option takes a value that is not the program
    module: frozenset[str] = frozenset()  # the program is named, not read (python -m)
    stdin: frozenset[str] = frozenset()  # read the program from stdin (sh -s)
    combined: bool = True  # short options combine: -xc


def _f(*xs: str) -> frozenset[str]:
    return frozenset(xs)


_SHELL = _Lang(code=_f("c"), value=_f("o", "O", "--rcfile", "--init-file"), stdin=_f("s"))
_LANGS: list[tuple[re.Pattern[str], _Lang]] = [
    (re.compile(r"(ba|z|da|k|mk|a|ya|r|po)?sh|fish|t?csh"), _SHELL),
    (re.compile(r"(python|pypy)[0-9.]*"), _Lang(code=_f("c"), value=_f("W", "X", "Q"),
                                                 module=_f("m"))),
    (re.compile(r"perl[0-9.]*"), _Lang(code=_f("e", "E"))),
    (re.compile(r"ruby[0-9.]*"), _Lang(code=_f("e"), value=_f("r", "I", "C", "E"))),
    (re.compile(r"node(js)?[0-9.]*|bun"), _Lang(
        code=_f("e", "p", "--eval", "--print"), value=_f("r", "--require", "--import",
                                                         "--loader", "C"), combined=False)),
    (re.compile(r"php[0-9.]*"), _Lang(code=_f("r"), module=_f("f"), value=_f("c", "d"))),
    (re.compile(r"lua(jit)?[0-9.]*"), _Lang(code=_f("e"), value=_f("l"))),
    (re.compile(r"pwsh|powershell"), _Lang(code=_f("c", "-Command", "-command", "Command"),
                                           stdin=_f("-"), combined=False)),
    (re.compile(r"tclsh[0-9.]*|wish|Rscript|julia|guile|racket|elixir|deno|osascript|groovy"),
     _Lang(code=_f("e", "--eval"), combined=False)),
]
_STDIN_NAMES = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})

#: Programs that run the rest of their arguments as a command, and which of
#: their options take a value.
_WRAPPERS: dict[str, frozenset[str]] = {
    "sudo": _f("-u", "-g", "-h", "-p", "-C", "-D", "-r", "-t", "-U", "-T", "--user", "--group",
               "--chdir", "--prompt", "--host", "--role", "--type", "--other-user"),
    "doas": _f("-u", "-C"),
    "run0": _f("-u", "-g", "-D", "--user", "--group", "--chdir"),
    "pkexec": _f("--user"),
    "env": _f("-u", "-C", "--unset", "--chdir"),
    "command": _f(),
    "builtin": _f(),
    "exec": _f("-a"),
    "nohup": _f(),
    "nice": _f("-n", "--adjustment"),
    "ionice": _f("-c", "-n", "-p", "--class", "--classdata"),
    "chrt": _f(),
    "time": _f("-f", "-o", "--format", "--output"),
    "timeout": _f("-s", "-k", "--signal", "--kill-after"),
    "stdbuf": _f("-i", "-o", "-e"),
    "setsid": _f(),
    "unbuffer": _f(),
    "chronic": _f(),
    "xargs": _f("-I", "-L", "-n", "-P", "-s", "-d", "-E", "-a", "--arg-file", "--delimiter",
                "--max-args", "--max-procs", "--replace"),
    "busybox": _f(),
    "strace": _f("-o", "-e", "-p", "-s", "-u", "-P", "-E"),
    "ltrace": _f("-o", "-e", "-p", "-s", "-u"),
    "firejail": _f(),
    "torsocks": _f(),
    "proxychains": _f("-f"),
    "proxychains4": _f("-f"),
    "flock": _f("-w", "-E", "-c"),
    "watch": _f("-n", "-d"),
}
_WRAPPER_POSITIONAL = {"timeout": 1, "chrt": 1, "flock": 1}


def _base(prog: str) -> str:
    return prog.rsplit("/", 1)[-1]


def _lang(name: str) -> _Lang | None:
    for pattern, lang in _LANGS:
        if pattern.fullmatch(name):
            return lang
    return None


def is_interpreter(name: str) -> bool:
    return _lang(name) is not None or name in ("source", ".", "eval")


def _program_source(lang: _Lang, args: list[Word]) -> tuple[str, int | None]:
    """Where an interpreter takes its program from: ("stdin" | "code" | "file" |
    "module", index of the word holding it, if any)."""
    j = 0
    while j < len(args):
        lit = args[j].literal()
        if lit is None:
            return "file", j  # a computed word as the script: <(…), $(…)
        if lit == "--":
            j += 1
            if j < len(args) and args[j].literal() not in _STDIN_NAMES:
                return "file", j
            return "stdin", None
        if lit in _STDIN_NAMES:
            return "stdin", j
        if lit.startswith("--"):
            opt, eq, _ = lit.partition("=")
            if opt in lang.code:
                return "code", j if eq else j + 1
            if opt in lang.module:
                return "module", None
            if opt in lang.stdin:
                return "stdin", None
            j += 2 if opt in lang.value and not eq else 1
            continue
        if lit[:1] in ("-", "+") and len(lit) > 1:
            if lit in lang.code or lit[1:] in lang.code and not lang.combined:
                return "code", j + 1
            if lit in lang.stdin:
                return "stdin", None
            letters = lit[1:] if lang.combined else ""
            skip = 1
            for k, ch in enumerate(letters):
                last = k == len(letters) - 1
                if ch in lang.code:
                    return "code", j + 1 if last else j
                if ch in lang.module:
                    return "module", None
                if ch in lang.stdin:
                    return "stdin", None
                if ch in lang.value:
                    skip = 2 if last else 1
                    break
            if not lang.combined and lit[1:] in lang.value | {v.lstrip("-") for v in lang.value}:
                skip = 2
            j += skip
            continue
        return "file", j
    return "stdin", None


@dataclass
class Analysis:
    parsed: bool = True
    error: str = ""
    download_to_interpreter: bool = False
    mentions_downloader: bool = False
    findings: list[str] = field(default_factory=list)
    programs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "parsed": self.parsed,
            "error": self.error,
            "download_to_interpreter": self.download_to_interpreter,
            "mentions_downloader": self.mentions_downloader,
            "findings": list(dict.fromkeys(self.findings))[:8],
            "programs": sorted(set(self.programs))[:32],
        }


class _Walker:
    """Follows where downloaded bytes flow: through pipes, substitutions,
    redirections and nested `sh -c` strings."""

    def __init__(self, a: Analysis) -> None:
        self.a = a

    def seq(self, s: Seq, stdin: bool, depth: int) -> bool:
        """Walk a list; return whether its output carries downloaded bytes."""
        out = False
        for p in s.pipelines:
            flow = stdin
            for c in p.commands:
                flow = self.command(c, flow, depth)
            out = out or flow
        return out

    def _tainted(self, w: Word, depth: int) -> bool:
        """Walk a word's substitutions; whether any of them outputs downloaded bytes."""
        tainted = False
        for sub in w.subs():
            if self.seq(sub.body, False, depth + 1):
                tainted = True
        return tainted

    def _redirs(self, redirs: list[Redir], stdin: bool, depth: int) -> tuple[bool, bool]:
        """(stdin carries a download, stdout is redirected away)."""
        away = False
        for rd in redirs:
            tainted = self._tainted(rd.target, depth)
            if rd.op in ("<", "<>", "<&") and rd.fd in (None, 0):
                stdin = tainted or (stdin and rd.target.literal() in _STDIN_NAMES)
            elif rd.op in ("<<", "<<-", "<<<") and rd.fd in (None, 0):
                stdin = tainted
            elif rd.op in (">", ">>", ">|", "&>", "&>>") and rd.fd in (None, 1):
                away = True
        return stdin, away

    def command(self, c: Command, stdin: bool, depth: int) -> bool:
        if isinstance(c, Group):
            stdin, away = self._redirs(c.redirs, stdin, depth)
            return self.seq(c.body, stdin, depth) and not away
        for w in c.assigns:
            self._tainted(w, depth)
        stdin, away = self._redirs(c.redirs, stdin, depth)
        words = c.words
        tainted = [self._tainted(w, depth) for w in words]
        i, via_xargs = self._unwrap(words)
        if i >= len(words):
            return stdin and not away
        prog = words[i].literal()
        if prog is None:
            if stdin or tainted[i]:
                self._find(f"downloaded bytes reach a program whose name is computed "
                           f"({words[i].show()})")
            return stdin and not away
        name = _base(prog)
        self.a.programs.append(name)
        args, args_tainted = words[i + 1 :], tainted[i + 1 :]
        if name in DOWNLOADERS:
            self.a.mentions_downloader = True
            return (_to_stdout(name, args) or stdin) and not away
        if is_interpreter(name):
            if via_xargs and stdin:
                self._find(f"xargs hands a download to {name}")
            self._interpreter(name, args, args_tainted, stdin and not via_xargs, depth)
        return stdin and not away

    def _unwrap(self, words: list[Word]) -> tuple[int, bool]:
        """Skip sudo, env, timeout, ...: the index of the real program."""
        i, via_xargs = 0, False
        while i < len(words):
            lit = words[i].literal()
            name = _base(lit) if lit is not None else ""
            if name not in _WRAPPERS:
                return i, via_xargs
            via_xargs = via_xargs or name == "xargs"
            values = _WRAPPERS[name]
            positional = _WRAPPER_POSITIONAL.get(name, 0)
            i += 1
            while i < len(words):
                nxt = words[i].literal()
                if nxt is None:
                    break
                if nxt == "--":
                    i += 1
                    break
                if nxt[:1] == "-" and len(nxt) > 1:
                    i += 2 if nxt in values else 1
                    continue
                if name == "env" and _ASSIGN.match(nxt):
                    i += 1
                    continue
                if positional:
                    positional -= 1
                    i += 1
                    continue
                break
        return i, via_xargs

    def _interpreter(self, name: str, args: list[Word], tainted: list[bool], stdin: bool,
                     depth: int) -> None:
        if name == "eval":
            if any(tainted):
                self._find("eval runs the output of a download")
            elif args and all(w.literal() is not None for w in args):
                self._nested(" ".join(w.literal() or "" for w in args), stdin, depth)
            return
        if name in ("source", "."):
            if args and tainted[0]:
                self._find(f"{name} runs a download ({args[0].show()})")
            elif args and stdin and args[0].literal() in _STDIN_NAMES:
                self._find(f"a download is piped into {name} {args[0].show()}")
            return
        lang = _lang(name)
        assert lang is not None
        where, at = _program_source(lang, args)
        if where == "stdin":
            if stdin:
                self._find(f"a download is piped into {name}, which runs it unread")
        elif where == "code" and at is not None and at < len(args):
            if tainted[at]:
                self._find(f"{name} runs the output of a download as code ({args[at].show()})")
            else:
                code = args[at].literal()
                if lang is _SHELL and code is not None:
                    self._nested(code, stdin, depth)
        elif where == "file" and at is not None and tainted[at]:
            self._find(f"{name} runs a download as its script ({args[at].show()})")
        elif where == "file" and at is not None and stdin and args[at].literal() is None:
            self._find(f"a download is piped into {name}, whose script argument "
                       f"({args[at].show()}) is computed and may be empty")

    def _nested(self, code: str, stdin: bool, depth: int) -> None:
        try:
            inner = parse_seq(code, depth + 1)
        except ShellSyntaxError as exc:
            self.a.parsed = False
            self.a.error = f"in a nested command: {exc}"
            self.a.mentions_downloader |= _mentions_downloader(code)
            return
        self.seq(inner, stdin, depth + 1)

    def _find(self, what: str) -> None:
        self.a.download_to_interpreter = True
        self.a.findings.append(what)


def _to_stdout(name: str, args: list[Word]) -> bool:
    """Whether this downloader writes what it fetches to stdout."""
    lits = [w.literal() or "" for w in args]
    nxt = [*lits[1:], ""][: len(lits)]
    stdout_names = ("-", "/dev/stdout")
    if name in ("curl", "curlie"):
        to_file = False
        for a, after in zip(lits, nxt, strict=True):
            if a in ("-O", "--remote-name", "--remote-name-all"):
                to_file = True
            elif a in ("-o", "--output"):
                to_file = after not in stdout_names
            elif a.startswith("--output="):
                to_file = a.split("=", 1)[1] not in stdout_names
            elif a[:1] == "-" and a[1:2] != "-" and len(a) > 2:
                flags = a[1:]
                if "o" in flags:
                    rest = flags[flags.index("o") + 1 :]
                    to_file = (rest or after) not in stdout_names
                elif "O" in flags:
                    to_file = True
        return not to_file
    if name in ("wget", "wget2"):
        for a, after in zip(lits, nxt, strict=True):
            if a in ("-O", "--output-document"):
                if after in stdout_names:
                    return True
            elif a.startswith("--output-document="):
                if a.split("=", 1)[1] in stdout_names:
                    return True
            elif a[:1] == "-" and a[1:2] != "-" and "O" in a:
                rest = a[a.index("O") + 1 :]
                if (rest or after) in stdout_names:
                    return True
        return False
    return True  # the others: assume they can


_DOWNLOADER_WORD = re.compile(
    r"(?<![\w.-])(" + "|".join(re.escape(d) for d in sorted(DOWNLOADERS)) + r")(?![\w.-])"
)


def _mentions_downloader(text: str) -> bool:
    return _DOWNLOADER_WORD.search(text) is not None


def analyze(command: str) -> Analysis:
    """Read `command` and report whether it runs downloaded bytes unread."""
    a = Analysis()
    try:
        seq = parse_seq(command)
        _Walker(a).seq(seq, False, 0)
    except (ShellSyntaxError, RecursionError) as exc:
        a.parsed = False
        a.error = str(exc) if isinstance(exc, ShellSyntaxError) else "nested too deeply"
        a.mentions_downloader = _mentions_downloader(command)
    return a
