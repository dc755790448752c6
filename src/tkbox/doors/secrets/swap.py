"""Swapping a placeholder for the value in the bound header. Pure.

The bound header's value (leading and trailing spaces and tabs ignored) must
be exactly one of these, with PH the secret's placeholder:

- `PH`                    -> `VALUE`
- `Bearer PH`, `token PH` -> `Bearer VALUE`, `token VALUE` (scheme case kept)
- `Basic B64`             where B64 is strict base64 (RFC 7617 §2) of
                            `user:password` and `user` or `password` (or
                            both) equals PH -> the same with VALUE there,
                            re-encoded

Anything else is no swap (`None`); the caller then treats a placeholder or
value in that header as a leak, so a form we do not understand never carries
either anywhere.
"""

from __future__ import annotations

import base64
import binascii

SCHEMES = (b"bearer", b"token")
MAX_BASIC = 16384


def swap(header_value: bytes, placeholder: bytes, value: bytes) -> bytes | None:
    """The header value with the placeholder swapped, or None if it is not a swap form."""
    v = header_value.strip(b" \t")
    if v == placeholder:
        return value
    scheme, sp, rest = v.partition(b" ")
    if not sp:
        return None
    rest = rest.strip(b" \t")
    low = scheme.lower()
    if low in SCHEMES:
        return scheme + b" " + value if rest == placeholder else None
    if low == b"basic":
        if len(rest) > MAX_BASIC:
            return None
        try:
            plain = base64.b64decode(rest, validate=True)
        except (binascii.Error, ValueError):
            return None
        user, colon, password = plain.partition(b":")
        if not colon:
            return None
        swapped = False
        if user == placeholder:
            user, swapped = value, True
        if password == placeholder:
            password, swapped = value, True
        if not swapped:
            return None
        return scheme + b" " + base64.b64encode(user + b":" + password)
    return None
