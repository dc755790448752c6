"""Checks before a box starts and before a command runs: no value goes in.

- `load_secrets`: the `--secret` specs, with values the client read (the CLI
  reads `env:`/`file:` in the user's own shell and sends them over the
  daemon's private socket) or, for a name the client sent no value for, read
  by the daemon from its own environment or files.
- `check_workspace`: every regular file of the checkout that would be copied
  into the box (not `.git`, whose objects are compressed, nor credential
  files, which are never copied) is scanned, streaming, for every value in
  every form the leak scanner knows; a hit refuses the box, naming the file
  and the secret.
- `check_command`: a command line, a per-command environment value or stdin
  holding a value is refused (the command should use the placeholder).

Messages name secrets and files, never a byte of a value; nested or
overlapping values are refused at load (`spec.overlap`), so no message can
show part of one by naming another.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tkbox.doors.secrets.credentials import is_credential
from tkbox.doors.secrets.leaks import LeakScanner, patterns
from tkbox.doors.secrets.spec import (
    MAX_SECRETS,
    Secret,
    check_distinct,
    check_value,
    parse_spec,
    placeholder,
    read_value,
)
from tkbox.errors import Refused, UserError

INSPECT_MODES = ("", "bound", "all")
CHUNK = 1 << 20


def load_secrets(specs: Sequence[str], values: Mapping[str, str],
                 inspect: str = "") -> list[Secret]:
    if inspect not in INSPECT_MODES:
        raise UserError(f"--inspect {inspect[:20]!r} is not known; use --inspect all "
                        "(every allowed host is read) or leave it out (bound hosts only)")
    out: list[Secret] = []
    names = set()
    for text in specs:
        spec = parse_spec(text)
        if spec.name in names:
            raise UserError(f"--secret {spec.name} is given twice; give each name once")
        names.add(spec.name)
        if len(out) >= MAX_SECRETS:
            raise UserError(f"more than {MAX_SECRETS} --secret flags")
        if spec.name in values:
            value = check_value(spec.name, values[spec.name].encode("utf-8", "surrogateescape"))
        else:
            value = read_value(spec)
        check_distinct(spec, value, out)
        out.append(Secret(spec, value, placeholder(spec.name)))
    extra = set(values) - names
    if extra:
        raise UserError(f"a value was sent for {sorted(extra)[0]!r}, which no --secret names")
    return out


def _scanner(secrets: Iterable[Secret]) -> LeakScanner:
    return LeakScanner(patterns([(s.name, "value", s.value) for s in secrets]))


def refuse_values(secrets: Sequence[Secret], data: bytes, where: str) -> None:
    if not secrets or not data:
        return
    hits = _scanner(secrets).feed(data)
    if hits:
        raise Refused(f"refused: {where} holds the value of secret {hits[0].name}; "
                      f"use its placeholder (${hits[0].name} in the box) instead")


def check_command(secrets: Sequence[Secret], argv: Sequence[str],
                  env: Mapping[str, str] | None, stdin: bytes | None) -> None:
    if not secrets:
        return
    enc = "utf-8"
    refuse_values(secrets, "\0".join(argv).encode(enc, "surrogateescape"), "the command line")
    for k, v in (env or {}).items():
        refuse_values(secrets, f"{k}={v}".encode(enc, "surrogateescape"),
                      f"the command's environment variable {k[:64]}")
    if stdin:
        refuse_values(secrets, stdin, "the command's stdin")


def check_workspace(secrets: Sequence[Secret], root: Path) -> None:
    """Refuse a checkout holding any value (see the module docstring)."""
    if not secrets:
        return
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        keep = []
        for d in dirnames:
            rel = d if rel_dir == "." else f"{rel_dir}/{d}"
            if d == ".git" or is_credential(rel, True) or os.path.islink(os.path.join(dirpath, d)):
                continue
            keep.append(d)
        dirnames[:] = keep
        for f in filenames:
            rel = f if rel_dir == "." else f"{rel_dir}/{f}"
            path = os.path.join(dirpath, f)
            if is_credential(rel, False) or os.path.islink(path) or not os.path.isfile(path):
                continue
            scanner = _scanner(secrets)
            try:
                with open(path, "rb") as fh:
                    while chunk := fh.read(CHUNK):
                        hits = scanner.feed(chunk)
                        if hits:
                            raise UserError(
                                f"workspace file {rel[:200]} holds the value of secret "
                                f"{hits[0].name}; remove it from the checkout (the box must "
                                "only ever see the placeholder)")
            except OSError:
                continue  # unreadable here means not copied either


MIN_HELD_PREFIX = 4


class InputGuard:
    """Keystrokes into a command's terminal, where nothing can wait for a whole body.

    Bytes go on at once, except while the last ones typed could begin a value (at
    least its first 4 bytes, any case): those wait for the next keystroke to show
    they do not. A completed value is refused, so at most its first 3 bytes were
    ever sent. Only the raw form is guarded here (nobody types base64).
    """

    def __init__(self, secrets: Sequence[Secret]) -> None:
        self.values = [(s.name, s.value.lower()) for s in secrets]
        self.longest = max((len(v) for _, v in self.values), default=0)
        self.sent = b""  # the last bytes already sent (matching may start in them)
        self.held = b""

    def feed(self, data: bytes) -> bytes:
        if not self.values:
            return data
        buf = self.held + data
        low = (self.sent + buf).lower()
        for name, v in self.values:
            if v in low:
                self.held = b""
                raise Refused(f"refused: the terminal input holds the value of secret {name}; "
                              f"use its placeholder (${name} in the box) instead")
        hold = 0
        for _, v in self.values:
            for k in range(min(len(v) - 1, len(low)), MIN_HELD_PREFIX - 1, -1):
                if low.endswith(v[:k]):
                    hold = max(hold, min(k, len(buf)))
                    break
        out = buf[:len(buf) - hold]
        self.held = buf[len(buf) - hold:] if hold else b""
        self.sent = (self.sent + out)[-self.longest:]
        return out
