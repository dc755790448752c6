"""Pulls from a real registry on loopback (Debian's docker-registry) over TLS with a test CA.

The images are built and pushed by the tests themselves; the root disk is read
back with `sqfs2tar` and compared with what the OCI image spec says.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tkbox.errors import RegistryError, UserError
from tkbox.image import oci
from tkbox.image.progress import ProgressEvent
from tkbox.image.store import ImageStore
from tkbox.image.testing import LayerBuilder as L
from tkbox.image.testing import LocalRegistry, ScratchCA, push_image, push_index

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    d = tmp_path_factory.mktemp("registry")
    reg = LocalRegistry(d, ScratchCA.create(d / "tls")).start()
    yield reg
    reg.stop()


@pytest.fixture
def store(tmp_path: Path, registry: LocalRegistry) -> Iterator[ImageStore]:
    s = ImageStore(tmp_path / "images", ca_bundle=registry.ca.ca_pem)
    yield s
    s.close()


def read_disk(path: Path) -> dict[str, dict[str, Any]]:
    p = subprocess.run(["sqfs2tar", str(path)], capture_output=True, check=True)
    import io

    tree: dict[str, dict[str, Any]] = {}
    with tarfile.open(fileobj=io.BytesIO(p.stdout), mode="r:") as tf:
        for m in tf:
            name = m.name.rstrip("/")
            f = tf.extractfile(m) if m.isfile() else None
            tree[name] = {"type": m.type, "data": f.read() if f else None, "mode": m.mode,
                          "uid": m.uid, "gid": m.gid, "mtime": int(m.mtime),
                          "link": m.linkname, "dev": (m.devmajor, m.devminor),
                          "xattrs": {k: v for k, v in m.pax_headers.items() if "xattr" in k}}
    return tree


def layers_with_everything() -> list[bytes]:
    base = (L().dir("etc", mode=0o755).file("etc/passwd", b"root:x:0:0::/root:/bin/sh\n")
            .file("etc/old.conf", b"old").dir("var/cache/app", mode=0o700, uid=1000)
            .file("var/cache/app/a", b"a").file("var/cache/app/sub/b", b"b")
            .file("bin/busybox", b"BUSYBOX", mode=0o755).hardlink("bin/sh", "bin/busybox")
            .symlink("bin/ls", "busybox").device("dev/null", 1, 3, mode=0o666)
            .file("home/big/f", b"big ids", uid=200000, gid=300000, mode=0o640, mtime=1234567890)
            .file("usr/bin/ping", b"ping", xattrs={"security.capability":
                                                   "\x01\x00\x00\x02\x00\x20\x00\x00"})
            .tar())
    middle = (L().whiteout("etc/old.conf").opaque("var/cache/app")
              .file("var/cache/app/new", b"new").file("etc/added", b"added")
              .hardlink("bin/cat", "bin/busybox").tar())
    top = (L().whiteout("bin/busybox").file("etc/passwd", b"changed\n", mode=0o600)
           .dir("var/cache/app", mode=0o750, uid=2000).tar())
    return [base, middle, top]


def test_multi_layer_image_flattens_exactly_as_the_spec_says(
        registry: LocalRegistry, store: ImageStore) -> None:
    with registry.client() as c:
        pushed = push_image(c, "test/spec", "v1", layers_with_everything(),
                            compression=["gzip", "zstd", "none"],
                            config={"Env": ["A=1"], "Cmd": ["/bin/sh"], "WorkingDir": "/w",
                                    "User": "1000"})
    events: list[ProgressEvent] = []

    class Sink:
        def emit(self, e: ProgressEvent) -> None:
            events.append(e)

    image = asyncio.run(store.resolve(f"{registry.host}/test/spec:v1", progress=Sink()))
    assert image.digest == pushed.digest
    assert image.config.env == ("A=1",) and image.config.working_dir == "/w"
    assert image.config.user == "1000" and image.config.cmd == ("/bin/sh",)
    assert image.rootfs.is_file() and image.size == image.rootfs.stat().st_size
    tree = read_disk(image.rootfs)
    files = {k: v for k, v in tree.items() if v["type"] != tarfile.DIRTYPE}
    assert sorted(files) == sorted([
        "etc/passwd", "etc/added", "var/cache/app/new", "bin/sh", "bin/ls", "bin/cat",
        "dev/null", "home/big/f", "usr/bin/ping"])
    assert tree["etc/passwd"]["data"] == b"changed\n" and tree["etc/passwd"]["mode"] == 0o600
    # the hard links outlive the whiteout of the path they were made from
    linked = [tree["bin/sh"], tree["bin/cat"]]
    assert sorted(x["type"] for x in linked) == [tarfile.REGTYPE, tarfile.LNKTYPE]
    assert next(x for x in linked if x["type"] == tarfile.REGTYPE)["data"] == b"BUSYBOX"
    assert tree["bin/ls"]["type"] == tarfile.SYMTYPE and tree["bin/ls"]["link"] == "busybox"
    assert tree["dev/null"]["type"] == tarfile.CHRTYPE and tree["dev/null"]["dev"] == (1, 3)
    big = tree["home/big/f"]
    assert (big["uid"], big["gid"], big["mode"], big["mtime"]) == (200000, 300000, 0o640,
                                                                   1234567890)
    assert tree["usr/bin/ping"]["xattrs"] == {
        "SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00"}
    app = tree["var/cache/app"]
    assert (app["type"], app["mode"], app["uid"]) == (tarfile.DIRTYPE, 0o750, 2000)
    assert "var/cache/app/sub" not in tree and "etc/old.conf" not in tree
    assert not any(".wh." in k for k in tree)
    kinds = {(e.kind, e.state) for e in events}
    assert {("resolve", ""), ("blob", "start"), ("blob", "done"), ("flatten", "done"),
            ("ready", "")} <= kinds


def test_index_with_several_platforms_boots_the_amd64_one(
        registry: LocalRegistry, store: ImageStore) -> None:
    with registry.client() as c:
        arm = push_image(c, "test/multi", None, [L().file("which", b"arm64").tar()],
                         architecture="arm64")
        amd = push_image(c, "test/multi", None, [L().file("which", b"amd64").tar()])
        s390 = push_image(c, "test/multi", None, [L().file("which", b"s390x").tar()],
                          architecture="s390x")
        index = push_index(c, "test/multi", "latest", [
            (arm, "linux", "arm64", "v8"), (amd, "linux", "amd64", None),
            (s390, "linux", "s390x", None)])
    image = asyncio.run(store.pull(f"{registry.host}/test/multi"))
    assert image.digest == amd.digest and image.index_digest == index
    assert read_disk(image.rootfs)["which"]["data"] == b"amd64"
    # by the index's digest too, from the cache now
    again = asyncio.run(store.resolve(f"{registry.host}/test/multi@{index}"))
    assert again.digest == amd.digest


def test_docker_v2_media_types_and_manifest_list(
        registry: LocalRegistry, store: ImageStore) -> None:
    with registry.client() as c:
        amd = push_image(c, "test/docker", None, [L().file("d", b"docker").tar()], docker=True)
        push_index(c, "test/docker", "v2", [(amd, "linux", "amd64", None)], docker=True)
    image = asyncio.run(store.pull(f"{registry.host}/test/docker:v2"))
    assert image.digest == amd.digest
    assert read_disk(image.rootfs)["d"]["data"] == b"docker"


def test_cached_image_resolves_without_the_registry(
        registry: LocalRegistry, tmp_path: Path) -> None:
    with registry.client() as c:
        pushed = push_image(c, "test/cached", "v1", [L().file("c", b"c").tar()])
    ref = f"{registry.host}/test/cached:v1"
    with ImageStore(tmp_path / "images", ca_bundle=registry.ca.ca_pem) as s:
        asyncio.run(s.pull(ref))
    # A store whose registry client cannot reach anything still resolves the cached tag.
    with ImageStore(tmp_path / "images", ca_bundle=tmp_path / "missing.pem") as s:
        assert asyncio.run(s.resolve(ref)).digest == pushed.digest
        assert asyncio.run(s.resolve(pushed.digest)).digest == pushed.digest


def test_blob_altered_in_the_registry_is_refused_and_not_cached(
        registry: LocalRegistry, store: ImageStore) -> None:
    """Tampering with stored content (in the registry or on the way) is caught by digest."""
    with registry.client() as c:
        pushed = push_image(c, "test/tamper", "v1",
                            [L().file("f", b"original content " * 100).tar()])
    layer_digest = pushed.layers[0][0]
    data_path = registry.blob_data_path(layer_digest)
    raw = bytearray(data_path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data_path.write_bytes(bytes(raw))
    with pytest.raises(RegistryError, match=f"blob {layer_digest} failed verification"):
        asyncio.run(store.pull(f"{registry.host}/test/tamper:v1"))
    assert not store.has_blob(layer_digest)
    assert list(store.root.glob("disks/sha256/*")) == []
    assert [p for p in store.root.glob("tmp/*/*")] == []
    assert store.ls() == []


def test_unknown_image_and_unreachable_registry(registry: LocalRegistry,
                                                store: ImageStore) -> None:
    with pytest.raises(UserError, match="not found"):
        asyncio.run(store.pull(f"{registry.host}/test/nothing-here:v1"))
    with pytest.raises(UserError, match="tkbox image build"):
        asyncio.run(store.resolve("tkbox/default"))


def test_untrusted_certificate_is_refused(registry: LocalRegistry, tmp_path: Path) -> None:
    """Without the test CA, the registry's certificate does not verify: no pull."""
    other = ScratchCA.create(tmp_path / "other")
    with ImageStore(tmp_path / "images", ca_bundle=other.ca_pem) as s, \
            pytest.raises(RegistryError, match="certificate of 127.0.0.1:.* does not verify"):
        asyncio.run(s.pull(f"{registry.host}/test/spec:v1"))


