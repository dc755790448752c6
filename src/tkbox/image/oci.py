"""OCI / Docker v2 documents: digests, descriptors, manifests, indexes, image configs.

Pure: bytes in, typed objects out. Everything here comes from a registry, an
OCI layout or an archive someone handed us, so it is parsed as hostile:

- bounded sizes (`MAX_MANIFEST`, `MAX_CONFIG`) and counts, checked before parsing;
- strict JSON: UTF-8, no duplicate keys, no NaN/Infinity, bounded nesting;
- every digest is `sha256:` and 64 lowercase hex digits (the only algorithm
  tkbox verifies; anything else is refused rather than trusted unverified);
- only `RegistryError` escapes (never `ValueError`, `KeyError`, `RecursionError`).

Media types are those of image-spec `media-types.md` and of Docker's "Image
Manifest V2, Schema 2"; schema 1 and non-image artifacts are refused by name.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from tkbox.errors import RegistryError

# Documents
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_SCHEMA1 = (
    "application/vnd.docker.distribution.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v1+prettyjws",
)
MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEXES = (OCI_INDEX, DOCKER_LIST)
ACCEPT = ", ".join((OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST))

# Configs
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
CONFIGS = (OCI_CONFIG, DOCKER_CONFIG)

# Layers (compression is read from the blob's magic bytes, not trusted from here)
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
LAYERS = (
    OCI_LAYER,
    OCI_LAYER + "+gzip",
    OCI_LAYER + "+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
)
FOREIGN_LAYERS = (
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
)

MAX_MANIFEST = 4 * 1024 * 1024
MAX_CONFIG = 8 * 1024 * 1024
MAX_LAYERS = 500  # Docker refuses more than 127; leave room, but bound memory
MAX_INDEX_ENTRIES = 1000
MAX_NESTING = 64
MAX_BLOB = 64 * 1024**3  # one layer; also bounds what a descriptor may claim
# The layers' declared sizes together: the image's uncompressed bound (flatten), checked
# before a byte is fetched. Each layer alone within MAX_BLOB let 500 of them claim 31 TiB,
# all fetched, verified against digests the registry chose, and kept in the store.
MAX_IMAGE_LAYERS_SIZE = 64 * 1024**3

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_RESTRICTED_NAME = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"  # RFC 6838 §4.2
_MEDIA_TYPE = re.compile(_RESTRICTED_NAME + "/" + _RESTRICTED_NAME)
# os, architecture and variant: Go's GOOS/GOARCH words ("linux", "amd64", "v8"), which
# tkbox names in its messages; anything else (an escape sequence for the terminal) is
# malformed.
_PLATFORM_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")

PLATFORM_OS = "linux"
PLATFORM_ARCH = "amd64"


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_digest(value: object, what: str = "digest") -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        shown = repr(value)[:80]
        raise RegistryError(f"{what} {shown} is not a sha256 digest (only sha256 is accepted)")
    return value


def hex_of(digest: str) -> str:
    return check_digest(digest)[len("sha256:"):]


# --- strict JSON ----------------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise RegistryError(f"duplicate JSON key {k[:40]!r}")
        out[k] = v
    return out


def _reject_constant(name: str) -> None:
    raise RegistryError(f"JSON constant {name} is not allowed")


def _depth_ok(data: bytes, limit: int) -> bool:
    """True if brackets never nest deeper than `limit` (strings skipped); linear time."""
    depth = 0
    in_str = False
    esc = False
    for b in data:
        if in_str:
            if esc:
                esc = False
            elif b == 0x5C:
                esc = True
            elif b == 0x22:
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return False
        elif b in (0x5D, 0x7D):
            depth -= 1
    return True


def parse_json(data: bytes, what: str, limit: int) -> dict[str, Any]:
    if len(data) > limit:
        raise RegistryError(f"{what} is {len(data)} bytes, more than the {limit} allowed")
    if not _depth_ok(data, MAX_NESTING):
        raise RegistryError(f"{what} nests deeper than {MAX_NESTING} levels")
    try:
        text = data.decode("utf-8")
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except RegistryError as e:
        raise RegistryError(f"{what} is not valid: {e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise RegistryError(f"{what} is not valid JSON: {type(e).__name__}") from None
    if not isinstance(obj, dict):
        raise RegistryError(f"{what} is not a JSON object")
    return obj


def _str(obj: dict[str, Any], key: str, what: str, *, required: bool = True) -> str | None:
    v = obj.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, str):
        raise RegistryError(f"{what}: {key!r} must be a string")
    return v


def _platform_word(obj: dict[str, Any], key: str, what: str, *,
                   required: bool = True) -> str | None:
    v = _str(obj, key, what, required=required)
    if v == "" and not required:
        return None
    if v is not None and not _PLATFORM_WORD.fullmatch(v):
        raise RegistryError(f"{what}: {key} {v[:80]!r} is malformed")
    return v


def _int(v: object, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise RegistryError(f"{what} must be an integer")
    return v


# --- documents ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Platform:
    os: str
    architecture: str
    variant: str | None = None


@dataclass(frozen=True, slots=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    platform: Platform | None = None
    annotations: tuple[tuple[str, str], ...] = ()

    def annotation(self, key: str) -> str | None:
        return dict(self.annotations).get(key)


def parse_descriptor(v: object, what: str) -> Descriptor:
    if not isinstance(v, dict):
        raise RegistryError(f"{what} is not an object")
    mt = _str(v, "mediaType", what)
    assert mt is not None
    if not _MEDIA_TYPE.fullmatch(mt):
        raise RegistryError(f"{what}: media type {mt[:80]!r} is malformed")
    digest = check_digest(v.get("digest"), f"{what} digest")
    size = _int(v.get("size"), f"{what} size")
    if not 0 <= size <= MAX_BLOB:
        raise RegistryError(f"{what}: size {size} is out of range")
    platform = None
    if v.get("platform") is not None:
        p = v["platform"]
        if not isinstance(p, dict):
            raise RegistryError(f"{what}: platform is not an object")
        os_ = _platform_word(p, "os", what)
        arch = _platform_word(p, "architecture", what)
        variant = _platform_word(p, "variant", what, required=False)
        assert os_ is not None and arch is not None
        platform = Platform(os_, arch, variant)
    ann: tuple[tuple[str, str], ...] = ()
    if v.get("annotations") is not None:
        a = v["annotations"]
        if not isinstance(a, dict) or not all(isinstance(x, str) for x in a.values()):
            raise RegistryError(f"{what}: annotations must map strings to strings")
        ann = tuple(sorted(a.items()))
    return Descriptor(mt, digest, size, platform, ann)


@dataclass(frozen=True, slots=True)
class Manifest:
    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]


@dataclass(frozen=True, slots=True)
class Index:
    media_type: str
    manifests: tuple[Descriptor, ...]


def _document_type(obj: dict[str, Any], content_type: str | None, what: str) -> str:
    # A document with both shapes is read as one or the other depending on a header that
    # is not part of its digest (CVE-2021-41190): one digest, two images. The image spec
    # forbids it; so it is refused, and the shape alone then tells the two kinds apart.
    if "manifests" in obj and ("config" in obj or "layers" in obj):
        raise RegistryError(f"{what} has both 'manifests' and 'config' or 'layers', so it "
                            "could be read as an index or as a manifest; refused")
    mt = obj.get("mediaType")
    if mt is not None and not isinstance(mt, str):
        raise RegistryError(f"{what}: mediaType must be a string")
    if mt is None:
        ct = (content_type or "").split(";")[0].strip()
        mt = ct or None
        if mt is None:
            # OCI allows the field to be absent; tell the two kinds apart by shape.
            mt = OCI_INDEX if "manifests" in obj else OCI_MANIFEST
    version = obj.get("schemaVersion")
    if isinstance(version, bool) or not isinstance(version, int | None):
        raise RegistryError(f"{what}: schemaVersion must be an integer")
    if mt in DOCKER_SCHEMA1 or version == 1:
        raise RegistryError(
            f"{what} uses Docker's old schema 1, which tkbox does not read; "
            "ask for an image pushed with a current tool"
        )
    if mt not in MANIFESTS + INDEXES:
        raise RegistryError(f"{what} has media type {mt[:80]!r}, not an image manifest or index")
    if version != 2:
        raise RegistryError(f"{what}: schemaVersion must be 2")
    return mt


def parse_document(
    data: bytes, content_type: str | None = None, what: str = "manifest"
) -> Manifest | Index:
    """A manifest or an index, from its bytes (`content_type`: the HTTP header, if any)."""
    obj = parse_json(data, what, MAX_MANIFEST)
    mt = _document_type(obj, content_type, what)
    if mt in INDEXES:
        entries = obj.get("manifests")
        if not isinstance(entries, list):
            raise RegistryError(f"{what}: 'manifests' must be a list")
        if len(entries) > MAX_INDEX_ENTRIES:
            raise RegistryError(f"{what} lists more than {MAX_INDEX_ENTRIES} manifests")
        return Index(mt, tuple(parse_descriptor(d, f"{what} entry") for d in entries))
    config = parse_descriptor(obj.get("config"), f"{what} config")
    if config.media_type not in CONFIGS:
        raise RegistryError(
            f"{what}: config media type {config.media_type!r} is not a container image "
            "(an artifact, not something to boot)"
        )
    if config.size > MAX_CONFIG:
        raise RegistryError(f"{what}: the image config is {config.size} bytes, too large")
    layers = obj.get("layers")
    if not isinstance(layers, list):
        raise RegistryError(f"{what}: 'layers' must be a list")
    if len(layers) > MAX_LAYERS:
        raise RegistryError(f"{what} has more than {MAX_LAYERS} layers")
    descs = tuple(parse_descriptor(d, f"{what} layer") for d in layers)
    for d in descs:
        if d.media_type in FOREIGN_LAYERS:
            raise RegistryError(
                f"layer {d.digest} is a foreign (non-distributable) layer, which tkbox "
                "does not fetch"
            )
        if d.media_type not in LAYERS:
            raise RegistryError(f"layer {d.digest} has unknown media type {d.media_type!r}")
    sizes: dict[str, int] = {}
    for d in descs:
        sizes[d.digest] = max(d.size, sizes.get(d.digest, 0))
    total = sum(sizes.values())
    if total > MAX_IMAGE_LAYERS_SIZE:
        raise RegistryError(
            f"{what}: its layers add up to {total} bytes, more than the "
            f"{MAX_IMAGE_LAYERS_SIZE // 1024**3} GiB an image may have")
    return Manifest(mt, config, descs)


def select_platform(index: Index, os_: str = PLATFORM_OS, arch: str = PLATFORM_ARCH) -> Descriptor:
    """The entry for `os_/arch` (amd64: variant absent or v1 preferred, then any)."""
    candidates = [
        d for d in index.manifests
        if d.platform is not None and d.platform.os == os_ and d.platform.architecture == arch
        and d.media_type in MANIFESTS + INDEXES
    ]
    if not candidates:
        have = sorted({
            f"{d.platform.os}/{d.platform.architecture}" for d in index.manifests if d.platform
        })
        raise RegistryError(
            f"the image has no {os_}/{arch} variant (it has: {', '.join(have) or 'none'})"
        )
    candidates.sort(key=lambda d: (d.platform is None or d.platform.variant not in (None, "v1")))
    return candidates[0]


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """What the image says about how to run it (the `config` of the image config)."""

    env: tuple[str, ...] = ()
    cmd: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    working_dir: str = ""
    user: str = ""
    diff_ids: tuple[str, ...] = field(default=(), compare=False)
    os: str = PLATFORM_OS
    architecture: str = PLATFORM_ARCH

    def to_json(self) -> dict[str, Any]:
        return {
            "Env": list(self.env),
            "Cmd": None if self.cmd is None else list(self.cmd),
            "Entrypoint": None if self.entrypoint is None else list(self.entrypoint),
            "WorkingDir": self.working_dir,
            "User": self.user,
        }


def _strings(v: object, what: str) -> tuple[str, ...] | None:
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise RegistryError(f"image config: {what} must be a list of strings")
    return tuple(v)


def parse_config(data: bytes) -> ImageConfig:
    obj = parse_json(data, "image config", MAX_CONFIG)
    os_ = _platform_word(obj, "os", "image config")
    arch = _platform_word(obj, "architecture", "image config")
    assert os_ is not None and arch is not None
    rootfs = obj.get("rootfs")
    if not isinstance(rootfs, dict) or rootfs.get("type") != "layers":
        raise RegistryError("image config: rootfs must be of type 'layers'")
    diff_ids = _strings(rootfs.get("diff_ids"), "rootfs.diff_ids") or ()
    for d in diff_ids:
        check_digest(d, "image config diff_id")
    c = obj.get("config")
    if c is None:
        c = {}
    if not isinstance(c, dict):
        raise RegistryError("image config: 'config' must be an object")
    wd = c.get("WorkingDir") or ""
    user = c.get("User") or ""
    if not isinstance(wd, str) or not isinstance(user, str):
        raise RegistryError("image config: WorkingDir and User must be strings")
    return ImageConfig(
        env=_strings(c.get("Env"), "Env") or (),
        cmd=_strings(c.get("Cmd"), "Cmd"),
        entrypoint=_strings(c.get("Entrypoint"), "Entrypoint"),
        working_dir=wd,
        user=user,
        diff_ids=diff_ids,
        os=os_,
        architecture=arch,
    )


def check_manifest_against_config(manifest: Manifest, config: ImageConfig) -> None:
    if config.os != PLATFORM_OS or config.architecture != PLATFORM_ARCH:
        raise RegistryError(
            f"the image is for {config.os}/{config.architecture}, not "
            f"{PLATFORM_OS}/{PLATFORM_ARCH}"
        )
    if len(config.diff_ids) != len(manifest.layers):
        raise RegistryError(
            f"the manifest lists {len(manifest.layers)} layers but the config has "
            f"{len(config.diff_ids)} diff_ids"
        )


# --- documents tkbox writes for images it imports or builds ----------------------------


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def synthesize(layer_digest: str, layer_size: int, config: ImageConfig,
               created: str) -> tuple[bytes, bytes]:
    """(config bytes, manifest bytes) of a one-layer OCI image with an uncompressed layer."""
    cfg = {
        "architecture": PLATFORM_ARCH,
        "os": PLATFORM_OS,
        "created": created,
        "config": {k: v for k, v in config.to_json().items() if v not in (None, "", [])},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    cfg_bytes = canonical(cfg)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha256_digest(cfg_bytes),
                   "size": len(cfg_bytes)},
        "layers": [{"mediaType": OCI_LAYER, "digest": layer_digest, "size": layer_size}],
    }
    return cfg_bytes, canonical(manifest)
