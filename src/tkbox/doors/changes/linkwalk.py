"""Every symlink of the checkout, read without following any (a blocking shell).

`checkout_links` walks the checkout from its root descriptor with
`O_DIRECTORY|O_NOFOLLOW` opens, never entering a symlink or a `.git`
directory (nor anything a filesystem could fold to `.git`), and returns
{relative path: target} for each symlink, for `links.FinalTree`; given
`markers`, it also fills it with {directory: paths of its entries named like
`HEAD`, `objects`, `refs` or `commondir`}, for `gitdirs`. The walk is
bounded: past `MAX_ENTRIES` entries the patch is refused, since tkbox could
not say which names reach the files it writes.
"""

from __future__ import annotations

import errno
import os

from tkbox.doors.changes.errors import PatchRefused
from tkbox.doors.changes.gitdirs import is_marker
from tkbox.doors.changes.paths import is_dotgit
from tkbox.errors import HostError, TkboxError

MAX_ENTRIES = 2_000_000
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def checkout_links(root_fd: int, max_entries: int = MAX_ENTRIES,
                   markers: dict[str, set[str]] | None = None) -> dict[str, bytes]:
    links: dict[str, bytes] = {}
    count = 0
    stack: list[tuple[int, str]] = [(os.dup(root_fd), "")]
    try:
        while stack:
            fd, rel = stack.pop()
            try:
                with os.scandir(fd) as it:
                    for entry in it:
                        count += 1
                        if count > max_entries:
                            raise PatchRefused(
                                f"the checkout has more than {max_entries} entries; tkbox cannot "
                                "check which symlinks reach the patch's files, so nothing was "
                                "applied: apply the patch to a smaller checkout"
                            )
                        path = f"{rel}/{entry.name}" if rel else entry.name
                        if markers is not None and is_marker(entry.name):
                            markers.setdefault(rel, set()).add(path)
                        if entry.is_symlink():
                            links[path] = os.fsencode(os.readlink(entry.name, dir_fd=fd))
                        elif entry.is_dir(follow_symlinks=False) and not is_dotgit(entry.name):
                            stack.append((_open_dir(fd, entry.name, path), path))
            except OSError as e:
                raise _error(rel or ".", e) from None
            finally:
                os.close(fd)
    except BaseException:
        for fd, _ in stack:
            os.close(fd)
        raise
    return links


def _open_dir(fd: int, name: str, path: str) -> int:
    try:
        return os.open(name, _DIR, dir_fd=fd)
    except OSError as e:
        raise _error(path, e) from None


def _error(path: str, e: OSError) -> TkboxError:
    """A directory tkbox cannot read could hide a symlink: refuse, saying which."""
    if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
        return PatchRefused(f"the checkout changed while tkbox read it ({path!r}); nothing was "
                            "applied, run tkbox apply again")
    return HostError(f"cannot read the checkout's directory {path!r} ({e.strerror}); tkbox "
                     "must see every symlink of the checkout: fix its permissions")
