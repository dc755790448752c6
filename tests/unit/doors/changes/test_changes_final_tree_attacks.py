"""Sensitive names, symlinks resolved on the final tree, and files git config names (pure).

Each test is named for the attack it stops. The door decides on every name
a path is reachable by once the patch is applied (`FinalTree.aliases`), not
only on how the patch spells it, and on the files the checkout's own git
configuration runs or includes (`gitnamed`).
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tkbox.doors.changes.errors import PatchRefused
from tkbox.doors.changes.gitnamed import Named, named_paths
from tkbox.doors.changes.links import LOOP, OUTSIDE, FinalTree
from tkbox.doors.changes.sensitive import sensitive_reason
from tkbox.gitconfig import Entry

ROOT = "/home/u/repo"


@pytest.mark.parametrize("path", [".devcontainer", ".vscode", ".github", ".github/workflows",
                                  ".husky", ".idea", "sub/.vscode", ".VSCode", ".docker",
                                  ".github/actions", ".circleci", ".gitea", ".ssh"])
def test_a_sensitive_name_is_held_back_whatever_its_type(path: str) -> None:
    """Stops a file or a symlink named `.vscode` (to an ordinary directory) passing unheld."""
    assert sensitive_reason(path) is not None


@pytest.mark.parametrize("path", [".github/ISSUE_TEMPLATE/bug.md", "github", ".vscodex",
                                  "docs/.github.md", "docker"])
def test_names_near_sensitive_ones_are_not_held_back(path: str) -> None:
    assert sensitive_reason(path) is None


def test_resolution_follows_links_the_patch_creates() -> None:
    """Stops `a -> b/x` passing a lexical check while `b` (a new link) leads elsewhere."""
    tree = FinalTree({"b": b"../..", "a": b"b/x"})
    assert tree.resolve("a") == OUTSIDE
    assert FinalTree({"l": b".", "a": b"l/../etc"}).resolve("a") == OUTSIDE


def test_dotdot_after_a_link_goes_up_from_where_the_link_led() -> None:
    """Stops a lexical reading of `l/../x` (`x`) when `l -> d1/d2` makes it `d1/x`."""
    tree = FinalTree({"l": b"d1/d2", "a": b"l/../x"})
    assert tree.resolve("a") == "d1/x"  # the kernel's answer, not the lexical `x`


def test_absolute_targets_inside_the_checkout_are_followed() -> None:
    tree = FinalTree({".vscode": f"{ROOT}/tools".encode()}, ROOT)
    assert tree.resolve(".vscode") == "tools"
    assert FinalTree({"x": b"/etc"}, ROOT).resolve("x") == OUTSIDE


def test_loops_are_bounded() -> None:
    assert FinalTree({"a": b"b", "b": b"a"}).resolve("a") == LOOP
    assert FinalTree({"a": b"a"}).resolve("a/x") == LOOP


def test_a_sensitive_link_makes_its_target_sensitive() -> None:
    """Stops `.vscode -> tools` then writing tools/tasks.json (read as .vscode/tasks.json)."""
    names = FinalTree({".vscode": b"tools"}).aliases("tools/tasks.json").names
    assert ".vscode/tasks.json" in names


def test_aliases_follow_chains_of_links() -> None:
    """Stops `.github -> gh`, `gh/workflows -> wf`, then writing wf/ci.yml."""
    tree = FinalTree({".github": b"gh", "gh/workflows": b"../wf"})
    names = tree.aliases("wf/ci.yml").names
    assert ".github/workflows/ci.yml" in names
    assert any(sensitive_reason(n) for n in names)


def test_a_link_to_the_root_is_bounded() -> None:
    """Stops a self-referencing link making the alias search endless."""
    al = FinalTree({"a": b".", "b": b"."}).aliases("x/y", limit=64)
    assert "a/x/y" in al.names and len(al.names) <= 64


def test_a_link_into_the_root_under_a_sensitive_name_makes_everything_sensitive() -> None:
    """Stops `.vscode -> .` making the root's tasks.json read as .vscode/tasks.json."""
    names = FinalTree({".vscode": b"."}).aliases("tasks.json").names
    assert ".vscode/tasks.json" in names


