"""The `tkbox.apply` record says what the door noted: above all, that an earlier
apply into the checkout was cut short and put right (its Write decisions have no
completion, and this is where a reader of the record learns why)."""

from __future__ import annotations

from tkbox.daemon.manager import MAX_APPLY_NOTES, _apply_record

UNDONE = ("an apply into this checkout begun 2026-12-03 07:40:47 UTC was cut short; it was "
          "undone (3 path(s) put back as they were) before this one")


def _result(notes: list[str]) -> dict[str, object]:
    return {"patch_sha256": "ab" * 32, "counts": {"applied": 1}, "allow_sensitive": False,
            "files": [{"path": "a", "status": "applied"}], "notes": notes}


def test_the_door_s_notes_are_in_the_record() -> None:
    rec = _apply_record(_result([UNDONE]))
    assert rec["notes"] == [UNDONE]


def test_the_notes_are_bounded_in_number_and_length() -> None:
    rec = _apply_record(_result(["x" * 10_000] * 100))
    assert len(rec["notes"]) == MAX_APPLY_NOTES and all(len(n) == 300 for n in rec["notes"])
