"""Applying a section's hunks to the old file: exactly, and in little memory.

The applier keeps the old file as one bytes object and finds each hunk's
position by counting LFs; these tests hold it to the results and refusals of
the plain applier it replaced (the file split into a list of lines, kept here
as `by_lines`), and to memory in proportion to the file, not to its lines.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tkbox.doors.changes.errors import PatchRefused
from tkbox.doors.changes.patch import (
    Section,
    _apply_hunks,
    _skip_lines,
    apply_section,
    git_blob_sha1,
    parse_patch,
)
from tkbox.guest.diff import _hunks
from tkbox.guest.diff import _lines as guest_lines


def section(old: bytes, new: bytes) -> Section:
    """The section git would write to turn `old` into `new` (a plain modification)."""
    hunks = b"".join(_hunks(guest_lines(old), guest_lines(new)))
    patch = (b"diff --git a/f b/f\n"
             + f"index {git_blob_sha1(old)}..{git_blob_sha1(new)} 100644\n".encode()
             + b"--- a/f\n+++ b/f\n" + hunks)
    (s,) = parse_patch(patch).sections
    return s


def hand(old: bytes, new: bytes, hunks: bytes) -> Section:
    """A section with hunks written by hand, as a guest would."""
    patch = (b"diff --git a/f b/f\n"
             + f"index {git_blob_sha1(old)}..{git_blob_sha1(new)} 100644\n".encode()
             + b"--- a/f\n+++ b/f\n" + hunks)
    (s,) = parse_patch(patch).sections
    return s


def by_lines(s: Section, old: bytes, max_bytes: int) -> bytes:
    """The applier `_apply_hunks` replaced, one list item per line: the reference."""
    lines = [line + b"\n" for line in old.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    if not lines[-1]:
        lines.pop()
    out: list[bytes] = []
    size = cursor = 0
    for h in s.hunks:
        pos = h.old_start - 1 if h.old_count else h.old_start
        if pos > len(lines):
            raise PatchRefused(f"{s.where}: a hunk past the end of the file")
        out.extend(lines[cursor:pos])
        cursor = pos
        for tag, content in h.lines:
            if tag == b"+":
                out.append(content)
                size += len(content)
                continue
            if cursor >= len(lines) or lines[cursor] != content:
                raise PatchRefused(f"{s.where}: the hunk at old line {h.old_start} does not "
                                   "match the file")
            if tag == b" ":
                out.append(content)
                size += len(content)
            cursor += 1
        if size > max_bytes:
            raise PatchRefused(f"{s.where}: the result is larger than {max_bytes} bytes")
    out.extend(lines[cursor:])
    result = b"".join(out)
    if len(result) > max_bytes:
        raise PatchRefused(f"{s.where}: the result is larger than {max_bytes} bytes")
    return result


Applier = Callable[[Section, bytes, int], bytes]


def outcome(apply: Applier, s: Section, old: bytes, max_bytes: int = 1 << 20) -> bytes | str:
    """The result, or the refusal's message."""
    try:
        return apply(s, old, max_bytes)
    except PatchRefused as e:
        return str(e)


