"""The workspace disks: a read-only copy of the checkout, and an empty upper disk.

The lower disk is a squashfs made from a tar stream of the checkout, leaving
out credential files (ignored by git or not), `.git/hooks`, sockets and
devices, and rewriting `.git/config` without credentials (userinfo in remote
URLs, credential helpers, extra headers, includes of host files). The upper
disk is a sparse ext4 file the guest mounts as the overlay's upper layer.
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import shutil
import stat
import subprocess
import tarfile
import threading
from pathlib import Path

from tkbox.errors import HostError, UserError

#: names of credential files, matched against each path component's name
CREDENTIAL_NAMES = (
    ".env", ".env.*", "*.env", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks",
    "*.keystore", ".netrc", "_netrc", ".npmrc", ".yarnrc", ".yarnrc.yml", ".pypirc",
    ".pgpass", ".git-credentials", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    ".htpasswd", "credentials", "credentials.json", "*.kubeconfig", "kubeconfig",
    ".vault-token", "terraform.tfstate*", "*.tfvars", "secrets.y*ml", ".boto", ".s3cfg",
)
#: directories never copied (their whole subtree)
CREDENTIAL_DIRS = (".ssh", ".aws", ".gnupg", ".kube", ".azure", ".gcloud")
#: exact relative paths never copied
CREDENTIAL_PATHS = (".docker/config.json", ".config/gcloud", ".config/gh/hosts.yml",
                    ".git/hooks", ".git/credentials")


def is_credential(rel: str, is_dir: bool) -> bool:
    parts = rel.split("/")
    lower = [p.lower() for p in parts]
    if is_dir and lower[-1] in CREDENTIAL_DIRS:
        return True
    for p in CREDENTIAL_PATHS:
        if rel == p or rel.startswith(p + "/"):
            return True
    if not is_dir:
        name = lower[-1]
        if any(fnmatch.fnmatchcase(name, pat) for pat in CREDENTIAL_NAMES):
            # `.env.example` and friends carry no secrets by convention.
            if name.endswith((".example", ".sample", ".template", ".dist")):
                return False
            return True
    return False


_URL_USERINFO = re.compile(r"^(\s*[A-Za-z][\w+.-]*://)[^/@\s]*@", re.ASCII)
_DROP_KEYS = {"extraheader", "helper", "askpass", "sshcommand", "password", "token",
              "cookiefile", "proxyauthmethod"}


def sanitize_git_config(text: str) -> str:
    """`.git/config` without anything that can hold or fetch a credential."""
    out: list[str] = []
    section = ""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("["):
            section = s.lower()
            if section.startswith(("[credential", "[include", "[includeif", "[http")) \
                    and "extraheader" not in section:
                # whole sections that only configure credentials or include host files
                if section.startswith(("[credential", "[include")):
                    section = "#drop"
                    continue
            out.append(line)
            continue
        if section == "#drop":
            continue
        key, eq, value = s.partition("=")
        k = key.strip().lower()
        if eq and k in _DROP_KEYS:
            continue
        if eq and k in ("url", "pushurl", "insteadof", "pushinsteadof"):
            indent = line[: len(line) - len(line.lstrip())]
            clean = _URL_USERINFO.sub(r"\1", value.strip())
            line = f"{indent}{key.strip()} = {clean}"
        out.append(line)
    return "\n".join(out) + "\n"


def _tar_checkout(root: Path, out: io.RawIOBase,
                  owner: tuple[int, int] = (0, 0)) -> dict[str, int]:
    stats = {"files": 0, "skipped_credentials": 0, "bytes": 0}
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        def add(path: Path, rel: str) -> None:
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
                data: bytes | None = None
                if rel == ".git/config":
                    data = sanitize_git_config(path.read_text(errors="replace")).encode()
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                else:
                    info.size = st.st_size
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                stats["files"] += 1
                stats["bytes"] += info.size

        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            d = Path(dirpath)
            rel_dir = d.relative_to(root).as_posix()
            keep_dirs = []
            for name in sorted(dirnames):
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                p = d / name
                if p.is_symlink():
                    filenames.append(name)  # a symlink to a directory is copied as a link
                    continue
                if is_credential(rel, True):
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
                if is_credential(rel, False):
                    stats["skipped_credentials"] += 1
                    continue
                add(p, rel)
    return stats


def build_lower(checkout: Path, target: Path,
                owner: tuple[int, int] = (0, 0)) -> dict[str, int]:
    """Squashfs of the filtered checkout at `target` (via tar2sqfs), every file owned by
    `owner` (uid, gid): the user the box's commands run as, so they can change it."""
    if not checkout.is_dir():
        raise UserError(f"workspace {checkout} is not a directory; pass an existing "
                        "directory with --workspace")
    tool = shutil.which("tar2sqfs")
    if tool is None:
        raise HostError("tar2sqfs is missing; run 'sudo apt-get install squashfs-tools-ng'")
    err: list[bytes] = []
    with subprocess.Popen([tool, "-q", "-f", "-c", "zstd", "-s", str(target)],
                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stderr is not None
        stderr = proc.stderr
        reader = threading.Thread(target=lambda: err.append(stderr.read()))
        reader.start()
        try:
            stats = _tar_checkout(checkout, proc.stdin, owner)  # type: ignore[arg-type]
            proc.stdin.close()
        except OSError as exc:
            proc.kill()
            proc.wait()
            reader.join()
            target.unlink(missing_ok=True)
            raise HostError(f"cannot copy the workspace: {exc}") from None
        code = proc.wait()
        reader.join()
    if code != 0:
        target.unlink(missing_ok=True)
        msg = b"".join(err).decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise HostError(f"tar2sqfs failed building the workspace disk: {msg[0]}")
    return stats


def build_upper(target: Path, size_mib: int) -> None:
    """A sparse ext4 disk of `size_mib` for the overlay's upper layer."""
    tool = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
    if not os.path.exists(tool):
        raise HostError("mkfs.ext4 is missing; run 'sudo apt-get install e2fsprogs'")
    with open(target, "wb") as f:
        f.truncate(size_mib * 1024 * 1024)
    proc = subprocess.run([tool, "-q", "-F", "-m", "0", "-O", "^has_journal",
                           "-E", "lazy_itable_init=1,root_owner=0:0", str(target)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        target.unlink(missing_ok=True)
        raise HostError(f"mkfs.ext4 failed: {proc.stderr.strip()}")