def _held_back_through(tree: FinalTree, path: str, name: str) -> bool:
    """`name` is one of `path`'s names, and a sensitive one (the door holds `path` back)."""
    names = tree.aliases(path).names
    return name in names and sensitive_reason(name) is not None


@pytest.mark.parametrize(("links", "spellings"), [
    ({".vscode": b"../repo/tools"}, []),  # out of the checkout and back in
    ({".vscode": b"..//repo/./tools/"}, []),  # the same, with `.` and repeated slashes
    ({".vscode": b"//home//u/./repo/tools"}, []),  # absolute, spelled another way
    ({".vscode": b"/home/u/x/../repo/sub/../tools"}, []),  # absolute, through `..`
    ({".vscode": b"/link/repo/tools"}, ["/link/repo"]),  # the checkout's given path
    ({".vscode": b"/link/repo/../repo/tools"}, ["/link/repo"]),  # `..` from the real path
    ({".vscode": b"tools/../../../u/repo/tools"}, []),  # down, out, back in
    ({".vscode": b"up/repo/tools", "up": b".."}, []),  # a chain: the second link leaves
    ({".vscode": b"a", "a": b"../repo/b", "b": b"/home/u/repo/tools"}, []),  # three links
])
def test_a_link_that_leaves_the_checkout_and_comes_back_gives_its_sensitive_name(
        links: dict[str, bytes], spellings: list[str]) -> None:
    """Stops `.vscode -> ../<checkout>/tools` (or any target that reaches the checkout
    from outside it) passing for a link out, so that tools/tasks.json is written
    unchecked while VS Code reads it as .vscode/tasks.json."""
    tree = FinalTree(links, ROOT, spellings) if spellings else FinalTree(links, ROOT)
    assert tree.resolve(".vscode") == "tools"
    assert tree.resolve(".vscode/tasks.json") == "tools/tasks.json"
    assert _held_back_through(tree, "tools/tasks.json", ".vscode/tasks.json")


@pytest.mark.parametrize("target", [
    b"../repo2/tools",  # a sibling whose name starts with the checkout's
    b"/home/u/repo-evil/tools",
    b"/home/u/repo/../repo2/tools",
    b"../../../../../repo/tools",  # `/..` is `/`: this is /repo/tools
    b"../repo/../../u/x/tools",
    b"/link/repo/tools",  # a spelling of the checkout tkbox was not given
])
def test_a_link_that_truly_leaves_the_checkout_stays_outside(target: bytes) -> None:
    """Stops a target that only looks like the checkout's path (a sibling `repo2`, a
    path that comes in and leaves again) being taken for a path inside it."""
    tree = FinalTree({".vscode": target, "t": b".vscode/tasks.json"}, ROOT)
    assert tree.resolve(".vscode") == OUTSIDE and tree.resolve("t") == OUTSIDE
    assert not _held_back_through(tree, "tools/tasks.json", ".vscode/tasks.json")


_kernel_comp = st.sampled_from(["a", "b", "d", "x", "repo", "..", ".", ""])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "x", "d/a", "d/b"]),
                       st.tuples(st.sampled_from(["", "{root}", "{parent}"]),
                                 st.lists(_kernel_comp, min_size=1, max_size=5)),
                       min_size=1, max_size=4))
