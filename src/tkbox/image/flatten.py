"""Flatten an image's layers into one tar stream, per the OCI image spec, without root.

The layers are never extracted to disk. Two passes over the (verified, cached)
layer blobs:

1. **Plan.** Read every layer's headers (no content) and apply them, in
   order, to a tree held in memory (directories, and inodes shared by hard
   links), as `image-spec/layer.md` says ("Applying Changesets", "Whiteouts"):

   - whiteouts `D/.wh.NAME` and opaque markers `D/.wh..wh..opq` of a layer act
     on the lower layers only, whatever their position in the layer: they are
     applied first, then the layer's other entries in order;
   - an entry over an existing path replaces it (unlink and recreate), except
     directory over directory, which replaces only the attributes;
   - a hard link names a path that already exists (in this layer or a lower
     one) and shares its inode: it keeps that inode's content even if a later
     layer removes or replaces the path it was made from;
   - the uncompressed stream of each layer is hashed and checked against the
     config's `diff_id`.

   Every entry name is checked here, and refused with the layer's digest and
   the entry's name if it escapes the root: an absolute name, a `..`
   component, or a path whose parent is a symlink (or another non-directory)
   at that point of the image.

2. **Emit.** Write one POSIX (PAX) tar stream holding the final tree:
   directories first (parents before children), then each surviving inode once,
   with its content read again from its layer, under its first path in sorted
   order; then the other paths of shared inodes as hard links to it. Kept:
   modes, uid/gid (PAX for values above the ustar range), mtimes, device
   numbers, symlink targets, xattrs (`SCHILY.xattr.*` PAX records). Dropped:
   user and group names (the disk is numeric), whiteouts, AUFS metadata
   (`.wh..wh.*`). The root directory keeps the packer's defaults (0755, 0:0).

Python's `tarfile` parses the headers. It reads a PAX or GNU long-name record
into memory whole, so `BoundedTarInfo` bounds those records before it does;
every other failure of the parser or the decompressors becomes a
`RegistryError` naming the layer.

One module of about 540 lines on purpose: the two passes are one algorithm
over one private tree (`_Inode`, `_Dir`, `_Entry`) that the plan builds and
the emit walks; split, that tree would become an interface nobody else uses.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, BinaryIO

import zstandard

from tkbox.errors import InternalError, RegistryError, TkboxError

# --- limits ---------------------------------------------------------------------------

MAX_ENTRIES = 1_000_000  # entries and directories they imply, over all layers (plan memory)
MAX_PLAN_BYTES = 256 * 1024**2  # names, link names, xattrs and implied paths the plan keeps
MAX_PATH = 4096  # bytes in one entry name, as Linux's PATH_MAX
MAX_COMPONENT = 255  # bytes in one path component, as Linux's NAME_MAX
MAX_EXT_HEADER = 256 * 1024  # bytes in one PAX or GNU long-name record
MAX_HEADER_CHAIN = 8  # extended headers (PAX, GNU long name/link) before one entry
MAX_UNCOMPRESSED = 64 * 1024**3  # bytes of uncompressed tar over all layers

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_XATTR_PREFIXES = ("SCHILY.xattr.", "LIBARCHIVE.xattr.")
_CHUNK = 1024 * 1024


class Cancelled(Exception):
    """Raised inside a flatten running in a thread when its caller cancelled it."""


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer to apply: its blob (opened afresh for each pass) and expected diff_id."""

    digest: str
    open: Callable[[], BinaryIO]
    diff_id: str | None = None


class BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo that bounds the extended headers `tarfile` reads before an entry.

    - An oversized PAX or GNU long-name record is refused by its declared size
      before `tarfile` reads it into memory whole.
    - `tarfile` reads each extended header by calling itself for the next one:
      more than `MAX_HEADER_CHAIN` in a row are refused (a layer of a few
      thousand of them raised a `RecursionError`, not a refusal).
    - A global PAX header (type `g`) is skipped, as containerd and Docker do
      when they unpack a layer. `tarfile` would merge it into state it copies
      into every later entry: a layer of 2,000 of them (500 KB of zstd) took
      over 200 s of CPU, and their keys added up without bound.

    (Overrides private `tarfile` hooks, stable since Python 2.)
    """

    def _chained(self, tarfile_: tarfile.TarFile, what: str) -> int:
        if self.size > MAX_EXT_HEADER:
            raise tarfile.HeaderError(f"{what} record of {self.size} bytes is too large")
        depth: int = getattr(tarfile_, "_tkbox_header_chain", 0)
        if depth >= MAX_HEADER_CHAIN:
            raise tarfile.HeaderError(
                f"more than {MAX_HEADER_CHAIN} extended headers before one entry")
        setattr(tarfile_, "_tkbox_header_chain", depth + 1)  # noqa: B010
        return depth

    def _proc_pax(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        depth = self._chained(tarfile_, "PAX")
        try:
            if self.type == tarfile.XGLTYPE:
                assert tarfile_.fileobj is not None
                tarfile_.fileobj.read(-(-self.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE)
                try:
                    return self.fromtarfile(tarfile_)
                except tarfile.HeaderError as e:
                    raise tarfile.ReadError(str(e)) from None  # as TarFile.next would
            info: tarfile.TarInfo = super()._proc_pax(tarfile_)  # type: ignore[misc]
            return info
        finally:
            setattr(tarfile_, "_tkbox_header_chain", depth)  # noqa: B010

    def _proc_gnulong(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        depth = self._chained(tarfile_, "GNU long-name")
        try:
            info: tarfile.TarInfo = super()._proc_gnulong(tarfile_)  # type: ignore[misc]
            return info
        finally:
            setattr(tarfile_, "_tkbox_header_chain", depth)  # noqa: B010


class _Reader(io.RawIOBase):
    """Counts, hashes and bounds the bytes read from a stream; checks cancellation."""

    def __init__(
        self, inner: BinaryIO, budget: list[int], cancel: threading.Event | None
    ) -> None:
        self.inner = inner
        self.sha = hashlib.sha256()
        self.budget = budget
        self.cancel = cancel

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled()
        data = self.inner.read(len(b))
        n = len(data)
        self.budget[0] -= n
        if self.budget[0] < 0:
            raise _LayerRefused("the image is larger than "
                                f"{MAX_UNCOMPRESSED // 1024**3} GiB uncompressed")
        self.sha.update(data)
        memoryview(b)[:n] = data
        return n

    def drain(self) -> None:
        while self.readinto(bytearray(_CHUNK)):
            pass


class _LayerRefused(Exception):
    """Internal: a refusal inside a layer, turned into RegistryError with the layer named."""


def _decompressed(raw: BinaryIO) -> BinaryIO:
    magic = raw.read(4)
    raw.seek(0)
    if magic.startswith(_GZIP_MAGIC):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if magic == _ZSTD_MAGIC:
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return reader
    return raw


# --- entry names ------------------------------------------------------------------------


def split_name(name: str) -> tuple[str, ...]:
    """The components of a layer entry name; raises `_LayerRefused` if it escapes.

    Accepted: `a/b`, `./a/b`, `a/b/` (directories). Refused: `/a`, `a/../b`,
    `a//b`, `a/./b`, NUL, oversized names. `()` is the root itself (`./`, `.`).
    """
    if len(name.encode("utf-8", "surrogateescape")) > MAX_PATH:
        raise _LayerRefused("the name is longer than PATH_MAX")
    if name.startswith("/"):
        raise _LayerRefused("an absolute name escapes the image root")
    if "\x00" in name:
        raise _LayerRefused("the name holds a NUL byte")
    while name.startswith("./"):
        name = name[2:]
    if name in ("", "."):
        return ()
    if name.endswith("/"):
        name = name[:-1]
    parts = tuple(name.split("/"))
    for p in parts:
        if p == "..":
            raise _LayerRefused("a '..' component escapes the image root")
        if p in ("", "."):
            raise _LayerRefused("the name is not canonical (empty or '.' component)")
        if len(p.encode("utf-8", "surrogateescape")) > MAX_COMPONENT:
            raise _LayerRefused("a component is longer than NAME_MAX")
    return parts


# --- the plan ---------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Inode:
    """A non-directory file: which member of which layer supplies it."""

    layer: int
    ordinal: int
    kind: bytes
    name: str  # the member's name in its layer, checked again in pass 2


@dataclass(slots=True)
class _DirMeta:
    mode: int
    uid: int
    gid: int
    mtime: float
    xattrs: dict[str, str]


@dataclass(slots=True, eq=False)
class _Dir:
    meta: _DirMeta | None  # None: created implicitly (no entry named it)
    children: dict[str, _Dir | _Inode] = field(default_factory=dict)


@dataclass(slots=True)
class _Entry:
    ordinal: int
    kind: bytes
    dirmeta: _DirMeta | None
    name: str  # its components and a hard link's target are split again when applied
    linkname: str


_REG = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_OTHER = (tarfile.SYMTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE)


def _xattrs(info: tarfile.TarInfo) -> dict[str, str]:
    out = {k: v for k, v in info.pax_headers.items() if k.startswith(_XATTR_PREFIXES)}
    if out and info.pax_headers.get("hdrcharset") == "BINARY":
        out["hdrcharset"] = "BINARY"
    return out


@dataclass
class Plan:
    """What pass 2 writes: directories, inodes per layer, hard links."""

    dirs: list[tuple[str, _DirMeta | None]]
    emit: list[dict[int, tuple[str, str]]]  # per layer: ordinal -> (output path, member name)
    links: list[tuple[str, str]]  # (path, target path)

    @property
    def count(self) -> int:
        return len(self.dirs) + sum(len(e) for e in self.emit) + len(self.links)


class Planner:
    """Applies layers' headers to an in-memory tree (pass 1). Pure given its inputs."""

    def __init__(self) -> None:
        self.root = _Dir(_DirMeta(0o755, 0, 0, 0, {}))
        self.entries = 0
        self.layers = 0
        self.bytes = 0

    def _charge(self, nodes: int, size: int) -> None:
        """Count what the plan keeps. Every entry and every directory a name implies is a
        node; names, link names, xattrs and the paths of implied directories are bytes. A
        tiny compressed layer can name a directory 2,000 levels deep per entry, or carry
        256 KiB of xattrs per entry: bounded here, before the tree holds them."""
        self.entries += nodes
        self.bytes += size
        if self.entries > MAX_ENTRIES:
            raise _LayerRefused(f"the image has more than {MAX_ENTRIES} entries "
                                "(with the directories their names imply)")
        if self.bytes > MAX_PLAN_BYTES:
            raise _LayerRefused(f"the image's names and xattrs take more than "
                                f"{MAX_PLAN_BYTES // 1024**2} MiB")

    # tree helpers
    def _lookup(self, parts: tuple[str, ...]) -> _Dir | _Inode | None:
        node: _Dir | _Inode = self.root
        for p in parts:
            if not isinstance(node, _Dir):
                return None
            nxt = node.children.get(p)
            if nxt is None:
                return None
            node = nxt
        return node

    def _dir(self, parts: tuple[str, ...], *, create: bool) -> _Dir | None:
        """The directory at `parts`. Through a symlink: refused. Missing: created
        (implicitly, as tar does) if `create`, else None. A non-directory: refused
        if `create`, else None (a whiteout under a file hides nothing)."""
        node = self.root
        depth = 0
        for p in parts:
            depth += len(p) + 1
            nxt = node.children.get(p)
            if nxt is None:
                if not create:
                    return None
                self._charge(1, depth)
                nxt = node.children[p] = _Dir(None)
            elif isinstance(nxt, _Inode):
                if nxt.kind == tarfile.SYMTYPE:
                    raise _LayerRefused(f"the path goes through the symlink {p!r}")
                if not create:
                    return None
                raise _LayerRefused(f"the path goes through {p!r}, which is not a directory")
            node = nxt
        return node

    def add_layer(self, members: Iterator[tarfile.TarInfo]) -> None:
        index = self.layers
        self.layers += 1
        whiteouts: list[tuple[str, bool]] = []  # (name, opaque); split again when applied
        entries: list[_Entry] = []
        for ordinal, info in enumerate(members):
            xattrs = _xattrs(info) if info.type == tarfile.DIRTYPE else {}
            self._charge(1, len(info.name) + len(info.linkname)
                         + sum(len(k) + len(v) for k, v in xattrs.items()))
            try:
                parts = split_name(info.name)
            except _LayerRefused as e:
                raise _LayerRefused(f"entry {info.name!r}: {e}") from None
            base = parts[-1] if parts else ""
            if parts and parts[0].startswith(WHITEOUT + WHITEOUT) and parts[0] != OPAQUE:
                continue  # AUFS metadata tree (.wh..wh.plnk/...): ignored, as Docker does
            if base.startswith(WHITEOUT):
                if base == OPAQUE:
                    whiteouts.append((info.name, True))
                elif base.startswith(WHITEOUT + WHITEOUT):
                    continue  # AUFS metadata (.wh..wh.plnk, ...): ignored, as Docker does
                else:
                    target = base[len(WHITEOUT):]
                    if target in ("", ".", ".."):
                        raise _LayerRefused(f"entry {info.name!r}: a whiteout of {target!r}")
                    whiteouts.append((info.name, False))
                continue
            if not parts:
                continue  # the root's own entry: the root keeps the packer's defaults
            kind = info.type
            dirmeta: _DirMeta | None = None
            if kind in _REG:
                kind = tarfile.REGTYPE
            elif kind == tarfile.DIRTYPE:
                dirmeta = _DirMeta(info.mode, info.uid, info.gid, info.mtime, xattrs)
            elif kind == tarfile.LNKTYPE:
                try:
                    link = split_name(info.linkname)
                except _LayerRefused as e:
                    raise _LayerRefused(
                        f"entry {info.name!r}: hard link target {info.linkname!r}: {e}"
                    ) from None
                if not link:
                    raise _LayerRefused(f"entry {info.name!r}: a hard link to the root")
            elif kind in _OTHER:
                pass
            elif kind in (tarfile.GNUTYPE_SPARSE,) or info.issparse():
                raise _LayerRefused(f"entry {info.name!r}: sparse files are not supported")
            else:
                raise _LayerRefused(f"entry {info.name!r}: unsupported tar entry type {kind!r}")
            entries.append(_Entry(ordinal, kind, dirmeta, info.name,
                                  info.linkname if kind == tarfile.LNKTYPE else ""))

        # Whiteouts hide what the LOWER layers hold, wherever they sit in this layer.
        for name, opaque in whiteouts:
            parts = split_name(name)  # D/.wh..wh..opq (opaque) or D/.wh.NAME
            try:
                parent = self._dir(parts[:-1], create=False)
            except _LayerRefused as e:
                raise _LayerRefused(f"entry {name!r}: {e}") from None
            if parent is None:
                continue
            if opaque:
                parent.children.clear()
            else:
                parent.children.pop(parts[-1][len(WHITEOUT):], None)

        for ent in entries:
            parts = split_name(ent.name)  # checked above; not kept, to keep the plan small
            try:
                parent = self._dir(parts[:-1], create=True)
            except _LayerRefused as err:
                raise _LayerRefused(f"entry {ent.name!r}: {err}") from None
            assert parent is not None
            base = parts[-1]
            existing = parent.children.get(base)
            if ent.kind == tarfile.DIRTYPE:
                if isinstance(existing, _Dir):
                    existing.meta = ent.dirmeta
                else:
                    parent.children[base] = _Dir(ent.dirmeta)
            elif ent.kind == tarfile.LNKTYPE:
                link = split_name(ent.linkname)
                linked = self._lookup(link)
                if not isinstance(linked, _Inode):
                    raise _LayerRefused(
                        f"entry {ent.name!r}: hard link to {'/'.join(link)!r}, which is "
                        + ("a directory" if isinstance(linked, _Dir) else "not in the image")
                    )
                parent.children[base] = linked
            else:
                parent.children[base] = _Inode(index, ent.ordinal, ent.kind, ent.name)

    def plan(self) -> Plan:
        dirs: list[tuple[str, _DirMeta | None]] = []
        paths: dict[_Inode, list[str]] = {}
        order: list[_Inode] = []
        stack: list[tuple[str, _Dir]] = [("", self.root)]
        while stack:
            prefix, d = stack.pop()
            subdirs: list[tuple[str, _Dir]] = []
            for name in sorted(d.children):
                node = d.children[name]
                path = f"{prefix}{name}"
                if isinstance(node, _Dir):
                    dirs.append((path, node.meta))
                    subdirs.append((path + "/", node))
                else:
                    if node not in paths:
                        paths[node] = []
                        order.append(node)
                    paths[node].append(path)
            stack.extend(reversed(subdirs))
        emit: list[dict[int, tuple[str, str]]] = [{} for _ in range(self.layers)]
        links: list[tuple[str, str]] = []
        for inode in order:
            first, *rest = paths[inode]
            emit[inode.layer][inode.ordinal] = (first, inode.name)
            links.extend((p, first) for p in rest)
        return Plan(dirs, emit, links)


