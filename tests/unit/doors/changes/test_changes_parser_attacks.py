"""The attack corpus against the pure parts of the changes door.

Each test is named for the attack it stops. Patches are built by hand, as a
hostile guest would write them; the git-level checks (`git apply` reading
the same, ignore rules, the checkout's own state) are exercised in
tests/integration/changes/.
"""

from __future__ import annotations

import base64
import tracemalloc
import zlib

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tkbox.doors.changes.errors import PatchRefused
from tkbox.doors.changes.patch import (
    _B85,
    Limits,
    Patch,
    _b85decode,
    apply_section,
    git_blob_sha1,
    parse_patch,
    quote_path,
)
from tkbox.doors.changes.paths import (
    check_path,
    check_symlink_target,
    folded_parts,
    is_dotgit,
    under,
)
from tkbox.doors.changes.plan import ABSENT, FilePlan, Plan, State, build, classify
from tkbox.doors.changes.sensitive import rules, sensitive_reason
from tkbox.errors import Refused

Z = "0" * 40


def add(path: bytes, content: bytes = b"x\n", mode: bytes = b"100644") -> bytes:
    q = lambda p: quote_path(p)  # noqa: E731
    n = content.count(b"\n")
    body = b"".join(b"+" + line + b"\n" for line in content.split(b"\n")[:-1])
    tab = b"\t" if b" " in path else b""
    return (b"diff --git " + q(b"a/" + path) + b" " + q(b"b/" + path) + b"\n"
            + b"new file mode " + mode + b"\n"
            + f"index {Z}..{git_blob_sha1(content)}\n".encode()
            + b"--- /dev/null\n+++ " + q(b"b/" + path) + tab + b"\n"
            + (b"@@ -0,0 +1 @@\n" if n == 1 else b"@@ -0,0 +1,%d @@\n" % n) + body)


def refused(patch: bytes, match: str) -> None:
    with pytest.raises(PatchRefused, match=match):
        parse_patch(patch)


def test_well_formed_creation_parses() -> None:
    p = parse_patch(add(b"src/ok.py", b"a\nb\n"))
    (s,) = p.sections
    assert (s.path, s.is_new, s.added, s.deleted) == ("src/ok.py", True, 2, 0)
    assert apply_section(s, None, 1 << 20) == b"a\nb\n"


def test_refusal_is_a_refused_error_of_one_line() -> None:
    with pytest.raises(Refused) as e:
        parse_patch(add(b"../x"))
    assert "\n" not in str(e.value) and "patch line 1" in str(e.value)


@pytest.mark.parametrize("path", [b"../evil", b"a/../../evil", b"a/./b", b"/etc/passwd",
                                  b"a//b", b"a/", b"..", b"a\\..\\..\\x", b"a/\x00b"])
def test_path_escaping_the_checkout_is_refused(path: bytes) -> None:
    """`../`, absolute paths, empty components, backslash and NUL tricks."""
    with pytest.raises(PatchRefused):
        check_path(path, "t")
    with pytest.raises(PatchRefused):
        parse_patch(add(path))


def test_dotdot_path_in_a_patch_is_refused() -> None:
    """A section writing ../outside never gets past the parser."""
    refused(add(b"../outside"), "leaves or confuses the checkout")


def test_absolute_path_in_a_patch_is_refused() -> None:
    """`diff --git a//etc/x b//etc/x` names /etc/x after the prefix."""
    refused(add(b"/etc/cron.d/x"), "absolute path")


@pytest.mark.parametrize("path", [".git/config", ".git/hooks/pre-commit",
                                  ".GIT/hooks/post-checkout", ".Git/config", "sub/.git/config",
                                  "vendor/x/.gIt/HEAD"])
def test_writes_into_dot_git_whatever_the_case_are_refused(path: str) -> None:
    """`.git/`, `.GIT/`, hooks: git's own directory, any case, any depth."""
    refused(add(path.encode()), "inside .git")


