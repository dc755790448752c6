"""The record's own fields: its time, and its leaf hash."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tkbox.formats import FormatError, merkle, record


def _open(time: str | None = None) -> record.Record:
    return record.make("r", 0, None, record.OPEN, {"isolation": "same-user"}, time=time)


def test_a_record_time_takes_only_ascii_digits() -> None:
    """`\\d` in a str pattern would take any Unicode digit: a record's time is
    RFC 3339, whose digits are ASCII."""
    good = _open("2026-01-02T03:04:05.678Z")
    assert record.parse(good.raw).time == "2026-01-02T03:04:05.678Z"
    odd = good.raw.replace(b'"time":"2', '"time":"\u0662'.encode())
    with pytest.raises(FormatError) as exc:
        record.parse(odd)
    assert exc.value.code == "record.schema"


def test_now_is_the_utc_clock_in_the_record_format(monkeypatch: pytest.MonkeyPatch) -> None:
    before = datetime.now(UTC)
    stamp = record.now()
    after = datetime.now(UTC)
    assert record.TIME.fullmatch(stamp)
    t = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert before - timedelta(milliseconds=1) <= t <= after
    # The second's text is made once per second: each millisecond and second still shows.
    for ns, want in [(1_767_225_599_999_000_000, "2025-12-31T23:59:59.999Z"),
                     (1_767_225_600_000_999_999, "2026-01-01T00:00:00.000Z"),
                     (1_767_225_600_042_000_000, "2026-01-01T00:00:00.042Z"),
                     (1_767_225_599_001_000_000, "2025-12-31T23:59:59.001Z")]:
        monkeypatch.setattr(record, "time_ns", lambda ns=ns: ns)
        assert record.now() == want


def test_the_leaf_hash_is_computed_once_and_is_rfc_6962s() -> None:
    rec = _open()
    assert rec.hash == merkle.leaf_hash(rec.raw)
    assert rec.hash is rec.hash
    assert rec == record.parse(rec.raw)  # the kept hash is not part of what a record is


@pytest.mark.parametrize(("n", "ok"), [(9007199254740991, True), (-9007199254740991, True),
                                       (9007199254740992, False), (-9007199254740992, False),
                                       (10**20, False)])
def test_read_links_checks_the_integers_of_the_record_that_has_long_ones(n: int, ok: bool) -> None:
    """`read_links` checks integers only in records with a run of 16 digits or more;
    one such record among others is read exactly as `parse` reads it, and named."""
    recs = [_open()]
    for seq in (1, 2, 3):  # (a completion: the decision it names is what its link keeps)
        recs.append(record.make("r", seq, recs[-1].hash, record.COMPLETE, {"decision": seq}))
    raws = [r.raw for r in recs]
    raws[2] = raws[2].replace(b'"decision":2', b'"decision":%d' % n)
    if ok:
        assert record.read_links(raws)[2].fact == n
        assert record.read_links(raws)[2] == record.link(record.parse(raws[2]))
    else:
        with pytest.raises(FormatError) as exc:
            record.read_links(raws, first=40)
        assert exc.value.where == "record 42"
