"""The registry HTTP API v2 client (OCI distribution spec), on httpx.

What it does, and where:

- `_send`: one request with the anonymous Bearer-token challenge (`auth`),
  redirects followed by hand so that `Authorization` goes only to the
  registry's own origin (a redirect to blob storage on another host gets no
  credentials), https only, and bounded retries with backoff on 429, 5xx and
  transport errors (honouring `Retry-After`, capped).
- `resolve_manifest`: the manifest or index for a tag or digest (bounded at
  `oci.MAX_MANIFEST`), checked against the digest asked for and the
  `Docker-Content-Digest` header; an index resolved to linux/amd64. Both
  documents go into the store by their digests.
- `fetch_blob`: a blob streamed into a `sink.BlobSink` through its writer (bounded
  by its descriptor's size, hashed, verified, fsynced, renamed); a transfer
  broken halfway is restarted from byte 0, within the same retry budget.
- `RegistryPull`: one pull's endpoints in order (a registry's mirrors, then the
  registry: `mirrors.Registries`), a `RegistryClient` each. A request goes to the
  first endpoint that may answer it; one that cannot (`Unavailable`: unreachable, kept
  failing, wants credentials; `NotFound`) passes it to the next, and an unreachable one
  is not asked again in that pull. One that answers wrongly (another digest than the
  one asked, a manifest that does not hash to the `Docker-Content-Digest` it claims, a
  blob that fails verification, a certificate that does not verify) ends the pull, in
  one line naming the mirror and where it was configured: a mirror is not trusted for
  content. The endpoint that answered the reference, and the digest it answered, are
  what `provenance` reports (kept with the image's name, and in the run's open record).

Nothing unverified reaches the store, and no token reaches a log or an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

import httpx

from tkbox.errors import RegistryError, TkboxError, UserError
from tkbox.image import oci
from tkbox.image.auth import parse_challenges, parse_token_response, token_request
from tkbox.image.mirrors import Endpoint, candidates
from tkbox.image.progress import ProgressEvent, ProgressSink
from tkbox.image.sink import BlobSink

MAX_ATTEMPTS = 5
#: attempts at an endpoint that another follows: one retry, then the next is asked
FALLBACK_ATTEMPTS = 2
MAX_REDIRECTS = 5
MAX_RETRY_AFTER = 30.0
MAX_ERROR_BODY = 4096
MAX_TOKEN_REFRESHES = 100  # new anonymous tokens in one pull, each after one that worked
CONNECT_TIMEOUT = 15.0
READ_TIMEOUT = 60.0
# httpx's timeouts bound each read, not a transfer: a registry sending a byte every 59 s
# held a pull for ever. A document (manifest, index, token answer) must arrive whole
# within DOCUMENT_DEADLINE; a blob must bring MIN_PROGRESS bytes in every PROGRESS_WINDOW
# (about 17 KiB/s), or it counts as broken off (retried, within the attempts).
DOCUMENT_DEADLINE = 120.0
PROGRESS_WINDOW = 60.0
MIN_PROGRESS = 1024 * 1024

Sleep = Callable[[float], Awaitable[None]]
# What httpx raises, other than a TransportError, on an answer it cannot parse: its own
# InvalidURL, or idna's IDNAError (a UnicodeError) for a redirect to a host like `xn--`,
# which it reads even when it does not follow redirects.
_UNPARSABLE = (httpx.InvalidURL, UnicodeError)


class NotFound(UserError):
    """The endpoint has no such manifest or blob (404): the next endpoint is asked."""


class Unavailable(RegistryError):
    """The endpoint could not answer (unreachable, kept failing, wants credentials): the
    next endpoint is asked. An endpoint that answered wrongly raises another error."""


def ssl_context(ca_bundle: Path | None = None, extra: Sequence[str] = (),
                where: str = "") -> ssl.SSLContext:
    """Trust `ca_bundle`, else `SSL_CERT_FILE`, else the system's certificates; and the CA
    files in `extra` besides (an endpoint's `ca` in hosts.toml, named by `where`)."""
    cafile = ca_bundle or (Path(os.environ["SSL_CERT_FILE"]) if os.environ.get("SSL_CERT_FILE")
                           else None)
    try:
        ctx = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    except (OSError, ssl.SSLError) as e:
        raise UserError(f"cannot read the CA bundle {cafile}: {e}") from None
    for ca in extra:
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as e:
            raise UserError(f"{where}: cannot read the CA {ca[:200]!r}: {e}") from None
    return ctx


def _https_url(base: str, ref: str, what: str) -> str:
    """`ref` (a redirect's Location, a token realm) resolved against `base`, parsed the way
    httpx will parse it, and https; else one `RegistryError`. httpx raised its own
    InvalidURL, or idna's IDNAError, for a host like `xn--` or a port like `:b`."""
    try:
        url = urljoin(base, ref)
        parsed = httpx.URL(url)
        host = parsed.host  # decodes an IDNA host: raises for a malformed one
        _origin(url)  # urllib's port: raises for one out of range
    except (httpx.InvalidURL, ValueError):  # IDNAError and UnicodeError are ValueErrors
        raise RegistryError(f"{what} {ref[:100]!r}, which is not a valid URL; "
                            "refused") from None
    if parsed.scheme != "https" or not host:
        raise RegistryError(f"{what} {ref[:100]!r}, a non-https URL; refused")
    return url


def _shown(s: str) -> str:
    """`s` as is if it is printable (a host name), else quoted with its escapes."""
    return s if s.isprintable() else repr(s[:100])


def _now() -> float:
    return time.monotonic()


def _origin(url: str) -> tuple[str, str, int]:
    p = urlsplit(url)
    return (p.scheme, (p.hostname or "").lower(), p.port or (443 if p.scheme == "https" else 80))


class RegistryClient:
    """One endpoint of a registry: `https://host/v2` (`host`), or the `endpoint` given (a
    mirror's API root, its CA files). A mirror is asked with `?ns=<namespace>` (the
    registry it stands in for, as containerd asks), and is named so in every error."""

    def __init__(
        self, host: str, repository: str, *, ca_bundle: Path | None = None,
        transport: httpx.AsyncBaseTransport | None = None, sleep: Sleep | None = None,
        max_attempts: int = MAX_ATTEMPTS, endpoint: Endpoint | None = None,
        namespace: str | None = None,
    ) -> None:
        self.endpoint = endpoint or Endpoint(f"https://{host}", "/v2")
        self.host = self.endpoint.netloc
        self.repository = repository
        self.base = self.endpoint.url
        #: how errors name it: its host, or "the mirror https://…/v2"
        self.label = f"the mirror {self.base}" if self.endpoint.mirror else self.host
        self._query = f"?ns={namespace}" if namespace and self.endpoint.mirror else ""
        self._origin = _origin(self.base)
        self._sleep: Sleep = sleep or asyncio.sleep
        self._max_attempts = max_attempts
        kwargs: dict[str, Any] = {}
        if transport is not None:
            kwargs["transport"] = transport
        else:
            kwargs["verify"] = ssl_context(ca_bundle, self.endpoint.ca, self.endpoint.where)
        self._client = httpx.AsyncClient(
            follow_redirects=False, trust_env=False,
            timeout=httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT),
            headers={"User-Agent": "tkbox", "Accept-Encoding": "identity"}, **kwargs,
        )
        self._token: str | None = None
        self._token_tried = False
        # A request with the current token succeeded: a 401 now means it expired (an
        # anonymous token lasts minutes; a slow pull outlives it), not that the image
        # is private. A new token is fetched then, at most MAX_TOKEN_REFRESHES times.
        self._token_used = False
        self._refreshes = 0

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._client.aclose()

    # --- one request --------------------------------------------------------------------

    def where(self) -> str:
        if self.endpoint.mirror:
            return f"{self.repository} on the mirror {self.base}"
        return f"{self.host}/{self.repository}"

    async def _backoff(self, attempt: int, retry_after: str | None = None) -> None:
        delay = min(8.0, 0.5 * 2 ** attempt) * (0.5 + random.random() / 2)  # noqa: S311
        if retry_after is not None and retry_after.strip().isdigit():
            delay = max(delay, min(MAX_RETRY_AFTER, float(retry_after.strip())))
        await self._sleep(delay)

    async def _fetch_token(self, response: httpx.Response) -> None:
        challenges = []
        for value in response.headers.get_list("www-authenticate"):
            challenges.extend(parse_challenges(value))
        bearer = next((c for c in challenges if c.scheme == "bearer"), None)
        if bearer is None:
            raise self._private()
        if self._token_tried:
            if not self._token_used or self._refreshes >= MAX_TOKEN_REFRESHES:
                raise self._private()
            self._refreshes += 1  # the token worked, then expired: a new one
        self._token_tried = True
        self._token_used = False
        req = token_request(bearer, self.repository)
        url = _https_url(self.base, req.url, f"{self.label} sent its token service to")
        for attempt in range(self._max_attempts):
            try:
                async with self._client.stream("GET", url) as r:
                    if r.status_code == 429 or r.status_code >= 500:
                        retry_after = r.headers.get("retry-after")
                        await r.aclose()
                        await self._backoff(attempt, retry_after)
                        continue
                    if r.status_code in (401, 403):
                        raise self._private()
                    if r.status_code != 200:
                        raise Unavailable(
                            f"the token service of {self.label} answered {r.status_code}")
                    body = await _read_bounded(r, 64 * 1024, "the token service's answer")
                    self._token = parse_token_response(body)
                    return
            except _UNPARSABLE as e:
                raise self._unparsable(e) from None
            except httpx.TransportError:
                await self._backoff(attempt)
        raise Unavailable(f"the token service of {self.label} did not answer; try again later")

    def _unparsable(self, e: BaseException) -> RegistryError:
        return RegistryError(f"{self.label} answered with a header httpx cannot parse "
                             f"({type(e).__name__}: {str(e)[:100]!r}); refused")

    def _private(self) -> Unavailable:
        return Unavailable(
            f"{self.where()} needs credentials (it answered 401 to an anonymous token): "
            "private registries and images are not supported yet"
        )

    async def _send(self, path: str, *, accept: str | None = None,
                    attempt_box: list[int] | None = None) -> httpx.Response:
        """GET `path` on the registry; returns a streaming 2xx response (caller closes)."""
        attempts = attempt_box if attempt_box is not None else [0]
        url = self.base + path + self._query
        redirects = 0
        while True:
            headers = {}
            if accept:
                headers["Accept"] = accept
            if self._token is not None and _origin(url) == self._origin:
                headers["Authorization"] = f"Bearer {self._token}"
            request = self._client.build_request("GET", url, headers=headers)
            try:
                r = await self._client.send(request, stream=True)
            except _UNPARSABLE as e:
                raise self._unparsable(e) from None
            except httpx.TransportError as e:
                if _bad_certificate(e):
                    raise RegistryError(
                        f"the TLS certificate of {_shown(urlsplit(url).netloc)} does not verify; "
                        "if it is a private CA, pass its bundle with --ca-bundle or "
                        "SSL_CERT_FILE" + (", or name it with ca = \"FILE\" in hosts.toml"
                                           if self.endpoint.mirror else "")) from None
                attempts[0] += 1
                if attempts[0] >= self._max_attempts:
                    raise Unavailable(
                        f"{self.label} could not be reached after {attempts[0]} attempts "
                        f"({type(e).__name__}); check the name and your network"
                    ) from None
                await self._backoff(attempts[0])
                continue
            status = r.status_code
            if "Authorization" in headers and status not in (401, 403):
                self._token_used = True  # the registry took it (an answer, a redirect)
            if status == 401 and _origin(url) == self._origin:
                await r.aclose()
                await self._fetch_token(r)
                continue
            if status in (301, 302, 303, 307, 308):
                location = r.headers.get("location")
                await r.aclose()
                redirects += 1
                if not location or redirects > MAX_REDIRECTS:
                    raise RegistryError(f"{self.label} redirected too often or nowhere")
                url = _https_url(url, location, f"{self.label} redirected to")
                continue
            if status == 429 or status >= 500:
                retry_after = r.headers.get("retry-after")
                await r.aclose()
                attempts[0] += 1
                if attempts[0] >= self._max_attempts:
                    raise Unavailable(
                        f"{self.label} kept answering {status} after {attempts[0]} attempts; "
                        "try again later")
                await self._backoff(attempts[0], retry_after)
                continue
            if status in (401, 403):
                await r.aclose()
                raise self._private()
            if status == 404:
                await r.aclose()
                raise NotFound(f"{self.where()}: not found ({path.rsplit('/', 1)[-1]}); "
                               "check the image name and tag")
            if not 200 <= status < 300:
                await r.aclose()
                raise Unavailable(f"{self.label} answered {status} for {path}")
            if r.headers.get("content-encoding", "identity").lower() != "identity":
                await r.aclose()
                raise RegistryError(f"{self.label} sent {path} with a Content-Encoding after "
                                    "being asked for none; refused")
            return r

    # --- manifests ----------------------------------------------------------------------

    async def document(self, reference: str) -> tuple[bytes, str | None, str]:
        """(body, content type, digest) of the manifest or index `reference` names, checked
        against the digest asked for and the `Docker-Content-Digest` the answer claims."""
        r = await self._send(f"/{self.repository}/manifests/{reference}", accept=oci.ACCEPT)
        try:
            body = await _read_bounded(r, oci.MAX_MANIFEST, "the manifest")
        finally:
            await r.aclose()
        digest = oci.sha256_digest(body)
        distrust = ": a mirror is not trusted for content" if self.endpoint.mirror else ""
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(
                f"{self.where()} sent a manifest that hashes to {digest}, not the "
                f"{reference} asked for; refused{distrust}")
        header = r.headers.get("docker-content-digest")
        if header and header.startswith("sha256:") and header != digest:
            raise RegistryError(
                f"{self.where()}: the manifest hashes to {digest} but the "
                f"{'mirror' if self.endpoint.mirror else 'registry'} says "
                f"{header[:80]!r}; refused{distrust}")
        return body, r.headers.get("content-type"), digest

    async def resolve_manifest(
        self, reference: str, store: BlobSink
    ) -> tuple[str, str | None, oci.Manifest]:
        """(manifest digest, index digest or None, manifest), both documents stored."""

        async def fetch(ref: str) -> tuple[RegistryClient, bytes, str | None, str]:
            return (self, *await self.document(ref))

        return await resolve_documents(fetch, reference, store)

    # --- blobs ----------------------------------------------------------------------------

    async def fetch_blob(self, desc: oci.Descriptor, store: BlobSink, sink: ProgressSink,
                         *, limit: int | None = None) -> Path:
        if limit is not None and desc.size > limit:
            raise RegistryError(f"blob {desc.digest} is {desc.size} bytes, over {limit}")
        path = store.blob_path(desc.digest)
        if path.is_file():
            sink.emit(ProgressEvent("blob", digest=desc.digest, size=desc.size,
                                    done=desc.size, state="cached"))
            return path
        lock = store.blob_lock(desc.digest)
        # Another process may be fetching it: an flock has no event, so poll (cancellable).
        while not lock.try_acquire():
            await asyncio.sleep(0.1)
        try:
            if path.is_file():  # another process fetched it while we waited
                sink.emit(ProgressEvent("blob", digest=desc.digest, size=desc.size,
                                        done=desc.size, state="cached"))
                return path
            sink.emit(ProgressEvent("blob", digest=desc.digest, size=desc.size, state="start"))
            with store.blob_writer(desc.digest, desc.size) as w:
                attempts = [0]
                while True:
                    r = await self._send(f"/{self.repository}/blobs/{desc.digest}",
                                         attempt_box=attempts)
                    try:
                        # As the bytes come (not gathered into large chunks, which
                        # would wait for a trickle): the pace is checked on each.
                        window, window_bytes, shown = _now(), 0, 0
                        async for chunk in r.aiter_bytes():
                            w.write(chunk)
                            window_bytes += len(chunk)
                            if _now() - window >= PROGRESS_WINDOW:
                                if window_bytes < MIN_PROGRESS:
                                    raise httpx.ReadTimeout("the transfer is too slow")
                                window, window_bytes = _now(), 0
                            if w.written - shown >= 1024 * 1024 or w.written == desc.size:
                                shown = w.written
                                sink.emit(ProgressEvent("blob", digest=desc.digest,
                                                        size=desc.size, done=w.written,
                                                        state="progress"))
                        if w.written < desc.size:
                            raise httpx.RemoteProtocolError("the transfer ended early")
                    except httpx.TransportError as e:
                        attempts[0] += 1
                        if attempts[0] >= self._max_attempts:
                            raise Unavailable(
                                f"blob {desc.digest} from {self.label} broke off "
                                f"{attempts[0]} times ({type(e).__name__}); try again later"
                            ) from None
                        w.reset()
                        await self._backoff(attempts[0])
                        continue
                    finally:
                        await r.aclose()
                    final = w.commit()
                    break
            sink.emit(ProgressEvent("blob", digest=desc.digest, size=desc.size,
                                    done=desc.size, state="done"))
            return final
        finally:
            lock.release()


