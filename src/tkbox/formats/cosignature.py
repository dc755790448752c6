"""C2SP tlog-cosignature, Ed25519 `cosignature/v1` (signature type 0x04).

A witness's cosignature is an ordinary signed-note signature line on the
checkpoint, whose bytes after the key ID are

    timestamp (uint64, big-endian, POSIX seconds, <= 2^63 - 1) || Ed25519 signature (64)

over the message

    "cosignature/v1" LF "time " <timestamp, decimal> LF <checkpoint note text>

The key ID is SHA-256(name || LF || 0x04 || public key)[:4]; the verifier key
is `name+<id>+base64(0x04 || public key)`.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from tkbox.formats import _strict, note
from tkbox.formats.errors import FormatError
from tkbox.formats.note import NoteError, Signature

ALG_COSIGNATURE_V1 = 0x04
SIG_SIZE = 8 + 64


def message(timestamp: int, checkpoint_text: bytes) -> bytes:
    return b"cosignature/v1\ntime %d\n" % timestamp + checkpoint_text


def timestamp(sig: Signature) -> int:
    """The timestamp of a cosignature (checked to be one by the caller)."""
    return int(struct.unpack(">Q", sig.raw[:8])[0])


class CosignatureVerifier(note.Verifier):
    def __init__(self, name: str, public_key: bytes) -> None:
        if not note.valid_name(name) or len(public_key) != 32:
            raise NoteError("note.bad-key", "", "malformed verifier id")
        self.name = name
        self.public_key = public_key
        self.key_id = note.key_id(name, bytes([ALG_COSIGNATURE_V1]) + public_key)
        self._key = Ed25519PublicKey.from_public_bytes(public_key)

    def verify(self, text: bytes, sig: bytes) -> bool:
        if len(sig) != SIG_SIZE:
            return False
        (ts,) = struct.unpack(">Q", sig[:8])
        if ts > _strict.INT64_MAX:
            return False
        try:
            self._key.verify(sig[8:], message(ts, text))
        except InvalidSignature:
            return False
        return True

    def vkey(self) -> str:
        typed = bytes([ALG_COSIGNATURE_V1]) + self.public_key
        return f"{note.key_tag(self.name, self.key_id)}+{_strict.b64e(typed)}"


class CosignatureSigner(note.Signer):
    """Signs `cosignature/v1` with the time from `clock` (POSIX seconds)."""

    def __init__(self, name: str, seed: bytes, clock: Callable[[], float] = time.time) -> None:
        if not note.valid_name(name) or len(seed) != 32:
            raise NoteError("note.bad-key", "", "malformed signer id")
        self.name = name
        self.seed = seed
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self.public_key = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key_id = note.key_id(name, bytes([ALG_COSIGNATURE_V1]) + self.public_key)
        self._clock = clock

    def sign(self, text: bytes) -> bytes:
        ts = int(self._clock())
        if not 0 < ts <= _strict.INT64_MAX:
            raise NoteError("note.invalid-signer", "", "the clock gives no valid timestamp")
        return struct.pack(">Q", ts) + self._key.sign(message(ts, text))

    def verifier(self) -> CosignatureVerifier:
        return CosignatureVerifier(self.name, self.public_key)

    def skey(self) -> str:
        typed = bytes([ALG_COSIGNATURE_V1]) + self.seed
        return f"PRIVATE+KEY+{note.key_tag(self.name, self.key_id)}+{_strict.b64e(typed)}"


def generate(name: str, clock: Callable[[], float] = time.time) -> CosignatureSigner:
    key = Ed25519PrivateKey.generate()
    seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return CosignatureSigner(name, seed, clock)


def parse_vkey(vkey: str) -> CosignatureVerifier:
    name, _, typed = note.split_vkey(vkey)
    if typed[0] != ALG_COSIGNATURE_V1:
        raise NoteError("note.bad-key", "",
                        "unknown verifier algorithm (a witness key is type 0x04)")
    if len(typed) != 33:
        raise NoteError("note.bad-key", "", "malformed verifier id")
    return CosignatureVerifier(name, typed[1:])


def parse_skey(skey: str, clock: Callable[[], float] = time.time) -> CosignatureSigner:
    """`PRIVATE+KEY+name+id+base64(0x04 || seed)`, the note skey form with type 0x04."""
    parts = skey.split("+", 4)
    if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
        raise NoteError("note.bad-key", "", "malformed signer id")
    _, _, name, hex_id, key64 = parts
    try:
        typed = _strict.b64(key64, "note.bad-key", "signer key")
    except FormatError:
        raise NoteError("note.bad-key", "", "malformed signer id") from None
    if len(typed) != 33 or typed[0] != ALG_COSIGNATURE_V1:
        raise NoteError("note.bad-key", "", "malformed signer id")
    signer = CosignatureSigner(name, typed[1:], clock)
    if f"{signer.key_id:08x}" != hex_id:
        raise NoteError("note.bad-key", "", "invalid signer hash")
    return signer
