"""Flattening layers per the OCI image spec, in memory: whiteouts, opaque dirs, links, escapes."""

from __future__ import annotations

import gzip
import io
import tarfile
import tracemalloc
from typing import Any

import pytest
import zstandard

from tkbox.errors import RegistryError
from tkbox.image import flatten, oci
from tkbox.image.flatten import Layer, plan_layers, write_flat
from tkbox.image.testing import LayerBuilder as L


def layer(data: bytes, name: str = "", diff_id: str | None = None) -> Layer:
    digest = oci.sha256_digest(data)
    return Layer(name or digest, lambda: io.BytesIO(data), diff_id)


def flat(*tars: bytes, check_ids: bool = True) -> dict[str, dict[str, Any]]:
    layers = [layer(t, diff_id=oci.sha256_digest(t) if check_ids else None) for t in tars]
    out = io.BytesIO()
    write_flat(layers, plan_layers(layers), out)
    out.seek(0)
    tree: dict[str, dict[str, Any]] = {}
    with tarfile.open(fileobj=out, mode="r:") as tf:
        for m in tf:
            assert m.name not in tree, f"{m.name} written twice"
            f = tf.extractfile(m) if m.isfile() else None
            tree[m.name] = {
                "type": {tarfile.REGTYPE: "file", tarfile.DIRTYPE: "dir",
                         tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink",
                         tarfile.CHRTYPE: "chr", tarfile.BLKTYPE: "blk",
                         tarfile.FIFOTYPE: "fifo"}[m.type],
                "data": f.read() if f else None, "mode": m.mode, "uid": m.uid, "gid": m.gid,
                "mtime": m.mtime, "link": m.linkname, "dev": (m.devmajor, m.devminor),
                "xattrs": {k: v for k, v in m.pax_headers.items() if "xattr" in k},
            }
    return tree


def test_single_layer_keeps_every_attribute() -> None:
    t = (L().dir("./etc", mode=0o750, uid=3, gid=4, mtime=111)
         .file("./etc/big-ids", b"x", uid=100000, gid=3_000_000, mode=0o4755, mtime=222)
         .file("etc/caps", b"", xattrs={"security.capability": "\x01\x00\x00\x02",
                                        "user.k": "v"})
         .symlink("etc/link", "/etc/big-ids").device("dev/null", 1, 3, mode=0o666)
         .device("dev/sda", 8, 0, block=True).fifo("run/fifo").tar())
    tree = flat(t)
    assert tree["etc"] == {"type": "dir", "data": None, "mode": 0o750, "uid": 3, "gid": 4,
                           "mtime": 111, "link": "", "dev": (0, 0), "xattrs": {}}
    big = tree["etc/big-ids"]
    assert (big["uid"], big["gid"], big["mode"], big["mtime"]) == (100000, 3_000_000, 0o4755, 222)
    assert tree["etc/caps"]["xattrs"] == {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02",
                                          "SCHILY.xattr.user.k": "v"}
    assert tree["etc/link"]["type"] == "symlink" and tree["etc/link"]["link"] == "/etc/big-ids"
    assert (tree["dev/null"]["type"], tree["dev/null"]["dev"]) == ("chr", (1, 3))
    assert (tree["dev/sda"]["type"], tree["dev/sda"]["dev"]) == ("blk", (8, 0))
    assert tree["run/fifo"]["type"] == "fifo"
    # parents nobody named are made as tar does: 0755 root
    assert (tree["dev"]["type"], tree["dev"]["mode"], tree["dev"]["uid"]) == ("dir", 0o755, 0)


def test_directories_come_before_their_children_and_links_last() -> None:
    t = L().file("a/b/c", b"1").hardlink("z", "a/b/c").dir("a/b", mode=0o700).tar()
    tree = flat(t)
    names = list(tree)
    assert names.index("a") < names.index("a/b") < names.index("a/b/c")
    # one inode, two paths: the first in sorted walk order holds the data, the other links
    assert tree["z"]["type"] == "file" and tree["z"]["data"] == b"1"
    assert tree["a/b/c"]["type"] == "hardlink" and tree["a/b/c"]["link"] == "z"
    assert names[-1] == "a/b/c"


def test_whiteout_removes_a_lower_file_and_a_lower_subtree() -> None:
    base = L().file("etc/a", b"A").file("etc/b", b"B").file("opt/x/y/z", b"Z").tar()
    top = L().whiteout("etc/a").whiteout("opt/x").tar()
    tree = flat(base, top)
    assert "etc/a" not in tree and "etc/.wh.a" not in tree
    assert tree["etc/b"]["data"] == b"B"
    assert not any(p.startswith("opt/x") for p in tree)
    assert tree["opt"]["type"] == "dir"


