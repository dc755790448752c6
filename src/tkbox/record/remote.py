"""`RemoteSignerClient`: the real `SignerClient` for a signer on another host, over TLS.

    tkbox daemon --signer https://signer.example:7390 --signer-ca ca.pem \
        [--signer-cert daemon.pem --signer-key daemon.key]    mutual TLS
        [--signer-token github:AUDIENCE | file:PATH | env:VAR] workload identity

Everything `UnixSignerClient` does (the same frames, pipelining, timeouts,
pushes on a second connection), over a TLS 1.3 stream to the signer's network
listener (`tkbox signer serve --listen`). Each connection, before it is used:

1. the TLS handshake: the signer's certificate must chain to `--signer-ca`
   alone (pinned; the system's store is not used) and name the URL's host; the
   daemon's client certificate, if given, is presented;
2. with a token source, `auth` with a fresh token (`TokenSource.get`, read
   again for every connection, so a reconnect after the first token expired
   presents a new one); the signer answers with the workload it recorded;
3. the clocks: the signer's time (in that answer, or in a `ping`) must be
   within `max_skew` seconds of ours, or the connection is refused: a record
   whose times cannot be trusted is not made.

Fail closed as `UnixSignerClient`: any failure of the three, a TLS error, a
connection cut mid-batch or a silent signer raise `SignerUnavailable` with one
line that says which; the caller refuses the crossing (or stops the box, and
the loss is recorded as `tkbox.gap` once the signer answers again). Tokens
never appear in an error or a log line.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tkbox._clock import Clock, SystemClock
from tkbox.errors import SignerUnavailable, UserError
from tkbox.formats import wire
from tkbox.record.unix import Streams, UnixSignerClient

MAX_SKEW = 120.0  # seconds between the daemon's clock and the signer's
MAX_TOKEN = 16 * 1024
HANDSHAKE_TIMEOUT = 10.0


class TokenSource(ABC):
    """Where a daemon gets a workload token (one per connection)."""

    @abstractmethod
    async def get(self) -> str:
        """A token, or SignerUnavailable saying why there is none."""


@dataclass(frozen=True)
class FileToken(TokenSource):
    """A token in a file, read again for each connection (a sidecar keeps it fresh)."""

    path: Path

    async def get(self) -> str:
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeError) as exc:
            raise SignerUnavailable(f"cannot read the workload token {self.path}: "
                                    f"{getattr(exc, 'strerror', None) or exc.__class__.__name__}"
                                    ) from None
        return _bounded(text, str(self.path))


@dataclass(frozen=True)
class EnvToken(TokenSource):
    var: str

    async def get(self) -> str:
        return _bounded(os.environ.get(self.var, "").strip(), f"${self.var}")


@dataclass(frozen=True)
class GithubToken(TokenSource):
    """GitHub Actions' `id-token` for `audience`, asked of the runner as
    `@actions/core`'s getIDToken does: GET `$ACTIONS_ID_TOKEN_REQUEST_URL&audience=…`
    with `Authorization: bearer $ACTIONS_ID_TOKEN_REQUEST_TOKEN`, answer
    `{"value": <token>}`. The job needs `permissions: id-token: write`."""

    audience: str

    async def get(self) -> str:
        url = os.environ.get("ACTIONS_ID_TOKEN_REQUEST_URL", "")
        bearer = os.environ.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "")
        if not url or not bearer:
            raise SignerUnavailable("no GitHub id-token here (ACTIONS_ID_TOKEN_REQUEST_URL is "
                                    "not set): give the job `permissions: id-token: write`")
        try:
            async with httpx.AsyncClient(timeout=10.0, trust_env=False) as c:
                resp = await c.get(url, params={"audience": self.audience},
                                   headers={"Authorization": f"bearer {bearer}",
                                            "Accept": "application/json"})
        except httpx.HTTPError as exc:
            raise SignerUnavailable(f"cannot ask the runner for an id-token "
                                    f"({exc.__class__.__name__})") from None
        if resp.status_code != 200 or len(resp.content) > 4 * MAX_TOKEN:
            raise SignerUnavailable(f"the runner refused an id-token (HTTP {resp.status_code})")
        try:
            value = json.loads(resp.content).get("value")
        except (ValueError, AttributeError):
            value = None
        if not isinstance(value, str):
            raise SignerUnavailable("the runner's id-token answer holds no value")
        return _bounded(value, "the runner's id-token")


def _bounded(token: str, where: str) -> str:
    if not token:
        raise SignerUnavailable(f"the workload token in {where} is empty")
    if len(token) > MAX_TOKEN or not token.isascii():
        raise SignerUnavailable(f"the workload token in {where} is not a token")
    return token


def token_source(spec: str) -> TokenSource:
    """`github:AUDIENCE`, `file:PATH` or `env:VAR` (UserError otherwise)."""
    kind, _, arg = spec.partition(":")
    if kind == "github" and arg:
        return GithubToken(arg)
    if kind == "file" and arg:
        return FileToken(Path(arg))
    if kind == "env" and arg:
        return EnvToken(arg)
    raise UserError(f"--signer-token {spec!r}: use github:AUDIENCE, file:PATH or env:VAR")


def parse_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.username:
        raise UserError(f"--signer {url!r}: a remote signer is https://HOST:PORT")
    try:
        port = parts.port or 443
    except ValueError:
        raise UserError(f"--signer {url!r}: the port is not a number") from None
    return parts.hostname, port


class RemoteSignerClient(UnixSignerClient):
    def __init__(self, url: str, *, ca: Path | None, cert: Path | None = None,
                 key: Path | None = None, token: TokenSource | None = None,
                 max_skew: float = MAX_SKEW, clock: Clock | None = None, **kw: Any) -> None:
        self.url = url.rstrip("/")
        self.host, self.port = parse_url(url)
        if cert is None and token is None:
            raise UserError(f"a remote signer needs to know who this daemon is: "
                            f"--signer-cert/--signer-key or --signer-token (for {self.url})")
        if (cert is None) != (key is None):
            raise UserError("--signer-cert and --signer-key go together")
        self._ssl = self._context(ca, cert, key)
        self._token = token
        self.max_skew = max_skew
        self._clock = clock or SystemClock()  # this host's time, beside the signer's
        self.workload = ""  # what the signer said this daemon is, once authenticated
        self._streams: set[asyncio.StreamWriter] = set()
        super().__init__(self.url, **kw)

    @staticmethod
    def _context(ca: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext:
        try:
            # cafile given: only that CA is trusted (pinned); otherwise the system's store.
            ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3
            if cert is not None and key is not None:
                ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise UserError(f"cannot set up TLS to the signer: {_why(exc)}") from None
        return ctx

    async def _open(self) -> Streams:
        # The whole of it (TLS, auth, the clock) within connect_timeout + HANDSHAKE_TIMEOUT.
        try:
            return await asyncio.wait_for(self._connect(),
                                          self.connect_timeout + HANDSHAKE_TIMEOUT)
        except TimeoutError:
            raise SignerUnavailable(f"the signer at {self.url} did not complete the "
                                    "connection in time; check it is up") from None

    async def _connect(self) -> Streams:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                self.host, self.port, ssl=self._ssl, server_hostname=self.host,
                limit=wire.MAX_FRAME + 4, ssl_handshake_timeout=HANDSHAKE_TIMEOUT),
                self.connect_timeout + HANDSHAKE_TIMEOUT)
        except ssl.SSLCertVerificationError as exc:
            raise SignerUnavailable(f"the signer at {self.url} is not the one --signer-ca "
                                    f"vouches for ({exc.verify_message or _why(exc)})") from None
        except ssl.SSLError as exc:
            raise SignerUnavailable(f"TLS with the signer at {self.url} failed ({_why(exc)}); "
                                    "check --signer-ca and the daemon's certificate") from None
        except (TimeoutError, OSError) as exc:
            raise SignerUnavailable(f"the signer at {self.url} does not answer ({_why(exc)})"
                                    ) from None
        try:
            if self._token is not None:
                answer = await self._handshake(reader, writer,
                                               wire.Auth(0, await self._token.get()))
                self.workload = str(answer.get("workload", ""))
            else:
                answer = await self._handshake(reader, writer, wire.Ping(0))
            self._check_clock(answer.get("time_ms"))
        except BaseException:
            await _closed(writer)
            raise
        self._streams.add(writer)
        return reader, writer

    async def aclose(self) -> None:
        await super().aclose()
        # TLS says goodbye (close_notify) on the loop: let each connection finish closing,
        # so none is left to the garbage collector.
        streams, self._streams = self._streams, set()
        for w in streams:
            await _closed(w)

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         req: wire.Auth | wire.Ping) -> dict[str, Any]:
        """One request before the connection is handed over (id 0; nothing else is in
        flight on it yet, and the signer sends nothing unasked before `subscribe`)."""
        decoder = wire.Decoder()
        try:
            writer.write(req.encode())
            await writer.drain()
            while (frame := decoder.next()) is None:
                data = await reader.read(1 << 16)
                if not data:
                    raise SignerUnavailable(f"the signer at {self.url} closed the connection "
                                            f"during {req.OP} (did it refuse this daemon's "
                                            "certificate?)")
                decoder.feed(data)
        except wire.WireError as exc:
            raise SignerUnavailable(f"the signer sent a bad frame ({exc})") from None
        except ssl.SSLError as exc:
            raise SignerUnavailable(f"the signer at {self.url} refused this daemon's TLS "
                                    f"certificate ({_why(exc)})") from None
        except (ConnectionError, OSError) as exc:
            raise SignerUnavailable(f"the connection to the signer at {self.url} broke during "
                                    f"{req.OP} ({_why(exc)}; did it refuse this daemon's "
                                    "certificate?)") from None
        if decoder.buffered:
            raise SignerUnavailable("the signer sent more than the answer to " + req.OP)
        try:
            answer = wire.parse_answer(frame)
        except wire.BadSignerAnswer:
            answer = None
        if not isinstance(answer, wire.Ok) or answer.id != 0:
            error = answer.error if isinstance(answer, wire.Refused | wire.Failed) else None
            raise SignerUnavailable(f"the signer at {self.url} refused this daemon: "
                                    f"{error if error is not None else 'no reason'}")
        return answer.result

    def _check_clock(self, signer_ms: Any) -> None:
        if not isinstance(signer_ms, int) or isinstance(signer_ms, bool):
            raise SignerUnavailable("the signer did not say its time; refusing (the records' "
                                    "times could not be trusted)")
        skew = abs(signer_ms / 1000 - self._clock.time())
        if skew > self.max_skew:
            raise SignerUnavailable(f"the signer's clock and this host's differ by {skew:.0f} s "
                                    f"(at most {self.max_skew:.0f} s); fix the clocks (NTP)")


async def _closed(writer: asyncio.StreamWriter) -> None:
    """Close, waiting at most a second; a close that hangs is aborted. A connection
    that broke while closing is already gone: aborting it then raised AttributeError
    from inside asyncio's TLS transport (its protocol already dropped), which ended
    `tkbox daemon` with a traceback instead of its one-line refusal."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    except TimeoutError:
        writer.transport.abort()
    except (ConnectionError, OSError, ssl.SSLError):
        pass  # the peer reset or refused it: nothing left to abort


def _why(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or exc.__class__.__name__
