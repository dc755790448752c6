"""The changes door's error types.

`PatchRefused` is a `tkbox.errors.Refused`: the patch (or one file of it) was
refused, and the message says what, why and where (the patch line when there
is one). Everything the parser, the checks and the writer refuse raises it;
nothing else escapes them because of input.

`ApplyFailed` is a `tkbox.errors.HostError`: the host could not write the
checkout (the disk is full, a permission, an I/O error). The message names the
file, the system's reason, and that the checkout was restored; no raw `OSError`
escapes `apply_patch`.
"""

from __future__ import annotations

from tkbox.errors import HostError, Refused


class PatchRefused(Refused):
    """The patch was refused; `str()` is one line for a person."""


class ApplyFailed(HostError):
    """Writing the checkout failed on the host; every step was undone."""