def test_whiteout_hides_only_lower_layers_not_its_own() -> None:
    """image-spec: files present in the same layer as a whiteout are not hidden by it."""
    base = L().file("a", b"old").tar()
    top = L().file("a", b"new").whiteout("a").tar()
    assert flat(base, top)["a"]["data"] == b"new"


def test_opaque_directory_hides_lower_children_wherever_the_marker_sits() -> None:
    base = L().dir("a", mode=0o700).file("a/old", b"o").file("a/b/c/bar", b"bar").tar()
    marker_first = L().dir("a").opaque("a").file("a/b/c/foo", b"foo").tar()
    marker_last = L().dir("a").file("a/b/c/foo", b"foo").opaque("a").tar()
    for top in (marker_first, marker_last):
        tree = flat(base, top)
        assert sorted(p for p in tree if p.startswith("a")) == ["a", "a/b", "a/b/c", "a/b/c/foo"]
        assert tree["a"]["mode"] == 0o755
        assert ".wh..wh..opq" not in "".join(tree)


def test_directory_over_directory_replaces_attributes_keeps_children() -> None:
    base = L().dir("d", mode=0o700, uid=5).file("d/keep", b"k").tar()
    top = L().dir("d", mode=0o755, uid=6, mtime=5).tar()
    tree = flat(base, top)
    assert (tree["d"]["mode"], tree["d"]["uid"], tree["d"]["mtime"]) == (0o755, 6, 5)
    assert tree["d/keep"]["data"] == b"k"


def test_file_over_directory_and_directory_over_file_replace() -> None:
    base = L().file("d/x", b"x").file("f", b"f").tar()
    top = L().file("d", b"now a file").file("f/inner", b"i").tar()
    with pytest.raises(RegistryError, match="not a directory"):
        flat(base, top)  # "f/inner" under a file: refused
    top = L().file("d", b"now a file").dir("f").file("f/inner", b"i").tar()
    tree = flat(base, top)
    assert tree["d"]["data"] == b"now a file" and "d/x" not in tree
    assert tree["f"]["type"] == "dir" and tree["f/inner"]["data"] == b"i"


def test_hard_links_share_content_within_and_across_layers() -> None:
    base = L().file("bin/busybox", b"BB", mode=0o755).hardlink("bin/sh", "bin/busybox").tar()
    top = L().hardlink("bin/ls", "bin/busybox").tar()
    tree = flat(base, top)
    assert tree["bin/busybox"]["data"] == b"BB"
    assert tree["bin/ls"] == {**tree["bin/ls"], "type": "hardlink", "link": "bin/busybox"}
    assert tree["bin/sh"]["link"] == "bin/busybox"


def test_hard_link_keeps_its_inode_when_the_original_path_goes() -> None:
    base = L().file("a", b"shared", mode=0o600).hardlink("b", "a").hardlink("c", "a").tar()
    top = L().whiteout("a").tar()
    tree = flat(base, top)
    assert "a" not in tree
    assert tree["b"]["type"] == "file" and tree["b"]["data"] == b"shared"
    assert tree["b"]["mode"] == 0o600
    assert tree["c"] == {**tree["c"], "type": "hardlink", "link": "b"}
    # replaced rather than removed: the link keeps the old content
    top = L().file("a", b"replaced").tar()
    tree = flat(base, top)
    assert tree["a"]["data"] == b"replaced" and tree["a"]["type"] == "file"
    assert tree["b"]["data"] == b"shared"


def test_hard_link_to_a_missing_or_directory_target_is_refused() -> None:
    with pytest.raises(RegistryError, match="not in the image"):
        flat(L().hardlink("x", "nope").tar())
    with pytest.raises(RegistryError, match="a directory"):
        flat(L().dir("d").hardlink("x", "d").tar())


@pytest.mark.parametrize("name,why", [
    ("/etc/passwd", "absolute"), ("../evil", "'..'"), ("a/../../evil", "'..'"),
    ("a//b", "not canonical"), ("a/./b", "not canonical"), ("x" * 300, "NAME_MAX"),
])
def test_escaping_entry_names_are_refused_with_layer_and_entry(name: str, why: str) -> None:
    """A layer must not write outside the image root (tar-slip)."""
    t = L().file(name, b"x").tar()
    lay = layer(t, name="sha256:" + "e" * 64)
    with pytest.raises(RegistryError, match=why) as e:
        plan_layers([lay])
    assert "sha256:" + "e" * 64 in str(e.value)
    assert repr(name)[:20] in str(e.value)