def test_resolution_is_the_kernels(links: dict[str, tuple[str, list[str]]]) -> None:
    """Stops resolution parting from what the kernel does with the same links, in a
    real checkout: out of it and back in, absolute, through `..`, and in chains."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        parent = os.path.join(os.path.realpath(tmp), "p")
        root = os.path.join(parent, "repo")
        os.makedirs(os.path.join(root, "d"))
        os.makedirs(os.path.join(parent, "x"))
        targets: dict[str, bytes] = {}
        for key, (base, parts) in links.items():
            start = base.format(root=root, parent=parent)
            target = "/".join([start, *parts] if start else parts) or "."
            os.symlink(target, os.path.join(root, key))
            targets[key] = target.encode()
        tree = FinalTree(targets, root)
        for path in ["a", "b", "x", "d/a", "d/b", "a/x", "d/a/b", "b/../a"]:
            mine = tree.resolve(path)
            if mine == LOOP:
                continue  # realpath does not say so; the door lets a loop be
            try:
                os.stat(os.path.join(root, path))
            except OSError as e:
                if e.errno == errno.ELOOP:
                    continue
            # as the kernel resolves it; a missing component is taken as a directory
            real = os.path.realpath(os.path.join(root, path))
            if real == root or real.startswith(root + "/"):
                assert mine == os.path.relpath(real, root).removeprefix("."), (path, targets)
            else:
                assert mine == OUTSIDE, (path, targets)


def test_without_a_root_a_link_that_climbs_out_cannot_come_back() -> None:
    """Stops an unknown root being matched by a name: nothing comes back in."""
    assert FinalTree({".vscode": b"../repo/tools"}).resolve(".vscode") == OUTSIDE
    assert FinalTree({".vscode": b"/tools"}).resolve(".vscode") == OUTSIDE


_comp = st.sampled_from(["a", "b", "c", "..", "."])
_target = st.lists(_comp, min_size=1, max_size=5).map(lambda p: "/".join(p).encode())


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "a/b", "c/a"]), _target, max_size=4),
       st.sampled_from(["a", "b", "c", "a/b", "c/a", "a/b/c"]))
def test_resolution_never_escapes_unseen(links: dict[str, bytes], path: str) -> None:
    """Whatever the links, a result is OUTSIDE, LOOP, or a clean path inside the checkout."""
    r = FinalTree(links).resolve(path)
    assert r in (OUTSIDE, LOOP) or all(c not in ("", ".", "..") for c in r.split("/")) or r == ""


def _e(key: str, value: str | None, origin: str = "file:.git/config") -> Entry:
    first, last = key.index("."), key.rindex(".")
    sub = key[first + 1 : last] if last > first else None
    return Entry(key[:first], sub, key[last + 1 :], value, origin)


@pytest.mark.parametrize(("key", "value", "named"), [
    ("core.fsmonitor", "tools/fsmon.sh", "tools/fsmon.sh"),
    ("core.fsmonitor", "watch-hook", "watch-hook"),
    ("core.hookspath", ".githooks", ".githooks"),
    ("filter.lfs.clean", "./scripts/clean %f", "scripts/clean"),
    ("filter.x.process", "bin/filter --serve", "bin/filter"),
    ("diff.bin.textconv", "tools/conv", "tools/conv"),
    ("diff.bin.command", "tools/difftool", "tools/difftool"),
    ("merge.ours.driver", "scripts/merge.sh %O %A %B", "scripts/merge.sh"),
    ("core.sshcommand", "ssh -F ./ssh_config", "ssh_config"),
    ("core.editor", "./ed.sh", "ed.sh"),
    ("core.pager", "tools/pager", "tools/pager"),
    ("alias.up", "!./scripts/up.sh --fast", "scripts/up.sh"),
    ("alias.co", "!sh -c 'tools/co \"$1\"' -", "tools/co"),
    ("include.path", "../tools/git.cfg", "tools/git.cfg"),
    ("includeif.gitdir:/x/.path", "../cfg/more", "cfg/more"),
    ("credential.helper", "!tools/cred", "tools/cred"),
    ("gpg.program", "bin/gpg", "bin/gpg"),
    ("core.askpass", f"{ROOT}/ask.sh", "ask.sh"),
    ("mytool.runner", "./scripts/run", "scripts/run"),  # a key git does not know
])
def test_files_the_git_config_runs_or_includes_are_sensitive(key: str, value: str,
                                                             named: str) -> None:
    """Stops a patch changing a program or include the checkout's git config names."""
    found = Named(named_paths([_e(key, value)], ROOT, "/home/u"))
    why = found.reason(named)
    assert why is not None and value not in why


