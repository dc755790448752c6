"""C2SP signed-note, byte-compatible with Go's `golang.org/x/mod/sumdb/note`.

A note is UTF-8 text (no control character but LF), a blank line, then one
or more signature lines:

    <text, each line ending in LF>
    LF
    "— " <key name> " " base64(key ID [4, big-endian] || signature) LF   (1..100)

The text ends at the *last* blank line (it may hold blank lines itself) and
includes its final LF. A key is named by (name, key ID), where

    key ID = SHA-256(name || LF || type byte || public key)[:4]

and its verifier key is written `name+<8 lowercase hex of key ID>+base64(type
byte || public key)`. Type 0x01 is Ed25519 over the text (this module); type
0x04, the timestamped cosignature, lives in `tkbox.formats.cosignature` and
plugs in through the same `Verifier` interface.

`open_note` follows Go's `note.Open`: signatures by unknown keys are kept
aside (unverified), a signature by a known key must verify or the whole note
is refused, duplicates are collapsed, and at least one known signature must
verify. Stricter than Go in one way only: base64 must be canonical (its
unused low bits zero), since we accept only the canonical form of anything.

Errors are `NoteError` (a `FormatError`) whose message starts with Go's own
error string (`malformed note`, `unknown key N+H`, `invalid signature for
key N+H`, ...), and whose `code` says which.
"""

from __future__ import annotations

import hashlib
import struct
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from tkbox.formats import _strict
from tkbox.formats.errors import FormatError

ALG_ED25519 = 0x01
SIG_PREFIX = "— "  # U+2014 EM DASH, then a space: E2 80 94 20
MAX_SIGNATURES = 100  # Go's limit; C2SP asks verifiers to accept at least 16
MAX_NOTE = 1 << 20


class NoteError(FormatError):
    pass


def _err(code: str, what: str, where: str = "") -> NoteError:
    return NoteError(f"note.{code}", where, what)


def _malformed(detail: str, where: str = "") -> NoteError:
    return _err("malformed", f"malformed note: {detail}", where)


def _go_space(c: str) -> bool:
    """Go's unicode.IsSpace: Latin-1 spaces, NEL, NBSP, and category Z."""
    return c in "\t\n\v\f\r \x85\xa0" or (c > "\xff" and unicodedata.category(c)[0] == "Z")


def valid_name(name: str) -> bool:
    """Go's isValidName: non-empty, no Unicode whitespace, no '+'."""
    return bool(name) and "+" not in name and not any(_go_space(c) for c in name)


def key_id(name: str, typed_key: bytes) -> int:
    """SHA-256(name || 0x0A || type byte || public key)[:4], big-endian."""
    digest = hashlib.sha256(name.encode() + b"\n" + typed_key).digest()
    return int.from_bytes(digest[:4], "big")


def key_tag(name: str, kid: int) -> str:
    return f"{name}+{kid:08x}"


@dataclass(frozen=True)
class Signature:
    """One signature line: who (name, key ID) and the algorithm's bytes."""

    name: str
    key_id: int
    raw: bytes  # after the 4-byte key ID
    #: the base64 text as given, for a signature built with `from_b64` and not
    #: checked yet (Go's Note.Sigs hold text; `sign` checks what it keeps)
    given_b64: str | None = None

    @classmethod
    def from_b64(cls, name: str, kid: int, b64: str) -> Signature:
        return cls(name, kid, b"", b64)

    @property
    def b64(self) -> str:
        if self.given_b64 is not None:
            return self.given_b64
        return _strict.b64e(struct.pack(">I", self.key_id) + self.raw)

    def checked(self) -> Signature:
        """This signature with its base64 decoded and its key ID checked."""
        if self.given_b64 is None:
            return self
        try:
            raw = _strict.b64(self.given_b64, "note.malformed", "signature")
        except FormatError:
            raise _malformed("an existing signature is not base64") from None
        if len(raw) < 4 or int.from_bytes(raw[:4], "big") != self.key_id:
            raise _malformed("an existing signature does not start with its key ID")
        return Signature(self.name, self.key_id, raw[4:])

    def line(self) -> str:
        return f"{SIG_PREFIX}{self.name} {self.b64}\n"


@dataclass(frozen=True)
class Note:
    text: str
    sigs: tuple[Signature, ...] = ()  # verified by a known key
    unverified: tuple[Signature, ...] = ()  # by keys we do not know


class Verifier(ABC):
    name: str
    key_id: int

    @abstractmethod
    def verify(self, text: bytes, sig: bytes) -> bool:
        """Whether `sig` (the bytes after the key ID) signs the note text."""


class Signer(ABC):
    name: str
    key_id: int

    @abstractmethod
    def sign(self, text: bytes) -> bytes:
        """The signature bytes (without the key ID) over the note text."""


