"""The Claude Code image, `tkbox/claude-code`: built once, then a cached local image.

How (the simplest sound way we found; docs/agents.md says the same):

1. **Base.** `mmdebstrap` builds Debian (the host's own mirror and release, as
   for `tkbox/default`) with the default packages plus Debian's `nodejs` and
   `npm`; it is imported as `tkbox/claude-code-base`.
2. **Install through the door.** A box of that base, with nothing but the
   `npm` preset allowed, runs `npm install -g --prefix /workspace/prefix
   @anthropic-ai/claude-code@VERSION`. The package's native binary comes as its
   optional dependency `@anthropic-ai/claude-code-linux-x64`, which npm
   fetches too; the postinstall puts it in place. The install happens on the
   box's workspace disk (not the root's memory-backed overlay), and the box's
   run records every connection it made, like any other job.
3. **Layer.** `tar` in the box streams the installed prefix out (exec output,
   through the daemon), renamed to `usr/local/`; the host writes the base's
   root filesystem with that layer on top as one tarball and imports it as
   `tkbox/claude-code`. The helper box is exported (`NAME.tkb`) next to the
   store's temporary files only while building, then removed.

The image is content-addressed like every other; building again (`rebuild`)
reuses the base when it is there.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from tkbox import paths
from tkbox.errors import HostError, TkboxError, UserError
from tkbox.image.flatten import BoundedTarInfo
from tkbox.sdk import Client

IMAGE = "tkbox/claude-code"
BASE = "tkbox/claude-code-base"
PACKAGE = "@anthropic-ai/claude-code"
#: the version measured in docs/agents.md; TKBOX_CLAUDE_CODE_VERSION overrides it
VERSION = os.environ.get("TKBOX_CLAUDE_CODE_VERSION", "2.1.328")
EXTRA_PACKAGES = ("nodejs", "npm")
#: files the layer installed in the box may hold (Claude Code's are a few hundred)
MAX_LAYER_MEMBERS = 100_000

INSTALL = r"""set -eu
cd /workspace
npm install -g --prefix /workspace/prefix --no-fund --no-audit --loglevel=error \
  --registry "$2" "$1"
exe=/workspace/prefix/lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe
size=$(wc -c < "$exe")
if [ "$size" -lt 1000000 ]; then
  echo "tkbox: the native binary was not put in place ($exe is $size bytes)" >&2; exit 1
fi
# The binary is in place: its platform package is a second copy, left out.
lib=/workspace/prefix/lib/node_modules/@anthropic-ai
rm -rf "$lib/claude-code/node_modules/@anthropic-ai/claude-code-linux-x64"
rm -rf "$lib/claude-code-linux-x64"
"$exe" --version >&2
"""
PACK = ("tar -C /workspace/prefix --owner=0 --group=0 --numeric-owner "
        "--transform 's,^\\./,usr/local/,' -cf - ./lib/node_modules ./bin")


def have(client: Client, ref: str) -> bool:
    from tkbox.image.store import ImageStore

    with ImageStore(paths.images()) as store:
        try:
            store.inspect(ref)
        except UserError:
            return False
    return True


def ensure_image(client: Client, *, rebuild: bool = False,
                 log: Callable[[str], None] = lambda m: None) -> str:
    """`tkbox/claude-code`, built first if it is not in the store."""
    if not rebuild and have(client, IMAGE):
        return IMAGE
    from tkbox.image.build import DEFAULT_PACKAGES, build_rootfs
    from tkbox.image.store import ImageStore

    work = Path(tempfile.mkdtemp(prefix="tkbox-cc-image-"))
    try:
        base_tar = work / "base.tar"
        if rebuild or not _base_layer(base_tar):
            log(f"building {BASE} (Debian with nodejs and npm; a few minutes, once)")
            build_rootfs(base_tar, packages=(*DEFAULT_PACKAGES, *EXTRA_PACKAGES),
                         log=lambda m: None)
            with ImageStore(paths.images()) as store:
                store.import_tar(base_tar, BASE, source="build")
        layer = work / "layer.tar"
        log(f"installing {PACKAGE}@{VERSION} in a box, through the door (npm preset)")
        install_in_box(client, layer)
        merged = work / "rootfs.tar"
        merge(base_tar, layer, merged)
        base_tar.unlink()
        with ImageStore(paths.images()) as store:
            store.import_tar(merged, IMAGE, source="build")
        log(f"built {IMAGE}")
        return IMAGE
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _base_layer(dest: Path) -> bool:
    """Copy the stored base's one layer (an uncompressed tar) to `dest`, if it is there."""
    from tkbox.image.store import ImageStore

    with ImageStore(paths.images()) as store:
        found = store._find(BASE)
        if found is None:
            return False
        try:
            manifest = store._manifest(found[1]["digest"])
            if len(manifest.layers) != 1:
                return False
            src = store.blob_path(manifest.layers[0].digest)
            shutil.copyfile(src, dest)
        except (TkboxError, OSError, KeyError):
            return False
    return True