def test_an_included_config_inside_the_checkout_is_sensitive() -> None:
    """Stops changing a config file git includes, which could set core.fsmonitor."""
    found = Named(named_paths([_e("user.name", "x", f"file:{ROOT}/tools/git.cfg")], ROOT,
                              "/home/u"))
    assert found.reason("tools/git.cfg") is not None


def test_a_named_directory_names_everything_below_it() -> None:
    found = Named(named_paths([_e("core.hookspath", "hooks-dir")], ROOT, "/home/u"))
    assert found.reason("hooks-dir/pre-commit") is not None
    assert found.reason("hooks-dirx/pre-commit") is None


def test_ordinary_values_name_nothing_outside_and_no_plain_words() -> None:
    entries = [_e("user.name", "Alice"), _e("branch.main.remote", "origin"),
               _e("core.pager", "/usr/bin/less"), _e("core.hookspath", "/etc/hooks")]
    assert set(named_paths(entries, ROOT, "/home/u")) == {".git/config"}  # the origin only


def test_a_reason_never_shows_a_value_or_a_subsection() -> None:
    """Stops a credential in a URL subsection or value reaching the report and the record."""
    e = _e("url.https://u:TOKEN@h/.insteadof", "./x")
    whys = named_paths([e], ROOT, "/home/u").values()
    assert whys and all("TOKEN" not in w for w in whys)


_names3 = ["a", "b", "c"]
_all_paths = ["/".join(p) for n in (1, 2, 3) for p in __import__("itertools").product(
    _names3, repeat=n)]


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "a/b", "b/c", "c/a"]),
                       st.sampled_from([b".", b"..", b"a", b"b", b"c", b"a/b", b"../c", b"b/.."]),
                       max_size=3),
       st.sampled_from(["a", "b", "c", "a/b", "b/c", "c/a", "a/a", "c/c/c"]))
def test_aliases_are_exactly_the_names_that_reach_the_path(links: dict[str, bytes],
                                                           path: str) -> None:
    """Stops a name that reaches a written file going unchecked (and a false alias).

    Brute force over every path of up to three components: each one that
    resolves where `path` resolves (through a link on its way) must be among
    `aliases(path)`, and every alias must resolve there.
    """
    _aliases_are_exact(FinalTree(links), path)


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "a/b", "b/c", "c/a"]),
                       st.sampled_from([b"..", b"a", b"../repo/a", b"../repo", b"/home/u/repo/b",
                                        b"../repo2/c", b"b/../../repo/c", b"/home/u/../u/repo"]),
                       max_size=3),
       st.sampled_from(["a", "b", "c", "a/b", "b/c", "c/a", "a/a", "c/c/c"]))
def test_aliases_are_exactly_the_names_that_reach_the_path_from_outside(
        links: dict[str, bytes], path: str) -> None:
    """The same, with targets that leave the checkout and come back in, or do not."""
    _aliases_are_exact(FinalTree(links, ROOT), path)


def _aliases_are_exact(tree: FinalTree, path: str) -> None:
    real = tree.resolve(path)
    if real in (OUTSIDE, LOOP) or real != path:
        return  # the door asks for aliases of paths it writes: no link on their way
    al = tree.aliases(path)
    for name in al.names:
        assert tree.resolve(name) == real, name
    if al.truncated:
        return
    for other in _all_paths:
        if tree.resolve(other) == real:
            assert other in al.names, (other, sorted(al.names))


def test_the_checkout_scan_finds_every_link_but_none_in_git(tmp_path: Path) -> None:
    import os

    from tkbox.doors.changes.linkwalk import checkout_links

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / ".git" / "x").mkdir(parents=True)
    (tmp_path / ".git" / "x" / "l").symlink_to("y")
    (tmp_path / "a" / "b" / ".vscode").symlink_to("../../tools")
    (tmp_path / "top").symlink_to("/etc")
    (tmp_path / "dirlink").symlink_to("a")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert checkout_links(fd) == {"a/b/.vscode": b"../../tools", "top": b"/etc",
                                      "dirlink": b"a"}
    finally:
        os.close(fd)