class Ed25519Verifier(Verifier):
    def __init__(self, name: str, public_key: bytes) -> None:
        if not valid_name(name) or len(public_key) != 32:
            raise _err("bad-key", "malformed verifier id")
        self.name = name
        self.public_key = public_key
        self.key_id = key_id(name, bytes([ALG_ED25519]) + public_key)
        self._key = Ed25519PublicKey.from_public_bytes(public_key)

    def verify(self, text: bytes, sig: bytes) -> bool:
        if len(sig) != 64:
            return False
        try:
            self._key.verify(sig, text)
        except InvalidSignature:
            return False
        return True

    def vkey(self) -> str:
        typed = bytes([ALG_ED25519]) + self.public_key
        return f"{key_tag(self.name, self.key_id)}+{_strict.b64e(typed)}"


class Ed25519Signer(Signer):
    def __init__(self, name: str, seed: bytes) -> None:
        if len(seed) != 32:
            raise _err("bad-key", "malformed signer id")
        self.name = name
        self.seed = seed
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self.public_key = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key_id = key_id(name, bytes([ALG_ED25519]) + self.public_key)

    def sign(self, text: bytes) -> bytes:
        return self._key.sign(text)

    def verifier(self) -> Ed25519Verifier:
        return Ed25519Verifier(self.name, self.public_key)

    def skey(self) -> str:
        return (f"PRIVATE+KEY+{key_tag(self.name, self.key_id)}+"
                f"{_strict.b64e(bytes([ALG_ED25519]) + self.seed)}")


def generate(name: str) -> Ed25519Signer:
    """A new Ed25519 note signer called `name`."""
    if not valid_name(name):
        raise _err("bad-key", "invalid signer")
    key = Ed25519PrivateKey.generate()
    seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return Ed25519Signer(name, seed)


def _chop(s: str, sep: str) -> tuple[str, str]:
    """Go's chop: split at the first `sep`; everything and "" if absent."""
    i = s.find(sep)
    return (s, "") if i < 0 else (s[:i], s[i + len(sep) :])


def _hex8(s: str) -> int | None:
    if len(s) != 8 or any(c not in "0123456789abcdef" for c in s):
        return None
    return int(s, 16)


def split_vkey(vkey: str) -> tuple[str, int, bytes]:
    """(name, key ID, type byte || key) of a verifier key, checked against its ID."""
    name, rest = _chop(vkey, "+")
    hex_id, key64 = _chop(rest, "+")
    kid = _hex8(hex_id)
    try:
        typed = _strict.b64(key64, "note.bad-key", "verifier key")
    except FormatError:
        typed = b""
    if kid is None or not typed or not valid_name(name):
        raise _err("bad-key", "malformed verifier id")
    if kid != key_id(name, typed):
        raise _err("bad-key", "invalid verifier hash")
    return name, kid, typed


def parse_vkey(vkey: str) -> Verifier:
    """Go's NewVerifier for Ed25519 (type 0x01) verifier keys."""
    name, _, typed = split_vkey(vkey)
    if typed[0] != ALG_ED25519:
        raise _err("bad-key", "unknown verifier algorithm")
    if len(typed) != 33:
        raise _err("bad-key", "malformed verifier id")
    return Ed25519Verifier(name, typed[1:])


def parse_skey(skey: str) -> Ed25519Signer:
    """Go's NewSigner: `PRIVATE+KEY+name+id+base64(0x01 || seed)`."""
    priv1, rest = _chop(skey, "+")
    priv2, rest = _chop(rest, "+")
    name, rest = _chop(rest, "+")
    hex_id, key64 = _chop(rest, "+")
    kid = _hex8(hex_id)
    try:
        typed = _strict.b64(key64, "note.bad-key", "signer key")
    except FormatError:
        typed = b""
    if priv1 != "PRIVATE" or priv2 != "KEY" or kid is None or not typed or not valid_name(name):
        raise _err("bad-key", "malformed signer id")
    if typed[0] != ALG_ED25519:
        raise _err("bad-key", "unknown signer algorithm")
    if len(typed) != 33:
        raise _err("bad-key", "malformed signer id")
    signer = Ed25519Signer(name, typed[1:])
    if signer.key_id != kid:
        raise _err("bad-key", "invalid signer hash")
    return signer


class Verifiers:
    """Go's VerifierList: look a key up by (name, key ID)."""

    def __init__(self, verifiers: Iterable[Verifier] = ()) -> None:
        self._by: dict[tuple[str, int], list[Verifier]] = {}
        for v in verifiers:
            self._by.setdefault((v.name, v.key_id), []).append(v)

    def lookup(self, name: str, kid: int) -> Verifier:
        found = self._by.get((name, kid), [])
        if not found:
            raise _err("unknown-key", f"unknown key {key_tag(name, kid)}")
        if len(found) > 1:
            raise _err("ambiguous-key", f"ambiguous key {key_tag(name, kid)}")
        return found[0]

    def knows(self, name: str, kid: int) -> bool:
        return (name, kid) in self._by


