"""The registry client against an in-memory registry (an httpx transport): no network, no clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from tkbox.errors import RegistryError, UserError
from tkbox.image import oci
from tkbox.image.progress import NullProgress
from tkbox.image.registry import RegistryClient
from tkbox.image.store import ImageStore

HOST = "reg.test"
REPO = "org/app"
TOKEN = "s3cr3t-token-value"
BLOB = b"layer bytes " * 1000
BLOB_D = oci.sha256_digest(BLOB)


class Broken(httpx.AsyncByteStream):
    """A body that sends `n` bytes and then breaks, as a dropped connection does."""

    def __init__(self, data: bytes, n: int) -> None:
        self.data, self.n = data, n

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data[: self.n]
        raise httpx.ReadError("connection reset")


class Transport(httpx.AsyncBaseTransport):
    """Like httpx.MockTransport, but leaves bodies unread so they stream (and can break)."""

    def __init__(self, handler: Callable[[httpx.Request], httpx.Response]) -> None:
        self.handler = handler

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return self.handler(request)


class FakeRegistry:
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.need_token = False
        self.private = False
        self.fail: list[int] = []  # statuses to answer first, in order
        self.break_after: list[int] = []  # break blob bodies after n bytes, in order
        self.redirect_blobs = False
        self.blobs: dict[str, bytes] = {BLOB_D: BLOB}
        self.manifests: dict[str, tuple[bytes, str]] = {}

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        url = request.url
        if url.host == "auth.test":
            assert "authorization" not in request.headers
            return httpx.Response(200, json={"token": TOKEN})
        if url.host == "storage.test":
            return httpx.Response(200, content=self.blobs[url.path.rsplit("/", 1)[-1]])
        if self.need_token and request.headers.get("authorization") != f"Bearer {TOKEN}" \
                or self.private:
            return httpx.Response(401, headers={"www-authenticate":
                'Bearer realm="https://auth.test/token",service="reg.test"'})
        if self.fail:
            status = self.fail.pop(0)
            return httpx.Response(status, headers={"retry-after": "2"} if status == 429 else {})
        parts = url.path.split("/")
        if "/blobs/" in url.path:
            digest = parts[-1]
            if self.redirect_blobs:
                return httpx.Response(307, headers={"location": f"https://storage.test/b/{digest}"})
            data = self.blobs.get(digest)
            if data is None:
                return httpx.Response(404)
            if self.break_after:
                return httpx.Response(200, stream=Broken(data, self.break_after.pop(0)))
            return httpx.Response(200, content=data)
        if "/manifests/" in url.path:
            entry = self.manifests.get(parts[-1])
            if entry is None:
                return httpx.Response(404)
            body, ct = entry
            return httpx.Response(200, content=body, headers={"content-type": ct})
        return httpx.Response(404)


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    s = ImageStore(tmp_path / "images")
    yield s
    s.close()


def run(fake: FakeRegistry, fn: Callable[[RegistryClient], object]) -> tuple[object, list[float]]:
    delays: list[float] = []

    async def sleep(d: float) -> None:
        delays.append(d)

    async def main() -> object:
        async with RegistryClient(HOST, REPO, transport=Transport(fake.handler),
                                  sleep=sleep) as c:
            return await fn(c)  # type: ignore[misc]

    return asyncio.run(main()), delays


def desc(data: bytes = BLOB) -> oci.Descriptor:
    return oci.Descriptor(oci.OCI_LAYER, oci.sha256_digest(data), len(data))


def test_anonymous_token_challenge_then_blob(store: ImageStore) -> None:
    fake = FakeRegistry()
    fake.need_token = True
    path, _ = run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))
    assert Path(str(path)).read_bytes() == BLOB
    token_req = [r for r in fake.requests if r.url.host == "auth.test"]
    assert len(token_req) == 1
    assert token_req[0].url.params["scope"] == f"repository:{REPO}:pull"
    assert token_req[0].url.params["service"] == "reg.test"
    assert fake.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"


def test_credentials_are_not_carried_to_another_host_on_redirect(store: ImageStore) -> None:
    """A redirect to blob storage on another host must not receive the registry's token."""
    fake = FakeRegistry()
    fake.need_token = True
    fake.redirect_blobs = True
    run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))
    storage = [r for r in fake.requests if r.url.host == "storage.test"]
    assert len(storage) == 1
    assert "authorization" not in storage[0].headers
    assert store.has_blob(BLOB_D)