# --- the two passes ---------------------------------------------------------------------


def _members(tf: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    while True:
        info = tf.next()
        if info is None:
            return
        tf.members = []  # type: ignore[attr-defined]  # stream mode would otherwise keep every header in memory
        yield info


_PARSE_ERRORS = (tarfile.TarError, EOFError, zlib.error, zstandard.ZstdError,
                 gzip.BadGzipFile, UnicodeError, ValueError, OverflowError)


def _refusal(layer: Layer, exc: BaseException | str) -> RegistryError:
    return RegistryError(f"layer {layer.digest} refused: {exc}")


def plan_layers(
    layers: list[Layer], *, cancel: threading.Event | None = None,
    on_layer: Callable[[int], None] | None = None,
) -> Plan:
    """Pass 1: read every layer's headers, check names and diff_ids, build the plan."""
    planner = Planner()
    budget = [MAX_UNCOMPRESSED]
    for i, layer in enumerate(layers):
        try:
            with layer.open() as raw:
                reader = _Reader(_decompressed(raw), budget, cancel)
                stream = io.BufferedReader(reader, _CHUNK)
                tf = tarfile.open(fileobj=stream, mode="r|", tarinfo=BoundedTarInfo)
                planner.add_layer(_members(tf))
                # Hash the rest of the stream too (padding after the end-of-archive).
                while stream.read(_CHUNK):
                    pass
                digest = "sha256:" + reader.sha.hexdigest()
                if layer.diff_id is not None and digest != layer.diff_id:
                    raise _LayerRefused(
                        f"its uncompressed content is {digest}, but the image config "
                        f"says {layer.diff_id}"
                    )
        except (Cancelled, TkboxError):
            raise
        except _LayerRefused as e:
            raise _refusal(layer, e) from None
        except _PARSE_ERRORS as e:
            raise _refusal(layer, f"not a valid tar layer ({type(e).__name__}: {e})") from None
        if on_layer is not None:
            on_layer(i)
    return planner.plan()


def _dir_info(path: str, meta: _DirMeta | None) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path)
    info.type = tarfile.DIRTYPE
    if meta is None:
        info.mode, info.uid, info.gid, info.mtime = 0o755, 0, 0, 0
    else:
        info.mode, info.uid, info.gid, info.mtime = meta.mode, meta.uid, meta.gid, meta.mtime
        info.pax_headers = dict(meta.xattrs)
    info.uname = info.gname = ""
    return info