def _bad_certificate(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLCertVerificationError) or \
                "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _read_bounded(r: httpx.Response, limit: int, what: str) -> bytes:
    declared = r.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RegistryError(f"{what} is {declared} bytes, more than the {limit} allowed")
    buf = bytearray()
    start = _now()
    try:
        async for chunk in r.aiter_bytes():
            buf += chunk
            if len(buf) > limit:
                raise RegistryError(f"{what} is more than the {limit} bytes allowed")
            if _now() - start > DOCUMENT_DEADLINE:
                raise Unavailable(f"{what} took more than {DOCUMENT_DEADLINE:.0f} s to "
                                    "arrive; refused")
    except httpx.TransportError as e:
        raise Unavailable(f"{what} broke off ({type(e).__name__}); try again") from None
    return bytes(buf)


Fetch = Callable[[str], Awaitable[tuple[RegistryClient, bytes, str | None, str]]]


async def resolve_documents(fetch: Fetch, reference: str,
                            store: BlobSink) -> tuple[str, str | None, oci.Manifest]:
    """(manifest digest, index digest or None, manifest) for `reference`: an index is
    resolved to its linux/amd64 manifest. Both documents are stored once both are
    verified and parsed, so a pull that fails between them leaves neither."""
    client, body, ctype, digest = await fetch(reference)
    doc = oci.parse_document(body, ctype, f"the manifest of {client.where()}")
    if not isinstance(doc, oci.Index):
        store.put_bytes(body, digest)
        return digest, None, doc
    entry = oci.select_platform(doc)
    child, cbody, cctype, cdigest = await fetch(entry.digest)
    cdoc = oci.parse_document(cbody, cctype, f"the manifest of {child.where()}")
    if isinstance(cdoc, oci.Index):
        raise RegistryError(f"{child.where()}: an index inside an index; not supported")
    store.put_bytes(body, digest)
    store.put_bytes(cbody, cdigest)
    return cdigest, digest, cdoc


