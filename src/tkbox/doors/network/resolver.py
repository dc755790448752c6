"""Name resolution on the host, the host's own addresses, and hosts files.

- `Resolver`: the interface (`resolve(name, port) -> [address]`), with
  `SystemResolver` (the host's `getaddrinfo` through the event loop) and
  `FakeResolver` for tests (a fixed table, or a sequence of answers per name
  to play DNS rebinding). The door resolves a name once per connection and
  dials exactly the addresses it checked. `SystemResolver` asks for the
  name's absolute form (`names.fully_qualified`, `intranet.`), whatever form
  it is given, so the host's `search` domains never complete a box's name
  into another one; its `lookup` (the `Lookup` boundary, `getaddrinfo` by
  default) receives exactly those bytes.
- `HostAddresses`: this host's own addresses, re-read at most every five
  seconds. Linux only: IPv4 from `/proc/net/fib_trie` (the `LOCAL` routes),
  IPv6 from `/proc/net/if_inet6`. Hand-written: the standard library has no
  `getifaddrs`, and the maintained library that does (psutil) is a large
  native dependency for two small files.
- `parse_hosts(text)`: the hosts-file format (`address name [alias...]`,
  `#` comments) for the operator's `--egress-hosts` map of internal mirrors.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tkbox._clock import Clock
from tkbox.doors.network.addresses import IPAddress
from tkbox.doors.network.names import HostNameError, fully_qualified, normalize_name
from tkbox.errors import RemoteError, UserError

RESOLVE_TIMEOUT = 10.0
MAX_ANSWERS = 32
OWN_REFRESH = 5.0
MAX_HOSTS_FILE = 1 << 20


class ResolveError(RemoteError):
    """The name did not resolve (no such name, or the resolver failed)."""


class Resolver(ABC):
    @abstractmethod
    async def resolve(self, name: str, port: int) -> list[IPAddress]:
        """Addresses for a normalised name. Raises ResolveError."""


def _sockaddr_ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None


#: `getaddrinfo`'s answer: (family, type, proto, canonname, sockaddr) tuples
AddrInfo = tuple[Any, Any, Any, Any, tuple[Any, ...]]
#: the system resolver's boundary: an absolute name's ASCII bytes and a port → answers
Lookup = Callable[[bytes, int], Awaitable[Sequence[AddrInfo]]]


async def getaddrinfo(query: bytes, port: int) -> Sequence[AddrInfo]:
    """The host's `getaddrinfo` through the event loop, for TCP. The name goes as
    bytes, so Python's own IDNA 2003 codec never re-encodes what `names` made."""
    loop = asyncio.get_running_loop()
    return await loop.getaddrinfo(query, port, type=socket.SOCK_STREAM,
                                  proto=socket.IPPROTO_TCP)


class SystemResolver(Resolver):
    """The host's resolver (`getaddrinfo`), bounded in time and answers.

    Every name is asked in its absolute form (`fully_qualified`: normalised, one
    trailing dot), so the host's `search` domains never apply."""

    def __init__(self, timeout: float = RESOLVE_TIMEOUT, lookup: Lookup = getaddrinfo) -> None:
        self.timeout = timeout
        self.lookup = lookup

    async def resolve(self, name: str, port: int) -> list[IPAddress]:
        try:
            query = fully_qualified(name).encode("ascii")
        except HostNameError as exc:
            raise ResolveError(exc.message.removeprefix("refused: ")) from None
        try:
            async with asyncio.timeout(self.timeout):
                infos = await self.lookup(query, port)
        except TimeoutError:
            raise ResolveError(f"{name} did not resolve within {self.timeout:g} s") from None
        except (OSError, UnicodeError) as exc:
            raise ResolveError(f"{name} does not resolve ({exc.__class__.__name__})") from None
        out: list[IPAddress] = []
        for _family, _type, _proto, _canon, sockaddr in infos:
            ip = _sockaddr_ip(str(sockaddr[0]))
            if ip is not None and ip not in out:
                out.append(ip)
        if not out:
            raise ResolveError(f"{name} has no addresses")
        return out[:MAX_ANSWERS]


