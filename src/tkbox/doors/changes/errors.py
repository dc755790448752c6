"""The changes door's one error type.

`PatchRefused` is a `tkbox.errors.Refused`: the patch (or one file of it) was
refused, and the message says what, why and where (the patch line when there
is one). Everything the parser, the checks and the writer refuse raises it;
nothing else escapes them because of input.
"""

from __future__ import annotations

from tkbox.errors import Refused


class PatchRefused(Refused):
    """The patch was refused; `str()` is one line for a person."""
