"""An apply's journal, so that one killed half-way is undone at the next apply.

`fs.place_all` is a transaction in memory: a failure it sees is undone step by
step. A process that dies mid-way (SIGKILL, a power cut, the OOM killer) sees
nothing, and leaves the checkout half-written: some files new, some old, the
originals under `.tkbox-*.tmp` names and in the staging directory. The journal
is what the next apply reads to finish the job.

Before the first step, `place_all` writes every name it will use (each file's
temporary name, each original's name in the staging directory, the staging
directory), what each path held (its identity: inode, mode, size, mtime) and
what it will hold (the new content's SHA-256), the directories it may create
and those it may remove (with their permission bits). The journal is durable
(fsync'd, then renamed into place, the directory fsync'd) before the staging
directory is made. Once every file has its name and the renames are durable,
one line more says so (`placed`). The journal is removed when the originals
are.

Nothing else is written while the apply runs: what happened to each path is
read back from the checkout itself, each name being one the journal chose.
The original found under the temporary name (same identity) means the two were
exchanged; found in the staging directory, it was moved aside; the new content
at a name that was empty means it was put there. So a journal is enough
whatever step the process died at, and whichever of its renames reached the
disk before a power cut.

`recover` (at the start of every apply into the checkout) takes each journal
left for that checkout (`<TKBOX_HOME>/applies/<sha256 of the checkout's real
path>-<random>.journal`) and:

- without `placed`, undoes it: each path back as it was (the new file removed,
  the original given its name again), the directories it made removed if
  empty, those it removed made again, the staging directory removed;
- with `placed` (the files were written and the signer may have recorded them
  so), finishes it: the originals kept for undo are removed.

An apply holds the checkout's lock (`lock_checkout`: an `flock` on
`<key>.lock` beside the journals) from before its journal is begun until the
journal goes, and a recovery holds it while it works: so a recovery waits for
an apply writing into the checkout (and never sees its journal), and an apply
whose checkout was left by an apply killed while it was being prepared (it
read a half-written checkout) refuses instead of writing. Each journal is also
locked while its apply runs, for `pending` (a dry run takes no lock).

Recovery never follows a symlink (every directory is walked
from the checkout's descriptor, as the writes are) and never removes what it
cannot show is its own: a name whose content is neither the original nor the
new file is left and named. What it cannot put right is one `HostError` naming
each path and where its original is; the journal stays until then.

The journal lives beside the daemon's state (0700, the user's own), never in
the checkout: a patch writes into the checkout, and a journal there could be
planted to steer a later recovery.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tkbox._fs import fsync_dir, write_all
from tkbox.errors import HostError

VERSION = 1
MAX_JOURNAL_BYTES = 1 << 30  # our own file: bounded all the same (a patch's paths, ~4×)
SUFFIX = ".journal"
PART = ".part"  # a journal being written: `.<key>-<random>.part`
LOCK = ".lock"  # `<key>.lock`: held by the apply writing into the checkout, or recovering it
LOCK_WAIT = 120.0  # seconds to wait for another apply writing into the same checkout


def lock_checkout(where: Path, root: Path) -> int:
    """The checkout's lock (an exclusive `flock` on `<where>/<key>.lock`, never
    removed), waited for up to `LOCK_WAIT` seconds: a descriptor to close to release
    it. An apply holds it from before its journal is begun until the journal is
    removed or kept, a recovery while it works: so a recovery never runs beside an
    apply's writes, and every journal of the checkout's that a holder sees (but its
    own) is one left by an apply that ended."""
    try:
        fd = os.open(where / f"{key(root)}{LOCK}",
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise HostError(f"cannot lock the applies into {str(root)!r} in {str(where)!r}: "
                        f"{e.strerror}; nothing was applied") from None
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise HostError(f"another tkbox apply into {str(root)!r} has been writing "
                                f"for {LOCK_WAIT:g} s; nothing was applied; run tkbox apply "
                                f"again once it ends") from None
            time.sleep(0.05)


def listing(where: Path, root: Path, suffix: str = SUFFIX) -> list[str]:
    """The names of the checkout's journals in `where` (`suffix=PART`: of those being
    written), sorted."""
    prefix = f"{key(root)}-" if suffix == SUFFIX else f".{key(root)}-"
    try:
        return sorted(n for n in os.listdir(where) if n.startswith(prefix) and n.endswith(suffix))
    except FileNotFoundError:
        return []


def key(root: Path) -> str:
    """The prefix of every journal for the checkout at `root` (its real path)."""
    return hashlib.sha256(os.fsencode(str(root))).hexdigest()[:32]


@dataclass(frozen=True)
class Entry:
    """One path of the apply, as the journal has it."""

    path: str
    tmp: str | None  # the new file's temporary name in its directory (a put)
    backup: str | None  # the original's name in the staging directory
    present: bool  # the path held a file or link the apply replaces or deletes
    old: tuple[int, ...]  # its identity (ino, mode, size, mtime_ns); () if none
    new_kind: str  # "absent" (a deletion), "file" or "link"
    new_size: int
    new_sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "tmp": self.tmp, "backup": self.backup,
                "present": self.present, "old": list(self.old), "new_kind": self.new_kind,
                "new_size": self.new_size, "new_sha256": self.new_sha256}

    @classmethod
    def from_json(cls, o: Any) -> Entry:
        if not isinstance(o, dict):
            raise ValueError("an entry is not an object")
        e = cls(o["path"], o["tmp"], o["backup"], o["present"], tuple(o["old"]),
                o["new_kind"], o["new_size"], o["new_sha256"])
        if not (isinstance(e.path, str) and e.path and _opt_name(e.tmp) and _opt_name(e.backup)
                and type(e.present) is bool and all(type(i) is int for i in e.old)
                and e.new_kind in ("absent", "file", "link") and type(e.new_size) is int
                and isinstance(e.new_sha256, str)):
            raise ValueError("an entry is malformed")
        return e


def _opt_name(v: Any) -> bool:
    return v is None or (isinstance(v, str) and _is_name(v))


def _is_name(v: str) -> bool:
    return bool(v) and "/" not in v and v not in (".", "..") and "\0" not in v


@dataclass(frozen=True)
class Plan:
    """Everything the journal says about one apply."""

    root: str
    stage: str
    started: float
    entries: tuple[Entry, ...]
    made: tuple[str, ...]  # directories that were not there, shallowest first
    kept: tuple[tuple[str, int], ...]  # directories that may be emptied, with their bits

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "root": self.root, "stage": self.stage,
                "started": self.started, "entries": [e.to_json() for e in self.entries],
                "made": list(self.made), "kept": [list(k) for k in self.kept]}

    @classmethod
    def from_json(cls, o: Any) -> Plan:
        if not isinstance(o, dict) or o.get("version") != VERSION:
            raise ValueError("not a journal of this version")
        made, kept = o["made"], o["kept"]
        if not (isinstance(made, list) and all(isinstance(d, str) and d for d in made)
                and isinstance(kept, list)
                and all(isinstance(k, list) and len(k) == 2 and isinstance(k[0], str) and k[0]
                        and type(k[1]) is int for k in kept)
                and isinstance(o["root"], str) and isinstance(o["stage"], str)
                and _is_name(o["stage"]) and isinstance(o["started"], (int, float))
                and isinstance(o["entries"], list)):
            raise ValueError("the journal is malformed")
        return cls(o["root"], o["stage"], float(o["started"]),
                   tuple(Entry.from_json(e) for e in o["entries"]), tuple(made),
                   tuple((k[0], k[1]) for k in kept))


class Journal:
    """One apply's journal file, locked (`flock`) while the apply runs."""

    def __init__(self, path: Path, fd: int, lock: int = -1) -> None:
        self.path = path
        self._fd = fd
        self._lock = lock  # the checkout's (`lock_checkout`), held while the journal is

    @classmethod
    def begin(cls, where: Path, plan: Plan) -> Journal:
        """Write `plan` durably (HostError if it cannot be: then nothing is applied), the
        checkout's lock held (waited for) from before it until the journal goes."""
        root = Path(plan.root)
        lock = lock_checkout(where, root)
        if listing(where, root):  # we hold the lock: left by an apply killed meanwhile
            os.close(lock)
            raise HostError("an earlier apply into this checkout was cut short while this one "
                            "was being prepared; nothing was applied; run tkbox apply again: "
                            "it puts that right first")
        name = f"{key(root)}-{os.urandom(8).hex()}"
        part, final = where / f".{name}{PART}", where / f"{name}{SUFFIX}"
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_CLOEXEC, 0o600)
        except OSError as e:
            os.close(lock)
            raise HostError(f"cannot write the apply's journal in {str(where)!r}: "
                            f"{e.strerror}; nothing was applied") from None
        try:
            # locked before it has its name: `pending` never sees it unlocked while we run
            fcntl.flock(fd, fcntl.LOCK_EX)
            write_all(fd, json.dumps(plan.to_json(), separators=(",", ":")).encode() + b"\n")
            os.fsync(fd)
            os.rename(part, final)
            fsync_dir(where)
        except OSError as e:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(part)
            with contextlib.suppress(OSError):
                os.unlink(final)
            os.close(lock)
            raise HostError(f"cannot write the apply's journal in {str(where)!r}: "
                            f"{e.strerror}; nothing was applied") from None
        return cls(final, fd, lock)

    def placed(self) -> None:
        """Every file has its name, durably: from now on a recovery finishes the apply."""
        write_all(self._fd, b'{"placed":true}\n')
        os.fsync(self._fd)

    def done(self) -> None:
        """The apply ended cleanly (or was undone in full): the journal goes."""
        try:
            os.unlink(self.path)
            with contextlib.suppress(OSError):
                fsync_dir(self.path.parent)
        finally:
            self.keep()

    def keep(self) -> None:
        """The apply left something to put right: the journal stays for the next one."""
        if self._fd >= 0:
            os.close(self._fd)  # the lock with it
            self._fd = -1
        if self._lock >= 0:
            os.close(self._lock)  # the checkout's: the next apply may put it right
            self._lock = -1


def read(fd: int) -> tuple[Plan | None, bool]:
    """(the plan, placed?); (None, False) for one that is not a journal of this
    version (a journal has its name only once written in full and durable)."""
    size = os.fstat(fd).st_size
    if size > MAX_JOURNAL_BYTES:
        raise ValueError(f"the journal is larger than {MAX_JOURNAL_BYTES} bytes")
    data = b""
    while len(data) < size:
        chunk = os.pread(fd, size - len(data), len(data))
        if not chunk:
            break
        data += chunk
    first, _, rest = data.partition(b"\n")
    if not _:
        return None, False
    try:
        plan = Plan.from_json(json.loads(first))
    except (ValueError, KeyError, TypeError):
        return None, False
    return plan, rest.startswith(b'{"placed":true}\n')


def ident(st: os.stat_result) -> tuple[int, ...]:
    """What the journal keeps of a file's identity: not the device number, which a
    reboot may change for the same filesystem."""
    return (st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns)