@pytest.mark.parametrize("name", [".git.", ".git ", ".git...", ".git. . ", "\uff0egit",
                                  "\uff0e\uff27\uff29\uff34", "git~1", "GIT~1",
                                  ".git::$INDEX_ALLOCATION", ".git:stream"])
def test_dot_git_look_alikes_are_refused(name: str) -> None:
    """Names a case-insensitive, NTFS-like or Unicode-normalising filesystem folds to .git."""
    assert is_dotgit(name)
    with pytest.raises(PatchRefused):
        check_path(f"{name}/hooks/pre-commit".encode(), "t")


@pytest.mark.parametrize("cp", [0x200C, 0x200D, 0x200E, 0x200F, 0x202A, 0x202E, 0x206A, 0xFEFF])
def test_hfs_ignorable_code_points_in_dot_git_are_refused(cp: int) -> None:
    """HFS+ drops these code points when comparing: `.g\\u200cit` is `.git` there."""
    name = f".g{chr(cp)}it"
    assert is_dotgit(name)
    with pytest.raises(PatchRefused):
        check_path(f"{name}/config".encode(), "t")


def test_honest_names_near_dot_git_are_accepted() -> None:
    for ok in [".github/x", ".gitkeep", "git/x", ".gitx", "x.git", "a/.git-blame-ignore-revs"]:
        assert check_path(ok.encode(), "t") == ok


def test_non_utf8_and_invisible_characters_are_refused() -> None:
    for bad in [b"\xff.txt", "a\u202eb".encode(), b"a\x1b[31m", "x\u00adY".encode()]:
        with pytest.raises(PatchRefused):
            check_path(bad, "t")


def test_rename_section_is_refused() -> None:
    """A rename would move a file the person never sees named as written."""
    p = (b"diff --git a/old b/new\nsimilarity index 100%\nrename from old\nrename to new\n")
    refused(p, "two different paths|rename and copy")
    p2 = b"diff --git a/x b/x\nsimilarity index 100%\nrename from x\nrename to x\n"
    refused(p2, "rename and copy sections are refused")


def test_copy_section_is_refused() -> None:
    p = b"diff --git a/x b/x\ncopy from y\ncopy to x\n"
    refused(p, "rename and copy sections are refused")


@pytest.mark.parametrize("mode", [b"104755", b"102755", b"101755", b"100777", b"160000", b"040000",
                                  b"644", b"0100644"])
def test_setuid_and_other_modes_are_refused(mode: bytes) -> None:
    """Only 100644, 100755 and 120000: no setuid/setgid/sticky, no submodules."""
    refused(add(b"x", mode=mode), "refused: only 100644, 100755 and 120000")


@pytest.mark.parametrize("mode", [b"100644\x1b]0;owned\x07", b"\x1b[2J\x1b[H100644",
                                  b"10\x9b31m0644", b"\xc2\x9b31m", b"100644\x7f\x08\x08"])
def test_refused_mode_is_shown_without_control_characters(mode: bytes) -> None:
    """The guest's mode text reaches the terminal only escaped, as _show shows lines."""
    for patch in (add(b"x", mode=mode),
                  add(b"x").replace(b"new file mode 100644\n",
                                    b"old mode 100644\nnew mode " + mode + b"\n", 1)):
        with pytest.raises(PatchRefused) as e:
            parse_patch(patch)
        text = str(e.value)
        assert "refused: only 100644" in text
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text), text


def test_header_disagreeing_with_minus_plus_lines_is_refused() -> None:
    """`diff --git a/x b/x` whose `+++` names another file: git and a naive parser differ."""
    p = add(b"harmless").replace(b"+++ b/harmless", b"+++ b/.github/workflows/ci.yml")
    refused(p, "does not match the 'diff --git' header")


def test_header_naming_two_paths_is_refused() -> None:
    refused(b"diff --git a/x b/y\nnew file mode 100644\n", "two different paths")


