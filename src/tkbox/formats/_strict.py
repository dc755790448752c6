"""Strict little parsers shared by the formats: decimals, base64, text."""

from __future__ import annotations

import base64
import binascii

from tkbox.formats.errors import FormatError

UINT64_MAX = (1 << 64) - 1
INT64_MAX = (1 << 63) - 1


def decimal(s: str, code: str, where: str, *, maximum: int = UINT64_MAX) -> int:
    """A non-negative decimal with no sign, no leading zero, no space, <= maximum."""
    if not s or len(s) > 20 or not s.isascii() or not s.isdigit():
        raise FormatError(code, where, f"{_show(s)} is not a decimal number")
    if s[0] == "0" and s != "0":
        raise FormatError(code, where, f"{_show(s)} has a leading zero")
    n = int(s)
    if n > maximum:
        raise FormatError(code, where, f"{s} is larger than {maximum}")
    return n


def b64(s: str, code: str, where: str, *, length: int | None = None) -> bytes:
    """Standard padded base64 (RFC 4648 §4) that re-encodes to the same text."""
    if not s.isascii():
        raise FormatError(code, where, "base64 holds a non-ASCII character")
    try:
        raw = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise FormatError(code, where, f"{_show(s)} is not valid base64") from None
    if base64.b64encode(raw).decode() != s:
        raise FormatError(code, where, f"{_show(s)} is not canonical base64")
    if length is not None and len(raw) != length:
        raise FormatError(code, where, f"expected {length} bytes, base64 holds {len(raw)}")
    return raw


def b64e(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def utf8(data: bytes, code: str, where: str) -> str:
    try:
        return data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise FormatError(code, where, f"not UTF-8 at byte {exc.start}") from None


def _show(s: str, limit: int = 40) -> str:
    """A short, printable rendering of untrusted text for an error message."""
    r = repr(s[:limit])
    return r + ("…" if len(s) > limit else "")


show = _show
