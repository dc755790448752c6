"""C2SP tlog-witness: the `add-checkpoint` request and response bodies.

Request (POST <submission prefix>/add-checkpoint):

    "old " <size the client believes the witness has, decimal> LF
    <base64 hash> LF                    (0..63: RFC 6962 consistency proof old -> new)
    LF
    <checkpoint, a signed note>

Response 200: one or more signature lines (the witness's cosignatures); 409:
`<the size the witness has>` LF, as `text/x.tlog.size`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tkbox.formats import _strict, note
from tkbox.formats.errors import FormatError
from tkbox.formats.merkle import HASH_SIZE

MAX_PROOF_LINES = 63
MAX_BODY = 64 * 1024
SIZE_CONTENT_TYPE = "text/x.tlog.size"


@dataclass(frozen=True)
class AddCheckpoint:
    old: int
    proof: tuple[bytes, ...]
    checkpoint: bytes  # the signed note, verbatim


def _fail(what: str, where: str) -> FormatError:
    return FormatError("witness.malformed", where, what)


def format_add_checkpoint(old: int, proof: list[bytes], checkpoint: bytes) -> bytes:
    head = f"old {old}\n" + "".join(f"{_strict.b64e(h)}\n" for h in proof) + "\n"
    return head.encode() + checkpoint


def parse_add_checkpoint(body: bytes) -> AddCheckpoint:
    if len(body) > MAX_BODY:
        raise _fail(f"{len(body)} bytes, more than {MAX_BODY}", "request")
    proof: list[bytes] = []
    pos, n = 0, 0
    old: int | None = None
    while True:
        end = body.find(b"\n", pos)
        if end < 0:
            raise _fail("the request ends before the blank line", f"request line {n + 1}")
        line = _strict.utf8(body[pos:end], "witness.malformed", f"request line {n + 1}")
        pos, n = end + 1, n + 1
        if n == 1:
            if not line.startswith("old "):
                raise _fail("the first line must be 'old <size>'", "request line 1")
            old = _strict.decimal(line[4:], "witness.malformed", "request line 1")
            continue
        if line == "":
            break
        if len(proof) == MAX_PROOF_LINES:
            raise _fail(f"more than {MAX_PROOF_LINES} proof hashes", f"request line {n}")
        proof.append(_strict.b64(line, "witness.malformed", f"request line {n}", length=HASH_SIZE))
    assert old is not None
    return AddCheckpoint(old, tuple(proof), body[pos:])


def parse_size(body: bytes) -> int:
    """The body of a 409: the witness's size for the log."""
    text = _strict.utf8(body, "witness.malformed", "409 body")
    if not text.endswith("\n") or "\n" in text[:-1]:
        raise _fail("a size body is one line", "409 body")
    return _strict.decimal(text[:-1], "witness.malformed", "409 body")


def parse_cosignatures(body: bytes) -> list[note.Signature]:
    """The body of a 200: signature lines, each '— <name> <base64>' LF."""
    if not body or len(body) > MAX_BODY:
        raise _fail("the response holds no signature lines", "response")
    # A signature block is what follows a note's blank line: reuse the note parser.
    _, sigs = note.split(b"x\n\n" + body)
    return sigs