def test_a_checkout_past_the_scan_bound_is_refused(tmp_path: Path) -> None:
    """Stops a checkout too large to scan hiding a sensitive symlink past the bound."""
    import os

    from tkbox.doors.changes.errors import PatchRefused
    from tkbox.doors.changes.linkwalk import checkout_links

    for i in range(5):
        (tmp_path / f"f{i}").write_text("x")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(PatchRefused, match="more than 3 entries"):
            checkout_links(fd, max_entries=3)
    finally:
        os.close(fd)


@given(st.dictionaries(st.text(st.sampled_from("ab./"), min_size=1, max_size=6),
                       st.binary(min_size=1, max_size=12), max_size=5),
       st.text(st.sampled_from("ab./"), min_size=1, max_size=8))
def test_any_links_and_path_resolve_without_error(links: dict[str, bytes], path: str) -> None:
    """A hostile tree of links (any target bytes) yields a result, never an exception."""
    tree = FinalTree(links, ROOT)
    r = tree.resolve(path)
    assert isinstance(r, str)
    al = tree.aliases(path, limit=64)
    assert al.names[0] == path and len(al.names) <= 64


def _counting_folds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every component folded from now on, by `folded_parts` or by `gitnamed` itself."""
    from tkbox.doors.changes import gitnamed, paths

    seen: list[str] = []
    real = paths.fold_ntfs

    def counting(component: str) -> str:
        seen.append(component)
        return real(component)

    monkeypatch.setattr(paths, "fold_ntfs", counting)
    monkeypatch.setattr(gitnamed, "fold_ntfs", counting, raising=False)
    paths.folded_parts.cache_clear()
    return seen


def test_a_deep_path_is_looked_up_in_steps_of_the_deepest_named_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stops a deep path (thousands of components, under 4096 names through symlinks)
    costing a hash of every leading slice of itself in every look-up: depth squared."""
    found = Named(named_paths([_e("core.hookspath", "tools/hooks"), _e("gpg.program", "bin/gpg")],
                              ROOT, "/home/u"))
    seen = _counting_folds(monkeypatch)
    for deep in ["d/" * 2000 + "x", "tools/" + "d/" * 2000 + "x", "Tools/HOOKS/" + "d/" * 2000]:
        seen.clear()
        why = found.reason(deep)
        assert (why is not None) == deep.startswith("Tools/HOOKS/")
        assert len(seen) <= 2, len(seen)  # the deepest named path has two components


def test_deep_named_paths_are_found_folded_and_the_shortest_first() -> None:
    found = Named({"a/b/c/d": "deep", "a/b": "shallow", "x/y/z": "xyz"})
    assert found.reason("A/B/c/d/e") == "shallow"
    assert found.reason("x/y/Z/w") == "xyz"
    assert found.reason("x/y") is None and found.reason("x/y/zz") is None
    assert Named({}).reason("a") is None


def test_names_made_through_links_are_bounded_in_total_length() -> None:
    """Stops 64 links `rNN -> .` making 4,096 names of a deep path, each longer than
    the path, that every check then reads: the names stop at MAX_ALIAS_CHARS in all."""
    from tkbox.doors.changes.links import MAX_ALIAS_CHARS

    tree = FinalTree({f"r{i:02d}": b"." for i in range(64)})
    deep = "d/" * 2000 + "x"
    al = tree.aliases(deep)
    assert al.truncated and al.names[0] == deep
    assert sum(len(n) for n in al.names) <= MAX_ALIAS_CHARS
    assert all(tree.resolve(n) == deep for n in al.names[:50])
    short = tree.aliases("a/b")  # an ordinary path still gets its 4,096 names
    assert short.truncated and len(short.names) == 4096


def test_resolving_deep_targets_costs_one_step_a_component() -> None:
    """Stops a patch of many links to deep paths (2,000 components each, well within
    the target limit) costing a join of the whole path at every step: seconds a link."""
    import time

    deep = "/".join(["d"] * 2000)
    tree = FinalTree({f"l{i}": f"{deep}/../x{i}".encode() for i in range(1000)}, ROOT)
    t0 = time.monotonic()
    assert all(tree.resolve(f"l{i}") == f"{deep[:-2]}/x{i}" for i in range(1000))
    assert time.monotonic() - t0 < 8