def test_escaping_hard_link_targets_are_refused() -> None:
    with pytest.raises(RegistryError, match="hard link target"):
        flat(L().hardlink("x", "../../etc/shadow").tar())
    with pytest.raises(RegistryError, match="hard link target"):
        flat(L().hardlink("x", "/etc/shadow").tar())


def test_path_through_a_symlink_in_a_lower_layer_is_refused() -> None:
    """A symlink `etc -> /host/etc` then `etc/x` would write through the link: refused."""
    base = L().symlink("etc", "/somewhere/else").tar()
    top = L().file("etc/passwd", b"root::0:0").tar()
    with pytest.raises(RegistryError, match="symlink 'etc'") as e:
        flat(base, top)
    assert "etc/passwd" in str(e.value)


def test_path_through_a_symlink_in_the_same_layer_is_refused() -> None:
    with pytest.raises(RegistryError, match="through the symlink"):
        flat(L().symlink("lib", "usr/lib").file("lib/libc.so", b"x").tar())


def test_whiteout_through_a_symlink_is_refused_and_under_a_file_ignored() -> None:
    base = L().symlink("s", "/x").file("f", b"f").tar()
    with pytest.raises(RegistryError, match="symlink"):
        flat(base, L().whiteout("s/y").tar())
    assert flat(base, L().whiteout("f/y").tar())["f"]["data"] == b"f"


def test_symlink_replaced_by_a_directory_then_used_is_fine() -> None:
    base = L().symlink("lib", "usr/lib").tar()
    top = L().dir("lib").file("lib/x", b"x").tar()
    tree = flat(base, top)
    assert tree["lib"]["type"] == "dir" and tree["lib/x"]["data"] == b"x"


def test_gzip_and_zstd_layers_and_diff_ids() -> None:
    t1 = L().file("a", b"1").tar()
    t2 = L().file("b", b"2").tar()
    g = gzip.compress(t1)
    z = zstandard.ZstdCompressor().compress(t2)
    layers = [layer(g, diff_id=oci.sha256_digest(t1)), layer(z, diff_id=oci.sha256_digest(t2))]
    out = io.BytesIO()
    write_flat(layers, plan_layers(layers), out)
    out.seek(0)
    assert sorted(tarfile.open(fileobj=out).getnames()) == ["a", "b"]


def test_a_layer_whose_content_does_not_match_its_diff_id_is_refused() -> None:
    """The config's diff_ids pin the uncompressed content; a swapped layer is caught."""
    t = L().file("a", b"1").tar()
    with pytest.raises(RegistryError, match="uncompressed content"):
        plan_layers([layer(gzip.compress(t), diff_id="sha256:" + "0" * 64)])


@pytest.mark.parametrize("blob", [
    b"not a tar at all" * 100, b"\x1f\x8b\x08\x00garbage", b"\x28\xb5\x2f\xfdgarbage",
    gzip.compress(b"x" * 1000),
])
def test_garbage_layers_are_registry_errors(blob: bytes) -> None:
    with pytest.raises(RegistryError, match="layer"):
        plan_layers([layer(blob)])


def test_oversized_pax_record_is_refused_before_it_is_read() -> None:
    """tarfile reads a PAX record whole; a huge one is a memory bomb, refused by size."""
    info = tarfile.TarInfo("x")
    info.pax_headers = {"comment": "a" * (flatten.MAX_EXT_HEADER + 10)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(info, io.BytesIO(b""))
    with pytest.raises(RegistryError, match="too large"):
        plan_layers([layer(buf.getvalue())])


def _pax_block(kind: bytes, records: dict[str, str]) -> bytes:
    data = b""
    for k, v in records.items():
        rec = f" {k}={v}\n".encode()
        n = len(rec) + 1
        while len(str(n)) + len(rec) != n:
            n += 1
        data += str(n).encode() + rec
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = kind, len(data)
    return info.tobuf(tarfile.USTAR_FORMAT) + data + b"\0" * (-len(data) % 512)


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME])
def test_a_long_chain_of_extended_headers_is_a_refusal(kind: bytes) -> None:
    """tarfile reads each extended header by recursing into the next: 3,000 in a row
    (1.5 MB) raised RecursionError, which no caller turns into a one-line error."""
    one = _pax_block(kind, {"comment": "x"})
    if kind == tarfile.GNUTYPE_LONGNAME:
        info = tarfile.TarInfo("././@LongLink")
        info.type, info.size = kind, 5
        one = info.tobuf(tarfile.USTAR_FORMAT) + b"name\0" + b"\0" * 507
    blob = one * 3000 + tarfile.TarInfo("f").tobuf(tarfile.USTAR_FORMAT) + b"\0" * 1024
    with pytest.raises(RegistryError, match="more than 8 extended headers before one entry"):
        plan_layers([layer(blob)])
    # a few in a row, as GNU tar and Go write them, are fine
    ok = (_pax_block(tarfile.XHDTYPE, {"uid": "5"}) + tarfile.TarInfo("f").tobuf(
        tarfile.USTAR_FORMAT) + b"\0" * 1024)
    assert flat(ok)["f"]["uid"] == 5


