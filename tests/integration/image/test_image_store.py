"""The store with real files and tar2sqfs: import, local names, OCI layouts, the CLI, crashes."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tkbox.errors import UserError
from tkbox.image import oci
from tkbox.image.cli import image_app
from tkbox.image.store import ImageStore
from tkbox.image.testing import LayerBuilder as L
from tkbox.image.testing import LocalRegistry, ScratchCA, push_image

pytestmark = pytest.mark.integration


def rootfs_tar(path: Path, *, gz: bool = False) -> Path:
    data = (L().dir("./").dir("./bin").file("./bin/sh", b"#!sh", mode=0o755)
            .file("./etc/os-release", b"ID=test\n").symlink("./usr/bin", "../bin").tar())
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def listing(disk: Path) -> list[str]:
    out = subprocess.run(["sqfs2tar", str(disk)], capture_output=True, check=True).stdout
    import io

    return sorted(m.name for m in tarfile.open(fileobj=io.BytesIO(out)))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ImageStore]:
    s = ImageStore(tmp_path / "images")
    yield s
    s.close()


def test_import_then_resolve_by_local_name_and_digest(store: ImageStore, tmp_path: Path) -> None:
    image = store.import_tar(rootfs_tar(tmp_path / "r.tar"), "tkbox/default")
    assert image.ref == "tkbox/default:latest" and image.source == "import"
    assert listing(image.rootfs) == ["bin", "bin/sh", "etc", "etc/os-release", "usr", "usr/bin"]
    manifest = oci.parse_document(store.blob_path(image.digest).read_bytes())
    assert isinstance(manifest, oci.Manifest) and len(manifest.layers) == 1
    assert image.config.cmd == ("/bin/sh",) and image.config.env[0].startswith("PATH=")
    assert asyncio.run(store.resolve("tkbox/default")).digest == image.digest
    assert asyncio.run(store.resolve(image.digest)).digest == image.digest
    # same content, same digest (gzip or not): the root disk is shared
    again = store.import_tar(rootfs_tar(tmp_path / "r.tar.gz", gz=True), "me/other:v1")
    assert again.digest == image.digest and again.rootfs == image.rootfs


def test_import_refuses_escaping_tarballs_and_leaves_nothing(store: ImageStore,
                                                             tmp_path: Path) -> None:
    """A rootfs tarball with ../ entries (tar-slip) is refused; no name, no disk."""
    bad = tmp_path / "bad.tar"
    bad.write_bytes(L().file("ok", b"").file("../../etc/cron.d/x", b"pwn").tar())
    with pytest.raises(UserError, match=r"'\.\.' component"):
        store.import_tar(bad, "me/bad")
    assert store.ls() == [] and not list(store.root.glob("disks/sha256/*"))


def test_import_stops_at_the_images_bound_while_it_decompresses(
        store: ImageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tarball was copied into the store decompressed, without a bound, before
    anything else looked at it: a 3 MB zstd of zeros wrote 4 GiB in 15 s and would have
    filled the disk. The copy stops at the image's uncompressed bound (here 1 MiB)."""
    import zstandard

    from tkbox.image import tarball

    monkeypatch.setattr(tarball, "MAX_TARBALL", 1024 * 1024, raising=False)
    bomb = tmp_path / "bomb.tar.zst"
    bomb.write_bytes(zstandard.ZstdCompressor().compress(
        L().file("zeros", b"\0" * (4 * 1024 * 1024)).tar()))
    with pytest.raises(UserError, match="decompresses to more than 1048576 bytes"):
        store.import_tar(bomb, "me/bomb")
    assert store.ls() == [] and not list(store.root.glob("blobs/sha256/*"))
    assert not [p for p in store.root.glob("tmp/*/*") if p.is_file()]


def test_rm_and_prune(store: ImageStore, tmp_path: Path) -> None:
    a = store.import_tar(rootfs_tar(tmp_path / "r.tar"), "me/a")
    store.import_tar(rootfs_tar(tmp_path / "r2.tar"), "me/b")
    assert [i.ref for i in store.ls()] == ["me/a:latest", "me/b:latest"]
    store.rm("me/a")
    assert a.rootfs.exists()  # me/b still names the same disk
    store.rm("me/b")
    assert not a.rootfs.exists()
    removed = store.prune()
    assert removed["blobs"] == 3 and removed["disks"] == 0
    assert not list(store.root.glob("blobs/sha256/*"))
    with pytest.raises(UserError, match="no image"):
        store.rm("me/a")


def test_temporaries_of_a_dead_process_are_swept_but_a_live_ones_are_not(tmp_path: Path) -> None:
    root = tmp_path / "images"
    # a process that opens a store, writes a temporary, and dies without cleaning up
    code = ("import os,sys; from pathlib import Path; from tkbox.image.store import ImageStore;"
            "s=ImageStore(Path(sys.argv[1])); (s._tmp.dir/'blob.partial').write_bytes(b'x');"
            "os._exit(9)")
    subprocess.run([sys.executable, "-c", code, str(root)], check=False)
    assert list(root.glob("tmp/*/blob.partial"))
    live = ImageStore(root)
    (live._tmp.dir / "blob.inflight").write_bytes(b"y")
    with ImageStore(root) as other:
        assert not list(root.glob("tmp/*/blob.partial"))
        assert (live._tmp.dir / "blob.inflight").exists()
        assert other._tmp.dir.exists()
    live.close()