@pytest.mark.parametrize("target", [
    "{P}/home/u/repo/tools",  # `ln -s "$PWD/tools" .vscode` with a symlinked home
    "../../../../home/u/repo/tools",  # up to a parent, then down the symlinked home
    "{P}/elsewhere/../home/u/repo/tools",
    "{P}/short/tools",  # a link outside straight to the checkout
    "{P}/hop",  # a chain of two links outside
])
def test_a_link_back_in_through_a_symlink_outside_the_checkout_gives_its_name(
        tmp_path: Path, target: str) -> None:
    """Stops `.vscode -> /home/u/repo/tools` passing for a link out when /home is a
    symlink to var/home (the checkout's real path /var/home/u/repo, as the daemon
    has it): the kernel follows the host's links outside the checkout, and so must
    resolution, or tools/tasks.json is written while VS Code reads .vscode/tasks.json."""
    import os

    from tkbox.doors.changes.links import host_link

    base = os.path.realpath(tmp_path)
    root = f"{base}/var/home/u/repo"
    os.makedirs(f"{root}/tools")
    os.makedirs(f"{base}/elsewhere")
    os.symlink("var/home", f"{base}/home")
    os.symlink("var/home/u/repo", f"{base}/short")
    os.symlink("short/tools", f"{base}/hop")
    os.symlink(target.format(P=base), f"{root}/.vscode")
    tree = FinalTree({".vscode": os.fsencode(os.readlink(f"{root}/.vscode"))}, root,
                     outside=host_link)
    assert os.path.realpath(f"{root}/.vscode") == f"{root}/tools"  # the kernel's answer
    assert tree.resolve(".vscode") == "tools"
    assert _held_back_through(tree, "tools/tasks.json", ".vscode/tasks.json")


def test_links_outside_the_checkout_are_followed_as_the_kernel_follows_them(
        tmp_path: Path) -> None:
    """Stops a new link being allowed because resolution took a host symlink outside
    for a directory: `up -> ..` then `w/../repo2/x` with w -> a deeper place leads
    where the kernel says, not where the spelling says."""
    import os

    from tkbox.doors.changes.links import host_link

    base = os.path.realpath(tmp_path)
    root = f"{base}/repo"
    os.makedirs(f"{root}/x")
    os.makedirs(f"{base}/deep/er")
    os.symlink("deep/er", f"{base}/w")  # outside: w/.. is deep, not base
    links = {"up": b"..", "a": b"up/w/../../repo/x"}
    for name, target in links.items():
        os.symlink(target, f"{root}/{name}")
    tree = FinalTree(links, root, outside=host_link)
    assert os.path.realpath(f"{root}/a") == f"{root}/x"
    assert tree.resolve("a") == "x"
    spelled = FinalTree(links, root)  # without the host's links: w/.. taken as spelled
    assert spelled.resolve("a") == OUTSIDE


def test_resolution_steps_are_bounded_over_the_whole_tree() -> None:
    """Stops a patch of many links into one chain of 40 long targets (each `x/..`
    800 times) costing the daemon hours: every link re-walked the whole chain,
    64,000 steps each (8 ms), 100,000 sections over ten minutes. The steps of
    every resolution are counted, and past the bound the patch is refused."""
    from tkbox.doors.changes.errors import PatchRefused

    pad = b"x/../" * 800
    links = {f"L{i}": pad + f"L{i + 1}".encode() for i in range(39)}
    links["L39"] = pad + b"d"
    links |= {f"p{i}": b"L0" for i in range(100)}
    tree = FinalTree(links, ROOT, max_steps=1_000_000)
    with pytest.raises(PatchRefused, match="more than 1000000 steps"):
        tree.by_target()
    assert tree.steps < 1_010_000  # stopped at the bound (a target's `.` and `..` past it)
    ordinary = {f"node_modules/.bin/t{i}": f"../p{i}/bin/t.js".encode() for i in range(10_000)}
    tree = FinalTree(ordinary, ROOT, max_steps=1_000_000)
    assert len(tree.by_target()) == 10_000 and tree.steps < 100_000


