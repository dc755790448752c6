"""What an image's config means for a box: its environment and its user.

An OCI image says how it expects to run: `Env` (a Go image puts `/usr/local/go/bin`
on `PATH`), `User` (a name or uid, with an optional group) and `WorkingDir`. A
box applies them, in this order, lowest first:

1. tkbox's defaults (`PATH`, `HOME`, `LANG`, `TERM`);
2. the image's `Env`;
3. what the box needs to reach its doors (proxy and CA variables);
4. the box's own `--env`.

`User` is resolved against the image's own `/etc/passwd` and `/etc/group`, read
from its root disk (`rdsquashfs --cat`), the way a container runtime does: a
name must exist there; a number need not. Commands then run with that uid, gid
and supplementary groups, and `HOME` is the user's unless the image's `Env` sets
it. `WorkingDir` is recorded but is not the default working directory: a box
exists for the checkout, so commands start in `/workspace` unless `--cwd` says
otherwise (a Go image's `WorkingDir` is `/go`, where `go test ./...` would find
nothing).

Everything here is read from the image, which may come from anywhere: sizes and
counts are bounded and malformed lines are skipped, as libc's own reader does.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tkbox._process import tool_env
from tkbox.errors import HostError, UserError

#: the most of /etc/passwd or /etc/group read from an image
MAX_DB = 1 << 20
#: the most variables taken from an image's Env
MAX_ENV = 512
#: the longest name taken (a longer one is skipped, as a malformed one is)
MAX_ENV_NAME = 256
#: the most bytes of one `NAME=VALUE` (Linux's MAX_ARG_STRLEN: a longer one makes
#: every exec in the box fail with E2BIG) and of all of them together
MAX_ENV_ENTRY = 128 * 1024
MAX_ENV_BYTES = 256 * 1024
#: the most bytes of the Env's names put into the run's open record
MAX_ENV_NAMES_RECORDED = 16 * 1024
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class RunUser:
    """The user an image names, resolved: what the guest switches to before exec."""

    spec: str  # as the image wrote it ("node", "1000:1000")
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    home: str = "/"

    def to_json(self) -> dict[str, object]:
        return {"spec": self.spec, "uid": self.uid, "gid": self.gid,
                "groups": list(self.groups), "home": self.home}


def image_env(entries: tuple[str, ...]) -> dict[str, str]:
    """The image's `Env` as a map: `NAME=VALUE` entries with a valid name, in order.

    UserError for an entry, or all of them, beyond what a box can run with
    (`MAX_ENV_ENTRY`, `MAX_ENV_BYTES`): refused whole rather than cut, since a
    variable cut short or left out changes what runs."""
    out: dict[str, str] = {}
    total = 0
    for e in entries[:MAX_ENV]:
        k, eq, v = e.partition("=")
        if not (eq and len(k) <= MAX_ENV_NAME and _NAME.match(k) and "\x00" not in v):
            continue
        size = len(e.encode("utf-8", "surrogateescape"))
        total += size
        if size > MAX_ENV_ENTRY or total > MAX_ENV_BYTES:
            raise UserError(f"the image's Env sets {k[:60]} to more than a box can take "
                            f"({MAX_ENV_ENTRY} bytes a variable, {MAX_ENV_BYTES} in all); "
                            "tkbox does not run it: rebuild the image with a smaller Env")
        out[k] = v
    return out


def recorded_names(env: dict[str, str]) -> list[str]:
    """The names of `env`, sorted, as many as fit in `MAX_ENV_NAMES_RECORDED` bytes; the
    rest counted in a last entry."""
    names = sorted(env)
    out: list[str] = []
    used = 0
    for i, n in enumerate(names):
        used += len(n) + 1
        if used > MAX_ENV_NAMES_RECORDED:
            out.append(f"... and {len(names) - i} more")
            break
        out.append(n)
    return out


def _id(s: str) -> int | None:
    # ASCII digits only: str.isdigit() is also true of '²' and other digits int() refuses.
    ok = s.isascii() and s.isdigit() and len(s) <= 10
    return int(s) if ok and int(s) < 2**32 - 1 else None


def _db(text: str, fields: int) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.split(":")
        if len(parts) >= fields:
            rows.append(parts)
    return rows


def resolve_user(spec: str, passwd: str, group: str) -> RunUser | None:
    """`spec` (`user`, `uid`, `user:group`, `uid:gid`) against the image's databases.

    None for root or an empty spec: nothing to switch to.
    """
    spec = spec.strip()
    if not spec:
        return None
    u, _, g = spec.partition(":")
    pw = _db(passwd, 7)
    gr = _db(group, 4)
    entry = next((p for p in pw if p[0] == u), None)
    if entry is None and _id(u) is not None:
        entry = next((p for p in pw if p[2] == u), None)
    if entry is not None and _id(entry[2]) is not None and _id(entry[3]) is not None:
        uid, gid, home, name = int(entry[2]), int(entry[3]), entry[5] or "/", entry[0]
    elif _id(u) is not None:
        uid, gid, home, name = int(u), int(u), "/", ""
    else:
        raise UserError(f"the image runs as user {u!r}, which its /etc/passwd does not "
                        "define; rebuild the image or give a numeric uid")
    if g:
        ge = next((x for x in gr if x[0] == g), None)
        if ge is not None and _id(ge[2]) is not None:
            gid = int(ge[2])
        elif _id(g) is not None:
            gid = int(g)
        else:
            raise UserError(f"the image runs as group {g!r}, which its /etc/group does not "
                            "define; rebuild the image or give a numeric gid")
    groups = tuple(sorted({int(x[2]) for x in gr if name and _id(x[2]) is not None
                           and name in x[3].split(",")} | {gid}))[:64]
    if uid == 0:
        return None
    return RunUser(spec, uid, gid, groups, home if home.startswith("/") else "/")


def read_from_rootfs(rootfs: Path, path: str) -> str:
    """A small text file of a squashfs root disk ('' when it is not there)."""
    tool = shutil.which("rdsquashfs")
    if tool is None:
        raise HostError("rdsquashfs is missing; run 'sudo apt-get install squashfs-tools-ng'")
    with subprocess.Popen([tool, "-c", path, str(rootfs)], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                          env=tool_env()) as proc:
        assert proc.stdout is not None
        data = proc.stdout.read(MAX_DB + 1)
        proc.kill()
    if len(data) > MAX_DB:
        raise UserError(f"the image's {path} is larger than {MAX_DB} bytes")
    return data.decode("utf-8", errors="replace") if proc.returncode in (0, -9) else ""


def user_of(rootfs: Path, spec: str) -> RunUser | None:
    """The image's `User`, resolved against its own root disk."""
    if not spec.strip() or spec.strip() in ("root", "0", "0:0", "root:root"):
        return None
    return resolve_user(spec, read_from_rootfs(rootfs, "/etc/passwd"),
                        read_from_rootfs(rootfs, "/etc/group"))