def test_crlf_patch_is_refused() -> None:
    """A CRLF patch: git strips CR from some lines and keeps it in others."""
    refused(add(b"x").replace(b"\n", b"\r\n"), "CR")


def test_non_canonical_quoting_is_refused() -> None:
    """Names quoted when git would not, or with octal for plain ASCII, read ambiguously."""
    refused(add(b"x").replace(b"diff --git a/x b/x", b'diff --git "a/x" "b/x"'), "quoted")
    refused(add(b"x").replace(b"diff --git a/x b/x", b'diff --git "a/\\170" "b/\\170"'), "quoted")
    # a raw UTF-8 name where git quotes it
    raw = "é".encode()
    refused(add(raw).replace(quote_path(b"a/" + raw), b"a/" + raw, 1), "quoted")


def test_quoted_names_are_read_as_git_reads_them() -> None:
    p = parse_patch(add('dir/é "q".txt'.encode()))
    assert p.sections[0].path == 'dir/é "q".txt'


def test_rename_look_alike_via_space_in_name_is_read_exactly() -> None:
    """`a/x b/y b/x b/y` is one path `x b/y`, as git reads it, never x -> y."""
    p = parse_patch(add(b"x b/y"))
    assert p.sections[0].path == "x b/y"


def test_garbage_after_a_hunk_is_refused() -> None:
    """Lines past a hunk's counts: git skips them, a naive parser applies them."""
    refused(add(b"x") + b"+evil\n", "unexpected")


def test_preamble_before_the_first_section_is_refused() -> None:
    refused(b"From: someone\n\n" + add(b"x"), "expected 'diff --git'")


def test_miscounted_hunk_is_refused() -> None:
    refused(add(b"x", b"a\nb\n").replace(b"+1,2 @@", b"+1,3 @@"), "hunk ends early")
    refused(add(b"x", b"a\nb\n").replace(b"+1,2 @@", b"+1 @@"), "unexpected")


def test_hunk_out_of_place_is_refused() -> None:
    """A hunk that only applies at an offset: git would search; we apply exactly."""
    old = b"".join(b"%d\n" % i for i in range(20))
    new = old.replace(b"10\n", b"X\n")
    patch = (b"diff --git a/f b/f\n"
             + f"index {git_blob_sha1(old)}..{git_blob_sha1(new)} 100644\n".encode()
             + b"--- a/f\n+++ b/f\n@@ -9,3 +9,3 @@\n 9\n-10\n+X\n 11\n")
    (s,) = parse_patch(patch).sections
    with pytest.raises(PatchRefused, match="does not match the file"):
        apply_section(s, old, 1 << 20)
    fixed = patch.replace(b"@@ -9,3 +9,3 @@", b"@@ -10,3 +10,3 @@")
    (s,) = parse_patch(fixed).sections
    assert apply_section(s, old, 1 << 20) == new


def test_content_other_than_the_index_line_names_is_refused() -> None:
    """The old and new blob names must be the contents'."""
    (s,) = parse_patch(add(b"x", b"a\n")).sections
    bad = add(b"x", b"a\n").replace(git_blob_sha1(b"a\n").encode(), b"1" * 40)
    (s,) = parse_patch(bad).sections
    with pytest.raises(PatchRefused, match="not the blob"):
        apply_section(s, None, 1 << 20)


def binary_add(path: bytes, content: bytes, claimed: int | None = None,
               compressed: bytes | None = None) -> bytes:
    data = compressed if compressed is not None else zlib.compress(content)
    lines = b""
    for i in range(0, len(data), 52):
        chunk = data[i : i + 52]
        k = len(chunk)
        lines += (bytes([0x41 + k - 1]) if k <= 26 else bytes([0x61 + k - 27])) \
            + base64.b85encode(chunk, pad=True) + b"\n"
    return (b"diff --git a/" + path + b" b/" + path + b"\nnew file mode 100644\n"
            + f"index {Z}..{git_blob_sha1(content)}\n".encode()
            + b"GIT binary patch\nliteral %d\n" % (len(content) if claimed is None else claimed)
            + lines + b"\n")


