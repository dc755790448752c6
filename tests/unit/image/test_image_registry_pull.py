"""`RegistryPull`: a registry's endpoints asked in order, against in-memory registries (one
httpx transport answering for several hosts): no network, no clock.

What falls through to the next endpoint (it could not answer) and what ends the pull (it
answered wrongly), who is asked for a tag and who for a digest, and what is kept of who
answered."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tkbox.errors import RegistryError, UserError
from tkbox.image import oci
from tkbox.image.mirrors import Registries, Settings, parse_hosts_toml
from tkbox.image.progress import NullProgress
from tkbox.image.registry import NotFound, RegistryPull, Unavailable
from tkbox.image.store import ImageStore

REPO = "library/app"
LAYER = b"layer " * 100
CONFIG = json.dumps({"architecture": "amd64", "os": "linux",
                     "rootfs": {"type": "layers", "diff_ids": []}}).encode()


def manifest(layer: bytes = LAYER) -> bytes:
    return json.dumps({
        "schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
        "config": {"mediaType": oci.OCI_CONFIG, "digest": oci.sha256_digest(CONFIG),
                   "size": len(CONFIG)},
        "layers": [{"mediaType": oci.OCI_LAYER, "digest": oci.sha256_digest(layer),
                    "size": len(layer)}]}).encode()


MANIFEST = manifest()
DIGEST = oci.sha256_digest(MANIFEST)
INDEX = json.dumps({"schemaVersion": 2, "mediaType": oci.OCI_INDEX, "manifests": [
    {"mediaType": oci.OCI_MANIFEST, "digest": DIGEST, "size": len(MANIFEST),
     "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
INDEX_DIGEST = oci.sha256_digest(INDEX)


class Host:
    """One registry or mirror: what it holds, how it misbehaves, what it was asked."""

    def __init__(self, **behaviour: Any) -> None:
        self.manifests: dict[str, bytes] = {"v1": MANIFEST, DIGEST: MANIFEST,
                                            "multi": INDEX, INDEX_DIGEST: INDEX}
        self.blobs = {oci.sha256_digest(LAYER): LAYER, oci.sha256_digest(CONFIG): CONFIG}
        self.status: int | None = behaviour.get("status")  # answer this to everything
        self.down = behaviour.get("down", False)
        self.lie: dict[str, bytes] = behaviour.get("lie", {})  # path end -> body instead
        self.asked: list[httpx.URL] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(request.url)
        if self.down:
            raise httpx.ConnectError("connection refused")
        if self.status is not None:
            return httpx.Response(self.status)
        path = request.url.path
        for end, body in self.lie.items():
            if path.endswith(end):
                return httpx.Response(200, content=body,
                                      headers={"content-type": oci.OCI_MANIFEST})
        kind, _, ref = path.rpartition("/")
        if kind.endswith("/manifests") and ref in self.manifests:
            body = self.manifests[ref]
            ct = json.loads(body)["mediaType"]
            return httpx.Response(200, content=body, headers={
                "content-type": ct, "docker-content-digest": oci.sha256_digest(body)})
        if kind.endswith("/blobs") and ref in self.blobs:
            return httpx.Response(200, content=self.blobs[ref])
        return httpx.Response(404)


class Hosts(httpx.AsyncBaseTransport):
    def __init__(self, hosts: dict[str, Host]) -> None:
        self.hosts = hosts

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return self.hosts[request.url.netloc.decode()].answer(request)


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    s = ImageStore(tmp_path / "images")
    yield s
    s.close()


def pull(table: Registries, registry: str, hosts: dict[str, Host],
         fn: Callable[[RegistryPull], Any]) -> Any:
    async def no_wait(_: float) -> None:
        return None

    async def main() -> Any:
        async with RegistryPull(registry, REPO, table.endpoints(registry),
                                transport=Hosts(hosts), sleep=no_wait) as p:
            return await fn(p), p

    return asyncio.run(main())


def flags(*mirrors: str, only: bool = False) -> Registries:
    return Registries.parse(Settings(tuple(mirrors), only))


def test_the_mirror_answers_and_is_recorded(store: ImageStore) -> None:
    mirror, hub = Host(), Host()
    (d, index, _), p = pull(flags("docker.io=https://m.test"), "docker.io",
                            {"m.test": mirror, "registry-1.docker.io": hub},
                            lambda p: p.resolve_manifest("multi", store))
    assert (d, index) == (DIGEST, INDEX_DIGEST)
    assert p.provenance() == {"registry": "docker.io", "endpoint": "https://m.test/v2",
                              "mirror": True, "answered": INDEX_DIGEST}
    assert hub.asked == []
    assert [str(u) for u in mirror.asked] == [
        f"https://m.test/v2/{REPO}/manifests/multi?ns=docker.io",
        f"https://m.test/v2/{REPO}/manifests/{DIGEST}?ns=docker.io"]


def test_the_registry_itself_is_asked_without_ns(store: ImageStore) -> None:
    hub = Host()
    _, p = pull(flags(), "docker.io", {"registry-1.docker.io": hub},
                lambda p: p.resolve_manifest("v1", store))
    assert [str(u) for u in hub.asked] == [
        f"https://registry-1.docker.io/v2/{REPO}/manifests/v1"]
    assert p.provenance()["mirror"] is False


@pytest.mark.parametrize("broken", [dict(down=True), dict(status=503), dict(status=401),
                                    dict(status=403), dict(status=404), dict(status=418)])
def test_an_endpoint_that_cannot_answer_passes_the_request_on(store: ImageStore,
                                                               broken: dict[str, Any]) -> None:
    first, second = Host(**broken), Host()
    (d, _, _), p = pull(flags("docker.io=https://a.test", "docker.io=https://b.test",
                              only=True), "docker.io", {"a.test": first, "b.test": second},
                        lambda p: p.resolve_manifest("v1", store))
    assert d == DIGEST and p.provenance()["endpoint"] == "https://b.test/v2"
    assert first.asked  # asked first


def test_an_endpoint_found_unreachable_is_not_asked_again_in_the_pull(
        store: ImageStore) -> None:
    first, second = Host(down=True), Host()
    table = flags("docker.io=https://a.test", "docker.io=https://b.test", only=True)

    async def whole(p: RegistryPull) -> None:
        _, _, m = await p.resolve_manifest("v1", store)
        for desc in (m.config, *m.layers):
            await p.fetch_blob(desc, store, NullProgress())

    pull(table, "docker.io", {"a.test": first, "b.test": second}, whole)
    assert len(first.asked) == 2  # FALLBACK_ATTEMPTS for the manifest, then never again
    assert store.has_blob(oci.sha256_digest(LAYER))


@pytest.mark.parametrize("lie, why", [
    ({f"/manifests/{DIGEST}": manifest(b"other")}, "not the .* asked for"),
    ({"/manifests/v1": manifest(b"other")}, None),  # a tag: any digest may be its answer
])
def test_a_mirror_that_answers_wrongly_ends_the_pull(store: ImageStore, lie: dict[str, bytes],
                                                      why: str | None) -> None:
    liar, hub = Host(lie=lie), Host()
    table = flags("docker.io=https://liar.test")
    hosts = {"liar.test": liar, "registry-1.docker.io": hub}
    if why is None:  # it answered a tag with another image: taken, and recorded as its word
        (d, _, _), p = pull(table, "docker.io", hosts, lambda p: p.resolve_manifest("v1", store))
        assert p.provenance() == {"registry": "docker.io", "endpoint": "https://liar.test/v2",
                                  "mirror": True, "answered": d}
        assert d != DIGEST
        return
    with pytest.raises(RegistryError, match=why) as e:
        pull(table, "docker.io", hosts, lambda p: p.resolve_manifest(DIGEST, store))
    assert "liar.test/v2" in str(e.value) and "--registry-mirror docker.io=…" in str(e.value)
    assert hub.asked == []  # not passed on: a lying mirror is the operator's to fix
    assert not store.has_blob(DIGEST)


def test_a_wrong_child_of_an_index_leaves_neither_document(store: ImageStore) -> None:
    liar = Host(lie={f"/manifests/{DIGEST}": manifest(b"other")})
    with pytest.raises(RegistryError, match="not trusted for content"):
        pull(flags("docker.io=https://liar.test", only=True), "docker.io",
             {"liar.test": liar}, lambda p: p.resolve_manifest("multi", store))
    assert not store.has_blob(INDEX_DIGEST) and not store.has_blob(DIGEST)


def test_everything_down_is_one_line_naming_every_endpoint(store: ImageStore) -> None:
    with pytest.raises(Unavailable) as e:
        pull(flags("docker.io=https://a.test"), "docker.io",
             {"a.test": Host(down=True), "registry-1.docker.io": Host(status=503)},
             lambda p: p.resolve_manifest("v1", store))
    msg = str(e.value)
    assert "\n" not in msg
    assert "the mirror https://a.test/v2 could not be reached after 2 attempts" in msg
    assert "registry-1.docker.io kept answering 503 after 5 attempts" in msg


def test_not_found_everywhere_is_a_user_error(store: ImageStore) -> None:
    with pytest.raises(NotFound, match="not found on any of 2 endpoints"):
        pull(flags("docker.io=https://a.test"), "docker.io",
             {"a.test": Host(), "registry-1.docker.io": Host()},
             lambda p: p.resolve_manifest("nope", store))


def test_a_tag_skips_pull_only_mirrors_and_a_digest_uses_them(store: ImageStore) -> None:
    table = Registries.parse(Settings(), {"docker.io": parse_hosts_toml(
        '[host."https://cache.test"]\ncapabilities = ["pull"]\n'
        '[host."https://resolver.test"]\ncapabilities = ["pull", "resolve"]\n',
        base=Path("/x"), where="hosts.toml")})
    cache, resolver, hub = Host(), Host(), Host()
    (_, _, m), p = pull(table, "docker.io", {"cache.test": cache, "resolver.test": resolver,
                                             "registry-1.docker.io": hub},
                        lambda p: p.resolve_manifest("v1", store))
    assert [u.path for u in cache.asked] == []  # a tag is not asked of a pull-only mirror
    assert p.provenance()["endpoint"] == "https://resolver.test/v2"

    async def blob(p: RegistryPull) -> Path:
        return await p.fetch_blob(m.layers[0], store, NullProgress())

    pull(table, "docker.io", {"cache.test": cache, "resolver.test": resolver,
                              "registry-1.docker.io": hub}, blob)
    assert [u.path for u in cache.asked] == [f"/v2/{REPO}/blobs/{m.layers[0].digest}"]


def test_no_endpoint_with_the_capability_is_a_user_error(store: ImageStore) -> None:
    table = Registries.parse(Settings(mirror_only=True), {"docker.io": parse_hosts_toml(
        'server = "https://cache.test"\ncapabilities = ["pull"]\n', base=Path("/x"),
        where="hosts.toml")})
    with pytest.raises(UserError, match="none has the pull and resolve capabilities in "
                                        "hosts.toml"):
        pull(table, "docker.io", {"cache.test": Host()},
             lambda p: p.resolve_manifest("v1", store))