@pytest.mark.parametrize("path", ["TOOLS/tasks.json", "Tools/tasks.json", "tools./tasks.json"])
def test_a_path_spelled_in_another_case_gets_the_names_of_links_to_it(path: str) -> None:
    """Stops `TOOLS/tasks.json` passing unheld with the checkout's `.vscode -> tools` on
    a case-insensitive filesystem (ext4 casefold, NTFS, FAT), where it is written into
    tools/ and VS Code reads it as .vscode/tasks.json."""
    tree = FinalTree({".vscode": b"tools"}, ROOT)
    assert ".vscode/tasks.json" in tree.aliases(path).names
    assert _held_back_through(tree, path, ".vscode/tasks.json")


def test_no_host_lookup_below_an_automount_point(tmp_path: Path) -> None:
    """Stops a patch's link target (`/net/<name>/...`) making the host mount, and so
    connect to and ask DNS for, a server the guest named: below an autofs mount
    point nothing is looked up, even a real symlink."""
    from tkbox.doors.changes.links import HostLinks

    (tmp_path / "auto").mkdir()
    (tmp_path / "auto" / "l").symlink_to("elsewhere")
    assert HostLinks(automounts=())(str(tmp_path / "auto" / "l")) == b"elsewhere"
    guarded = HostLinks(automounts=[str(tmp_path / "auto")])
    assert guarded(str(tmp_path / "auto" / "l")) is None
    assert guarded(str(tmp_path / "auto")) is None  # the point itself: a directory


def test_the_automount_points_are_read_from_the_mount_table(tmp_path: Path) -> None:
    from tkbox.doors.changes.links import _automounts

    table = tmp_path / "mountinfo"
    table.write_bytes(
        b"22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
        b"40 1 0:35 / /net rw,relatime shared:20 - autofs -hosts rw,fd=7\n"
        b"41 1 0:36 / /mnt/my\\040disks rw - autofs systemd-1 rw\n"
        b"42 1 8:1 / /data rw - ext4 /dev/sda1 rw\n")
    assert _automounts(str(table)) == ["/net", "/mnt/my disks"]
    assert _automounts(str(tmp_path / "missing")) == []


def test_lookups_outside_the_checkout_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stops a patch of links to many distinct places outside costing a readlink each
    without end: past the bound the patch is refused (not resolved as spelled, which
    a padded patch could use to slip one link past the lookups)."""
    from tkbox.doors.changes import links as links_mod

    monkeypatch.setattr(links_mod, "MAX_HOST_LOOKUPS", 50)
    asked: list[str] = []

    def outside(path: str) -> bytes | None:
        asked.append(path)
        return None

    tree = FinalTree({f"l{i}": f"/elsewhere{i}".encode() for i in range(100)}, ROOT,
                     outside=outside)
    with pytest.raises(PatchRefused, match="more than 50 places outside the checkout"):
        for i in range(100):
            tree.resolve(f"l{i}")
    assert len(asked) == 50


def test_outside_paths_longer_than_path_max_are_never_looked_up() -> None:
    """Stops a patch's deep targets outside the checkout (through a checkout link that
    leaves) costing a join of the whole path at every step: a path the kernel would
    refuse to look up (over PATH_MAX) is never built nor asked, and each shorter one
    is asked once however many links walk it."""
    asked: list[str] = []

    def outside(path: str) -> bytes | None:
        asked.append(path)
        return None

    deep = "u/" + "a/" * 2100 + "x"  # 4,200 bytes below /elsewhere
    links = {"u": b"/elsewhere", **{f"p{i}": deep.encode() for i in range(20)}}
    tree = FinalTree(links, ROOT, outside=outside)
    assert all(tree.resolve(f"p{i}") == OUTSIDE for i in range(20))
    assert asked and max(len(p) for p in asked) < 4096
    assert len(asked) == len(set(asked)) == tree.lookups