def test_binary_literal_roundtrips() -> None:
    data = bytes(range(256)) * 3
    (s,) = parse_patch(binary_add(b"b.bin", data)).sections
    assert s.binary == data and apply_section(s, None, 1 << 20) == data


@given(st.one_of(st.binary(max_size=60).map(lambda b: base64.b85encode(b, pad=True)),
                 st.lists(st.sampled_from(_B85), max_size=60).map(bytes),
                 st.binary(max_size=60)))
@example(b"|NsC0")  # 2^32 - 1: the largest group
@example(b"|NsC1")  # 2^32: one beyond
@example(b"~~~~~")
def test_binary_data_is_read_as_the_standard_base85_reader_reads_it(text: bytes) -> None:
    """The quick base85 reader of binary hunks (one C loop per step) takes exactly
    what `base64.b85decode` takes, as the same bytes, for whole groups of five:
    characters outside the alphabet and groups beyond 32 bits refused."""
    text += b"0" * (-len(text) % 5)  # whole groups, as a binary line holds
    try:
        want: bytes | str = base64.b85decode(text)
    except ValueError:
        want = "refused"
    try:
        got: bytes | str = _b85decode(text)
    except ValueError:
        got = "refused"
    assert got == want


def test_decompression_bomb_is_refused() -> None:
    """A literal claiming few bytes that inflates to many stops at the claim."""
    bomb = zlib.compress(b"\x00" * (8 << 20))
    refused(binary_add(b"b", b"\x00" * 10, claimed=10, compressed=bomb), "does not inflate")
    refused(binary_add(b"b", b"", claimed=1 << 35), "more than the limit")


def test_a_long_binary_literal_takes_memory_in_proportion_to_its_text() -> None:
    """A guest's literal of many lines (here ~4 MB of base85 claiming 10 bytes) is
    refused having held little more than its decoded bytes: the lines are decoded a
    batch at a time, not all together (which took ~10× the text, and
    `base64.b85decode` ~29×, so that a 256 MB patch would take gigabytes)."""
    patch = (b"diff --git a/b b/b\nnew file mode 100644\n" + f"index {Z}..{'1' * 40}\n".encode()
             + b"GIT binary patch\nliteral 10\n" + (b"z" + b"0" * 65 + b"\n") * 60_000 + b"\n")
    tracemalloc.start()
    try:
        refused(patch, "does not inflate")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * len(patch), f"{peak / len(patch):.1f}x the patch"


def test_delta_binary_hunks_are_refused() -> None:
    p = binary_add(b"b", b"\x00").replace(b"literal 1\n", b"delta 1\n")
    refused(p, "'delta' binary hunks are refused")


def test_binary_change_without_data_is_refused() -> None:
    p = b"diff --git a/b b/b\nindex 1111111..2222222 100644\nBinary files a/b and b/b differ\n"
    refused(p, "without its data")


def test_enormous_patch_is_refused_before_parsing() -> None:
    """A patch over the size limit is refused by its length alone."""
    limits = Limits(max_patch_bytes=1000)
    with pytest.raises(PatchRefused, match="more than the limit"):
        parse_patch(add(b"x", b"y\n" * 1000), limits)
    many = b"".join(add(b"f%d" % i) for i in range(50))
    with pytest.raises(PatchRefused, match="more than 10 sections"):
        parse_patch(many, Limits(max_sections=10))


def test_same_path_twice_or_folding_together_is_refused() -> None:
    """`README` and `readme` are one file on a case-insensitive checkout."""
    refused(add(b"x") + add(b"x"), "appears twice")
    refused(add(b"README") + add(b"readme"), "appears twice")


# --- plan: symlinks, ancestors, sensitive files ---------------------------------