def test_oci_layout_and_archive_made_by_skopeo(tmp_path: Path) -> None:
    if not shutil.which("skopeo"):
        pytest.skip("skopeo is not installed")
    reg = LocalRegistry(tmp_path / "reg", ScratchCA.create(tmp_path / "tls")).start()
    try:
        with reg.client() as c:
            pushed = push_image(c, "test/layout", "v1",
                                [L().file("a", b"1").tar(), L().whiteout("a").file("b").tar()])
        env = {**os.environ, "SSL_CERT_FILE": str(reg.ca.ca_pem)}
        certs = tmp_path / "certs"
        certs.mkdir()
        shutil.copy(reg.ca.ca_pem, certs / "ca.crt")
        for dest in (f"oci:{tmp_path / 'lay'}:v1", f"oci-archive:{tmp_path / 'lay.tar'}:v1"):
            subprocess.run(["skopeo", "copy", "--quiet", f"--src-cert-dir={certs}",
                            f"docker://{reg.host}/test/layout:v1", dest],
                           check=True, env=env, capture_output=True)
    finally:
        reg.stop()
    with ImageStore(tmp_path / "images") as s:
        for ref in (f"oci:{tmp_path / 'lay'}:v1", f"oci-archive:{tmp_path / 'lay.tar'}:v1",
                    f"oci:{tmp_path / 'lay'}"):
            image = asyncio.run(s.resolve(ref))
            assert image.digest == pushed.digest
            assert listing(image.rootfs) == ["b"]
        with pytest.raises(UserError, match="no image tagged 'v9'"):
            asyncio.run(s.resolve(f"oci:{tmp_path / 'lay'}:v9"))


def test_cli_import_ls_inspect_rm_prune_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    monkeypatch.setenv("TKBOX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CI", "1")
    runner = CliRunner()
    r = runner.invoke(image_app, ["import", str(rootfs_tar(tmp_path / "r.tar")), "--tag",
                                  "me/tool:v1", "--json"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.output.splitlines()]
    assert lines[-1]["ref"] == "me/tool:v1" and lines[-1]["digest"].startswith("sha256:")
    assert any(x.get("event") == "ready" for x in lines[:-1])
    assert Path(lines[-1]["rootfs"]).is_relative_to(tmp_path / "home" / "images")
    r = runner.invoke(image_app, ["ls", "--json"])
    assert [i["ref"] for i in json.loads(r.output)] == ["me/tool:v1"]
    r = runner.invoke(image_app, ["inspect", "me/tool:v1", "--json"])
    assert json.loads(r.output)["config"]["Cmd"] == ["/bin/sh"]
    r = runner.invoke(image_app, ["inspect", "nope"])
    assert r.exit_code == 2 and "no image 'nope'" in r.output
    r = runner.invoke(image_app, ["rm", "me/tool:v1", "--json"])
    assert json.loads(r.output) == {"removed": ["me/tool:v1"]}
    r = runner.invoke(image_app, ["prune", "--json"])
    assert json.loads(r.output)["blobs"] == 3
    r = runner.invoke(image_app, ["import", str(tmp_path / "missing.tar"), "--tag", "x"])
    assert r.exit_code == 2 and "is not a file" in r.output


def test_an_oci_archive_of_countless_members_is_refused_without_holding_them(
        store: ImageStore, tmp_path: Path) -> None:
    """The archive's headers were all read into memory first (getmembers): 200,000 empty
    members, a 450 KB gzip, took 72 MiB, and nothing bounded their number. Members are
    read one at a time, only those a layout uses are kept, and their number is bounded."""
    import tracemalloc

    from tkbox.errors import RegistryError

    archive = tmp_path / "bomb.tar.gz"
    header = tarfile.TarInfo("x").tobuf(tarfile.USTAR_FORMAT)
    with gzip.open(archive, "wb") as g:
        g.write(header * 100_001 + b"\0" * 1024)
    assert archive.stat().st_size < 1024 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(RegistryError, match="more than 100000 members"):
            asyncio.run(store.resolve(f"oci-archive:{archive}"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024


@pytest.mark.timeout(60, method="thread")  # a FIFO blocks a worker thread in open()
def test_an_oci_layouts_files_must_be_regular_files(store: ImageStore, tmp_path: Path) -> None:
    """A layout directory is someone else's: its index.json as a FIFO held `tkbox image
    pull oci:DIR` in open() for ever (in a worker thread, so not even a signal ended it);
    a blob linked to /dev/zero was read up to its descriptor's size. Each is refused by
    what it is, before a byte is read."""
    lay = tmp_path / "lay"
    (lay / "blobs" / "sha256").mkdir(parents=True)
    (lay / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    os.mkfifo(lay / "index.json")
    with pytest.raises(UserError, match="index.json is not a regular file"):
        asyncio.run(store.resolve(f"oci:{lay}"))
    (lay / "index.json").unlink()
    digest = "sha256:" + "ab" * 32
    (lay / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": oci.OCI_MANIFEST, "digest": digest, "size": 1000}]}))
    (lay / "blobs" / "sha256" / digest[7:]).symlink_to("/dev/zero")
    with pytest.raises(UserError, match=f"{digest[7:]} is not a regular file"):
        asyncio.run(store.resolve(f"oci:{lay}"))