def _copy_info(src: tarfile.TarInfo, name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.REGTYPE if src.type in _REG else src.type
    info.size = src.size if info.type == tarfile.REGTYPE else 0
    info.mode, info.uid, info.gid, info.mtime = src.mode, src.uid, src.gid, src.mtime
    info.uname = info.gname = ""
    info.linkname = src.linkname if src.type == tarfile.SYMTYPE else ""
    info.devmajor, info.devminor = src.devmajor, src.devminor
    info.pax_headers = _xattrs(src)
    return info


def write_flat(
    layers: list[Layer], plan: Plan, out: IO[bytes], *,
    cancel: threading.Event | None = None, on_layer: Callable[[int], None] | None = None,
) -> int:
    """Pass 2: write the flattened tree as one PAX tar stream to `out`; return entries."""
    written = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as dst:
        for path, meta in plan.dirs:
            dst.addfile(_dir_info(path, meta))
            written += 1
        budget = [MAX_UNCOMPRESSED]
        for i, layer in enumerate(layers):
            want = plan.emit[i]
            if want:
                try:
                    with layer.open() as raw:
                        reader = _Reader(_decompressed(raw), budget, cancel)
                        stream = io.BufferedReader(reader, _CHUNK)
                        src = tarfile.open(fileobj=stream, mode="r|", tarinfo=BoundedTarInfo)
                        left = len(want)
                        for ordinal, info in enumerate(_members(src)):
                            wanted = want.get(ordinal)
                            if wanted is None:
                                continue
                            name, original = wanted
                            if original != info.name:
                                raise InternalError(
                                    f"layer {layer.digest} changed between passes"
                                )
                            new = _copy_info(info, name)
                            fobj = src.extractfile(info) if new.type == tarfile.REGTYPE else None
                            dst.addfile(new, fobj)
                            written += 1
                            left -= 1
                            if not left:
                                break
                except (Cancelled, TkboxError, BrokenPipeError):
                    raise
                except _LayerRefused as e:
                    raise _refusal(layer, e) from None
                except _PARSE_ERRORS as e:
                    raise _refusal(layer, f"not a valid tar layer ({e})") from None
            if on_layer is not None:
                on_layer(i)
        for path, target in plan.links:
            info = tarfile.TarInfo(path)
            info.type = tarfile.LNKTYPE
            info.linkname = target
            info.uname = info.gname = ""
            dst.addfile(info)
            written += 1
    return written