def plan_of(patch: bytes, states: dict[str, State] | None = None):  # type: ignore[no-untyped-def]
    parsed = parse_patch(patch)
    st: dict[str, State] = {}
    for s in parsed.sections:
        parts = s.path.split("/")
        for i in range(1, len(parts) + 1):
            st.setdefault("/".join(parts[:i]), ABSENT)
    st.update(states or {})
    return build(parsed, st, max_file_bytes=1 << 20)


def test_symlink_created_then_written_through_is_refused() -> None:
    """`l -> /somewhere` and then `l/x`: the second write would land outside."""
    p = add(b"l", b"sub\n", mode=b"120000")
    p = p.replace(b"+sub\n", b"+sub\n\\ No newline at end of file\n")
    p = p.replace(git_blob_sha1(b"sub\n").encode(), git_blob_sha1(b"sub").encode())
    with pytest.raises(PatchRefused, match="through the symlink 'l' that the patch creates"):
        plan_of(p + add(b"l/x"))


def test_symlink_pointing_out_of_the_checkout_is_refused() -> None:
    for target, why in [(b"../../etc", "leaves the checkout"), (b"/etc/passwd", "absolute"),
                        (b"a/../../../x", "leaves the checkout"), (b".git/hooks", "into .git"),
                        (b"./.GIT./config", "into .git")]:
        with pytest.raises(PatchRefused, match=why):
            check_symlink_target("d/l", target, "t")
    assert check_symlink_target("d/l", b"../x", "t") == "../x"


def test_path_through_a_checkout_symlink_is_refused() -> None:
    """The checkout's `vendor -> /usr/lib`: `vendor/x` is never written through it."""
    with pytest.raises(PatchRefused, match="symlink in the checkout"):
        plan_of(add(b"vendor/x"), {"vendor": State("link", b"/usr/lib")})


def test_file_below_a_file_is_refused() -> None:
    with pytest.raises(PatchRefused, match="file in the checkout"):
        plan_of(add(b"f/x"), {"f": State("file", b"f\n")})


def test_directory_replaced_while_holding_other_files_is_refused() -> None:
    with pytest.raises(PatchRefused, match="still holds"):
        plan_of(add(b"d"), {"d": State("dir", below=frozenset({"d/.env"}))})


def test_executable_and_sensitive_changes_are_held_back() -> None:
    """New executables, +x mode changes and sensitive files wait for --allow-sensitive."""
    p = add(b"run.sh", b"#!/bin/sh\n", mode=b"100755") + add(b".github/workflows/ci.yml") \
        + add(b"src/ok.py")
    plan = plan_of(p)
    classify(plan, ignored={"src/ok.py"}, sensitive=sensitive_reason, allow_sensitive=False)
    status = {f.path: (f.status, f.reason) for f in plan.files}
    assert status["run.sh"] == ("held back", "sensitive: makes the file executable")
    assert status[".github/workflows/ci.yml"][0] == "held back"
    assert status["src/ok.py"][0] == "set apart"  # ignored by the checkout's git: not written
    plan = plan_of(p)
    classify(plan, ignored=set(), sensitive=sensitive_reason, allow_sensitive=True)
    assert all(f.status == "apply" for f in plan.files)


@pytest.mark.parametrize("path", [".github/workflows/ci.yml", ".GitHub/Workflows/x.yaml",
                                  ".gitignore", "sub/.gitattributes", "tkbox.yaml", ".envrc",
                                  ".husky/pre-commit", ".devcontainer/devcontainer.json",
                                  ".gitlab-ci.yml", ".circleci/config.yml", "Jenkinsfile",
                                  "azure-pipelines.yml", ".travis.yml", ".buildkite/p.yml",
                                  ".env", ".env.local", "certs/server.pem", "a/id_rsa",
                                  ".netrc", ".npmrc", ".pypirc", "home/.ssh/config",
                                  ".aws/credentials", ".docker/config.json", ".gitmodules",
                                  ".vscode/tasks.json", ".pre-commit-config.yaml", "CODEOWNERS"])
def test_sensitive_paths_are_recognised(path: str) -> None:
    assert sensitive_reason(path) is not None


