"""`apply_patch`: the six steps of DESIGN §7, in order (the asyncio shell).

1. parse strictly (`patch.parse_patch`, `paths.check_path`); refuse the hooks
   directory the checkout's git uses; refuse, per file, what it ignores;
2. hold back sensitive files (`sensitive`) unless `allow_sensitive`;
3. git, in an empty repository, must read the patch exactly as we do
   (`git apply --numstat -z --summary` compared byte for byte with what our
   parse predicts), with nothing on stderr;
4. build the result: our own exact application of every hunk
   (`plan.build`), and git's, in a scratch copy of the affected files with no
   hooks, filters or configuration; the two must agree on every path;
5. one `Write` decision per file; one refusal and nothing is applied;
6. check the checkout again and write each file (`fs.place_all`); the
   completions are recorded while the replaced originals are removed.

Whole-patch refusals raise `PatchRefused` (one line: what, why, where);
held-back and per-file refusals are in the returned `ApplyReport`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tkbox import paths
from tkbox._fs import write_all
from tkbox._tasks import TaskOwner
from tkbox._threads import through
from tkbox.doors.changes import gitdirs, recover, sensitive
from tkbox.doors.changes.errors import PatchRefused
from tkbox.doors.changes.fs import Checkout, Write, place_all, read_fd
from tkbox.doors.changes.git import Git, Result
from tkbox.doors.changes.gitnamed import Named, named_paths
from tkbox.doors.changes.links import Aliases, HostLinks
from tkbox.doors.changes.linkwalk import checkout_links
from tkbox.doors.changes.patch import Limits, Patch, git_reading, parse_patch
from tkbox.doors.changes.paths import folded_parts, under
from tkbox.doors.changes.plan import FilePlan, Plan, State, build, classify
from tkbox.doors.changes.report import ApplyReport, FileResult, Status
from tkbox.errors import HostError, SignerUnavailable, UserError
from tkbox.gitconfig import Entry
from tkbox.record.client import SignerClient, Verdict

__all__ = ["apply_patch", "ignored_paths"]

MAX_TOTAL_ALIASES = 1_000_000  # names checked over the whole patch (FinalTree.aliases)
DECIDE_WINDOW = 64  # Write decisions in flight at once
_READ_SCRATCH = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_SCRATCH = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


async def apply_patch(patch: bytes, checkout: Path, signer: SignerClient, run_id: str, *,
                      allow_sensitive: bool = False, dry_run: bool = False,
                      limits: Limits | None = None,
                      journals: Path | None = None) -> ApplyReport:
    """Apply the guest's `patch` to `checkout`, writing only what the signer allows.

    Parsing, reading the checkout and planning are CPU- and memory-bound on
    hostile input: they run in a worker thread (`asyncio.to_thread`), never
    on the daemon's event loop, within `Limits`.

    `journals`: where the writes' journal is kept (default
    `<TKBOX_HOME>/applies`); an apply into this checkout that died half-way is
    put right from it first (`recover`), and a dry run refuses until then.
    """
    limits = limits or Limits()
    root = Path(os.path.realpath(checkout))
    if not root.is_dir():
        raise UserError(f"the checkout {str(checkout)!r} is not a directory")
    where = await asyncio.to_thread(
        paths.private_dir, journals if journals is not None else paths.home() / "applies")
    notes: list[str] = await asyncio.to_thread(_put_right, where, root, dry_run)
    try:
        git: Git | None = Git()
    except HostError:
        git = None  # raised again below, once the patch is known to change something
    # The git runs that need no answer of ours run while we work, in their own
    # processes; each answer is still checked at its step, in the order above, so
    # the first fault found is the one reported, as when they ran one by one.
    reading: asyncio.Future[Result] | None = None
    started: list[asyncio.Future[Any]] = []  # git runs begun early; ended in `finally`
    # this apply's tasks: git runs and worker threads, all ended by its `finally`
    owner = TaskOwner("apply")
    if git is not None and len(patch) <= limits.max_patch_bytes:
        reading = owner.spawn(_git_reading(git, patch), "git reading",
                              awaited=True)  # git's part of (3)
        started.append(reading)
    try:
        parsed = await asyncio.to_thread(parse_patch, patch, limits)  # (1)
        if not parsed.sections:
            return ApplyReport(str(root), parsed.sha256, dry_run, allow_sensitive,
                               notes=(*notes, "the patch is empty"))
        if git is None or reading is None:  # no git; parse_patch refuses an oversized patch
            git = Git()
            reading = owner.spawn(_git_reading(git, patch), "git reading", awaited=True)
            started.append(reading)
        repo_task = owner.spawn(_repo_config(git, root, notes), "repo config", awaited=True)
        ignored_task = owner.spawn(_ignored_after(git, root, parsed, repo_task), "ignored",
                                   awaited=True)
        started += [repo_task, ignored_task]
        try:
            co = Checkout(root)
        except PatchRefused:
            await _git_reads_same(git, parsed, await reading)  # (3): its fault comes first
            await repo_task
            raise
        with co:
            plan_task = owner.spawn(asyncio.to_thread(  # (1), (4) ours
                _plan, co, parsed, limits, root, checkout), "plan", awaited=True)
            try:
                await _git_reads_same(git, parsed, await reading)  # (3)
                repo = await repo_task
                plan = await plan_task
                ignored = await ignored_task  # (1)
            finally:
                await _settle(started, [plan_task])
            await asyncio.to_thread(_classify, plan, root, repo, ignored,  # (1), (2)
                                    allow_sensitive)
            await _git_builds_same(git, plan)  # (4) git's
            if dry_run:
                return _report(root, plan, dry_run, allow_sensitive, notes, "would apply")
            verdicts = await _decide(signer, run_id, plan)  # (5)
            writing = owner.spawn(asyncio.to_thread(  # (6)
                place_all, co, _writes(plan), limits.max_file_bytes, where), "writing",
                awaited=True)
            cancelled = await through(writing)
            if (exc := writing.exception()) is not None:
                await _complete(signer, run_id, verdicts, {"written": False,
                                                           "reason": str(exc)[:500]})
                raise exc
            # Written and durable: recorded so while the originals kept for undo are
            # removed (a failure to remove them does not unwrite the files).
            removing = owner.spawn(asyncio.to_thread(writing.result().remove_originals),
                                   "removing originals", awaited=True)
            try:
                await _complete(signer, run_id, verdicts, {"written": True})
            finally:
                cancelled = await through(removing) or cancelled
            removing.result()  # HostError: what is left to remove by hand
            if cancelled:  # asked while writing: the writes ended, and are recorded
                raise asyncio.CancelledError
            return _report(root, plan, dry_run, allow_sensitive, notes, "applied")
    finally:
        await _settle(started, [])
        await owner.aclose()  # nothing is left running: settled, or waited out above
        if git is not None:
            git.close()


async def _settle(git_runs: list[asyncio.Future[Any]], threads: list[asyncio.Future[Any]]
                  ) -> None:
    """End what was started early and is no longer wanted: git runs are cancelled
    (their process killed), worker threads waited for (they cannot be stopped, and
    use the checkout's descriptor)."""
    for t in git_runs:
        t.cancel()
    await asyncio.gather(*git_runs, *threads, return_exceptions=True)


def _put_right(where: Path, root: Path, dry_run: bool) -> list[str]:
    """An earlier apply into `root` that died half-way: undone (or finished), a note
    each; a dry run, which changes nothing, refuses instead."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []  # the checkout's own walk refuses it, in its turn
    try:
        if dry_run:
            if recover.pending(where, root):
                raise UserError("an earlier apply into this checkout was cut short and is "
                                "not put right yet; run tkbox apply without --dry-run: it "
                                "undoes that first")
            return []
        return recover.recover(where, root, fd)
    finally:
        os.close(fd)


def _spellings(checkout: Path, root: Path) -> list[str]:
    """The checkout's absolute path as it was given, if it names `root` another way
    (through a symlinked directory): a link's absolute target may spell it so."""
    given = os.path.abspath(checkout)
    return [given] if given != str(root) and os.path.realpath(given) == str(root) else []


def _plan(co: Checkout, parsed: Patch, limits: Limits, root: Path, checkout: Path) -> Plan:
    """States, the checkout's symlinks, and the plan on the final tree (blocking)."""
    states = _states(co, parsed, limits)
    markers: dict[str, set[str]] = {}
    links = checkout_links(co.fd, markers=markers)
    plan = build(parsed, states, max_file_bytes=limits.max_file_bytes, links=links,
                 root=str(root), root_spellings=_spellings(checkout, root),
                 max_total_bytes=limits.max_total_bytes, outside=HostLinks())
    _refuse_below_checkout_symlinks(plan, states)
    plan.git_dirs = gitdirs.final_git_dirs(
        markers, [(f.path, f.old.kind != "absent" and f.old.blocked_by is None,
                   f.new.kind != "absent") for f in plan.files])
    return plan


@dataclass(frozen=True)
class RepoConfig:
    """What the checkout's git configuration says, read once with git itself."""

    top: Path | None  # None: not a git repository
    entries: tuple[Entry, ...] = ()

    def last(self, key: str) -> str | None:
        values = [e.value for e in self.entries if e.key == key and e.value is not None]
        return values[-1] if values else None


async def _repo_config(git: Git, root: Path, notes: list[str]) -> RepoConfig:
    top = await git.toplevel(root)
    if top is None:
        notes.append("the checkout is not a git repository: no ignore rules apply")
        return RepoConfig(None)
    return RepoConfig(top, tuple(await git.config_list(root)))


def _classify(plan: Plan, root: Path, repo: RepoConfig, ignored: set[str],
              allow_sensitive: bool) -> None:
    """Refuse the hooks directory; hold back what is sensitive under any of its names."""
    home = os.path.expanduser("~")
    named = Named(named_paths(repo.entries, str(root), home)) if repo.top else Named({})
    hooks = _hooks_prefixes(root, repo, home)
    reasons: dict[str, str | None] = {}
    total = 0
    for f in plan.files:
        aliases = plan.tree.aliases(f.path)
        total += len(aliases.names)
        if total > MAX_TOTAL_ALIASES:
            raise PatchRefused(f"the patch's files have more than {MAX_TOTAL_ALIASES} names "
                               "through symlinks; tkbox cannot check them all, so nothing was "
                               "applied: remove the symlinks that lead to their own directories")
        for name in aliases.names:
            if any(under(name, prefix) for prefix in hooks):
                via = "" if name == f.path else f", reached as {name!r}"
                raise PatchRefused(f"{f.sections[0].where}: inside the checkout's git hooks "
                                   f"directory (core.hooksPath{via})")
        reasons[f.path] = _sensitive(f.path, aliases, named, plan.git_dirs)
    classify(plan, ignored=ignored, sensitive=lambda p: reasons.get(p),
             allow_sensitive=allow_sensitive)


def _sensitive(path: str, aliases: Aliases, named: Named,
               git_dirs: set[tuple[str, ...]]) -> str | None:
    for name in aliases.names:
        why = (sensitive.sensitive_reason(name) or named.reason(name)
               or gitdirs.reason(name, git_dirs))
        if why is not None:
            return why if name == path else f"{why}, reached as {name!r} through symlinks"
    if aliases.truncated:
        return (f"reachable under more than {len(aliases.names)} names through symlinks; "
                "tkbox cannot check them all")
    return None


def _hooks_prefixes(root: Path, repo: RepoConfig, home: str) -> list[tuple[str, ...]]:
    """The hooks directory inside the checkout, as spelled and as the checkout resolves it."""
    hooks = repo.last("core.hookspath")
    if not hooks or repo.top is None:
        return []
    if hooks.startswith("~/") or hooks == "~":
        hooks = home + hooks[1:]
    out = []
    for target in (os.path.normpath(repo.top / hooks), os.path.realpath(repo.top / hooks)):
        try:
            rel = Path(target).relative_to(root)
        except ValueError:
            continue
        if str(rel) != ".":
            out.append(folded_parts(rel.as_posix()))
    return out


async def _ignored(git: Git, root: Path, paths: list[bytes], repo: RepoConfig) -> set[bytes]:
    """Which of `paths` the checkout's git ignores."""
    if repo.top is None:
        return set()
    excludes = repo.last("core.excludesfile")
    if excludes is not None and excludes.startswith("~"):
        excludes = os.path.expanduser(excludes)
    if excludes is None:
        xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
        default = Path(xdg) / "git" / "ignore"
        excludes = str(default) if default.is_file() else None
    return await git.ignored(root, paths, excludes)


async def _ignored_after(git: Git, root: Path, parsed: Patch,
                         repo: asyncio.Future[RepoConfig]) -> set[str]:
    paths = sorted({s.raw_path for s in parsed.sections})
    return {os.fsdecode(p) for p in await _ignored(git, root, paths, await repo)}


async def ignored_paths(checkout: Path, paths: list[bytes]) -> set[bytes]:
    """Which of `paths` (relative, as in a patch) `checkout`'s git ignores, decided as
    `apply_patch` decides it: the box sets these apart when it computes its patch
    (`tkbox.guest.diff`), so the box and the apply agree. Nothing, when `checkout` is
    not a git repository; a `PatchRefused` when git cannot check them."""
    root = Path(os.path.realpath(checkout))
    git = Git()
    try:
        return await _ignored(git, root, paths, await _repo_config(git, root, []))
    finally:
        await asyncio.to_thread(git.close)


def _refuse_below_checkout_symlinks(plan: Plan, states: dict[str, State]) -> None:
    """A patch replacing a checkout symlink by a directory is refused as a whole.

    `plan.build` allows it (the symlink is deleted before anything is made
    below it), but git cannot say whether paths below a symlink are ignored.
    """
    for f in plan.files:
        blocker = f.old.blocked_by
        if blocker is not None and states[blocker].kind == "link":
            raise PatchRefused(
                f"{f.sections[0].where}: the patch replaces the checkout's symlink "
                f"{blocker!r} by a directory; git cannot check ignore rules below a symlink, "
                "so make this change by hand"
            )


async def _git_reading(git: Git, data: bytes) -> Result:
    """git's reading of the patch (`git apply --numstat -z --summary`), in an empty
    repository; started before our own parse is done."""
    repo = git.tmp / "empty"
    await git.init(repo)
    # on stdin, not from a file: cancelled, it leaves nothing half-written behind
    return await git.run(repo, ["apply", "--numstat", "-z", "--summary"], stdin=data)


async def _git_reads_same(git: Git, parsed: Patch, r: Result | None = None) -> None:
    """Step 3: git's reading of every section must be ours, byte for byte.

    `r`: git's reading (`_git_reading`) if it was started already; else it runs now.
    """
    if r is None:
        r = await _git_reading(git, parsed.data)
    if r.rc != 0 or r.err:
        msg = r.err.decode("utf-8", errors="replace").strip().splitlines()
        raise PatchRefused("git and tkbox read the patch differently: git says "
                           f"{(msg[0] if msg else f'exit status {r.rc}')!r}")
    ours = await asyncio.to_thread(git_reading, parsed.sections)
    if r.out != ours:
        where = _where(parsed, r.out, ours)
        raise PatchRefused(f"git and tkbox read the patch differently at {where}")


def _where(parsed: Patch, theirs: bytes, ours: bytes) -> str:
    """The first section whose numstat record differs, for the message."""
    t, o = theirs.split(b"\x00"), ours.split(b"\x00")
    for i, s in enumerate(parsed.sections):
        if i >= len(t) or i >= len(o) or t[i] != o[i]:
            got = t[i][:80].decode("utf-8", "backslashreplace") if i < len(t) else "nothing"
            return f"{s.where}: git read {got!r}"
    return "the summary of creations, deletions and mode changes"


def _states(co: Checkout, parsed: Patch, limits: Limits) -> dict[str, State]:
    named = {s.path for s in parsed.sections}
    wanted: set[str] = set(named)
    for s in parsed.sections:
        parts = s.path.split("/")
        wanted.update("/".join(parts[:i]) for i in range(1, len(parts)))
    states: dict[str, State] = {}
    total = 0
    with contextlib.closing(co.states(sorted(wanted), limits.max_file_bytes,
                                      list_below=named)) as found:
        for p, st in found:
            total += len(st.content)
            if total > limits.max_total_bytes:
                raise PatchRefused(f"the checkout's files the patch changes add up to more "
                                   f"than {limits.max_total_bytes} bytes; apply it in parts")
            states[p] = st
    return states


async def _git_builds_same(git: Git, plan: Plan) -> None:
    """Step 4: git applies the kept sections to a scratch copy; it must match ours."""
    kept = plan.kept()
    if not kept:
        return
    scratch = git.scratch(sum(len(f.old.content) + len(f.new.content) for f in kept))
    scratch.mkdir(parents=True, exist_ok=True)

    def prepare() -> None:
        _populate(scratch, kept)

    # git init and the copy at once: they touch different names in `scratch`
    owner = TaskOwner("git builds")
    init = owner.spawn(git.init(scratch), "git init", awaited=True)
    copy = owner.spawn(asyncio.to_thread(prepare), "copy", awaited=True)
    try:
        await init
        await copy
    finally:
        await _settle([init], [copy])
        await owner.aclose()
    r = await git.run(scratch, ["apply", "--whitespace=nowarn"],
                      stdin=plan.patch.subset(plan.kept_sections()))
    if r.rc != 0 or r.err:
        msg = r.err.decode("utf-8", errors="replace").strip().splitlines()
        raise PatchRefused("git could not apply the patch to a copy of the checkout: "
                           f"{(msg[0] if msg else f'exit status {r.rc}')!r}")
    await asyncio.to_thread(_compare, kept, scratch)


def _compare(kept: list[FilePlan], scratch: Path) -> None:
    expected = {f.path: f.new for f in kept if f.new.kind != "absent"}
    found = _tree(scratch)
    for path in sorted(set(expected) | set(found)):
        e, g = expected.get(path), found.get(path)
        if e is None or g is None or (e.kind, e.content, e.exec) != (g.kind, g.content, g.exec):
            raise PatchRefused(f"git and tkbox build different results for {path!r}; "
                               "the patch is ambiguous")


def _populate(scratch: Path, kept: list[FilePlan]) -> None:
    """The old files and symlinks of `kept`, as we read them, in the scratch copy;
    each directory made once."""
    made = {""}
    for f in kept:
        old = f.old
        if old.blocked_by is not None or old.kind not in ("file", "link"):
            continue
        parent = f.path.rpartition("/")[0]
        if parent not in made:
            os.makedirs(os.path.join(scratch, parent), exist_ok=True)
            made.add(parent)
        target = os.path.join(scratch, f.path)
        if old.kind == "link":
            os.symlink(old.content, target)
            continue
        fd = os.open(target, _CREATE_SCRATCH)  # a new file: each path is there once
        try:
            write_all(fd, old.content)
            os.fchmod(fd, 0o755 if old.exec else 0o644)
        finally:
            os.close(fd)


def _tree(root: Path) -> dict[str, State]:
    """Every file and symlink below `root` (the scratch copy), but its `.git`."""
    out: dict[str, State] = {}
    todo = [("", str(root))]
    while todo:
        rel, full = todo.pop()
        with os.scandir(full) as entries:
            for e in entries:
                path = f"{rel}/{e.name}" if rel else e.name
                if e.is_symlink():
                    out[path] = State("link", os.fsencode(os.readlink(e.path)))
                elif e.is_dir(follow_symlinks=False):
                    if path != ".git":
                        todo.append((path, e.path))
                else:
                    fd = os.open(e.path, _READ_SCRATCH)
                    try:
                        st = os.fstat(fd)
                        content = read_fd(fd, st.st_size)
                    finally:
                        os.close(fd)
                    out[path] = State("file", content, exec=bool(st.st_mode & stat.S_IXUSR))
    return out


async def _decide(signer: SignerClient, run_id: str,
                  plan: Plan) -> list[tuple[FilePlan, Verdict]]:
    """Step 5: one Write decision per file; any refusal refuses the patch.

    Up to `DECIDE_WINDOW` requests are in flight at once, sent in patch order on the
    signer's one connection (it answers a batch with one durable commit); the
    first refusal in patch order is the one reported. A refusal stops new requests.
    """
    kept = plan.kept()
    answers: list[Verdict | BaseException | None] = [None] * len(kept)
    stop = asyncio.Event()
    window = asyncio.Semaphore(DECIDE_WINDOW)

    async def one(i: int, f: FilePlan) -> None:
        async with window:
            if stop.is_set():
                return
            resource = {"path": f.path, "sha256": f.sha256, "mode": f.mode}
            context = {"patch_sha256": plan.patch.sha256, "kind": f.kind,
                       "old_sha256": (hashlib.sha256(f.old.content).hexdigest()
                                      if f.old.kind in ("file", "link") else None)}
            try:
                v = await signer.decide(run_id, "Write", resource, context)
            except Exception as e:  # noqa: BLE001 - raised below, in patch order
                answers[i] = e
                stop.set()
                return
            answers[i] = v
            if not v.allowed:
                stop.set()

    async with asyncio.TaskGroup() as tg:
        for i, f in enumerate(kept):
            tg.create_task(one(i, f))
    verdicts: list[tuple[FilePlan, Verdict]] = []
    for f, a in zip(kept, answers, strict=True):
        if isinstance(a, SignerUnavailable):
            raise PatchRefused(f"nothing applied: the signer did not answer for {f.path!r} "
                               f"({a}); try again when it is back") from a
        if isinstance(a, BaseException):
            raise a
        if isinstance(a, Verdict) and not a.allowed:
            raise PatchRefused(f"nothing applied: the signer refused writing {f.path!r}: "
                               f"{a.reason}")
        if isinstance(a, Verdict):
            verdicts.append((f, a))
    if len(verdicts) != len(kept):  # only after a refusal, which raised above
        raise PatchRefused("nothing applied: the signer did not decide every file")
    return verdicts


async def _complete(signer: SignerClient, run_id: str,
                    verdicts: list[tuple[FilePlan, Verdict]], outcome: dict[str, object]) -> None:
    """Each decision's completion, pipelined like the decisions; the first failure raises."""
    window = asyncio.Semaphore(DECIDE_WINDOW)

    async def one(v: Verdict) -> None:
        async with window:
            await signer.complete(run_id, v.decision_id, outcome)

    results = await asyncio.gather(*(one(v) for _, v in verdicts), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r


def _writes(plan: Plan) -> list[Write]:
    def verifier(expected: str | None) -> Callable[[bytes], bool]:
        return lambda content: hashlib.sha256(content).hexdigest() == expected
    return [Write(f.path, f.new, f.old, verifier(f.sha256)) for f in plan.kept()]


def _report(root: Path, plan: Plan, dry_run: bool, allow_sensitive: bool, notes: list[str],
            done: Status) -> ApplyReport:
    files = []
    for f in plan.files:
        status: Status = done if f.status == "apply" else f.status
        files.append(FileResult(f.path, f.kind, status, f.reason, f.mode, f.sha256))
    return ApplyReport(str(root), plan.patch.sha256, dry_run, allow_sensitive, tuple(files),
                       tuple(notes), plan.patch.subset(plan.kept_sections()))

