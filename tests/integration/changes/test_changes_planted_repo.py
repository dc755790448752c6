"""`apply_patch` holds back a git repository planted in the checkout.

Four plain files, `evil/HEAD`, `evil/objects/keep`, `evil/refs/keep` and
`evil/config`, make `evil/` a bare repository: git run inside it (a shell
prompt runs `git status` on `cd`) reads its config and runs its
`core.fsmonitor`. Every change below a directory git would take for a
repository in the final tree is held back, whether the patch makes it one
or the checkout already held the other pieces. Real git, real checkouts,
guest patches from the guest's own diff writer, the fake signer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "doors" / "changes"))
from changes_apply_kit import apply, setup, statuses  # noqa: E402
from changes_trees import Tree, file, read_tree  # noqa: E402

pytestmark = pytest.mark.integration
REASON = "inside a directory git would take for a repository (its config can run commands)"
CONFIG = b'[core]\n\tbare = false\n\tworktree = ..\n\tfsmonitor = "touch PWNED; false"\n'
PIECES: Tree = {"evil/HEAD": file(b"ref: refs/heads/main\n"), "evil/objects/keep": file(b""),
                "evil/refs/keep": file(b"")}
PLANTED: Tree = {**PIECES, "evil/config": file(CONFIG)}


def git_status_in(d: Path) -> None:
    """What a git-aware prompt does on `cd d`; the result does not matter."""
    subprocess.run(["git", "status"], cwd=d, capture_output=True, check=False)


def test_a_planted_bare_repository_is_held_back(tmp_path: Path) -> None:
    """Stops the four-file patch: `git status` in evil/ would run its fsmonitor."""
    lower = {"src/a.py": file(b"a\n")}
    co, patch = setup(tmp_path, lower, {**lower, **PLANTED})
    report = apply(patch, co)
    assert statuses(report) == dict.fromkeys(PLANTED, "held back")
    assert all(f.reason == f"sensitive: {REASON}" for f in report.files)
    assert read_tree(co) == lower
    assert not (co / "evil").exists()
    git_status_in(co)
    assert not list(co.rglob("PWNED"))


def test_the_pieces_of_a_repository_alone_are_held_back(tmp_path: Path) -> None:
    """Stops the first of two applies: HEAD, objects and refs, the config to come later."""
    lower = {"src/a.py": file(b"a\n")}
    co, patch = setup(tmp_path, lower, {**lower, **PIECES})
    report = apply(patch, co)
    assert statuses(report) == dict.fromkeys(PIECES, "held back")
    assert read_tree(co) == lower


@pytest.mark.parametrize("pieces", [
    PIECES,
    {"evil/Head": file(b"ref: refs/heads/main\n"), "evil/OBJECTS/keep": file(b""),
     "evil/Refs/keep": file(b"")},
    {"evil/HEAD": file(b"ref: refs/heads/main\n"), "evil/commondir": file(b"..\n")},
], ids=["head-objects-refs", "other-case", "commondir"])
def test_a_config_added_to_a_repository_already_in_the_checkout_is_held_back(
        tmp_path: Path, pieces: Tree) -> None:
    """Stops the second of two applies: the checkout holds the pieces, the patch adds config."""
    lower = {"src/a.py": file(b"a\n"), **pieces}
    co, patch = setup(tmp_path, lower, {**lower, "evil/config": file(CONFIG)})
    report = apply(patch, co)
    assert statuses(report) == {"evil/config": "held back"}
    assert report.files[0].reason == f"sensitive: {REASON}"
    assert read_tree(co) == lower
    git_status_in(co / "evil")
    assert not list(co.rglob("PWNED"))


def test_a_file_in_a_subdirectory_of_a_planted_repository_is_held_back(tmp_path: Path
                                                                        ) -> None:
    """Stops a patch writing deeper in a repository the checkout already holds."""
    lower = {"src/a.py": file(b"a\n"), "vendor/r/HEAD": file(b"ref: refs/heads/main\n"),
             "vendor/r/objects/keep": file(b""), "vendor/r/refs/keep": file(b"")}
    co, patch = setup(tmp_path, lower, {**lower, "vendor/r/hooks/post-checkout": file(b"x\n"),
                                        "src/b.py": file(b"b\n")})
    report = apply(patch, co)
    assert statuses(report) == {"vendor/r/hooks/post-checkout": "held back",
                                "src/b.py": "applied"}


@pytest.mark.parametrize("extra", [
    {"docs/HEAD": file(b"the head of the docs\n")},
    {"refs/x": file(b"x\n")},
    {"lib/head": file(b"h\n"), "lib/refs/a": file(b"a\n"), "lib/config": file(b"c\n")},
    {"lib/objects/o": file(b"o\n"), "lib/refs/r": file(b"r\n"), "lib/config": file(b"c\n")},
], ids=["docs-HEAD", "refs-dir", "head-refs-no-objects", "objects-refs-no-head"])
def test_files_named_like_a_repository_s_apply(tmp_path: Path, extra: Tree) -> None:
    """A project's own `HEAD` file or `refs` directory, short of a repository, applies."""
    lower = {"src/a.py": file(b"a\n")}
    final = {**lower, **extra}
    co, patch = setup(tmp_path, lower, final)
    report = apply(patch, co)
    assert set(statuses(report).values()) == {"applied"}
    assert read_tree(co) == final


