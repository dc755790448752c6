"""The download-exec pack's reading of a command: does it run downloaded content
without anyone reading it first?

This is a parser, not a pattern match: `curl … | sh`, `wget -qO- … | sudo
bash -s`, `python3 <(curl …)`, `sh -c "$(curl …)"`, `bash <<< "$(wget -O- …)"`,
`eval "$(curl …)"`, `bash -c 'curl … | sh'` and `curl … | tee x | sh` are all
the same finding: bytes from a downloader reach an interpreter as its program.
Downloading to a file and running it later is not (someone could read it).

The command line is read by `tkbox.signer.bash`; this module follows where
downloaded bytes flow through the tree (pipes, substitutions, redirections,
wrappers such as `sudo` and `env`, nested `sh -c` strings). What the reader
cannot read is reported (`parsed: False`), and the policy
(`packs/download-exec.cedar`) then refuses a command that mentions a
downloader rather than guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tkbox.signer.bash import (
    ASSIGN,
    Command,
    Group,
    Redir,
    Seq,
    ShellSyntaxError,
    Word,
    parse_seq,
)

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
                if name == "env" and ASSIGN.match(nxt):
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