@pytest.mark.parametrize("path", ["Makefile", "src/main.py", "package.json", "README.md",
                                  ".github/ISSUE_TEMPLATE/bug.md", "docs/env.md", ".gitkeep"])
def test_ordinary_paths_are_not_sensitive(path: str) -> None:
    assert sensitive_reason(path) is None


def test_sensitive_rules_are_listed() -> None:
    listed = dict(rules())
    assert ".github/workflows/**" in listed and "**/.envrc" in listed


def _plan_of_paths(paths: list[str]) -> Plan:
    new = State("file", b"x\n")
    return Plan(Patch(b"", ""), [FilePlan(p, [], ABSENT, new, "added") for p in paths])


def _grouped_as_before(plan: Plan) -> None:
    """The grouping of dependent changes as it was: every kept file against every stopped one."""
    stopped = [f for f in plan.files if f.status != "apply"]
    for f in plan.files:
        if f.status != "apply":
            continue
        for g in stopped:
            if under(g.path, folded_parts(f.path)) or under(f.path, folded_parts(g.path)):
                f.status, f.reason = "held back", f"goes with {g.path!r} ({g.status})"
                break


_NAMES = st.sampled_from(["a", "A", "b", "B", "c", ".env", "x.py"])


@given(st.lists(st.tuples(st.lists(_NAMES, min_size=1, max_size=4).map("/".join),
                          st.sampled_from(["", "ignored", "sensitive"])),
                max_size=12, unique_by=lambda t: t[0]))
@example([("a", "sensitive"), ("a/b", ""), ("A/c", ""), ("b", ""), ("b/c/a", "ignored"),
          ("B/C", ""), ("c", "")])
def test_dependent_changes_are_grouped_as_by_comparing_every_pair(
        files: list[tuple[str, str]]) -> None:
    """The indexed grouping holds back exactly what comparing every pair held back,
    with the same reason (the first stopped file, folded, at, above or below)."""
    paths = [p for p, _ in files]
    ignored = {p for p, why in files if why == "ignored"}
    held = {p for p, why in files if why == "sensitive"}
    new, old = _plan_of_paths(paths), _plan_of_paths(paths)
    classify(new, ignored=ignored, sensitive=lambda p: "s" if p in held else None,
             allow_sensitive=False)
    reasons = {f.path: f.reason for f in new.files}
    for f in old.files:  # what classify sets before grouping, then the old grouping
        if f.path in ignored:
            f.status, f.reason = "set apart", reasons[f.path]
        elif f.path in held:
            f.status, f.reason = "held back", "sensitive: s"
    _grouped_as_before(old)
    assert [(f.path, f.status, f.reason) for f in new.files] == \
        [(f.path, f.status, f.reason) for f in old.files]


def test_grouping_dependent_changes_is_linear_in_the_files(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stops 8,000 kept and 8,000 held-back files costing 64 million comparisons
    (32 s; the parser allows 50,000 files): each file is folded once and looked up
    in steps of its depth."""
    import tkbox.doors.changes.plan as plan_mod

    n = 2000
    paths = sorted([f"h{i:05d}/.env" for i in range(n)] + [f"k{i:05d}/m.py" for i in range(n)]
                   + ["h00001", "k00001"])
    plan = _plan_of_paths(paths)
    calls = 0
    real = plan_mod.folded_parts

    def counting(path: str) -> tuple[str, ...]:
        nonlocal calls
        calls += 1
        return real(path)

    monkeypatch.setattr(plan_mod, "folded_parts", counting)
    classify(plan, ignored={"k00001"}, sensitive=sensitive_reason, allow_sensitive=False)
    status = {f.path: (f.status, f.reason) for f in plan.files}
    assert status["h00001"] == ("held back", "goes with 'h00001/.env' (held back)")
    assert status["k00001/m.py"] == ("held back", "goes with 'k00001' (set apart)")
    assert status["k00002/m.py"] == ("apply", "")
    assert calls <= 2 * len(paths), calls