T = TypeVar("T")


def _fact(client: RegistryClient, e: TkboxError) -> str:
    """What an endpoint's error says happened, without its advice, naming the endpoint."""
    fact = str(e).split("; ", 1)[0]
    return fact if client.label in fact else f"{client.label}: {fact}"


class RegistryPull:
    """One pull's registry: its endpoints in the order they are asked (`mirrors`), one
    `RegistryClient` each (module docstring). `provenance` says who answered."""

    def __init__(self, registry: str, repository: str, endpoints: Sequence[Endpoint], *,
                 ca_bundle: Path | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 sleep: Sleep | None = None) -> None:
        if not endpoints:
            raise UserError(f"no endpoint is configured for {registry}")
        self.registry = registry
        self.repository = repository
        self.endpoints = tuple(endpoints)
        self._options: dict[str, Any] = {"ca_bundle": ca_bundle, "transport": transport,
                                         "sleep": sleep}
        self._stack = contextlib.AsyncExitStack()
        self.clients: list[RegistryClient] = []
        self._down: dict[int, Unavailable] = {}  # could not answer: not asked again
        #: the endpoint that answered the reference, and the digest it answered
        self.answered: tuple[Endpoint, str] | None = None

    async def __aenter__(self) -> RegistryPull:
        try:
            for i, e in enumerate(self.endpoints):
                last = i == len(self.endpoints) - 1
                self.clients.append(await self._stack.enter_async_context(RegistryClient(
                    e.netloc, self.repository, endpoint=e, namespace=self.registry,
                    max_attempts=MAX_ATTEMPTS if last else FALLBACK_ATTEMPTS,
                    **self._options)))
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._stack.aclose()

    def _ref(self, reference: str) -> str:
        sep = "@" if reference.startswith("sha256:") else ":"
        return f"{self.registry}/{self.repository}{sep}{reference}"

    async def _first(self, by_digest: bool, what: str,
                     ask: Callable[[RegistryClient], Awaitable[T]]) -> tuple[RegistryClient, T]:
        """The answer of the first endpoint that may give one (see the module docstring)."""
        order = candidates(self.endpoints, by_digest=by_digest)
        if not order:
            need = "pull" if by_digest else "pull and resolve"
            raise UserError(f"no endpoint of {self.registry} may answer {what} (none has the "
                            f"{need} capabilities in {self.endpoints[0].where}); give one "
                            "those capabilities")
        failures: list[tuple[RegistryClient, TkboxError]] = []
        for i in order:
            client = self.clients[i]
            if i in self._down:
                failures.append((client, self._down[i]))
                continue
            try:
                return client, await ask(client)
            except Unavailable as e:
                self._down[i] = e
                failures.append((client, e))
            except NotFound as e:
                failures.append((client, e))
            except RegistryError as e:  # it answered wrongly: the pull ends here
                if client.endpoint.mirror:
                    named = "" if client.base in str(e) else f" {client.base}"
                    raise RegistryError(f"{e}; fix the mirror{named} or remove it "
                                        f"({client.endpoint.where}), then pull again") from None
                raise
        if len(failures) == 1:
            raise failures[0][1]
        tried = "; ".join(_fact(c, e) for c, e in failures)
        if all(isinstance(e, NotFound) for _, e in failures):
            raise NotFound(f"{what}: not found on any of {len(failures)} endpoints ({tried}); "
                           "check the image name and tag")
        raise Unavailable(f"{what}: no endpoint could answer ({tried}); check the mirrors "
                          f"({self.endpoints[0].where}) and your network")

    async def resolve_manifest(
        self, reference: str, store: BlobSink
    ) -> tuple[str, str | None, oci.Manifest]:
        """As `RegistryClient.resolve_manifest`, each document from the first endpoint
        that answers it; the endpoint that answered `reference` is kept (`answered`)."""

        async def fetch(ref: str) -> tuple[RegistryClient, bytes, str | None, str]:
            client, (body, ctype, digest) = await self._first(
                ref.startswith("sha256:"), self._ref(ref), lambda c: c.document(ref))
            if ref == reference:
                self.answered = (client.endpoint, digest)
            return client, body, ctype, digest

        return await resolve_documents(fetch, reference, store)

    async def fetch_blob(self, desc: oci.Descriptor, store: BlobSink, sink: ProgressSink,
                         *, limit: int | None = None) -> Path:
        _, path = await self._first(
            True, f"blob {desc.digest} of {self.registry}/{self.repository}",
            lambda c: c.fetch_blob(desc, store, sink, limit=limit))
        return path

    def provenance(self) -> dict[str, Any]:
        """Who answered the reference: what the image's name keeps, and a run records."""
        assert self.answered is not None, "resolve_manifest first"
        endpoint, digest = self.answered
        return {"registry": self.registry, "endpoint": endpoint.url,
                "mirror": endpoint.mirror, "answered": digest}
