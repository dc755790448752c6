"""Heads and trailers are scanned joined, once: the work is linear in their bytes.

Attack stopped: a guest sending thousands of tiny trailers (or plain-http
headers) made the door build a scanner per item, each looking at its own span,
on the event loop every box shares. And a placeholder split between two
headers or trailers is still a leak.
"""

from __future__ import annotations

from typing import Any

import pytest

from tkbox.doors.secrets import Secret, SecretSpec
from tkbox.doors.secrets import leaks as scan_mod
from tkbox.doors.secrets.leaks import LeakScanner
from tkbox.doors.secrets.rules import SecretLeak, TunnelRules


class _CountingScanner(LeakScanner):
    made: list[LeakScanner] = []

    def __init__(self, pats: Any) -> None:
        super().__init__(pats)
        _CountingScanner.made.append(self)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[LeakScanner]:
    made: list[LeakScanner] = []
    monkeypatch.setattr(_CountingScanner, "made", made)
    monkeypatch.setattr(scan_mod, "LeakScanner", _CountingScanner)
    return made


def _rules() -> TunnelRules:
    sec = Secret(SecretSpec("GH", "env", "GH", ("api.bound.test",)),
                 b"ghp_RealTokenValue0123456789", b"tkbox_GH_5f1d3c2b1a0998877665544332211000")
    return TunnelRules("api.bound.test", 443, [sec])


def test_many_trailers_are_scanned_once_joined(counted: list[LeakScanner]) -> None:
    trailers = [(b"a", b"b")] * 13000
    _rules().trailers(trailers)
    assert len(counted) == 1  # was one scanner (and its span of work) per trailer
    assert counted[0].scanned <= 6 * 13000


def test_many_plain_headers_are_scanned_once_joined(counted: list[LeakScanner]) -> None:
    _rules().check_plain(b"GET", b"/", [(b"a", b"b")] * 13000)
    assert len(counted) == 3  # the URL, the method, and all the headers at once


def test_a_trailer_leak_still_names_its_trailer(counted: list[LeakScanner]) -> None:
    ph = b"tkbox_GH_5f1d3c2b1a0998877665544332211000"
    with pytest.raises(SecretLeak) as e:
        _rules().trailers([(b"a", b"b")] * 100 + [(b"X-Debug", ph)] + [(b"c", b"d")] * 100)
    assert e.value.where == "trailer header X-Debug"
    with pytest.raises(SecretLeak) as e:
        _rules().check_plain(b"GET", b"/", [(b"a", b"b"), (b"X-Plain", ph)])
    assert e.value.where == "header X-Plain"


def test_a_placeholder_split_between_two_trailers_or_headers_is_caught() -> None:
    ph = b"tkbox_GH_5f1d3c2b1a0998877665544332211000"
    # names without letters or digits: the squeezed view joins the two halves
    split = [(b"-", ph[:20]), (b"_", ph[20:])]
    with pytest.raises(SecretLeak) as e:
        _rules().trailers(split)
    assert e.value.where == "trailers (split between them)"
    with pytest.raises(SecretLeak) as e:
        _rules().check_plain(b"GET", b"/", split)
    assert e.value.where == "headers (split between them)"
    with pytest.raises(SecretLeak) as e:
        _rules().request(b"GET", b"/", [(b"Host", b"api.bound.test")] + split)
    assert e.value.where == "headers (split between them)"


def test_dropped_headers_are_not_taken_for_a_split_leak() -> None:
    ph = b"tkbox_GH_5f1d3c2b1a0998877665544332211000"
    out, _ = _rules().request(b"GET", b"/", [(b"Host", b"api.bound.test"),
                                             (b"Accept-Encoding", ph)])
    assert all(ph not in v for _, v in out)