def test_global_pax_headers_are_skipped_as_containerd_does() -> None:
    """tarfile merged a global header (type g) into every later entry and copied the
    merged keys into each one: 2,000 of them with 1,000 keys each (500 KB of zstd) took
    over 200 s of CPU. containerd and Docker skip them when they unpack; so does tkbox."""
    blob = (_pax_block(tarfile.XGLTYPE, {"uid": "7", "SCHILY.xattr.user.g": "1",
                                         "comment": "from git archive"})
            + tarfile.TarInfo("f").tobuf(tarfile.USTAR_FORMAT) + b"\0" * 1024)
    tree = flat(blob)
    assert list(tree) == ["f"]
    assert (tree["f"]["uid"], tree["f"]["xattrs"]) == (0, {})


def test_entry_count_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flatten, "MAX_ENTRIES", 3)
    with pytest.raises(RegistryError, match="more than 3 entries"):
        flat(L().file("a").file("b").file("c").file("d").tar())


def test_directories_a_name_implies_are_bounded_like_entries() -> None:
    """A name 2,000 levels deep makes 2,000 directories the plan holds, each with its own
    path: 200 such entries (a 1.5 KB zstd layer) took 930 MiB. They are counted, with the
    bytes of their paths, before the tree holds them."""
    deep = "/".join(["a"] * 2000)
    t = L()
    for i in range(200):
        t.file(f"{i}/{deep}")
    blob = zstandard.ZstdCompressor().compress(t.tar())
    assert len(blob) < 64 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(RegistryError, match="names and xattrs take more than 256 MiB"):
            plan_layers([layer(blob)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 * 1024**2


def test_implied_directories_count_as_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flatten, "MAX_ENTRIES", 100)
    with pytest.raises(RegistryError, match="more than 100 entries"):
        plan_layers([layer(L().file("/".join(["d"] * 120)).tar())])


def test_xattrs_the_plan_keeps_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory's xattrs are held until the emit pass: 2,000 directories with 200 KB
    each (a 37 KB zstd layer) took 380 MiB; the bytes are counted against the plan's."""
    monkeypatch.setattr(flatten, "MAX_PLAN_BYTES", 1024 * 1024)
    t = L()
    for i in range(20):
        t.dir(f"d{i}", xattrs={"user.a": "v" * 100_000})
    with pytest.raises(RegistryError, match="names and xattrs take more than 1 MiB"):
        plan_layers([layer(t.tar())])
    # the same directories, with small xattrs, are fine
    t = L()
    for i in range(20):
        t.dir(f"d{i}", xattrs={"user.a": "v" * 100})
    assert len(plan_layers([layer(t.tar())]).dirs) == 20


def test_uncompressed_size_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small gzip that inflates without end (a decompression bomb) stops at the bound."""
    monkeypatch.setattr(flatten, "MAX_UNCOMPRESSED", 64 * 1024)
    t = L().file("zeros", b"\0" * (1024 * 1024)).tar()
    with pytest.raises(RegistryError, match="larger than"):
        plan_layers([layer(gzip.compress(t))])


def test_sparse_and_unknown_entry_types_are_refused() -> None:
    info = tarfile.TarInfo("vol")
    info.type = tarfile.GNUTYPE_SPARSE
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        tf.addfile(info)
    with pytest.raises(RegistryError, match="sparse|unsupported"):
        plan_layers([layer(buf.getvalue())])


def test_aufs_metadata_and_root_entries_are_dropped() -> None:
    t = L().dir("./").file(".wh..wh.plnk/1.2", b"").file("a", b"a").tar()
    assert list(flat(t)) == ["a"]


def test_cancel_stops_a_flatten() -> None:
    import threading

    ev = threading.Event()
    ev.set()
    with pytest.raises(flatten.Cancelled):
        plan_layers([layer(L().file("a", b"1").tar())], cancel=ev)
