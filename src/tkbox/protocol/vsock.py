"""Port streams over vsock: the hybrid (Unix-socket) flavour and real `AF_VSOCK`.

Three `Ports` transports live here (see `tkbox.protocol.ports`):

- `HybridVsockHostPorts`: the host side under Firecracker or Cloud Hypervisor,
  whose vsock device is exposed on the host as one Unix socket, `uds_path`.
  Host → guest: connect to `uds_path`, send `CONNECT <port>\\n` in one write,
  read back `OK <hostport>\\n`; from then on the socket is a plain pipe to the
  guest's accepted vsock socket. Guest → host: the VMM connects to the Unix
  socket `<uds_path>_<port>`, where we listen; no text handshake that way.
- `VhostVsockHostPorts`: the host side over `AF_VSOCK` (QEMU with
  `/dev/vhost-vsock`). One host listener per port serves every guest on the
  host, so listeners are shared per port and each accepted stream is handed to
  the `Ports` object of the guest whose CID the kernel reports for the peer;
  a stream from any other CID is closed at once.
- `GuestVsockPorts`: the guest side of both flavours (inside the VM the
  device is a real `AF_VSOCK` either way): connect to the host's CID 2, listen
  on the guest's own port, accept only the host.

The `CONNECT`/`OK` handshake is a small sans-IO core (`encode_connect`,
`parse_connect_reply`) with a thin asyncio shell. The `OK` line comes from the
VMM, not the guest, but it is parsed as strictly as anything else: a bounded
line, the canonical decimal form only, nothing else accepted. Bytes that arrive
in the same read as the `OK` line are already the guest's payload and are
handed to the stream first.

Bounds: at most `max_streams` streams the other side opened, per `Ports`
object (Firecracker itself allows 1023 per VM); a stream accepted beyond that
is closed at once. Streams we open are counted apart (at most `MAX_OWN`, and
`RESERVED_OWN` more only for `connect(..., reserved=True)`), so a
guest holding every stream it may open cannot stop the host's requests, and
ordinary requests cannot take the slots the host needs at stop.

Hand-written: Python has no library for Firecracker's hybrid vsock
convention; its byte-level behaviour is summarised in
`tests/testdata/firecracker/VSOCK-NOTES.md` and `docs/firecracker.md`.

Standard library only: the guest agent imports this module.

One idea: the three transports share one base
(`_SocketPorts`: stream counting, handler tasks, accept loops) and differ only
in how a socket is opened and listened for; split apart, each would import
the others' internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import struct
from abc import abstractmethod
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from tkbox._tasks import TaskOwner, cancel_and_wait
from tkbox.protocol.budget import Budget
from tkbox.protocol.ports import Handler, PortError, Ports, TransportClosed
from tkbox.protocol.streams import AsyncioStream, ByteStream

log = logging.getLogger(__name__)

#: The host's CID as the guest sees it (`VMADDR_CID_HOST`).
HOST_CID = 2
#: The CID tkbox gives every guest under a hybrid-vsock VMM (each VM has its own device).
DEFAULT_GUEST_CID = 3
#: vsock ports and CIDs are unsigned 32-bit integers.
MAX_U32 = (1 << 32) - 1
#: `OK 4294967295\n` is 14 bytes; Firecracker bounds its own command line at 32.
MAX_REPLY_LINE = 32
#: Seconds to wait for the VMM's `OK` (Firecracker gives the guest 2 s to answer).
HANDSHAKE_TIMEOUT = 5.0
#: Seconds to wait for an `AF_VSOCK` connect.
CONNECT_TIMEOUT = 5.0
#: Open streams per Ports object; Firecracker allows 1023 vsock connections per VM.
MAX_STREAMS = 1024
#: Streams this side opens, counted apart from the other side's.
MAX_OWN = 128
#: Beyond those, kept for `connect(..., reserved=True)` (the host's own use at stop).
RESERVED_OWN = 2
#: accept() errors that pass (out of descriptors or memory): wait, then accept again.
_TRANSIENT_ACCEPT_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: `sun_path` is 108 bytes on Linux, one of which is the terminating NUL.
MAX_UNIX_PATH = 107


# --- sans-IO core of the hybrid handshake -----------------------------------


def check_port(port: object) -> int:
    """`port` as a vsock port number, or PortError."""
    if type(port) is not int or not 0 <= port <= MAX_U32:
        raise PortError(f"vsock port must be an integer from 0 to {MAX_U32}, not {port!r}")
    return port


def encode_connect(port: int) -> bytes:
    """The command that asks the VMM for a stream to guest `port`: `CONNECT <port>\\n`."""
    return b"CONNECT %d\n" % check_port(port)


def parse_connect_reply(buffer: bytes, port: int) -> tuple[int, bytes] | None:
    """Parse the VMM's answer to `CONNECT <port>` from the bytes read so far.

    Returns None while the line is incomplete, else `(host_port, rest)` where
    `rest` is the payload that followed the line (it belongs to the stream).
    The only accepted line is `OK <n>\\n` with `n` a canonical decimal (no sign,
    no leading zero) of at most 32 bits; anything else, or no newline within
    MAX_REPLY_LINE bytes, raises PortError.
    """
    end = buffer.find(b"\n", 0, MAX_REPLY_LINE)
    if end < 0:
        if len(buffer) >= MAX_REPLY_LINE:
            raise PortError(
                f"the VMM answered CONNECT {port} with more than {MAX_REPLY_LINE} bytes "
                "and no newline; expected 'OK <port>'"
            )
        return None
    line, rest = buffer[:end], buffer[end + 1 :]
    digits = line[3:]
    if (
        not line.startswith(b"OK ")
        or not digits.isdigit()  # bytes.isdigit: ASCII 0-9 only
        or (digits.startswith(b"0") and digits != b"0")
        or int(digits) > MAX_U32
    ):
        raise PortError(
            f"the VMM answered CONNECT {port} with {line[:MAX_REPLY_LINE]!r}, "
            "not 'OK <port>'; is this socket a Firecracker/Cloud Hypervisor vsock socket?"
        )
    return int(digits), rest


def listener_path(uds_path: Path, port: int) -> Path:
    """Where the VMM connects for guest → host streams to `port`: `<uds_path>_<port>`."""
    return uds_path.with_name(f"{uds_path.name}_{check_port(port)}")


def check_unix_path(path: Path) -> None:
    """Raise PortError if `path` is too long to bind or connect as a Unix socket."""
    if len(os.fsencode(path)) > MAX_UNIX_PATH:
        raise PortError(
            f"socket path {str(path)[:60]}... is longer than {MAX_UNIX_PATH} bytes, "
            "the limit for a Unix socket; use a shorter TKBOX_HOME or TKBOX_RUNTIME"
        )


def vhost_vsock_problem(device: str = "/dev/vhost-vsock") -> str | None:
    """Why this host cannot give guests `AF_VSOCK` through vhost, or None."""
    if not hasattr(socket, "AF_VSOCK"):
        return "this Python has no AF_VSOCK"
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return f"no {device} (load it: sudo modprobe vhost_vsock)"
    except OSError as exc:
        return f"{device} does not open ({exc.strerror}); give tkbox's user access to it"
    os.close(fd)
    return None


def vhost_vsock_available() -> bool:
    """Whether this host can give guests `AF_VSOCK` (`/dev/vhost-vsock` opens)."""
    return vhost_vsock_problem() is None


# --- streams and the shared plumbing -----------------------------------------


class _PortStream(ByteStream):
    """An AsyncioStream that first returns bytes read ahead during a handshake,
    and tells its Ports object when it is closed."""

    def __init__(
        self,
        inner: AsyncioStream,
        prefix: bytes,
        on_close: Callable[[_PortStream], None],
    ) -> None:
        self._inner = inner
        self._prefix = prefix
        self._on_close = on_close

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._prefix and max_bytes > 0:
            data, self._prefix = self._prefix[:max_bytes], self._prefix[max_bytes:]
            return data
        return await self._inner.receive(max_bytes)

    async def send_all(self, data: bytes) -> None:
        await self._inner.send_all(data)

    async def send_eof(self) -> None:
        await self._inner.send_eof()

    async def aclose(self) -> None:
        self._prefix = b""
        self._on_close(self)
        await self._inner.aclose()


class _SocketPorts(Ports):
    """What the three transports share: stream tracking, handler tasks, listeners.

    Every task (accept loops and handlers) is owned by this object and is
    cancelled and awaited by `aclose`.
    """

    def __init__(self, max_streams: int) -> None:
        self._max_streams = max_streams
        self._streams: set[_PortStream] = set()
        self._own: set[_PortStream] = set()  # the streams we opened
        self._max_own = min(max_streams, MAX_OWN)
        self._opening = 0  # our connects not yet adopted
        self.budget = Budget()
        self._tasks = TaskOwner("tkbox-vsock")  # accept loops and handlers
        self._serving: set[int] = set()
        self._pending: set[socket.socket] = set()  # accepted, not yet adopted
        self._closed = False

    # subclasses -----------------------------------------------------------

    @abstractmethod
    async def _open(self, port: int) -> tuple[socket.socket, bytes]:
        """A connected non-blocking socket to `port`, and bytes read past a handshake."""

    @abstractmethod
    def _start_serving(self, port: int, handler: Handler) -> None:
        """Listen for `port`; accepted connections go to `self._dispatch`."""

    async def _stop_serving(self) -> None:
        """Close listeners (tasks are cancelled by the caller)."""

    # Ports ------------------------------------------------------------------

    async def connect(self, port: int, *, reserved: bool = False) -> ByteStream:
        check_port(port)
        self._check_open()
        self._own &= self._streams
        # RESERVED_OWN more slots are for `reserved=True` only (the host's diff and
        # shutdown at stop); streams still being opened count, so concurrent
        # connects cannot overshoot the bound.
        limit = self._max_own + (RESERVED_OWN if reserved else 0)
        if len(self._own) + self._opening >= limit:
            raise PortError(
                f"too many open port streams ({limit}); close some and retry"
            )
        self._opening += 1
        try:
            sock, prefix = await self._open(port)
            try:
                stream = await self._adopt(sock, prefix)
            except BaseException:
                sock.close()
                raise
        finally:
            self._opening -= 1
        self._own.add(stream)
        if self._closed:  # aclose ran while we were connecting
            await stream.aclose()
            raise TransportClosed("the port transport is closed")
        return stream

    def serve(self, port: int, handler: Handler) -> None:
        check_port(port)
        self._check_open()
        if port in self._serving:
            raise PortError(f"port {port} is already being served")
        self._start_serving(port, handler)
        self._serving.add(port)

    async def aclose(self) -> None:
        self._closed = True
        self._tasks.cancel()  # now: no handler outlives the streams closed below
        try:
            await self._stop_serving()
            for stream in list(self._streams):
                await stream.aclose()
        finally:
            await self._tasks.aclose()

    # shared helpers -----------------------------------------------------------

    def _open_count(self) -> int:
        """Streams the other side opened (adopted or still being adopted)."""
        self._own &= self._streams
        return len(self._streams) - len(self._own) + len(self._pending)

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed("the port transport is closed")

    async def _adopt(self, sock: socket.socket, prefix: bytes) -> _PortStream:
        reader, writer = await asyncio.open_connection(sock=sock)
        stream = _PortStream(AsyncioStream(reader, writer), prefix, self._streams.discard)
        self._streams.add(stream)
        return stream

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return self._tasks.spawn(coro, name)

    def _dispatch(self, port: int, handler: Handler, conn: socket.socket) -> None:
        """Hand an accepted connection to `handler` in a task we own, or close it."""
        if self._closed or self._open_count() >= self._max_streams:
            log.warning("port %d: stream refused, %d streams already open", port, self._max_streams)
            conn.close()
            return
        self._pending.add(conn)
        task = self._spawn(self._run_handler(port, handler, conn), f"tkbox-port-{port}")
        # A task cancelled before its first step never runs its body: close here too.
        task.add_done_callback(lambda _: self._drop_pending(conn))

    def _drop_pending(self, conn: socket.socket) -> None:
        if conn in self._pending:
            self._pending.discard(conn)
            conn.close()

    async def _run_handler(self, port: int, handler: Handler, conn: socket.socket) -> None:
        try:
            stream = await self._adopt(conn, b"")
        except Exception as exc:  # noqa: BLE001 - logged; the connection is dropped
            log.warning("port %d: cannot use an accepted stream: %s", port, exc)
            return
        self._pending.discard(conn)
        try:
            await handler(stream)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one bad stream must not stop the others
            # Type only: an exception's text could carry bytes the guest sent.
            log.warning("port %d: handler failed: %s", port, type(exc).__name__)
        finally:
            await stream.aclose()

    async def _accept_loop(
        self,
        listener: socket.socket,
        port: int,
        handler: Handler,
        accept_peer: Callable[[socket.socket], bool],
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if exc.errno in _TRANSIENT_ACCEPT_ERRORS:
                    log.warning("port %d: accept failed (%s); retrying", port, exc.strerror)
                    await asyncio.sleep(0.1)
                    continue
                log.warning("port %d: listener failed (%s); not serving", port, exc.strerror)
                return
            if accept_peer(conn):
                self._dispatch(port, handler, conn)
            else:
                conn.close()


def _connect_error(what: str, exc: OSError, kind: type[PortError] = PortError) -> PortError:
    reason = exc.strerror or type(exc).__name__
    return kind(f"cannot reach {what}: {reason}; is the VM running?")


# --- hybrid vsock (Firecracker, Cloud Hypervisor), host side ------------------


def _peer_is(uid: int) -> Callable[[socket.socket], bool]:
    """Whether the peer of a Unix-socket connection runs as `uid` (the VMM's: ours, or
    the uid of its own it was given in its cell).

    The private directory already keeps others out; this holds even if its
    mode is changed while the VM runs.
    """

    def check(conn: socket.socket) -> bool:
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                    struct.calcsize("3i"))
        except OSError:
            return False
        _pid, peer, _gid = struct.unpack("3i", creds)
        return bool(peer == uid)

    return check


class HybridVsockHostPorts(_SocketPorts):
    """Host side of a VMM's vsock device exposed as the Unix socket `uds_path`.

    `uds_path` must be in the VM's private (0700) directory: anyone who can
    reach these sockets can talk to the guest agent, and the guest's egress and
    boot-config streams arrive on `<uds_path>_<port>`. Listeners are created
    0600 and checked to be in a directory only we can enter.

    No half-close: when the host end of a stream reaches EOF, Firecracker
    shuts the guest's socket down in both directions, and it does not pass a
    guest's half-close on to the host (its `csm/connection.rs`). So
    `send_eof()` here ends the whole stream; protocols on these ports delimit
    their own messages (the length-prefixed frames do) and close when done.
    """

    def __init__(
        self,
        uds_path: Path,
        *,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        max_streams: int = MAX_STREAMS,
        vmm_uid: int | None = None,
    ) -> None:
        super().__init__(max_streams)
        self.uds_path = Path(uds_path)
        # A VMM in a cell of its own runs as its own uid (`vmm_uid`), in a directory
        # that uid owns: only it may connect, and its listeners are its to reach.
        self._vmm_uid = os.geteuid() if vmm_uid is None else vmm_uid
        self._timeout = handshake_timeout
        self._listeners: dict[int, tuple[socket.socket, Path, tuple[int, int]]] = {}
        check_unix_path(listener_path(self.uds_path, MAX_U32))

    async def _open(self, port: int) -> tuple[socket.socket, bytes]:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(self._timeout):
                try:
                    await loop.sock_connect(sock, os.fspath(self.uds_path))
                except OSError as exc:
                    # No socket, or nobody accepts on it: the VMM is gone.
                    gone = exc.errno in (errno.ENOENT, errno.ECONNREFUSED)
                    raise _connect_error(f"the VM's vsock socket {self.uds_path}", exc,
                                         TransportClosed if gone else PortError) from None
                # One write: Firecracker reads the command without waiting for more.
                await loop.sock_sendall(sock, encode_connect(port))
                buffer = b""
                while True:
                    try:
                        chunk = await loop.sock_recv(sock, 4096)
                    except OSError as exc:
                        raise _connect_error(f"guest port {port}", exc) from None
                    if not chunk:
                        raise PortError(
                            f"guest port {port} refused the stream: the VMM closed it "
                            "without 'OK' (nothing listens there in the guest, or the guest "
                            "did not answer); check the guest agent is up"
                        )
                    buffer += chunk
                    reply = parse_connect_reply(buffer, port)
                    if reply is not None:
                        return sock, reply[1]
        except TimeoutError:
            sock.close()
            raise PortError(
                f"no answer to CONNECT {port} within {self._timeout:g} s; "
                "the VMM or the guest is stuck"
            ) from None
        except BaseException:
            sock.close()
            raise

    def _start_serving(self, port: int, handler: Handler) -> None:
        path = listener_path(self.uds_path, port)
        parent = path.parent
        try:
            st = parent.stat()
        except OSError as exc:
            raise PortError(f"cannot use {parent} for vsock sockets: {exc.strerror}") from None
        if st.st_uid not in (os.geteuid(), self._vmm_uid) or st.st_mode & 0o077:
            raise PortError(
                f"{parent} is open to other users; vsock sockets must be in a private "
                "(0700) directory owned by tkbox's user or the VMM's"
            )
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()  # a stale socket from a VM that died with this directory
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(os.fspath(path))
            os.chmod(path, 0o600)
            if self._vmm_uid != os.geteuid():
                os.chown(path, self._vmm_uid, -1)  # the VMM connects to it
            listener.listen(64)
            listener.setblocking(False)
            sst = path.lstat()
        except OSError as exc:
            listener.close()
            raise PortError(f"cannot listen on {path}: {exc.strerror}") from None
        self._listeners[port] = (listener, path, (sst.st_dev, sst.st_ino))
        self._spawn(
            self._accept_loop(listener, port, handler, _peer_is(self._vmm_uid)),
            f"tkbox-hybrid-accept-{port}",
        )

    async def _stop_serving(self) -> None:
        for listener, path, ident in self._listeners.values():
            listener.close()
            with contextlib.suppress(OSError):
                st = path.lstat()
                if (st.st_dev, st.st_ino) == ident:  # only the socket we made
                    path.unlink()
        self._listeners.clear()


# --- AF_VSOCK ------------------------------------------------------------------


def _vsock_socket() -> socket.socket:
    if not hasattr(socket, "AF_VSOCK"):
        raise PortError("this Python has no AF_VSOCK support")
    try:
        sock = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except OSError as exc:
        raise PortError(
            f"cannot open an AF_VSOCK socket: {exc.strerror}; load the vsock modules"
        ) from None
    sock.setblocking(False)
    return sock


def _peer_cid(conn: socket.socket) -> int | None:
    try:
        cid = conn.getpeername()[0]
    except (OSError, IndexError, TypeError):
        return None
    return cid if type(cid) is int else None


async def _vsock_connect(cid: int, port: int, timeout: float) -> socket.socket:
    loop = asyncio.get_running_loop()
    sock = _vsock_socket()
    try:
        async with asyncio.timeout(timeout):
            await loop.sock_connect(sock, (cid, port))
    except TimeoutError:
        sock.close()
        raise PortError(f"no answer from vsock {cid}:{port} within {timeout:g} s") from None
    except OSError as exc:
        sock.close()
        raise _connect_error(f"vsock port {port} of CID {cid}", exc) from None
    except BaseException:
        sock.close()
        raise
    return sock


def _vsock_listener(port: int) -> socket.socket:
    sock = _vsock_socket()
    try:
        sock.bind((socket.VMADDR_CID_ANY, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise PortError(f"cannot listen on vsock port {port}: {exc.strerror}") from None
    return sock


Route = Callable[[socket.socket], None]


class _SharedListener:
    """One listening socket for a port, shared by every guest's Ports object.

    The host has one vsock port space for all its guests, so two boxes serving
    port 1025 must share the listener. Each accepted connection goes to the
    route registered for the peer's CID (as the kernel reports it, which the
    guest cannot choose); a connection from any other CID is closed at once.
    """

    _by_key: dict[tuple[int, int], _SharedListener] = {}

    def __init__(
        self,
        port: int,
        sock: socket.socket,
        peer_key: Callable[[socket.socket], int | None],
    ) -> None:
        self.port = port
        self._sock = sock
        self._peer_key = peer_key
        self.routes: dict[int, Route] = {}
        self._loop = asyncio.get_running_loop()
        # Owned by this listener: `leave` by its last route cancels and awaits it.
        self._owner = TaskOwner(f"tkbox-vsock-accept-{port}")
        self._task = self._owner.spawn(self._accept())

    @classmethod
    def join(
        cls,
        port: int,
        cid: int,
        route: Route,
        make_socket: Callable[[int], socket.socket],
        peer_key: Callable[[socket.socket], int | None],
    ) -> _SharedListener:
        loop = asyncio.get_running_loop()
        key = (id(loop), port)
        shared = cls._by_key.get(key)
        if shared is None or shared._loop is not loop or shared._task.done():
            shared = cls(port, make_socket(port), peer_key)
            cls._by_key[key] = shared
        if cid in shared.routes:
            raise PortError(f"vsock port {port} is already being served for CID {cid}")
        shared.routes[cid] = route
        return shared

    async def leave(self, cid: int) -> None:
        self.routes.pop(cid, None)
        if self.routes:
            return
        key = (id(self._loop), self.port)
        if self._by_key.get(key) is self:
            del self._by_key[key]
        try:
            await cancel_and_wait(self._task)
        finally:
            self._sock.close()

    async def _accept(self) -> None:
        while True:
            try:
                conn, _ = await self._loop.sock_accept(self._sock)
            except OSError as exc:
                if exc.errno in _TRANSIENT_ACCEPT_ERRORS:
                    log.warning("vsock port %d: accept failed (%s)", self.port, exc.strerror)
                    await asyncio.sleep(0.1)
                    continue
                log.warning("vsock port %d: listener failed (%s)", self.port, exc.strerror)
                return
            cid = self._peer_key(conn)
            route = self.routes.get(cid) if cid is not None else None
            if route is None:
                log.warning("vsock port %d: closed a stream from unknown CID %s", self.port, cid)
                conn.close()
            else:
                route(conn)


class VhostVsockHostPorts(_SocketPorts):
    """Host side over `AF_VSOCK` to the guest with CID `guest_cid`."""

    def __init__(
        self,
        guest_cid: int,
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
        max_streams: int = MAX_STREAMS,
    ) -> None:
        super().__init__(max_streams)
        if type(guest_cid) is not int or not 1 <= guest_cid < MAX_U32 or guest_cid == HOST_CID:
            raise PortError(f"{guest_cid!r} is not a guest CID")
        self.guest_cid = guest_cid
        self._timeout = connect_timeout
        self._joined: list[_SharedListener] = []

    async def _open(self, port: int) -> tuple[socket.socket, bytes]:
        return await _vsock_connect(self.guest_cid, port, self._timeout), b""

    def _start_serving(self, port: int, handler: Handler) -> None:
        shared = _SharedListener.join(
            port,
            self.guest_cid,
            lambda conn: self._dispatch(port, handler, conn),
            _vsock_listener,
            _peer_cid,
        )
        self._joined.append(shared)

    async def _stop_serving(self) -> None:
        for shared in self._joined:
            await shared.leave(self.guest_cid)
        self._joined.clear()


class GuestVsockPorts(_SocketPorts):
    """The guest's side of either vsock flavour: the host is CID `host_cid` (2)."""

    def __init__(
        self,
        *,
        host_cid: int = HOST_CID,
        connect_timeout: float = CONNECT_TIMEOUT,
        max_streams: int = MAX_STREAMS,
    ) -> None:
        super().__init__(max_streams)
        self.host_cid = host_cid
        self._timeout = connect_timeout
        self._listeners: list[socket.socket] = []

    async def _open(self, port: int) -> tuple[socket.socket, bytes]:
        return await _vsock_connect(self.host_cid, port, self._timeout), b""

    def _start_serving(self, port: int, handler: Handler) -> None:
        listener = _vsock_listener(port)
        self._listeners.append(listener)
        host = self.host_cid
        self._spawn(
            self._accept_loop(listener, port, handler, lambda conn: _peer_cid(conn) == host),
            f"tkbox-vsock-accept-{port}",
        )

    async def _stop_serving(self) -> None:
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
