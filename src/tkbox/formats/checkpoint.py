"""C2SP tlog-checkpoint: the signed head of a log.

    <origin> LF
    <tree size, decimal, no leading zero> LF
    <base64 of the 32-byte RFC 6962 root hash> LF
    <extension line, non-empty> LF      (zero or more)

It travels as the text of a signed note (`tkbox.formats.note`); the log's
signature is by a key whose name is the origin.
"""

from __future__ import annotations

from dataclasses import dataclass

from tkbox.formats import _strict
from tkbox.formats.errors import FormatError
from tkbox.formats.merkle import EMPTY_ROOT, HASH_SIZE

MAX_EXTENSIONS = 16
MAX_LINE = 1024


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        return "".join(
            f"{line}\n"
            for line in (self.origin, str(self.size), _strict.b64e(self.root), *self.extensions)
        )


def _fail(what: str, where: str) -> FormatError:
    return FormatError("checkpoint.malformed", where, what)


def parse(text: str) -> Checkpoint:
    """Parse a checkpoint note's text (with its final LF)."""
    if not text.endswith("\n"):
        raise _fail("the text does not end in a newline", "checkpoint")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise _fail("a checkpoint has an origin, a size and a root hash", "checkpoint")
    if len(lines) > 3 + MAX_EXTENSIONS:
        raise _fail(f"more than {MAX_EXTENSIONS} extension lines", "checkpoint")
    for n, line in enumerate(lines, 1):
        if not line:
            raise _fail("an empty line", f"checkpoint line {n}")
        if len(line) > MAX_LINE:
            raise _fail(f"a line longer than {MAX_LINE}", f"checkpoint line {n}")
    origin, size_s, root_s, *ext = lines
    size = _strict.decimal(size_s, "checkpoint.malformed", "checkpoint line 2",
                           maximum=_strict.INT64_MAX)
    root = _strict.b64(root_s, "checkpoint.malformed", "checkpoint line 3", length=HASH_SIZE)
    if size == 0 and root != EMPTY_ROOT:
        raise _fail("an empty tree's root hash is SHA-256 of nothing", "checkpoint line 3")
    return Checkpoint(origin, size, root, tuple(ext))
