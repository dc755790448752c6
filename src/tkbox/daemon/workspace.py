"""The workspace disks: a read-only copy of the checkout, and an empty upper disk.

The lower disk is a squashfs made from a tar stream of the checkout, leaving
out credential files (ignored by git or not), the `hooks` directory of every
repository (the checkout's, submodules', nested clones'), sockets and
devices. Every git configuration file under a `.git` directory (`config`,
`config.worktree`, `modules/*/config`, `worktrees/*/config*`, nested
repositories') is read with git itself and rewritten without every section
that carries a credential (`credential_reason`); a file git cannot read is
left out, and so is every file a config includes. The upper disk is a sparse
ext4 file the guest mounts as the overlay's upper layer.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tkbox._process import tool_env
from tkbox.doors.secrets.credentials import is_credential
from tkbox.errors import HostError, UserError
from tkbox.gitconfig import Entry, parse_list, render, same

__all__ = ["build_lower", "build_upper", "credential_reason", "is_credential"]

# userinfo in a URL (`scheme://user[:pass]@`), or `user:pass@host` in scp form
_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@|(?:^|[\s\"'=])[^\s/@:]+:[^\s/@]+@",
                       re.ASCII)
# well-known token shapes and authorization schemes, in any value
_TOKEN = re.compile(r"gh[opusr]_[A-Za-z0-9]{20}|github_pat_|glpat-|xox[abprs]-|"
                    r"(?i:\b(?:authorization|bearer|basic)\b)", re.ASCII)
# parts of a variable name that hold or fetch a credential
_CREDENTIAL_NAME = ("pass", "token", "secret", "cookie", "credential", "extraheader", "helper",
                    "askpass", "sshcommand", "sslkey", "sslcert", "auth", "apikey", "api-key",
                    "accesskey", "privatekey", "private-key")
#: sections dropped whole: they hold or fetch credentials, or pull in host files
CREDENTIAL_SECTIONS = ("credential", "include", "includeif")


def credential_reason(group: Sequence[Entry]) -> str | None:
    """Why one section (all its entries) carries a credential, or None.

    A section is dropped whole, never edited, when: it is `credential.*` or an
    include; its subsection, or any value, holds URL userinfo (`url."https://
    user:TOKEN@host/".insteadOf`, a remote's `url`, quoted or not: git has
    already unquoted it); any variable's name is credential-like
    (`http.*.extraHeader`, `credential.helper`, `sendemail.smtpPass`, a
    `*token*`); or any value has a token's or an authorization scheme's shape.
    """
    first = group[0]
    if first.section in CREDENTIAL_SECTIONS:
        return f"{first.section} section"
    if first.subsection is not None and _USERINFO.search(first.subsection):
        return "URL userinfo in the section name"
    for e in group:
        if any(part in e.name for part in _CREDENTIAL_NAME):
            return f"credential-like variable {e.name!r}"
        if e.value is not None and _USERINFO.search(e.value):
            return f"URL userinfo in {e.name!r}"
        if e.value is not None and _TOKEN.search(e.value):
            return f"a token or authorization in {e.name!r}"
    return None


def sanitize_entries(entries: Sequence[Entry]) -> tuple[list[Entry], int]:
    """The entries of every section that carries no credential, and how many sections went.

    A section is all the entries with the same section and subsection,
    wherever they appear in the file (git merges them too).
    """
    groups: dict[tuple[str, str | None], list[Entry]] = {}
    for e in entries:
        groups.setdefault(e.group, []).append(e)
    dropped = {g for g, es in groups.items() if credential_reason(es) is not None}
    return [e for e in entries if e.group not in dropped], len(dropped)


def _git_env(home: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": home, "XDG_CONFIG_HOME": home,
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}


def _git_list(git: str, path: Path, home: str) -> list[Entry] | None:
    """The file's entries as git reads them (includes not followed); None if git cannot."""
    try:
        proc = subprocess.run([git, "config", "--file", str(path), "--no-includes", "--list",
                               "--null"], capture_output=True, env=_git_env(home), cwd=home,
                              check=False, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise HostError(f"cannot read the git configuration {path} with git: {e}") from None
    if proc.returncode != 0:
        return None
    return parse_list(proc.stdout)


class GitConfigCleaner:
    """Rewrites git config files without credentials, reading them with git itself.

    `clean(path)` returns the new bytes (None: git cannot read the file, so
    it is left out of the copy) and the number of sections dropped. The
    result is read back with git and must list exactly the kept entries.
    """

    def __init__(self) -> None:
        git = shutil.which("git")
        if git is None:
            raise HostError("git is not installed; tkbox needs it to copy a checkout's "
                            "git configuration without credentials")
        self.git = git
        self.home = tempfile.mkdtemp(prefix="tkbox-gitcfg-")

    def close(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> GitConfigCleaner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def clean(self, path: Path) -> CleanedConfig:
        entries = _git_list(self.git, path, self.home)
        if entries is None:
            return CleanedConfig(None, 0, ())
        includes = []
        for e in entries:
            if e.section in ("include", "includeif") and e.name == "path" and e.value:
                # git-config(1): a relative include is relative to the including file
                target = Path(os.path.expanduser(e.value))
                includes.append(Path(os.path.normpath(path.parent / target)))
        kept, dropped = sanitize_entries(entries)
        data = render(kept)
        check = Path(self.home) / "check.config"
        check.write_bytes(data)
        back = _git_list(self.git, check, self.home)
        if back is None or not same(back, kept):
            raise HostError(f"cannot copy {path}: git reads the configuration tkbox wrote "
                            "without credentials differently; report this as a tkbox bug")
        return CleanedConfig(data, dropped, tuple(includes))


@dataclass(frozen=True)
class CleanedConfig:
    data: bytes | None  # None: git cannot read the file; it is left out
    dropped_sections: int
    includes: tuple[Path, ...]  # files it includes (left out of the copy too)


def is_git_config(rel: str) -> bool:
    """A configuration file of some repository under `.git` (submodules, worktrees too)."""
    parts = rel.split("/")
    name = parts[-1]
    return ".git" in parts[:-1] and (name == "config" or name.startswith("config."))


def _is_git_dir(dirpath: str, dirnames: Sequence[str], filenames: Sequence[str]) -> bool:
    return "HEAD" in filenames and ("objects" in dirnames or "commondir" in filenames)


def _git_configs(root: Path,
                 stats: dict[str, int]) -> tuple[dict[str, bytes | None], set[str]]:
    """Pass 1: every git config under a `.git`, cleaned; the paths they include.

    Git is needed only when there is a config to read (a checkout that is
    not a repository is copied without it).
    """
    cleaned: dict[str, bytes | None] = {}
    includes: set[str] = set()
    cleaner: GitConfigCleaner | None = None
    try:
        for dirpath, _dirnames, filenames in os.walk(root, followlinks=False):
            d = Path(dirpath)
            rel_dir = d.relative_to(root).as_posix()
            for name in filenames:
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                if not is_git_config(rel):
                    continue
                p = d / name
                if not stat.S_ISREG(p.lstat().st_mode):
                    cleaned[rel] = None  # a linked config could lead to a file copied as is
                    continue
                cleaner = cleaner or GitConfigCleaner()
                c = cleaner.clean(p)
                cleaned[rel] = c.data
                stats["git_config_sections_dropped"] += c.dropped_sections
                for inc in c.includes:
                    includes.add(str(inc))
                    includes.add(os.path.realpath(inc))
    finally:
        if cleaner is not None:
            cleaner.close()
    return cleaned, includes


class _Stopped(Exception):
    """`build_lower`'s `stop` was set: the copy ends where it is."""


def _tar_checkout(root: Path, out: io.RawIOBase, owner: tuple[int, int] = (0, 0),
                  stop: threading.Event | None = None) -> dict[str, int]:
    stats = {"files": 0, "skipped_credentials": 0, "bytes": 0, "git_config_sections_dropped": 0}
    configs, includes = _git_configs(root, stats)
    inside = os.path.realpath(root).rstrip("/") + "/"
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        def add(path: Path, rel: str) -> None:
            if stop is not None and stop.is_set():
                raise _Stopped
            st = path.lstat()
            info = tarfile.TarInfo(rel)
            info.mode = stat.S_IMODE(st.st_mode)
            info.mtime = int(st.st_mtime)
            info.uid, info.gid = owner  # the box's user (the image's User), else root
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif stat.S_ISLNK(st.st_mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(path)
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                data = configs.get(rel)
                if data is not None:
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                else:
                    info.size = st.st_size
                    with os.fdopen(_open_inside(path, rel, st, inside), "rb") as f:
                        tar.addfile(info, f)
                stats["files"] += 1
                stats["bytes"] += info.size

        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            d = Path(dirpath)
            rel_dir = d.relative_to(root).as_posix()
            git_dir = _is_git_dir(dirpath, dirnames, filenames)
            keep_dirs = []
            for name in sorted(dirnames):
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                p = d / name
                if p.is_symlink():
                    filenames.append(name)  # a symlink to a directory is copied as a link
                    continue
                if is_credential(rel, True) or (git_dir and name == "hooks"):
                    stats["skipped_credentials"] += 1
                    continue
                add(p, rel)
                keep_dirs.append(name)
            dirnames[:] = keep_dirs
            for name in sorted(filenames):
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                p = d / name
                st = p.lstat()
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    continue  # sockets, fifos, devices
                included = bool(includes) and (str(p) in includes
                                               or os.path.realpath(p) in includes)
                if is_credential(rel, False) or included \
                        or (rel in configs and configs[rel] is None):
                    stats["skipped_credentials"] += 1
                    continue
                add(p, rel)
    return stats


def _open_inside(path: Path, rel: str, st: os.stat_result, inside: str) -> int:
    """`path`, the regular file `st` (its lstat) describes, opened for reading; a
    `UserError` if it is no longer that file inside the checkout.

    The walk looks at an entry, then opens it by its path: something that swaps the
    file, or a directory above it, for a symlink in between (another user with write
    access to a shared checkout, say) would have a file from elsewhere on the host
    read into the box. The open follows no final symlink, must be the same inode,
    and the kernel's own name for it (`/proc/self/fd`) must be inside the checkout."""
    changed = UserError(f"the checkout changed while it was copied into the box "
                        f"({rel[:200]!r} is no longer the file that was there, inside the "
                        "checkout); nothing was copied: run again once nothing is moving "
                        "files in it")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # now a symlink
            raise changed from None
        raise
    try:
        now = os.fstat(fd)
        where = os.readlink(f"/proc/self/fd/{fd}")
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) \
                or not where.startswith(inside):
            raise changed
    except BaseException:
        os.close(fd)
        raise
    return fd


def build_lower(checkout: Path, target: Path, owner: tuple[int, int] = (0, 0),
                stop: threading.Event | None = None) -> dict[str, int]:
    """Squashfs of the filtered checkout at `target` (via tar2sqfs), every file owned by
    `owner` (uid, gid): the user the box's commands run as, so they can change it.
    Once `stop` is set, the copy ends before the next file: tar2sqfs is killed, the
    target removed, and a `HostError` raised."""
    if not checkout.is_dir():
        raise UserError(f"workspace {checkout} is not a directory; pass an existing "
                        "directory with --workspace")
    tool = shutil.which("tar2sqfs")
    if tool is None:
        raise HostError("tar2sqfs is missing; run 'sudo apt-get install squashfs-tools-ng'")
    err: list[bytes] = []
    with subprocess.Popen([tool, "-q", "-f", "-c", "zstd", "-s", str(target)],
                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, env=tool_env()) as proc:
        assert proc.stdin is not None and proc.stderr is not None
        stderr = proc.stderr
        reader = threading.Thread(target=lambda: err.append(stderr.read()))
        reader.start()
        try:
            stats = _tar_checkout(checkout, proc.stdin, owner, stop)  # type: ignore[arg-type]
            proc.stdin.close()
        except (OSError, _Stopped, UserError) as exc:
            proc.kill()
            with contextlib.suppress(OSError):  # unflushed bytes for a killed tar2sqfs:
                proc.stdin.close()              # Popen's exit would raise BrokenPipe
            proc.wait()
            reader.join()
            target.unlink(missing_ok=True)
            if isinstance(exc, UserError):  # the checkout changed under the copy
                raise
            if isinstance(exc, _Stopped):
                raise HostError("the workspace copy was stopped") from None
            raise HostError(f"cannot copy the workspace: {exc}") from None
        code = proc.wait()
        reader.join()
    if code != 0:
        target.unlink(missing_ok=True)
        msg = b"".join(err).decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise HostError(f"tar2sqfs failed building the workspace disk: {msg[0]}")
    return stats


def build_upper(target: Path, size_mib: int, owner: tuple[int, int] = (0, 0)) -> None:
    """A sparse ext4 disk of `size_mib` for the overlay's upper layer, its root owned by
    `owner` (as the lower copy's files are: the box's user may add files at the top)."""
    tool = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
    if not os.path.exists(tool):
        raise HostError("mkfs.ext4 is missing; run 'sudo apt-get install e2fsprogs'")
    with open(target, "wb") as f:
        f.truncate(size_mib * 1024 * 1024)
    proc = subprocess.run([tool, "-q", "-F", "-m", "0", "-O", "^has_journal",
                           "-E", f"lazy_itable_init=1,root_owner={owner[0]}:{owner[1]}",
                           str(target)],
                          capture_output=True, text=True, check=False, env=tool_env())
    if proc.returncode != 0:
        target.unlink(missing_ok=True)
        raise HostError(f"mkfs.ext4 failed: {proc.stderr.strip()}")
