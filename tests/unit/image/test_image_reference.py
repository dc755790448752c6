"""Image references: Docker's grammar, local names, OCI layouts; malformed input is a UserError."""

from __future__ import annotations

from pathlib import Path

import pytest

from tkbox.errors import UserError
from tkbox.image.reference import (
    DOCKER_HUB_API,
    DigestRef,
    LayoutRef,
    RegistryRef,
    parse_local_tag,
    parse_reference,
)

D = "sha256:" + "ab" * 32


def reg(s: str) -> RegistryRef:
    r = parse_reference(s)
    assert isinstance(r, RegistryRef)
    return r


def test_docker_hub_short_name_gets_library_and_the_api_host() -> None:
    r = reg("python:3.12-slim")
    assert (r.registry, r.repository, r.tag, r.digest) == ("docker.io", "library/python",
                                                          "3.12-slim", None)
    assert r.api_host == DOCKER_HUB_API
    assert r.api_host != "docker.io"
    assert str(r) == "docker.io/library/python:3.12-slim"
    assert r.local_key == "python:3.12-slim"
    assert not r.explicit_registry


def test_docker_hub_two_components_and_default_tag() -> None:
    r = reg("library/python")
    assert (r.repository, r.tag) == ("library/python", "latest")
    r = reg("tkbox/default")
    assert (r.repository, r.tag, r.local_key) == ("tkbox/default", "latest",
                                                  "tkbox/default:latest")


@pytest.mark.parametrize("alias", ["docker.io", "index.docker.io", "registry-1.docker.io"])
def test_docker_hub_aliases_normalize(alias: str) -> None:
    r = reg(f"{alias}/library/debian:12")
    assert r.registry == "docker.io" and r.repository == "library/debian"
    assert r.local_key is None  # a registry was written: never a local name


def test_full_name_with_host_port_and_digest() -> None:
    r = reg(f"localhost:5000/org/tool@{D}")
    assert (r.registry, r.repository, r.tag, r.digest) == ("localhost:5000", "org/tool",
                                                          None, D)
    assert r.reference == D and r.api_host == "localhost:5000"
    r = reg(f"ghcr.io/org/tool:v1@{D}")
    assert r.tag == "v1" and r.reference == D  # the digest wins
    r = reg("[::1]:5000/a/b:c")
    assert r.registry == "[::1]:5000" and r.repository == "a/b"


def test_first_component_is_a_host_only_when_it_looks_like_one() -> None:
    assert reg("localhost/x").registry == "localhost"
    assert reg("my.reg/x").registry == "my.reg"
    assert reg("myorg/x").registry == "docker.io"
    # "localhost:5000" alone is Docker Hub's "library/localhost" at tag 5000, as Docker reads it
    r = reg("localhost:5000")
    assert (r.repository, r.tag) == ("library/localhost", "5000")


def test_oci_layouts_split_at_the_first_colon() -> None:
    assert parse_reference("oci:/tmp/lay:v2") == LayoutRef(Path("/tmp/lay"), "v2", False)
    assert parse_reference("oci:rel/dir") == LayoutRef(Path("rel/dir"), None, False)
    assert parse_reference("oci-archive:/a.tar:t") == LayoutRef(Path("/a.tar"), "t", True)
    assert parse_reference(D) == DigestRef(D)


@pytest.mark.parametrize("bad", [
    "", " ", "Python", "python:", "python:-x", "a//b", "a/", "/a", "python@sha256:abc",
    f"python@sha512:{'a' * 128}", f"python@{D.upper()}", "a:b:c", "x" * 2000, "oci:",
    "oci:dir:bad tag", "host:99999/a", "host:0/a", "host:05/a", "ex_ample.com/a",
    "[zz]:1/a", "a\nb", "a..b", "a__-b", "é",
])
def test_malformed_references_are_user_errors(bad: str) -> None:
    with pytest.raises(UserError):
        parse_reference(bad)


def test_name_length_is_bounded() -> None:
    with pytest.raises(UserError):
        parse_reference("a/" * 127 + "b")


def test_local_tags_refuse_registry_hosts_and_digests() -> None:
    assert parse_local_tag("tkbox/default") == "tkbox/default:latest"
    assert parse_local_tag("me/tool:v1") == "me/tool:v1"
    for bad in ("ghcr.io/me/tool", f"me/tool@{D}", "oci:/x", "localhost:5000/a"):
        with pytest.raises(UserError):
            parse_local_tag(bad)
