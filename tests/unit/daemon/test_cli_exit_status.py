"""The exit statuses of `tkbox apply` (docs/exit-status.md): what a script acts on."""

from __future__ import annotations

import pytest

from tkbox.cli.main import EXIT_NEEDS_PERSON, apply_status
from tkbox.errors import Refused


def report(*statuses: str) -> dict[str, object]:
    return {"files": [{"path": f"f{i}", "status": s} for i, s in enumerate(statuses)]}


@pytest.mark.parametrize("statuses,code", [
    ((), 0),
    (("applied", "applied"), 0),
    (("would apply",), 0),
    (("applied", "held back"), EXIT_NEEDS_PERSON),
    (("held back", "refused"), Refused.exit_code),
    (("refused",), Refused.exit_code),
])
def test_apply_exits_0_only_when_every_file_was_written(statuses: tuple[str, ...],
                                                         code: int) -> None:
    assert apply_status(report(*statuses)) == code


def test_the_statuses_are_distinct_from_the_error_tree() -> None:
    assert EXIT_NEEDS_PERSON == 6 and Refused.exit_code == 5