def test_a_small_patch_to_a_large_file_of_short_lines_takes_memory_in_proportion_to_it() -> None:
    """A guest's few-byte patch against a large checkout file of one-byte lines
    (here 4 MiB, 2,097,152 lines) is applied holding about the file and its result:
    the old applier split the file into a list of lines, ~70x its size (1.15 GiB
    for 16 MiB; at the 64 MiB per-file limit ~4.6 GiB)."""
    n = 2 << 20
    old = b"x\n" * n
    new = b"x\n" * 1000 + b"y\n" + b"x\n" * (n - 2001) + b"z\n" + b"x\n" * 999
    s = hand(old, new, b"@@ -1000,3 +1000,3 @@\n x\n-x\n+y\n x\n"
             + b"@@ -%d,3 +%d,3 @@\n x\n-x\n+z\n x\n" % (n - 1000, n - 1000))
    tracemalloc.start()
    try:
        result = apply_section(s, old, 64 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result == new
    assert peak < 1.5 * len(old), f"{peak / len(old):.1f}x the file"


def test_many_hunks_are_applied_in_one_pass() -> None:
    """A guest's many hunks each start from the last one, not from the file's start."""
    old = b"".join(b"%d\n" % i for i in range(100_000))
    new = b"".join(b"%d!\n" % i if i and i % 10 == 0 else b"%d\n" % i for i in range(100_000))
    hunks = b"".join(b"@@ -%d +%d @@\n-%d\n+%d!\n" % (i + 1, i + 1, i, i)
                     for i in range(10, 100_000, 10))  # 9,999 hunks, no context
    s = hand(old, new, hunks)
    assert apply_section(s, old, 1 << 20) == new == by_lines(s, old, 1 << 20)


@pytest.mark.parametrize(("old", "new"), [
    (b"a\nb\nc\n", b"A\nb\nc\n"),  # first line
    (b"a\nb\nc\n", b"a\nb\nC\n"),  # last line
    (b"a\nb\nc", b"a\nb\nC"),  # last line, no LF at the end
    (b"a\nb\nc", b"a\nb\nc\n"),  # an LF added at the end
    (b"a\nb\nc\n", b"a\nb\nc"),  # the LF at the end removed
    (b"a\nb\nc", b"a\nb\nc\nd"),  # a line after a last line without LF
    (b"a\r\nb\r\nc\r\n", b"a\r\nB\r\nc\r\n"),  # CRLF: the CR is content
    (b"a\r\nb\r\nc\r\n", b"a\nb\r\nc\r\n"),  # only the line ending changes
    (b"a\n", b""),  # emptied
    (b"", b"a\nb"),  # filled
    (b"\n\n\n", b"\n\nx\n\n"),  # empty lines
    (b"".join(b"%d\n" % i for i in range(100)),
     b"".join(b"%d\n" % i for i in range(100) if i % 30)),  # several hunks
])
def test_edge_hunks_apply_as_git_wrote_them(old: bytes, new: bytes) -> None:
    s = section(old, new)
    assert apply_section(s, old, 1 << 20) == new == by_lines(s, old, 1 << 20)


def test_a_context_line_must_match_the_whole_old_line() -> None:
    """A guest's context line that is only part of the file's line ("a" of "ab",
    "a" of "a\\r", of a last line "a" without its LF, and the other way round)
    does not match it."""
    cases = [
        (b"ab\nc\n", b"@@ -1,2 +1,2 @@\n a\n-c\n+d\n"),
        (b"a\r\nc\n", b"@@ -1,2 +1,2 @@\n a\n-c\n+d\n"),
        (b"a\nc\n", b"@@ -1,2 +1,2 @@\n a\r\n-c\n+d\n"),
        (b"c\na\n", b"@@ -1,2 +1,2 @@\n-c\n+d\n a\n\\ No newline at end of file\n"),
        (b"c\na", b"@@ -1,2 +1,2 @@\n-c\n+d\n a\n"),
        (b"c\nab", b"@@ -1,2 +1,2 @@\n-c\n+d\n a\n\\ No newline at end of file\n"),
    ]
    for old, hunks in cases:
        s = hand(old, b"", hunks)
        with pytest.raises(PatchRefused, match="does not match the file"):
            _apply_hunks(s, old, 1 << 20)
        assert outcome(by_lines, s, old) == outcome(_apply_hunks, s, old)


def test_a_hunk_at_a_position_other_than_stated_is_refused() -> None:
    """No offset or fuzz: the hunk applies where it says or not at all, including
    past the last line (with or without a final LF)."""
    old = b"a\nb\nc"
    for hunks in (b"@@ -2 +2 @@\n-c\n+C\n", b"@@ -4 +4 @@\n-c\n+C\n", b"@@ -4,0 +5 @@\n+d\n",
                  b"@@ -3,2 +3,2 @@\n-c\n+C\n-d\n+D\n"):
        s = hand(old, b"", hunks)
        with pytest.raises(PatchRefused, match="does not match|past the end"):
            _apply_hunks(s, old, 1 << 20)
        assert outcome(by_lines, s, old) == outcome(_apply_hunks, s, old)
    s = hand(old, b"", b"@@ -3,0 +4 @@\n+d\n")  # after the last line, which has no LF
    assert outcome(by_lines, s, old) == outcome(_apply_hunks, s, old) == b"a\nb\ncd\n"


def test_a_result_over_the_limit_is_refused_before_it_is_built() -> None:
    old = b"x\n" * 1000
    s = section(old, old.replace(b"x\n", b"y\n", 1))
    with pytest.raises(PatchRefused, match="larger than 1999 bytes"):
        _apply_hunks(s, old, 1999)
    s = section(old, b"y" * 3000 + old)
    assert outcome(by_lines, s, old, 2000) == outcome(_apply_hunks, s, old, 2000)


lines = st.lists(st.sampled_from([b"a\n", b"b\n", b"\n", b"a\r\n", b"\r\n", b"ab\n"]),
                 max_size=40).map(b"".join)
tails = st.sampled_from([b"", b"a", b"b", b"\r", b"ab"])


@example(old=b"a\nb\n", new=b"a\nc\n", other=b"a\nb")
@example(old=b"a\n", new=b"b\n", other=b"")
@given(old=st.tuples(lines, tails).map(b"".join), new=st.tuples(lines, tails).map(b"".join),
       other=st.tuples(lines, tails).map(b"".join))
def test_results_and_refusals_are_the_line_list_appliers(old: bytes, new: bytes,
                                                         other: bytes) -> None:
    """Against the file it was made for and against any other one, the applier
    gives what the line-list applier gave: the same bytes or the same refusal."""
    if old == new:
        return
    s = section(old, new)
    assert apply_section(s, old, 1 << 20) == new
    assert outcome(_apply_hunks, s, other) == outcome(by_lines, s, other)


@given(data=st.lists(st.sampled_from([b"\n", b"a", b"a" * 50]), max_size=400).map(b"".join),
       first=st.integers(0, 500), k=st.integers(0, 500))
def test_skipping_lines_lands_where_the_line_list_says(data: bytes, first: int, k: int) -> None:
    """From any line start, k lines on is the start of line first+k, the end of
    the file after its last line (with or without an LF), or -1 past it."""
    starts = [0]
    for line in data.splitlines(keepends=True):  # only LF here: lines as git counts them
        starts.append(starts[-1] + len(line))
    first = min(first, len(starts) - 1)
    want = starts[first + k] if first + k < len(starts) else -1
    assert _skip_lines(data, starts[first], k) == want