PULLER = r"""
import asyncio, sys, time
from pathlib import Path
from tkbox.image.store import ImageStore
from tkbox.image.progress import JsonProgress

class Slow(JsonProgress):
    def emit(self, event):
        super().emit(event)
        if event.kind == "blob" and event.state == "progress":
            time.sleep(0.2)  # slow the transfer so the test can kill it halfway

with ImageStore(Path(sys.argv[1]), ca_bundle=Path(sys.argv[2])) as s:
    asyncio.run(s.pull(sys.argv[3], progress=Slow(every=0)))
"""


def test_pull_killed_halfway_leaves_nothing_half_made_and_restarts(
        registry: LocalRegistry, tmp_path: Path) -> None:
    big = os.urandom(12 * 1024 * 1024)
    with registry.client() as c:
        pushed = push_image(c, "test/killed", "v1",
                            [L().file("small", b"s").tar(), L().file("big", big).tar()],
                            compression="none")
    ref = f"{registry.host}/test/killed:v1"
    root = tmp_path / "images"
    proc = subprocess.Popen([sys.executable, "-c", PULLER, str(root), str(registry.ca.ca_pem),
                             ref], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        ev = json.loads(line)
        if ev["event"] == "blob" and ev.get("state") == "progress" and ev.get("done", 0) > 0 \
                and ev.get("size", 0) > 1024 * 1024:
            break
    partial = list(root.glob("tmp/*/blob.*"))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert partial, "the kill should land during a blob transfer"
    # Nothing half-made is visible: every stored blob verifies, no disk, no name.
    for blob in root.glob("blobs/sha256/*"):
        assert oci.sha256_digest(blob.read_bytes()) == "sha256:" + blob.name
    assert not list(root.glob("disks/sha256/*"))
    big_digest = pushed.layers[1][0]
    assert not (root / "blobs/sha256" / oci.hex_of(big_digest)).exists()
    # The next store sweeps the dead pull's temporaries and pulls cleanly.
    with ImageStore(root, ca_bundle=registry.ca.ca_pem) as s:
        assert not [p for p in partial if p.exists()]
        image = asyncio.run(s.pull(ref))
        assert image.digest == pushed.digest
        assert read_disk(image.rootfs)["big"]["data"] == big


def test_two_processes_pulling_the_same_image_at_once(
        registry: LocalRegistry, tmp_path: Path) -> None:
    with registry.client() as c:
        pushed = push_image(c, "test/race", "v1",
                            [L().file("f", os.urandom(2 * 1024 * 1024)).tar(),
                             L().file("g", b"g").tar()])
    root = tmp_path / "images"
    script = PULLER.replace("time.sleep(0.2)", "time.sleep(0.01)")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(root),
                               str(registry.ca.ca_pem), f"{registry.host}/test/race:v1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    with ImageStore(root) as s:
        (image,) = s.ls()
        assert image.digest == pushed.digest
        assert read_disk(image.rootfs)["g"]["data"] == b"g"
    assert len(list(root.glob("disks/sha256/*"))) == 1