def test_deleting_a_piece_of_a_repository_applies(tmp_path: Path) -> None:
    """Taking HEAD away leaves no repository in the final tree: the deletion applies."""
    lower = {"src/a.py": file(b"a\n"), **PIECES}
    final = {k: v for k, v in lower.items() if k != "evil/HEAD"}
    co, patch = setup(tmp_path, lower, final)
    report = apply(patch, co)
    assert statuses(report) == {"evil/HEAD": "applied"}
    assert read_tree(co) == final


def test_allow_sensitive_applies_a_planted_repository(tmp_path: Path) -> None:
    """--allow-sensitive writes it, as it writes every other held-back change."""
    lower = {"src/a.py": file(b"a\n")}
    final = {**lower, **PLANTED}
    co, patch = setup(tmp_path, lower, final)
    report = apply(patch, co, allow_sensitive=True)
    assert set(statuses(report).values()) == {"applied"}
    assert read_tree(co) == final


def test_a_file_replaced_by_a_directory_of_the_same_name_counts(tmp_path: Path) -> None:
    """Stops `evil/refs` the file deleted and `evil/refs/keep` made in the same patch."""
    lower = {"src/a.py": file(b"a\n"), "evil/HEAD": file(b"ref: refs/heads/main\n"),
             "evil/objects/keep": file(b""), "evil/refs": file(b"not yet\n")}
    final = {k: v for k, v in lower.items() if k != "evil/refs"}
    final.update({"evil/refs/keep": file(b""), "evil/config": file(CONFIG)})
    co, patch = setup(tmp_path, lower, final)
    report = apply(patch, co)
    assert statuses(report) == {"evil/refs": "held back", "evil/refs/keep": "held back",
                                "evil/config": "held back"}
    assert read_tree(co) == lower


def test_final_git_dirs_takes_deletions_before_creations() -> None:
    """Whatever the order of the changes, a name deleted and made again is there."""
    from tkbox.doors.changes.gitdirs import final_git_dirs

    checkout = {"evil": {"evil/HEAD", "evil/objects", "evil/refs"}}
    for changes in ([("evil/refs/keep", False, True), ("evil/refs", True, False)],
                    [("evil/refs", True, False), ("evil/refs/keep", False, True)]):
        assert final_git_dirs(checkout, changes) == {("evil",)}
    assert final_git_dirs(checkout, [("evil/HEAD", True, False)]) == set()
    assert final_git_dirs({}, [("HEAD", False, True), ("commondir", False, True)]) == {()}
    assert final_git_dirs({"A/B": {"A/B/Head"}}, [("a/b/OBJECTS/x", False, True),
                                                  ("a/b/refs/y", False, True)]) == {("a", "b")}