def _check_chars(msg: bytes) -> str:
    text = _strict.utf8(msg, "note.malformed", "note")
    for i, ch in enumerate(text):
        if ch < " " and ch != "\n":
            line = text.count("\n", 0, i) + 1
            raise _malformed(f"control character U+{ord(ch):04X}", f"line {line}")
    return text


def split(msg: bytes, *, max_size: int = MAX_NOTE) -> tuple[str, list[Signature]]:
    """Parse a note's text and signature lines, without verifying anything."""
    if len(msg) > max_size:
        raise _malformed(f"{len(msg)} bytes, more than {max_size}")
    try:
        whole = _check_chars(msg)
    except NoteError:
        raise
    except FormatError as exc:
        raise _malformed(exc.what) from None
    cut = whole.rfind("\n\n")
    if cut < 0:
        raise _malformed("no blank line before the signatures")
    text, block = whole[: cut + 1], whole[cut + 2 :]
    if not block or not block.endswith("\n"):
        raise _malformed("the signature block is empty or does not end in a newline")
    first_line = text.count("\n") + 2
    sigs: list[Signature] = []
    for n, line in enumerate(block[:-1].split("\n")):
        where = f"line {first_line + n}"
        if not line.startswith(SIG_PREFIX):
            raise _malformed("a signature line must start with '— '", where)
        name, b64 = _chop(line[len(SIG_PREFIX) :], " ")
        if not valid_name(name) or not b64:
            raise _malformed("a signature line needs a key name and a signature", where)
        try:
            raw = _strict.b64(b64, "note.malformed", where)
        except FormatError as exc:
            raise _malformed(exc.what, where) from None
        if len(raw) < 5:
            raise _malformed("a signature is a 4-byte key ID and at least one byte", where)
        if len(sigs) == MAX_SIGNATURES:
            raise _malformed(f"more than {MAX_SIGNATURES} signatures", where)
        sigs.append(Signature(name, int.from_bytes(raw[:4], "big"), raw[4:]))
    return text, sigs


def open_note(msg: bytes, known: Verifiers, *, max_size: int = MAX_NOTE) -> Note:
    """Go's note.Open: parse, and verify every signature by a known key."""
    text, sigs = split(msg, max_size=max_size)
    text_bytes = text.encode()
    verified: list[Signature] = []
    unverified: list[Signature] = []
    seen: set[tuple[str, int]] = set()
    seen_unverified: set[Signature] = set()
    for sig in sigs:
        try:
            v = known.lookup(sig.name, sig.key_id)
        except NoteError as exc:
            if exc.code != "note.unknown-key":
                raise
            if sig not in seen_unverified:  # drop repeated identical lines
                seen_unverified.add(sig)
                unverified.append(sig)
            continue
        if v.name != sig.name or v.key_id != sig.key_id:
            raise _err("mismatched-verifier", "verifier name or hash doesn't match signature")
        if (sig.name, sig.key_id) in seen:  # one signature per known key
            continue
        seen.add((sig.name, sig.key_id))
        if not v.verify(text_bytes, sig.raw):
            raise _err("invalid-signature",
                       f"invalid signature for key {key_tag(sig.name, sig.key_id)}")
        verified.append(sig)
    if not verified:
        raise _err("unverified", "note has no verifiable signatures")
    return Note(text, tuple(verified), tuple(unverified))


def sign(note: Note | str, signers: Sequence[Signer]) -> bytes:
    """Go's note.Sign: the text, a blank line, the kept old signatures, the new ones.

    An old signature by a key that signs now is replaced by the new one.
    """
    if isinstance(note, str):
        note = Note(note)
    if not note.text.endswith("\n"):
        raise _malformed("the text must end in a newline")
    text_bytes = note.text.encode()
    new: list[str] = []
    have: set[tuple[str, int]] = set()
    for s in signers:
        have.add((s.name, s.key_id))
        if not valid_name(s.name):
            raise _err("invalid-signer", "invalid signer")
        new.append(Signature(s.name, s.key_id, s.sign(text_bytes)).line())
    old: list[str] = []
    for sig in (*note.sigs, *note.unverified):
        if not valid_name(sig.name):
            raise _malformed("an existing signature has an invalid name")
        if (sig.name, sig.key_id) in have:
            continue
        old.append(sig.checked().line())
    return (note.text + "\n" + "".join(old) + "".join(new)).encode()
