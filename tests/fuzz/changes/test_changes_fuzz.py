"""Fuzzing the changes door's parser: garbage raises only PatchRefused.

The promise (h11 fuzz/README style): any bytes given to `parse_patch` either
parse or raise `PatchRefused`, never another exception, and never use memory
beyond the limits (binary literals are inflated with a bound). Inputs are
random bytes and mutations of valid patches (the interesting corner).
"""

from __future__ import annotations

import base64
import zlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.doors.changes.errors import PatchRefused
from tkbox.doors.changes.patch import Limits, apply_section, git_blob_sha1, parse_patch
from tkbox.doors.changes.paths import check_path, check_symlink_target

SEED = (
    b"diff --git a/x b/x\nindex 7898192261ab1a0d4e1e8e8ad3fc5a25d4d2b2a8..6178079822d2c4bf"
    b"c2e9b4f6c3fb1ba0f08fe6d6 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
    b'diff --git "a/\\303\\251 q" "b/\\303\\251 q"\nnew file mode 100755\nindex 0000000..e69de29\n'
    b"diff --git a/l b/l\nnew file mode 120000\nindex 0000000000000000000000000000000000000000.."
    b"2e65efe2a145dda7ee51d1741299f848e5bf752e\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+a\n"
    b"\\ No newline at end of file\n"
    b"diff --git a/b b/b\nnew file mode 100644\nindex 0000000000000000000000000000000000000000.."
    + git_blob_sha1(b"\x00\x01").encode() + b"\nGIT binary patch\nliteral 2\n"
    + b"J" + base64.b85encode(zlib.compress(b"\x00\x01"), pad=True)
    + b"\n\nliteral 0\nHcmV?d00001\n\n"
    b"diff --git a/m b/m\nold mode 100644\nnew mode 100755\n"
    b"diff --git a/d b/d\ndeleted file mode 100644\nindex 7898192..0000000\n"
    b"--- a/d\n+++ /dev/null\n"
    b"@@ -1 +0,0 @@\n-a\n"
)
LIMITS = Limits(max_patch_bytes=1 << 16, max_file_bytes=1 << 16, max_binary_bytes=1 << 18)


def check(data: bytes) -> None:
    try:
        p = parse_patch(data, LIMITS)
    except PatchRefused as e:
        assert "\n" not in str(e)
        return
    for s in p.sections:
        for old in (None, b"", b"a\n", b"\x00"):
            try:
                apply_section(s, old, 1 << 16)
            except PatchRefused:
                pass


def test_seed_parses() -> None:
    assert len(parse_patch(SEED).sections) == 6


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000))
def test_random_bytes_raise_only_patch_refused(data: bytes) -> None:
    check(data)
    check(b"diff --git " + data)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(SEED)), st.integers(0, 8), st.binary(max_size=6)),
                min_size=1, max_size=4))
def test_mutated_patches_raise_only_patch_refused(edits: list[tuple[int, int, bytes]]) -> None:
    data = bytearray(SEED)
    for pos, cut, ins in edits:
        pos = min(pos, len(data))
        data[pos : pos + cut] = ins
    check(bytes(data))


@settings(deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_path_and_target_checks_raise_only_patch_refused(path: bytes, target: bytes) -> None:
    try:
        ok = check_path(path, "fuzz")
    except PatchRefused:
        return
    assert ".." not in ok.split("/") and not ok.startswith("/")
    try:
        check_symlink_target(ok, target, "fuzz")
    except PatchRefused:
        pass
