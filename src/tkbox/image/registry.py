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

Nothing unverified reaches the store, and no token reaches a log or an error.
"""

from __future__ import annotations

import asyncio
import os
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from tkbox.errors import RegistryError, UserError
from tkbox.image import oci
from tkbox.image.auth import parse_challenges, parse_token_response, token_request
from tkbox.image.progress import ProgressEvent, ProgressSink
from tkbox.image.sink import BlobSink

MAX_ATTEMPTS = 5
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


def ssl_context(ca_bundle: Path | None = None) -> ssl.SSLContext:
    """Trust `ca_bundle`, else `SSL_CERT_FILE`, else the system's certificates."""
    cafile = ca_bundle or (Path(os.environ["SSL_CERT_FILE"]) if os.environ.get("SSL_CERT_FILE")
                           else None)
    try:
        return ssl.create_default_context(cafile=str(cafile) if cafile else None)
    except (OSError, ssl.SSLError) as e:
        raise UserError(f"cannot read the CA bundle {cafile}: {e}") from None


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
    def __init__(
        self, host: str, repository: str, *, ca_bundle: Path | None = None,
        transport: httpx.AsyncBaseTransport | None = None, sleep: Sleep | None = None,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        self.host = host
        self.repository = repository
        self.base = f"https://{host}"
        self._origin = _origin(self.base)
        self._sleep: Sleep = sleep or asyncio.sleep
        self._max_attempts = max_attempts
        kwargs: dict[str, Any] = {}
        if transport is not None:
            kwargs["transport"] = transport
        else:
            kwargs["verify"] = ssl_context(ca_bundle)
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

    def _where(self) -> str:
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
        url = _https_url(self.base, req.url, f"{self.host} sent its token service to")
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
                        raise RegistryError(
                            f"the token service of {self.host} answered {r.status_code}")
                    body = await _read_bounded(r, 64 * 1024, "the token service's answer")
                    self._token = parse_token_response(body)
                    return
            except _UNPARSABLE as e:
                raise self._unparsable(e) from None
            except httpx.TransportError:
                await self._backoff(attempt)
        raise RegistryError(f"the token service of {self.host} did not answer; try again later")

    def _unparsable(self, e: BaseException) -> RegistryError:
        return RegistryError(f"{self.host} answered with a header httpx cannot parse "
                             f"({type(e).__name__}: {str(e)[:100]!r}); refused")

    def _private(self) -> RegistryError:
        return RegistryError(
            f"{self._where()} needs credentials (it answered 401 to an anonymous token): "
            "private registries and images are not supported yet"
        )

    async def _send(self, path: str, *, accept: str | None = None,
                    attempt_box: list[int] | None = None) -> httpx.Response:
        """GET `path` on the registry; returns a streaming 2xx response (caller closes)."""
        attempts = attempt_box if attempt_box is not None else [0]
        url = self.base + path
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
                        "SSL_CERT_FILE") from None
                attempts[0] += 1
                if attempts[0] >= self._max_attempts:
                    raise RegistryError(
                        f"{self.host} could not be reached after {attempts[0]} attempts "
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
                    raise RegistryError(f"{self.host} redirected too often or nowhere")
                url = _https_url(url, location, f"{self.host} redirected to")
                continue
            if status == 429 or status >= 500:
                retry_after = r.headers.get("retry-after")
                await r.aclose()
                attempts[0] += 1
                if attempts[0] >= self._max_attempts:
                    raise RegistryError(
                        f"{self.host} kept answering {status} after {attempts[0]} attempts; "
                        "try again later")
                await self._backoff(attempts[0], retry_after)
                continue
            if status in (401, 403):
                await r.aclose()
                raise self._private()
            if status == 404:
                await r.aclose()
                raise UserError(f"{self._where()}: not found ({path.rsplit('/', 1)[-1]}); "
                                "check the image name and tag")
            if not 200 <= status < 300:
                await r.aclose()
                raise RegistryError(f"{self.host} answered {status} for {path}")
            if r.headers.get("content-encoding", "identity").lower() != "identity":
                await r.aclose()
                raise RegistryError(f"{self.host} sent {path} with a Content-Encoding after "
                                    "being asked for none; refused")
            return r

    # --- manifests ----------------------------------------------------------------------

    async def _document(self, reference: str) -> tuple[bytes, str | None, str]:
        r = await self._send(f"/v2/{self.repository}/manifests/{reference}", accept=oci.ACCEPT)
        try:
            body = await _read_bounded(r, oci.MAX_MANIFEST, "the manifest")
        finally:
            await r.aclose()
        digest = oci.sha256_digest(body)
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(
                f"{self._where()} sent a manifest that hashes to {digest}, not the "
                f"{reference} asked for; refused")
        header = r.headers.get("docker-content-digest")
        if header and header.startswith("sha256:") and header != digest:
            raise RegistryError(
                f"{self._where()}: the manifest hashes to {digest} but the registry says "
                f"{header[:80]!r}; refused")
        return body, r.headers.get("content-type"), digest

    async def resolve_manifest(
        self, reference: str, store: BlobSink
    ) -> tuple[str, str | None, oci.Manifest]:
        """(manifest digest, index digest or None, manifest), both documents stored."""
        body, ctype, digest = await self._document(reference)
        doc = oci.parse_document(body, ctype, f"the manifest of {self._where()}")
        index_digest: str | None = None
        if isinstance(doc, oci.Index):
            store.put_bytes(body, digest)
            index_digest = digest
            entry = oci.select_platform(doc)
            body, ctype, digest = await self._document(entry.digest)
            doc = oci.parse_document(body, ctype, f"the manifest of {self._where()}")
            if isinstance(doc, oci.Index):
                raise RegistryError(f"{self._where()}: an index inside an index; not supported")
        store.put_bytes(body, digest)
        return digest, index_digest, doc

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
                    r = await self._send(f"/v2/{self.repository}/blobs/{desc.digest}",
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
                            raise RegistryError(
                                f"blob {desc.digest} from {self.host} broke off "
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
                raise RegistryError(f"{what} took more than {DOCUMENT_DEADLINE:.0f} s to "
                                    "arrive; refused")
    except httpx.TransportError as e:
        raise RegistryError(f"{what} broke off ({type(e).__name__}); try again") from None
    return bytes(buf)
