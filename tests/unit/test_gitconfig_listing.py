"""Parsing git's own configuration listing (`git config --list --null`): only our error type."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tkbox.gitconfig import ConfigListError, Entry, parse_list, render


def test_listing_with_origins_keys_values_and_bare_keys() -> None:
    out = (b"file:.git/config\x00core.bare\x00file:/h/.gitconfig\x00"
           b"url.https://u:t@h/.insteadof\nhttps://h/\x00file:x\x00a..b\n\x00")
    entries = parse_list(out, show_origin=True)
    assert entries[0] == Entry("core", None, "bare", None, "file:.git/config")
    assert entries[1].subsection == "https://u:t@h/" and entries[1].value == "https://h/"
    assert entries[2] == Entry("a", "", "b", "", "file:x")  # empty subsection, empty value
    assert entries[1].origin_file == "/h/.gitconfig"


@pytest.mark.parametrize("out", [b"core.bare", b"nodot\x00", b".x\x00", b"a.\x00",
                                 b"A B.c\x00", b"a.1b\x00"])
def test_malformed_listings_are_refused(out: bytes) -> None:
    with pytest.raises(ConfigListError):
        parse_list(out)


@given(st.binary(max_size=200), st.booleans())
def test_any_bytes_give_entries_or_our_error(data: bytes, origin: bool) -> None:
    """A git we do not know printing anything cannot raise anything but ConfigListError."""
    try:
        entries = parse_list(data, show_origin=origin)
    except ConfigListError:
        return
    render(entries)  # and what parsed renders, or refuses with our error


def test_a_subsection_with_a_line_break_is_not_written() -> None:
    with pytest.raises(ConfigListError):
        render([Entry("a", "x\ny", "b", "1")])
