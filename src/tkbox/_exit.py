"""How a command ends on an error: one printable line on stderr, the class's status.

`exit_with` is the one error printer of every `tkbox` command and sub-app (the
CLI, `tkbox signer`, `tkbox image`, `tkbox verify`, the daemon's `main`); it lives
at the bottom layer, beside `errors`, so that every one of them may import it,
and apart from `errors`, which the pure cores import.
"""

from __future__ import annotations

import sys
from typing import NoReturn, TextIO

from tkbox.errors import TkboxError

#: the longest message `error_line` prints whole (a message may quote hostile bytes)
MAX_ERROR_LINE = 4000


def error_line(exc: TkboxError) -> str:
    """The error as the CLI says it: `tkbox: error: MESSAGE`, one line.

    Whatever the message quotes (a guest's, a registry's or a peer's bytes), what
    reaches a terminal is printable: a control or format character (ESC, BEL, a
    bidi override) is shown as its escape, so no message can move the cursor, recolour
    the screen or forge a second line; past `MAX_ERROR_LINE` characters it is cut.
    """
    text = str(exc)
    if len(text) > MAX_ERROR_LINE:
        text = text[:MAX_ERROR_LINE] + "…"
    safe = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return f"tkbox: error: {safe}"


def exit_with(exc: TkboxError, stream: TextIO | None = None) -> NoReturn:
    """End a command on `exc`: its `error_line` on stderr, and its class's exit status.

    Raises `SystemExit`, which typer and click let through, so a sub-app's command
    ends the same way run under `tkbox` or alone (`CliRunner`, `python -m`).
    """
    out = stream or sys.stderr
    print(error_line(exc), file=out, flush=True)
    raise SystemExit(exc.exit_code)
