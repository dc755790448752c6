"""Which paths a patch may name at all (pure).

A path from the guest is hostile. It is accepted only if it is canonical and
stays inside the checkout, and none of its components is, or could be folded
by some filesystem into, `.git`:

- bytes: non-empty, at most 4096 bytes, valid UTF-8, no NUL, no backslash (a
  separator on Windows), not absolute, no empty, `.` or `..` component, no
  component over 255 bytes, no component with leading or trailing whitespace,
  no control or format character anywhere (C0/C1 controls, bidi overrides and
  the zero-width code points HFS+ ignores: they also make a path read
  differently from what it is);
- `.git` look-alikes, after removing the HFS+ ignorable code points (git
  `utf8.c` `is_hfs_dotgit`), NFKC normalisation and case folding, then, as
  NTFS would, cutting an alternate data stream (`:...`) and trailing dots and
  spaces: `.git`, `.GIT`, `.Git`, `.git.`, `.git `, `.git::$INDEX_ALLOCATION`,
  full-width `．ｇｉｔ`, and `git~1` (the NTFS short name of `.git`, git
  `path.c` `is_ntfs_dotgit`).

`fold()` is also what the sensitive-file rules and the hooks directory are
compared on, so that `.GitHub/Workflows/x.yml` is as sensitive as
`.github/workflows/x.yml`.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from functools import lru_cache

from tkbox.doors.changes.errors import PatchRefused

MAX_PATH_BYTES = 4096
MAX_COMPONENT_BYTES = 255

# git utf8.c next_hfs_char: code points HFS+ drops when comparing names
_HFS_IGNORABLE = frozenset(
    [0x200C, 0x200D, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E,
     0x206A, 0x206B, 0x206C, 0x206D, 0x206E, 0x206F, 0xFEFF]
)
# Unicode general categories refused anywhere in a path: controls, format
# characters (bidi, zero-width), surrogates, private use, unassigned.
_REFUSED_CATEGORIES = frozenset(["Cc", "Cf", "Cs", "Co", "Cn"])


def fold(component: str) -> str:
    """The form a case-insensitive, Unicode-normalising filesystem compares."""
    if component.isascii():
        # ASCII is NFKC-stable, holds no HFS+ ignorable, and casefolds as lower()
        return component.lower()
    s = "".join(ch for ch in component if ord(ch) not in _HFS_IGNORABLE)
    # casefold can leave a string un-normalised ("ǰ"), so normalise again
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", s).casefold())


def fold_ntfs(component: str) -> str:
    """`fold`, then what NTFS ignores: an alternate data stream, trailing dots/spaces."""
    return fold(component).split(":", 1)[0].rstrip(". ")


def is_dotgit(component: str) -> bool:
    """True if some filesystem could take `component` for `.git`."""
    f = fold_ntfs(component)
    return f in (".git", "git~1")


@lru_cache(maxsize=8192)
def folded_parts(path: str) -> tuple[str, ...]:
    """Every component `fold_ntfs`'d (cached: the door asks for the same paths often)."""
    return tuple(fold_ntfs(p) for p in path.split("/"))


def check_path(raw: bytes, where: str) -> str:
    """`raw` as a checked relative path, or PatchRefused naming `where`."""

    def refuse(why: str) -> PatchRefused:
        shown = raw[:200].decode("utf-8", errors="backslashreplace")
        return PatchRefused(f"{where}: path {shown!r} refused: {why}")

    if not raw:
        raise refuse("empty path")
    if len(raw) > MAX_PATH_BYTES:
        raise refuse(f"longer than {MAX_PATH_BYTES} bytes")
    if b"\x00" in raw:
        raise refuse("NUL byte in path")
    if b"\\" in raw:
        raise refuse("backslash in path (a separator on Windows)")
    if raw.startswith(b"/"):
        raise refuse("absolute path")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise refuse("not valid UTF-8, cannot be checked for look-alikes") from None
    for part in text.split("/"):
        if part == "":
            raise refuse("empty path component")
        if part in (".", ".."):
            raise refuse(f"{part!r} component leaves or confuses the checkout")
        if len(part.encode()) > MAX_COMPONENT_BYTES:
            raise refuse(f"component longer than {MAX_COMPONENT_BYTES} bytes")
        for ch in part:
            if unicodedata.category(ch) in _REFUSED_CATEGORIES or ord(ch) in _HFS_IGNORABLE:
                raise refuse(f"control or invisible character U+{ord(ch):04X}")
        if part != part.strip():
            raise refuse("component begins or ends with whitespace")
        if is_dotgit(part):
            raise refuse("inside .git (or a name a filesystem could fold to .git)")
    return text


def under(path: str, prefix: Sequence[str]) -> bool:
    """True if `path` is `prefix` or below it, comparing folded components."""
    parts = folded_parts(path)
    return len(prefix) > 0 and parts[: len(prefix)] == tuple(prefix)


def check_symlink_target(path: str, target: bytes, where: str) -> str:
    """A symlink the patch creates must point inside the checkout, lexically.

    The target is resolved against the link's directory without touching the
    filesystem; it may not be absolute, may not climb above the checkout, and
    may not name anything a filesystem could fold to `.git`.
    """

    def refuse(why: str) -> PatchRefused:
        shown = target[:200].decode("utf-8", errors="backslashreplace")
        return PatchRefused(f"{where}: symlink {path!r} -> {shown!r} refused: {why}")

    if not target:
        raise refuse("empty target")
    if len(target) > MAX_PATH_BYTES:
        raise refuse(f"target longer than {MAX_PATH_BYTES} bytes")
    if b"\x00" in target or b"\n" in target or b"\\" in target:
        raise refuse("NUL, newline or backslash in target")
    if target.startswith(b"/"):
        raise refuse("absolute target")
    try:
        text = target.decode("utf-8")
    except UnicodeDecodeError:
        raise refuse("target is not valid UTF-8") from None
    stack = path.split("/")[:-1]
    for part in text.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                raise refuse("target leaves the checkout")
            stack.pop()
            continue
        if any(unicodedata.category(ch) in _REFUSED_CATEGORIES for ch in part):
            raise refuse("control or invisible character in target")
        if is_dotgit(part):
            raise refuse("target points into .git")
        stack.append(part)
    return text
