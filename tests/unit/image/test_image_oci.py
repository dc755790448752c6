"""OCI and Docker v2 documents: media types, platforms, strictness, bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tkbox.errors import RegistryError
from tkbox.image import oci

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
D3 = "sha256:" + "3" * 64


def manifest(mt: str = oci.OCI_MANIFEST, cmt: str = oci.OCI_CONFIG,
             lmt: str = oci.OCI_LAYER + "+gzip", **extra: Any) -> bytes:
    return json.dumps({
        "schemaVersion": 2, "mediaType": mt,
        "config": {"mediaType": cmt, "digest": D1, "size": 10},
        "layers": [{"mediaType": lmt, "digest": D2, "size": 20}], **extra,
    }).encode()


def index(entries: list[tuple[str, str, str | None]], mt: str = oci.OCI_INDEX) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": mt, "manifests": [
        {"mediaType": oci.OCI_MANIFEST, "digest": "sha256:" + f"{i:x}" * 64, "size": 1,
         "platform": {"os": o, "architecture": a, **({"variant": v} if v else {})}}
        for i, (o, a, v) in enumerate(entries)]}).encode()


@pytest.mark.parametrize("mt,cmt,lmt", [
    (oci.OCI_MANIFEST, oci.OCI_CONFIG, oci.OCI_LAYER),
    (oci.OCI_MANIFEST, oci.OCI_CONFIG, oci.OCI_LAYER + "+gzip"),
    (oci.OCI_MANIFEST, oci.OCI_CONFIG, oci.OCI_LAYER + "+zstd"),
    (oci.DOCKER_MANIFEST, oci.DOCKER_CONFIG, "application/vnd.docker.image.rootfs.diff.tar.gzip"),
])
def test_manifest_media_types(mt: str, cmt: str, lmt: str) -> None:
    doc = oci.parse_document(manifest(mt, cmt, lmt))
    assert isinstance(doc, oci.Manifest)
    assert doc.media_type == mt and doc.config.digest == D1
    assert [(x.media_type, x.digest, x.size) for x in doc.layers] == [(lmt, D2, 20)]


def test_media_type_from_content_type_or_shape_when_absent() -> None:
    body = json.loads(manifest())
    del body["mediaType"]
    raw = json.dumps(body).encode()
    assert isinstance(oci.parse_document(raw, oci.DOCKER_MANIFEST + "; charset=utf-8"),
                      oci.Manifest)
    assert isinstance(oci.parse_document(raw), oci.Manifest)
    idx = json.loads(index([("linux", "amd64", None)]))
    del idx["mediaType"]
    assert isinstance(oci.parse_document(json.dumps(idx).encode()), oci.Index)


def test_index_and_manifest_list_pick_linux_amd64() -> None:
    for mt in (oci.OCI_INDEX, oci.DOCKER_LIST):
        doc = oci.parse_document(index([("linux", "arm64", "v8"), ("windows", "amd64", None),
                                        ("linux", "amd64", "v3"), ("linux", "amd64", None),
                                        ("linux", "s390x", None)], mt))
        assert isinstance(doc, oci.Index)
        chosen = oci.select_platform(doc)
        assert chosen.platform == oci.Platform("linux", "amd64", None)
        assert chosen.digest == "sha256:" + "3" * 64


def test_index_without_amd64_names_what_it_has() -> None:
    doc = oci.parse_document(index([("linux", "arm64", None), ("linux", "riscv64", None)]))
    assert isinstance(doc, oci.Index)
    with pytest.raises(RegistryError, match="linux/arm64, linux/riscv64"):
        oci.select_platform(doc)


@pytest.mark.parametrize("body,match", [
    (b'{"schemaVersion":1,"name":"x"}', "schema 1"),
    (manifest(cmt="application/vnd.cncf.helm.config.v1+json"), "not a container image"),
    (manifest(lmt="application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"), "foreign"),
    (manifest(lmt="text/plain"), "unknown media type"),
    (manifest(mt="application/json"), "not an image manifest"),
    (manifest().replace(b'"schemaVersion": 2', b'"schemaVersion": true'), "schemaVersion"),
    (manifest().replace(D2.encode(), b"sha512:" + b"a" * 128), "sha256"),
    (manifest().replace(D2.encode(), b"sha256:" + b"A" * 64), "sha256"),
    (manifest().replace(b'"size": 20', b'"size": -1'), "out of range"),
    (manifest().replace(b'"size": 20', b'"size": 2.0'), "integer"),
    (manifest().replace(b'"size": 20', b'"size": true'), "integer"),
    (b'{"schemaVersion":2,"schemaVersion":2}', "duplicate"),
    (b'{"a":NaN}', "not allowed"),
    (b"[" * 100000 + b"]" * 100000, "nests deeper"),
    (b"\xff\xfe", "not valid JSON"),
    (b"[]", "not a JSON object"),
    (b" " * (oci.MAX_MANIFEST + 1), "more than"),
])
def test_refused_documents(body: bytes, match: str) -> None:
    with pytest.raises(RegistryError, match=match):
        oci.parse_document(body)


def test_counts_are_bounded() -> None:
    body = json.loads(manifest())
    body["layers"] = body["layers"] * (oci.MAX_LAYERS + 1)
    with pytest.raises(RegistryError, match="layers"):
        oci.parse_document(json.dumps(body).encode())
    with pytest.raises(RegistryError, match="more than"):
        oci.parse_document(index([("linux", "amd64", None)] * (oci.MAX_INDEX_ENTRIES + 1)))


def config(**c: Any) -> bytes:
    return json.dumps({"architecture": "amd64", "os": "linux", "config": c,
                       "rootfs": {"type": "layers", "diff_ids": [D2, D3]}}).encode()


def test_config_fields() -> None:
    cfg = oci.parse_config(config(Env=["A=1"], Cmd=["python3"], Entrypoint=["/e"],
                                  WorkingDir="/app", User="1000:1000"))
    assert cfg.env == ("A=1",) and cfg.cmd == ("python3",) and cfg.entrypoint == ("/e",)
    assert (cfg.working_dir, cfg.user, cfg.diff_ids) == ("/app", "1000:1000", (D2, D3))
    assert cfg.to_json()["Cmd"] == ["python3"]
    bare = oci.parse_config(b'{"architecture":"amd64","os":"linux",'
                            b'"rootfs":{"type":"layers","diff_ids":[]}}')
    assert bare.cmd is None and bare.env == ()


def test_config_must_match_manifest_and_platform() -> None:
    m = oci.parse_document(manifest())
    assert isinstance(m, oci.Manifest)
    with pytest.raises(RegistryError, match="1 layers but the config has 2"):
        oci.check_manifest_against_config(m, oci.parse_config(config()))
    arm = json.loads(config())
    arm["architecture"] = "arm64"
    arm["rootfs"]["diff_ids"] = [D2]
    with pytest.raises(RegistryError, match="linux/arm64"):
        oci.check_manifest_against_config(m, oci.parse_config(json.dumps(arm).encode()))


@pytest.mark.parametrize("c", [{"Env": "A=1"}, {"Cmd": [1]}, {"WorkingDir": 5}])
def test_bad_config_values(c: dict[str, Any]) -> None:
    with pytest.raises(RegistryError):
        oci.parse_config(config(**c))


def test_synthesized_image_is_a_valid_manifest_and_deterministic() -> None:
    cfg, man = oci.synthesize(D2, 99, oci.ImageConfig(env=("A=1",), cmd=("/bin/sh",)),
                              created="1970-01-01T00:00:00Z")
    doc = oci.parse_document(man)
    assert isinstance(doc, oci.Manifest)
    assert doc.config.digest == oci.sha256_digest(cfg)
    assert doc.layers[0].digest == D2 and doc.layers[0].size == 99
    assert oci.parse_config(cfg).diff_ids == (D2,)
    again = oci.synthesize(D2, 99, oci.ImageConfig(env=("A=1",), cmd=("/bin/sh",)),
                           created="1970-01-01T00:00:00Z")
    assert again == (cfg, man)


@pytest.mark.parametrize("where", ["index-os", "index-arch", "index-variant", "config-os",
                                   "config-arch"])
@pytest.mark.parametrize("value", ["\x1b]0;owned\x07\x1b[2J", "linux\x9b31m", "amd\u202e46",
                                   "a b", "x" * 65])
def test_platform_words_that_tkbox_would_print_are_parsed_strictly(where: str,
                                                                   value: str) -> None:
    """An index's platforms and a config's os/arch reach one-line errors ("the image has
    no linux/amd64 variant (it has: …)"): they printed the registry's terminal escapes
    raw. They are Go's GOOS/GOARCH words; anything else is malformed, shown escaped."""
    if where.startswith("index"):
        os_, arch, variant = "linux", "arm64", None
        if where == "index-os":
            os_ = value
        elif where == "index-arch":
            arch = value
        else:
            variant = value
        with pytest.raises(RegistryError, match="is malformed") as e:
            oci.parse_document(index([(os_, arch, variant)]))
    else:
        c = json.loads(config())
        c["os" if where == "config-os" else "architecture"] = value
        with pytest.raises(RegistryError, match="is malformed") as e:
            oci.parse_config(json.dumps(c).encode())
    assert str(e.value).isprintable()


def test_usual_platform_words_are_accepted() -> None:
    doc = oci.parse_document(index([("linux", "arm64", "v8"), ("unknown", "unknown", None),
                                    ("linux", "ppc64le", None), ("linux", "amd64", "v1")]))
    assert isinstance(doc, oci.Index)
    assert oci.select_platform(doc).platform == oci.Platform("linux", "amd64", "v1")
    body = json.loads(index([("linux", "amd64", None)]))
    body["manifests"][0]["platform"]["variant"] = ""
    doc = oci.parse_document(json.dumps(body).encode())
    assert isinstance(doc, oci.Index) and doc.manifests[0].platform == oci.Platform(
        "linux", "amd64", None)


def test_the_layers_declared_sizes_together_are_bounded_before_any_fetch() -> None:
    """Each layer may claim up to 64 GiB; 500 of them claimed 31 TiB, every byte fetched and
    kept in the store (the registry chooses the digests, so they verify)."""
    body = json.loads(manifest())
    one = body["layers"][0]
    body["layers"] = [{**one, "digest": "sha256:" + f"{i:064x}", "size": oci.MAX_BLOB}
                      for i in range(2)]
    with pytest.raises(RegistryError, match="layers add up to .* more than the 64 GiB"):
        oci.parse_document(json.dumps(body).encode())
    # the same layer twice is fetched once, and counted once
    body["layers"] = [{**one, "size": oci.MAX_BLOB}] * 2
    doc = oci.parse_document(json.dumps(body).encode())
    assert isinstance(doc, oci.Manifest) and len(doc.layers) == 2