def host_registry() -> str:
    """The npm registry this host is configured with: the one the `npm` preset allows,
    so the box's npm is pointed at it too (no registry name is written in tkbox)."""
    import subprocess

    from tkbox.doors.network.presets import _run, npm_hosts

    if not npm_hosts():
        raise HostError("the npm preset is empty on this host (no npm, or no registry "
                        "configured): install npm (apt-get install npm) to build "
                        f"{IMAGE}")
    try:
        url = _run(["npm", "config", "get", "registry"]).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        raise HostError("'npm config get registry' failed on this host") from None
    return url


def install_in_box(client: Client, layer: Path) -> None:
    registry = host_registry()
    ws = Path(tempfile.mkdtemp(prefix="tkbox-cc-ws-"))
    name = f"image-claude-code-{secrets.token_hex(3)}"
    box = client.run(image=BASE, workspace=ws, allow=["npm"], name=name, memory_mib=2048)
    try:
        r = box.exec(["sh", "-c", INSTALL, "tkbox-install", f"{PACKAGE}@{VERSION}", registry])
        if r.status != 0:
            lines = r.stderr.decode(errors="replace").strip().splitlines()
            tail = [x for x in lines if "ERR!" in x][:2] or lines[-1:] or ["no output"]
            raise HostError(f"installing {PACKAGE} in the box failed (exit {r.status}): "
                            f"{' '.join(tail)[:240]}; check that the npm preset reaches its "
                            "registry ('tkbox presets', 'tkbox egress check')")
        s = box.exec_stream(["sh", "-c", PACK])
        with open(layer, "wb") as f:
            for chunk in s:
                if chunk.fd == 1:
                    f.write(chunk.data)
        if s.result is None or s.result.status != 0:
            raise HostError(f"packing {PACKAGE} in the box failed "
                            f"(exit {s.result.status if s.result else None})")
    finally:
        try:
            box.rm(force=True)
        except TkboxError:
            pass
        shutil.rmtree(ws, ignore_errors=True)


def merge(base: Path, layer: Path, out: Path) -> None:
    """`base` with `layer` on top, as one tarball: a member of both comes from `layer`.

    The layer came out of a box, so it is read as untrusted: only regular files,
    directories and symlinks under `usr/local/`, with no `..` and no absolute
    names, are taken; anything else refuses the build.
    """
    try:
        # members one by one, with the image layers' bounds on extended headers (a
        # chain of them raised RecursionError; global PAX headers added up without
        # bound), and at most MAX_LAYER_MEMBERS of them (`getmembers` had no bound)
        with tarfile.open(layer, tarinfo=BoundedTarInfo) as lt:
            members: list[tarfile.TarInfo] = []
            names = set()
            for m in lt:
                if len(members) >= MAX_LAYER_MEMBERS:
                    raise HostError(f"the installed layer holds more than {MAX_LAYER_MEMBERS} "
                                    "files; refused")
                members.append(m)
                n = m.name
                if not n.startswith("usr/local/") or ".." in n.split("/") or \
                        not (m.isfile() or m.isdir() or m.issym()):
                    raise HostError(f"the installed layer holds {n[:100]!r}, which is not a "
                                    "file, directory or symlink under usr/local/; refused")
                names.add(n.rstrip("/"))
            with tarfile.open(base) as bt, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as o:
                for m in bt:
                    if m.name.removeprefix("./").rstrip("/") in names:
                        continue
                    o.addfile(m, bt.extractfile(m) if m.isfile() else None)
                for m in members:
                    m.uid = m.gid = 0
                    m.uname = m.gname = "root"
                    o.addfile(m, lt.extractfile(m) if m.isfile() else None)
    except (tarfile.TarError, OSError) as exc:
        raise HostError(f"building the {IMAGE} root filesystem failed: {exc}") from None
