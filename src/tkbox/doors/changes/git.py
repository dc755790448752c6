"""Git, run so that nothing but the patch steers it (the asyncio shell).

Every run gets an environment built from nothing (not inherited): `PATH`,
`HOME` and `XDG_CONFIG_HOME` set to an empty private directory,
`GIT_CONFIG_NOSYSTEM=1`, `GIT_CONFIG_GLOBAL=/dev/null`, `GIT_ATTR_NOSYSTEM=1`,
`GIT_CEILING_DIRECTORIES` at the working directory's parent, `LC_ALL=C`, and
`-c` options that switch off everything config could otherwise run or change:
hooks (`core.hooksPath=/dev/null`), fsmonitor, attributes files, line-ending
conversion, and whitespace fixing. Repositories are created with an empty
template (no sample hooks) and with `info/attributes` unsetting every
attribute that converts content (`text`, `eol`, `crlf`, `ident`, `filter`,
`working-tree-encoding`), which outranks any `.gitattributes` in the tree.

Only `git config --list --null --show-origin --includes` (read only;
nothing is executed) and `git rev-parse --show-toplevel` see the user's own
configuration, so that the user's hooks directory is refused, the files the
configuration names are held back (`gitnamed`) and their ignore rules apply;
`check-ignore` then runs with our switches and the user's excludes file
passed explicitly.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tkbox.doors.changes.errors import PatchRefused
from tkbox.errors import HostError
from tkbox.gitconfig import ConfigListError, Entry, parse_list

TIMEOUT = 120.0
MEMORY_DIR = Path("/dev/shm")
MEMORY_MARGIN = 256 << 20  # left free in MEMORY_DIR beyond twice the scratch copy
_SAFE = [
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "core.attributesFile=/dev/null",
    "-c", "core.autocrlf=false",
    "-c", "core.safecrlf=false",
    "-c", "core.eol=lf",
    "-c", "core.symlinks=true",
    "-c", "core.filemode=true",
    "-c", "core.ignorecase=false",
    "-c", "core.precomposeUnicode=false",
    "-c", "core.quotePath=true",
    "-c", "core.protectNTFS=true",
    "-c", "core.protectHFS=true",
    "-c", "apply.whitespace=nowarn",
    "-c", "apply.ignoreWhitespace=no",
    "-c", "init.defaultBranch=main",
    "-c", "protocol.allow=never",
]
_NO_CONVERSION = b"* !text !eol !crlf !ident !filter !working-tree-encoding !diff !merge\n"


@dataclass
class Result:
    rc: int
    out: bytes
    err: bytes


class Git:
    """A git binary with a private empty home; `close()` removes the home."""

    def __init__(self) -> None:
        exe = shutil.which("git")
        if exe is None:
            raise HostError("git is not installed; tkbox apply needs git to check the patch")
        self.exe = exe
        self.tmp = Path(tempfile.mkdtemp(prefix="tkbox-apply-"))
        self.home = self.tmp / "home"
        self.template = self.tmp / "template"
        self.home.mkdir()
        self.template.mkdir()
        self._memory: list[Path] = []  # scratch directories in MEMORY_DIR

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        for d in self._memory:
            shutil.rmtree(d, ignore_errors=True)

    def scratch(self, needed: int) -> Path:
        """A new empty directory for a scratch copy of `needed` bytes (old and new).

        In memory (`/dev/shm`, a tmpfs) when it has room for twice that, so the copy
        git applies to costs no journal commits; else under the private home.
        Removed by `close()` either way.
        """
        try:
            st = os.statvfs(MEMORY_DIR)
            room = st.f_bavail * st.f_frsize if MEMORY_DIR.is_dir() else 0
        except OSError:
            room = 0
        if room > 2 * needed + MEMORY_MARGIN:
            try:
                d = Path(tempfile.mkdtemp(prefix="tkbox-apply-", dir=MEMORY_DIR))
            except OSError:
                pass
            else:
                self._memory.append(d)
                return d / "scratch"
        return self.tmp / "scratch"

    def env(self, cwd: Path) -> dict[str, str]:
        return {
            "PATH": os.defpath + os.pathsep + os.path.dirname(self.exe),
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.home),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_CEILING_DIRECTORIES": str(cwd.parent),
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            "LC_ALL": "C",
        }

    async def run(self, cwd: Path, args: Sequence[str], stdin: bytes = b"",
                  env: dict[str, str] | None = None, safe: bool = True) -> Result:
        proc = await asyncio.create_subprocess_exec(
            self.exe, *(_SAFE if safe else []), *args, cwd=cwd, env=env or self.env(cwd),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, close_fds=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), TIMEOUT)
        except BaseException:
            proc.kill()
            await proc.wait()
            raise
        assert proc.returncode is not None
        return Result(proc.returncode, out, err)

    async def init(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        r = await self.run(path, ["init", "-q", f"--template={self.template}", "."])
        if r.rc != 0 or r.err:
            raise HostError(f"git init failed: {_first(r.err)}")
        info = path / ".git" / "info"
        info.mkdir(exist_ok=True)
        (info / "attributes").write_bytes(_NO_CONVERSION)

    async def user_config(self, checkout: Path, key: str) -> str | None:
        """`key` as the user's git sees it in `checkout` (read only)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env["LC_ALL"] = "C"
        # without our -c switches, which would hide the user's value of `key`
        r = await self.run(checkout, ["config", "--path", "--get", key], env=env, safe=False)
        if r.rc == 0:
            return os.fsdecode(r.out.rstrip(b"\n"))
        return None

    async def config_list(self, checkout: Path) -> list[Entry]:
        """Every configuration entry the user's git sees in `checkout`, with its origin.

        `git config --list --null --show-origin --includes`, read only (git
        runs nothing to list it), with the user's own environment so that
        global and system files count, as they will when the user runs git.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env["LC_ALL"] = "C"
        r = await self.run(checkout, ["config", "--list", "--null", "--show-origin",
                                      "--includes"], env=env, safe=False)
        if r.rc != 0:
            raise PatchRefused("cannot read the checkout's git configuration, so cannot tell "
                               f"which files it runs: git says {_first(r.err)!r}; fix it "
                               "and apply again")
        try:
            return parse_list(r.out, show_origin=True)
        except ConfigListError as e:
            raise PatchRefused(f"cannot read the checkout's git configuration: {e}") from None

    async def toplevel(self, checkout: Path) -> Path | None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env["LC_ALL"] = "C"
        r = await self.run(checkout, ["rev-parse", "--show-toplevel"], env=env)
        if r.rc != 0:
            return None
        return Path(os.fsdecode(r.out.rstrip(b"\n")))

    async def ignored(self, checkout: Path, paths: Sequence[bytes],
                      excludes_file: str | None) -> set[bytes]:
        """The paths the checkout's git ignores (tracked files are never ignored)."""
        if not paths:
            return set()
        args = ["-c", f"core.excludesFile={excludes_file or '/dev/null'}",
                "check-ignore", "-z", "--stdin"]
        r = await self.run(checkout, args, stdin=b"\x00".join(paths) + b"\x00",
                           env=self.env(checkout) | {"GIT_CEILING_DIRECTORIES": ""})
        if r.rc not in (0, 1) or r.err:
            raise PatchRefused(f"git check-ignore could not check the patch's paths: "
                               f"{_first(r.err)}")
        return {p for p in r.out.split(b"\x00") if p}


def _first(err: bytes) -> str:
    lines = err.decode("utf-8", errors="replace").strip().splitlines()
    return lines[0] if lines else "(no message)"
