"""The one error the formats raise: `FormatError` (a `BundleError`)."""

from __future__ import annotations

from tkbox.errors import BundleError


class FormatError(BundleError):
    """Malformed or non-verifying input.

    `code` is stable and short (`note.malformed`, `record.chain`, ...) for
    programs and tests; `where` names the part of the input (`record 3`,
    `bundle line 12`, `checkpoint`); `what` says what was wrong.
    """

    def __init__(self, code: str, where: str, what: str) -> None:
        self.code = code
        self.where = " ".join(where.split())
        self.what = " ".join(what.split())
        super().__init__(f"{self.where}: {self.what}" if self.where else self.what)

    def at(self, where: str) -> FormatError:
        """The same error, placed inside an outer part (`where` prefixed)."""
        inner = f"{where}, {self.where}" if self.where else where
        err = FormatError(self.code, inner, self.what)
        err.__cause__ = self.__cause__
        return err
