"""The CLI's client of the daemon API (HTTP over the daemon's Unix socket)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tkbox import paths
from tkbox.errors import (
    GuestError,
    HostError,
    InternalError,
    Refused,
    RegistryError,
    SignerUnavailable,
    TkboxError,
    UserError,
)

KINDS: dict[str, type[TkboxError]] = {
    "UserError": UserError, "Refused": Refused, "HostError": HostError,
    "GuestError": GuestError, "RegistryError": RegistryError,
    "SignerUnavailable": SignerUnavailable, "PatchRefused": Refused,
    "InternalError": InternalError,
}


class DaemonClient:
    def __init__(self, socket_path: Path | None = None, timeout: float | None = 600.0) -> None:
        self.path = socket_path or paths.daemon_socket()
        self.http = httpx.Client(transport=httpx.HTTPTransport(uds=str(self.path)),
                                 base_url="http://tkbox", timeout=timeout)

    def _not_running(self) -> HostError:
        return HostError(f"the tkbox daemon is not running (no answer on {self.path}); "
                         "start it with 'tkbox daemon &'")

    @staticmethod
    def _raise(resp: httpx.Response) -> None:
        try:
            err = resp.json().get("error") or {}
        except ValueError:
            err = {}
        if not err:
            detail = resp.text[:300] if resp.status_code != 422 else _validation(resp)
            raise UserError(f"the daemon refused the request ({resp.status_code}): {detail}")
        raise KINDS.get(err.get("type", ""), HostError)(str(err.get("message", "")))

    def call(self, method: str, url: str, **kw: Any) -> Any:
        try:
            resp = self.http.request(method, url, **kw)
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError):
            raise self._not_running() from None
        except httpx.TransportError as exc:
            raise HostError(f"lost the connection to the daemon: {exc}") from None
        if resp.status_code >= 400:
            self._raise(resp)
        return resp.json()

    def stream(self, method: str, url: str, **kw: Any) -> Iterator[dict[str, Any]]:
        try:
            with self.http.stream(method, url, timeout=None, **kw) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    self._raise(resp)
                for line in resp.iter_lines():
                    if line:
                        yield json.loads(line)
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError):
            raise self._not_running() from None
        except httpx.TransportError as exc:
            raise HostError(f"lost the connection to the daemon: {exc}") from None


def _validation(resp: httpx.Response) -> str:
    try:
        items = resp.json().get("detail", [])
        return "; ".join(f"{'.'.join(str(x) for x in i.get('loc', [])[1:])}: {i.get('msg')}"
                         for i in items)[:300]
    except ValueError:
        return resp.text[:300]
