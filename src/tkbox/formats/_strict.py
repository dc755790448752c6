"""Strict little parsers shared by the formats: decimals, base64, text."""

from __future__ import annotations

import base64
import binascii
import codecs

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


_CHUNK = 1 << 20  # bytes looked at at once in a long line (a multiple of 4)


def utf8_span(data: bytes, start: int, end: int, code: str, where: str) -> None:
    """`utf8(data[start:end])`'s check, made a chunk at a time: the same error (the
    byte named from the span's start), and never the span copied or decoded whole."""
    view = memoryview(data)
    at = start
    while at < end:
        stop = min(at + _CHUNK, end)
        try:
            _, used = codecs.utf_8_decode(view[at:stop], "strict", stop == end)
        except UnicodeDecodeError as exc:
            raise FormatError(code, where, f"not UTF-8 at byte {at - start + exc.start}") from None
        at += used  # (a character cut by the chunk's end is decoded with the next)
    view.release()


def b64_span(data: bytes, start: int, end: int, shown: str, code: str, where: str, *,
             length: int) -> FormatError:
    """What `b64(data[start:end].decode(), length=length)` raises, for a span of UTF-8
    text too long to copy (`shown`: its first characters, at least 41), found a chunk
    at a time. Padding may only end the text, so every chunk but the last decodes on
    its own, and holds only whole 4-character groups, which re-encode as they were."""
    if not all(data[a : min(a + _CHUNK, end)].isascii() for a in range(start, end, _CHUNK)):
        return FormatError(code, where, "base64 holds a non-ASCII character")
    n = 0
    try:
        for a in range(start, end, _CHUNK):
            part = data[a : min(a + _CHUNK, end)]
            last = a + _CHUNK >= end
            if not last and b"=" in part:
                raise binascii.Error("padding before the end")
            raw = binascii.a2b_base64(part, strict_mode=True)
            if last and base64.b64encode(raw) != part:
                return FormatError(code, where, f"{_show(shown)} is not canonical base64")
            n += len(raw)
    except (binascii.Error, ValueError):
        return FormatError(code, where, f"{_show(shown)} is not valid base64")
    return FormatError(code, where, f"expected {length} bytes, base64 holds {n}")


def _show(s: str, limit: int = 40) -> str:
    """A short, printable rendering of untrusted text for an error message."""
    r = repr(s[:limit])
    return r + ("…" if len(s) > limit else "")


show = _show