def test_redirect_to_plain_http_is_refused(store: ImageStore) -> None:
    fake = FakeRegistry()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(302, headers={"location": "http://storage.test/x"})

    fake.handler = handler  # type: ignore[method-assign]
    with pytest.raises(RegistryError, match="non-https"):
        run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))


def test_private_image_is_a_clear_message_and_never_shows_the_token(store: ImageStore) -> None:
    fake = FakeRegistry()
    fake.private = True
    with pytest.raises(RegistryError, match="private registries and images are not supported"
                       ) as e:
        run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))
    assert TOKEN not in str(e.value)
    assert not store.has_blob(BLOB_D)


def test_retries_with_backoff_on_429_and_5xx(store: ImageStore) -> None:
    fake = FakeRegistry()
    fake.fail = [503, 429, 502]
    _, delays = run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))
    assert store.has_blob(BLOB_D)
    assert len(delays) == 3
    assert delays[1] >= 2.0  # Retry-After honoured
    assert delays[2] > delays[0]  # growing


def test_retries_are_bounded(store: ImageStore) -> None:
    fake = FakeRegistry()
    fake.fail = [503] * 10
    with pytest.raises(RegistryError, match="kept answering 503"):
        run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))
    assert len(fake.requests) == 5


def test_broken_transfer_restarts_cleanly_and_verifies(store: ImageStore) -> None:
    fake = FakeRegistry()
    fake.break_after = [100, 5000]
    run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))
    assert store.blob_path(BLOB_D).read_bytes() == BLOB
    assert list((store.root / "tmp").rglob("blob.*")) == []


def test_transfer_that_keeps_breaking_leaves_nothing(store: ImageStore) -> None:
    fake = FakeRegistry()
    fake.break_after = [10] * 10
    with pytest.raises(RegistryError, match="broke off"):
        run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))
    assert not store.has_blob(BLOB_D)
    assert list((store.root / "tmp").rglob("blob.*")) == []


def test_tampered_blob_is_refused_and_not_cached(store: ImageStore) -> None:
    """Content that does not hash to its digest never enters the cache."""
    fake = FakeRegistry()
    fake.blobs[BLOB_D] = BLOB[:-1] + b"X"
    with pytest.raises(RegistryError, match="failed verification"):
        run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))
    assert not store.has_blob(BLOB_D)
    assert list((store.root / "tmp").rglob("blob.*")) == []


def test_blob_longer_than_its_descriptor_is_refused(store: ImageStore) -> None:
    fake = FakeRegistry()
    fake.blobs[BLOB_D] = BLOB + b"more"
    with pytest.raises(RegistryError, match="larger than"):
        run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))
    assert not store.has_blob(BLOB_D)


def manifest_bytes() -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
                       "config": {"mediaType": oci.OCI_CONFIG, "digest": BLOB_D, "size": 1},
                       "layers": []}).encode()


