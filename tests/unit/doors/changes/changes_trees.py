"""Trees for the changes tests: build them, read them, and fake an overlay upper.

A tree spec maps a path to ("file", bytes, exec) or ("link", target bytes).
`build_upper` writes the upper layer overlayfs would hold after turning the
lower tree into the final one: copies for added and changed entries,
whiteouts (character device 0/0, or the xattr form) for deletions, opaque
directories for directories that were removed and made again.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

Entry = tuple[str, bytes, bool] | tuple[str, bytes]
Tree = dict[str, Entry]


def file(content: bytes, exec: bool = False) -> Entry:
    return ("file", content, exec)


def link(target: bytes) -> Entry:
    return ("link", target)


def write_entry(path: Path, entry: Entry) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if entry[0] == "link":
        os.symlink(entry[1], path)
    else:
        path.write_bytes(entry[1])
        os.chmod(path, 0o755 if entry[2] else 0o644)  # type: ignore[misc]


def make_tree(root: Path, tree: Tree) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for p, e in sorted(tree.items()):
        write_entry(root / p, e)


def read_tree(root: Path) -> Tree:
    out: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d != ".git"]
        names = filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for n in names:
            full = os.path.join(dirpath, n)
            rel = os.path.normpath(os.path.join(rel_dir, n))
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.fsencode(os.readlink(full)))
            else:
                out[rel] = ("file", Path(full).read_bytes(), bool(st.st_mode & stat.S_IXUSR))
    return out


def dirs_of(tree: Tree) -> set[str]:
    out: set[str] = set()
    for p in tree:
        parts = p.split("/")
        out.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return out


def whiteout(path: Path, xattr: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if xattr:
        path.write_bytes(b"")
        os.setxattr(path, "trusted.overlay.whiteout", b"")
    else:
        os.mknod(path, stat.S_IFCHR | 0o600, 0)


def opaque(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.setxattr(path, "trusted.overlay.opaque", b"y")


def build_upper(upper: Path, lower: Tree, final: Tree, *, opaque_dirs: set[str] = frozenset(),
                copy_up_same: set[str] = frozenset(), xattr_whiteouts: bool = False) -> None:
    """The upper layer for lower -> final. `opaque_dirs`: dirs in both trees that
    were removed and made again; `copy_up_same`: unchanged entries copied up."""
    upper.mkdir(parents=True, exist_ok=True)
    ldirs, fdirs = dirs_of(lower), dirs_of(final)

    def hidden(p: str) -> bool:  # below an opaque dir: the lower does not show
        parts = p.split("/")
        return any("/".join(parts[:i]) in opaque_dirs for i in range(1, len(parts)))

    for d in sorted(opaque_dirs):
        assert d in ldirs and d in fdirs
        opaque(upper / d)
    for d in sorted(fdirs):
        (upper / d).mkdir(parents=True, exist_ok=True)
    for p, e in final.items():
        if lower.get(p) == e and not hidden(p) and p not in copy_up_same:
            continue
        write_entry(upper / p, e)
    # deletions
    for d in sorted(ldirs - fdirs):
        parent = d.rsplit("/", 1)[0] if "/" in d else ""
        if (parent == "" or parent in fdirs) and d not in final and not hidden(d):
            whiteout(upper / d, xattr_whiteouts)
    for p in lower:
        if p in final or p in fdirs or hidden(p):
            continue
        parent = p.rsplit("/", 1)[0] if "/" in p else ""
        if parent == "" or parent in fdirs:
            whiteout(upper / p, xattr_whiteouts)
    # a lower dir replaced by a final file: the file in the upper covers it