class FakeResolver(Resolver):
    """A table of answers. A list of lists answers each call with the next one."""

    def __init__(self, table: Mapping[str, Iterable[str] | list[list[str]]] | None = None) -> None:
        self._answers: dict[str, list[list[IPAddress]]] = {}
        self.calls: list[str] = []
        for name, value in (table or {}).items():
            self.set(name, value)

    def set(self, name: str, value: Iterable[str] | list[list[str]]) -> None:
        items: list[Any] = list(value)
        seq: list[list[str]] = items if items and isinstance(items[0], list) else [items]
        self._answers[name] = [[ipaddress.ip_address(a) for a in ans] for ans in seq]

    async def resolve(self, name: str, port: int) -> list[IPAddress]:
        self.calls.append(name)
        seq = self._answers.get(name)
        if not seq:
            raise ResolveError(f"{name} does not resolve (fake resolver)")
        return list(seq.pop(0) if len(seq) > 1 else seq[0])


def read_own_addresses(proc: Path = Path("/proc/net")) -> frozenset[IPAddress]:
    """This host's addresses from /proc (Linux); empty if unreadable."""
    out: set[IPAddress] = set()
    try:
        lines = (proc / "fib_trie").read_text().splitlines()
    except OSError:
        lines = []
    # A leaf line "|-- 192.0.2.2" is followed by "/32 host LOCAL" for an own address.
    for prev, line in zip(lines, lines[1:], strict=False):
        if line.strip().endswith("host LOCAL") and "|--" in prev:
            ip = _sockaddr_ip(prev.split("|--", 1)[1].strip())
            if ip is not None:
                out.add(ip)
    try:
        for line in (proc / "if_inet6").read_text().splitlines():
            hexaddr = line.split()[0] if line.split() else ""
            if len(hexaddr) == 32:
                try:
                    out.add(ipaddress.IPv6Address(int(hexaddr, 16)))
                except ValueError:
                    continue
    except OSError:
        pass
    return frozenset(out)


class HostAddresses:
    """This host's own addresses, re-read at most every `refresh` seconds."""

    def __init__(
        self,
        clock: Clock,
        read: Callable[[], frozenset[IPAddress]] = read_own_addresses,
        refresh: float = OWN_REFRESH,
    ) -> None:
        self._clock = clock
        self._read = read
        self._refresh = refresh
        self._at: float | None = None
        self._value: frozenset[IPAddress] = frozenset()

    def __call__(self) -> frozenset[IPAddress]:
        now = self._clock.monotonic()
        if self._at is None or now - self._at >= self._refresh:
            self._value = self._read()
            self._at = now
        return self._value


def parse_hosts(text: str, source: str = "--egress-hosts") -> dict[str, tuple[IPAddress, ...]]:
    """The hosts-file format: `address name [alias ...]`, `#` starts a comment."""
    out: dict[str, list[IPAddress]] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        if len(words) < 2:
            raise UserError(f"{source} line {n}: write 'address name [alias ...]'")
        try:
            ip = ipaddress.ip_address(words[0])
        except ValueError:
            raise UserError(f"{source} line {n}: {words[0]!r} is not an IP address") from None
        for w in words[1:]:
            try:
                name = normalize_name(w)
            except HostNameError as exc:
                raise UserError(
                    f"{source} line {n}: {exc.message.removeprefix('refused: ')}"
                ) from None
            addrs = out.setdefault(name, [])
            if ip not in addrs:
                addrs.append(ip)
    return {k: tuple(v) for k, v in out.items()}


def read_hosts_file(path: Path) -> dict[str, tuple[IPAddress, ...]]:
    try:
        if path.stat().st_size > MAX_HOSTS_FILE:
            raise UserError(f"--egress-hosts {path}: larger than {MAX_HOSTS_FILE} bytes")
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"--egress-hosts {path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"--egress-hosts {path}: not a text file") from None
    return parse_hosts(text, f"--egress-hosts {path}")
