"""Fuzz the image parsers: garbage raises only our error type, never anything else.

Promise: `parse_reference` and the mirror settings' parsers (`parse_hosts_toml`,
`parse_daemon_json`, `parse_mirror_flag`) raise only `UserError`; `parse_document`,
`parse_config`, `parse_challenges`, `parse_token_response` and the layer
planner raise only `RegistryError`, whatever the bytes.
"""

from __future__ import annotations

import io
import json
import tarfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.errors import RegistryError, UserError
from tkbox.image import oci
from tkbox.image.auth import parse_challenges, parse_token_response
from tkbox.image.flatten import Layer, plan_layers
from tkbox.image.reference import parse_reference

FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

ref_alphabet = st.sampled_from(list("abcAZ09:/@._-[]sha256 \t\n") + ["sha256:" + "a" * 64])


@FAST
@given(st.one_of(st.text(max_size=300), st.lists(ref_alphabet, max_size=40).map("".join)))
def test_reference_parser_raises_only_user_errors(s: str) -> None:
    try:
        parse_reference(s)
    except UserError:
        pass


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                      st.text(max_size=20),
                      st.sampled_from([oci.OCI_MANIFEST, oci.OCI_INDEX, oci.DOCKER_LIST,
                                       oci.OCI_LAYER, oci.OCI_CONFIG, "sha256:" + "0" * 64, 2]))
json_values = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["schemaVersion", "mediaType", "config", "layers",
                                         "manifests", "digest", "size", "platform", "os",
                                         "architecture", "annotations", "rootfs", "diff_ids",
                                         "type", "Env", "Cmd"]), inner, max_size=6)),
    max_leaves=30)


@FAST
@given(st.one_of(st.binary(max_size=400), json_values.map(lambda v: json.dumps(v).encode())),
       st.one_of(st.none(), st.text(max_size=40)))
def test_manifest_parser_raises_only_registry_errors(data: bytes, ctype: str | None) -> None:
    try:
        doc = oci.parse_document(data, ctype)
        if isinstance(doc, oci.Index):
            oci.select_platform(doc)
    except RegistryError:
        pass
    try:
        oci.parse_config(data)
    except RegistryError:
        pass


@FAST
@given(st.text(max_size=200))
def test_challenge_parser_raises_only_registry_errors(s: str) -> None:
    try:
        parse_challenges(s)
    except RegistryError:
        pass
    try:
        parse_token_response(s.encode("utf-8", "surrogatepass"))
    except RegistryError:
        pass


def _tar(entries: list[tuple[str, bytes, str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, link in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = link
            tf.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


names = st.lists(st.sampled_from(["a", "b", "..", ".", "", ".wh.a", ".wh..wh..opq", "/",
                                  "c", ".wh..wh.plnk"]), min_size=1, max_size=4).map("/".join)
kinds = st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
                         tarfile.CHRTYPE, tarfile.FIFOTYPE, b"V", b"S"])


@FAST
@given(st.lists(st.lists(st.tuples(names, kinds, names), max_size=8), min_size=1, max_size=3))
def test_layer_planner_raises_only_registry_errors(layers: list[list[tuple[str, bytes, str]]]
                                                   ) -> None:
    blobs = [_tar(entries) for entries in layers]
    try:
        plan_layers([Layer(f"sha256:{i:064x}", lambda b=b: io.BytesIO(b))
                     for i, b in enumerate(blobs)])
    except RegistryError:
        pass


@FAST
@given(st.binary(max_size=3000))
def test_layer_bytes_raise_only_registry_errors(data: bytes) -> None:
    try:
        plan_layers([Layer("sha256:" + "0" * 64, lambda: io.BytesIO(data))])
    except RegistryError:
        pass


# --- the mirror settings (an operator's files: UserError, one line, whatever the bytes) ----

toml_chars = st.sampled_from(list('[]."=,{}#\n \\') + ["host", "server", "https://m",
                                                          "capabilities", "ca", "skip_verify",
                                                          "override_path", "true", '"pull"',
                                                          '"resolve"', "'", '"""'])


@FAST
@given(st.one_of(st.text(max_size=300), st.lists(toml_chars, max_size=60).map("".join)))
def test_hosts_toml_parser_raises_only_user_errors(text: str) -> None:
    from pathlib import Path

    from tkbox.image.mirrors import parse_hosts_toml

    try:
        parse_hosts_toml(text, base=Path("/d"), where="hosts.toml")
    except UserError as e:
        assert "\n" not in str(e)


@FAST
@given(st.binary(max_size=300), st.text(max_size=200))
def test_daemon_json_and_mirror_flags_raise_only_user_errors(data: bytes, flag: str) -> None:
    from tkbox.image.mirrors import parse_daemon_json, parse_mirror_flag

    for fn in (lambda: parse_daemon_json(data, where="daemon.json"),
               lambda: parse_mirror_flag(flag)):
        try:
            fn()
        except UserError as e:
            assert "\n" not in str(e)