def test_index_resolves_to_amd64_and_both_documents_are_stored(store: ImageStore) -> None:
    fake = FakeRegistry()
    m = manifest_bytes()
    md = oci.sha256_digest(m)
    other = oci.sha256_digest(b"other")
    idx = json.dumps({"schemaVersion": 2, "mediaType": oci.OCI_INDEX, "manifests": [
        {"mediaType": oci.OCI_MANIFEST, "digest": other, "size": 5,
         "platform": {"os": "linux", "architecture": "arm64"}},
        {"mediaType": oci.OCI_MANIFEST, "digest": md, "size": len(m),
         "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
    fake.manifests = {"v1": (idx, oci.OCI_INDEX), md: (m, oci.OCI_MANIFEST)}
    (digest, index_digest, doc), _ = run(fake, lambda c: c.resolve_manifest("v1", store))  # type: ignore[misc]
    assert digest == md and index_digest == oci.sha256_digest(idx)
    assert store.has_blob(md) and store.has_blob(index_digest)
    accept = fake.requests[0].headers["accept"]
    for mt in (oci.OCI_INDEX, oci.DOCKER_LIST, oci.OCI_MANIFEST, oci.DOCKER_MANIFEST):
        assert mt in accept


def test_manifest_by_digest_must_hash_to_it(store: ImageStore) -> None:
    """A registry cannot answer a digest request with other content."""
    fake = FakeRegistry()
    wanted = "sha256:" + "7" * 64
    fake.manifests = {wanted: (manifest_bytes(), oci.OCI_MANIFEST)}
    with pytest.raises(RegistryError, match="not the"):
        run(fake, lambda c: c.resolve_manifest(wanted, store))
    assert not store.has_blob(oci.sha256_digest(manifest_bytes()))


def test_oversized_manifest_is_refused(store: ImageStore) -> None:
    fake = FakeRegistry()
    fake.manifests = {"big": (b" " * (oci.MAX_MANIFEST + 1), oci.OCI_MANIFEST)}
    with pytest.raises(RegistryError, match="more than"):
        run(fake, lambda c: c.resolve_manifest("big", store))


def test_unknown_image_is_a_user_error(store: ImageStore) -> None:
    with pytest.raises(UserError, match="not found"):
        run(FakeRegistry(), lambda c: c.resolve_manifest("nope", store))


def test_a_document_with_both_shapes_is_refused_before_it_is_stored(store: ImageStore) -> None:
    """Without a mediaType, a body with 'manifests' and 'config'/'layers' was a manifest when
    the Content-Type said so and an index when read back from the store by its digest: the
    pull ended in an InternalError (exit 70, "a bug in tkbox"). Refused as ambiguous."""
    body = json.dumps({
        "schemaVersion": 2,
        "config": {"mediaType": oci.OCI_CONFIG, "digest": BLOB_D, "size": len(BLOB)},
        "layers": [],
        "manifests": [{"mediaType": oci.OCI_MANIFEST, "digest": "sha256:" + "2" * 64,
                       "size": 3, "platform": {"os": "linux", "architecture": "amd64"}}],
    }).encode()
    for ctype in (oci.DOCKER_MANIFEST, oci.OCI_INDEX):
        fake = FakeRegistry()
        fake.manifests = {"v1": (body, ctype)}
        with pytest.raises(RegistryError, match="could be read as an index or as a manifest"):
            run(fake, lambda c: c.resolve_manifest("v1", store))
        assert not store.has_blob(oci.sha256_digest(body))


class HostileUrls(FakeRegistry):
    """A registry whose blob redirect, or token realm, is a URL httpx or urllib cannot use."""

    def __init__(self, where: str, url: str) -> None:
        super().__init__()
        self.where, self.url = where, url
        self.need_token = where == "location"  # the Authorization decision parses the URL

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == HOST and self.where == "realm":
            self.requests.append(request)
            return httpx.Response(401, headers={"www-authenticate": f'Bearer realm="{self.url}"'})
        if "/blobs/" in request.url.path and request.url.host == HOST and \
                request.headers.get("authorization"):
            self.requests.append(request)
            return httpx.Response(307, headers={"location": self.url})
        return super().handler(request)


@pytest.mark.parametrize("where", ["location", "realm"])
@pytest.mark.parametrize("url", ["https://xn--/x", "https://a:99999/x", "https://[::1/x",
                                 "https://a:b/x"])
def test_a_url_from_the_registry_that_cannot_be_parsed_is_a_registry_error(
        store: ImageStore, where: str, url: str) -> None:
    """A redirect to `https://xn--/x` raised idna's IDNAError out of httpx, a port out of
    range urllib's ValueError, a realm `https://a:b/` httpx's InvalidURL: `tkbox image
    pull` ended in a traceback. Each is one RegistryError, and nothing is fetched there."""
    fake = HostileUrls(where, url)
    with pytest.raises(RegistryError):
        run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))
    assert not store.has_blob(BLOB_D)


class Trickle(httpx.AsyncByteStream):
    """A body that sends `step` bytes at a time while the clock moves `gap` seconds each."""

    def __init__(self, data: bytes, step: int, gap: float, clock: list[float]) -> None:
        self.data, self.step, self.gap, self.clock = data, step, gap, clock
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self.data), self.step):
            self.clock[0] += self.gap
            self.sent += 1
            yield self.data[i:i + self.step]


