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
    (("applied", "set apart"), 0),  # ignored files (build output, caches) are not a failure
    (("applied", "held back"), EXIT_NEEDS_PERSON),
    (("held back", "refused"), Refused.exit_code),
    (("refused",), Refused.exit_code),
])
def test_apply_exits_0_only_when_every_file_was_written(statuses: tuple[str, ...],
                                                         code: int) -> None:
    assert apply_status(report(*statuses)) == code


def test_the_statuses_are_distinct_from_the_error_tree() -> None:
    assert EXIT_NEEDS_PERSON == 6 and Refused.exit_code == 5


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("15m", 900), ("2H", 7200)])
def test_timeout_durations(text: str, seconds: int) -> None:
    from tkbox.cli.main import parse_duration

    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "1.5m", "10d", "m", "9999999999s"])
def test_a_bad_timeout_is_a_user_error(text: str) -> None:
    from tkbox.cli.main import parse_duration
    from tkbox.errors import UserError

    with pytest.raises(UserError, match="--timeout"):
        parse_duration(text)