def trickling(monkeypatch: pytest.MonkeyPatch, step: int, gap: float
              ) -> tuple[FakeRegistry, list[Trickle]]:
    from tkbox.image import registry

    clock = [0.0]
    monkeypatch.setattr(registry, "_now", lambda: clock[0], raising=False)
    bodies: list[Trickle] = []

    class Slow(FakeRegistry):
        def handler(self, request: httpx.Request) -> httpx.Response:
            r = super().handler(request)
            if r.status_code != 200:
                return r
            body = Trickle(r.content, step, gap, clock)
            bodies.append(body)
            return httpx.Response(200, headers=r.headers, stream=body)

    return Slow(), bodies


def test_a_manifest_that_trickles_is_refused_at_its_deadline(
        store: ImageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx bounds each read (60 s), not a body: a byte every 59 s kept a pull waiting
    for years on a 4 MiB manifest. A document must arrive whole within 120 s."""
    fake, bodies = trickling(monkeypatch, 1, 59.0)
    fake.manifests = {"v1": (manifest_bytes(), oci.OCI_MANIFEST)}
    with pytest.raises(RegistryError, match="took more than 120 s"):
        run(fake, lambda c: c.resolve_manifest("v1", store))
    assert [b.sent for b in bodies] == [3]


def test_a_blob_that_trickles_is_broken_off_and_retried_within_the_attempts(
        store: ImageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    fake, bodies = trickling(monkeypatch, 1, 59.0)
    with pytest.raises(RegistryError, match="broke off 5 times"):
        run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))
    assert [b.sent for b in bodies] == [2] * 5
    assert not store.has_blob(BLOB_D)


def test_a_slow_but_steady_blob_is_not_cut(store: ImageStore,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """1 MiB or more a minute, for as long as the blob takes, is fine."""
    big = b"x" * (3 * 1024 * 1024)
    fake, _ = trickling(monkeypatch, 1024 * 1024, 59.0)
    fake.blobs[oci.sha256_digest(big)] = big
    path, _ = run(fake, lambda c: c.fetch_blob(desc(big), store, NullProgress()))
    assert Path(str(path)).read_bytes() == big


class ExpiringTokens(FakeRegistry):
    """Each anonymous token is good for `uses` authorized requests, as a 300 s token is
    for a slow pull; a new token from the token service is good again."""

    def __init__(self, uses: int) -> None:
        super().__init__()
        self.need_token = True
        self.uses = uses
        self.issued = 0
        self.used: dict[str, int] = {}

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "auth.test":
            self.requests.append(request)
            self.issued += 1
            return httpx.Response(200, json={"token": f"tok-{self.issued}"})
        auth = request.headers.get("authorization", "")
        if request.url.host == "reg.test" and auth.startswith("Bearer tok-"):
            n = self.used.get(auth, 0)
            if n < self.uses:
                self.used[auth] = n + 1
                request.headers["authorization"] = f"Bearer {TOKEN}"  # good: as the base
        return super().handler(request)


def test_a_token_that_expires_mid_pull_is_fetched_again(store: ImageStore) -> None:
    """An anonymous token lasts minutes; a pull of many layers on a slow link outlived
    it, and the 401 was taken for a private image: the pull failed saying so."""
    blobs = [b"layer %d " % i * 200 for i in range(5)]
    fake = ExpiringTokens(uses=2)
    for b in blobs:
        fake.blobs[oci.sha256_digest(b)] = b

    async def pull(c: RegistryClient) -> None:
        for b in blobs:
            await c.fetch_blob(desc(b), store, NullProgress())

    run(fake, pull)
    assert fake.issued == 3  # two blobs a token
    assert all(store.has_blob(oci.sha256_digest(b)) for b in blobs)


def test_a_new_token_refused_at_once_is_still_a_private_image(store: ImageStore) -> None:
    fake = ExpiringTokens(uses=0)  # no token ever works
    with pytest.raises(RegistryError, match="needs credentials"):
        run(fake, lambda c: c.fetch_blob(desc(), store, NullProgress()))
    assert fake.issued == 1, "asked once: a token that never worked is not an expired one"
