"""HybridVsockHostPorts against a fake VMM speaking Firecracker's Unix-socket convention.

The fake listens on `uds_path` and answers `CONNECT <port>\\n` the way a given
test needs (OK and a pipe, a refusal, garbage, an endless line, EOF, silence);
guest → host streams are made the way Firecracker makes them, by connecting to
`<uds_path>_<port>`. Behaviour per VSOCK-NOTES.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from tkbox.protocol.ports import PortError
from tkbox.protocol.streams import ByteStream
from tkbox.protocol.vsock import HybridVsockHostPorts, listener_path

pytestmark = pytest.mark.integration

FIRST_HOST_PORT = 1 << 30  # what Firecracker allocates first after boot


def run(coro: Coroutine[Any, Any, None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(20):
            await coro

    asyncio.run(bounded())


@pytest.fixture
def vmdir(tmp_path: Path) -> Path:
    d = tmp_path / "vm"
    d.mkdir(mode=0o700)
    return d


Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.write_eof()


class FakeVMM:
    """The host end of a hybrid vsock device: `behaviours[port]` answers CONNECT."""

    def __init__(self, uds_path: Path, behaviours: dict[int, Behaviour]) -> None:
        self.uds_path = uds_path
        self.behaviours = behaviours
        self.first_reads: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> FakeVMM:
        self._server = await asyncio.start_unix_server(self._client, path=str(self.uds_path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            # Like Firecracker: the command must be there, whole, at the first read.
            first = await reader.read(32)
            self.first_reads.append(first)
            words = first.split()
            behaviour = None
            if first.endswith(b"\n") and len(words) == 2 and words[0].lower() == b"connect":
                behaviour = self.behaviours.get(int(words[1]))
            if behaviour is not None:
                await behaviour(reader, writer)
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._tasks.discard(task)


def ok_then(
    after: Behaviour, line: bytes = b"OK %d\n" % FIRST_HOST_PORT, glued: bytes = b""
) -> Behaviour:
    async def behaviour(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(line + glued)  # one write: the payload shares the OK line's segment
        await writer.drain()
        await after(reader, writer)

    return behaviour


async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    return None


def reply(data: bytes) -> Behaviour:
    async def behaviour(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()

    return behaviour


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.Event().wait()


async def read_all(stream: ByteStream) -> bytes:
    parts = []
    while chunk := await stream.receive():
        parts.append(chunk)
    return b"".join(parts)


# --- host → guest ----------------------------------------------------------------


def test_connect_sends_one_command_and_gets_a_byte_pipe(vmdir: Path) -> None:
    async def main() -> None:
        uds = vmdir / "v.sock"
        async with FakeVMM(uds, {1024: ok_then(echo)}) as vmm:
            ports = HybridVsockHostPorts(uds)
            stream = await ports.connect(1024)
            payload = os.urandom(1 << 20)

            async def send() -> None:
                await stream.send_all(payload)
                await stream.send_eof()

            _, echoed = await asyncio.gather(send(), read_all(stream))
            assert echoed == payload
            await stream.aclose()
            await ports.aclose()
            assert vmm.first_reads == [b"CONNECT 1024\n"]

    run(main())


def test_payload_in_the_same_segment_as_ok_reaches_the_stream_first(vmdir: Path) -> None:
    async def main() -> None:
        uds = vmdir / "v.sock"
        async with FakeVMM(uds, {1024: ok_then(echo, glued=b"guest spoke first|")}):
            ports = HybridVsockHostPorts(uds)
            stream = await ports.connect(1024)
            await stream.send_all(b"then the host")
            await stream.send_eof()
            assert await read_all(stream) == b"guest spoke first|then the host"
            await ports.aclose()

    run(main())


def test_small_receives_drain_the_read_ahead_in_order(vmdir: Path) -> None:
    async def main() -> None:
        uds = vmdir / "v.sock"
        async with FakeVMM(uds, {1024: ok_then(close_at_once, glued=b"abcdef")}):
            ports = HybridVsockHostPorts(uds)
            stream = await ports.connect(1024)
            assert [await stream.receive(4), await stream.receive(4)] == [b"abcd", b"ef"]
            assert await stream.receive() == b""
            await ports.aclose()

    run(main())


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        (close_at_once, "refused the stream"),
        (reply(b"OK 12"), "refused the stream"),  # EOF in the middle of the line
        (reply(b"ERR no listener\n"), "not 'OK <port>'"),
        (reply(b"OK 0012\n"), "not 'OK <port>'"),
        (reply(b"O" * 4096), "no newline"),
    ],
    ids=["refused", "early-eof", "garbage", "non-canonical", "over-long-line"],
)
def test_bad_answers_raise_port_error(vmdir: Path, behaviour: Behaviour, message: str) -> None:
    async def main() -> None:
        uds = vmdir / "v.sock"
        async with FakeVMM(uds, {1024: behaviour}):
            ports = HybridVsockHostPorts(uds)
            with pytest.raises(PortError, match=message):
                await ports.connect(1024)
            await ports.aclose()

    run(main())


def test_stuck_vmm_times_out_with_port_error(vmdir: Path) -> None:
    async def main() -> None:
        uds = vmdir / "v.sock"
        async with FakeVMM(uds, {1024: silent}):
            ports = HybridVsockHostPorts(uds, handshake_timeout=0.2)
            with pytest.raises(PortError, match="no answer to CONNECT 1024 within 0.2 s"):
                await ports.connect(1024)
            await ports.aclose()

    run(main())


def test_missing_socket_says_the_vm_is_not_running(vmdir: Path) -> None:
    async def main() -> None:
        ports = HybridVsockHostPorts(vmdir / "v.sock")
        with pytest.raises(PortError, match="is the VM running"):
            await ports.connect(1024)
        await ports.aclose()

    run(main())


def test_connect_after_aclose_is_refused(vmdir: Path) -> None:
    async def main() -> None:
        ports = HybridVsockHostPorts(vmdir / "v.sock")
        await ports.aclose()
        await ports.aclose()  # idempotent
        with pytest.raises(PortError, match="closed"):
            await ports.connect(1024)

    run(main())


def test_aclose_tears_down_connected_streams(vmdir: Path) -> None:
    async def main() -> None:
        uds = vmdir / "v.sock"
        async with FakeVMM(uds, {1024: ok_then(silent)}):
            ports = HybridVsockHostPorts(uds)
            stream = await ports.connect(1024)
            await ports.aclose()
            assert await stream.receive() == b""

    run(main())


def test_connect_is_bounded_by_max_streams(vmdir: Path) -> None:
    async def main() -> None:
        uds = vmdir / "v.sock"
        async with FakeVMM(uds, {1024: ok_then(silent)}):
            ports = HybridVsockHostPorts(uds, max_streams=2)
            a = await ports.connect(1024)
            await ports.connect(1024)
            with pytest.raises(PortError, match="too many open port streams"):
                await ports.connect(1024)
            await a.aclose()
            await ports.connect(1024)  # room again once one is closed
            await ports.aclose()

    run(main())


# --- guest → host ------------------------------------------------------------------


async def dial(uds: Path, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """What Firecracker does when the guest connects to (CID 2, port)."""
    return await asyncio.open_unix_connection(str(listener_path(uds, port)))


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


def test_serve_listens_on_uds_underscore_port_0600_with_raw_bytes(vmdir: Path) -> None:
    async def main() -> None:
        uds = vmdir / "v.sock"
        ports = HybridVsockHostPorts(uds)

        async def upper(stream: ByteStream) -> None:
            data = await read_all(stream)
            await stream.send_all(data.upper())
            await stream.aclose()

        ports.serve(1025, upper)
        path = vmdir / "v.sock_1025"
        st = path.lstat()
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        # No preamble this way: the guest's first byte is the stream's first byte.
        reader, writer = await dial(uds, 1025)
        writer.write(b"CONNECT 9\nraw")
        writer.write_eof()
        assert await reader.read() == b"CONNECT 9\nRAW"
        await close(writer)
        await ports.aclose()
        assert not path.exists()

    run(main())


def test_serve_refuses_socket_dir_open_to_other_users(vmdir: Path) -> None:
    """A listener in a directory others can enter would let any local user talk
    to the guest's boot-config or egress port: refuse to create it."""

    async def main() -> None:
        vmdir.chmod(0o755)
        ports = HybridVsockHostPorts(vmdir / "v.sock")

        async def never(stream: ByteStream) -> None:
            raise AssertionError("no stream should arrive")

        with pytest.raises(PortError, match="private"):
            ports.serve(1026, never)
        assert not (vmdir / "v.sock_1026").exists()
        await ports.aclose()

    run(main())


def test_serve_twice_on_one_port_is_refused(vmdir: Path) -> None:
    async def main() -> None:
        ports = HybridVsockHostPorts(vmdir / "v.sock")

        async def handler(stream: ByteStream) -> None:
            await stream.aclose()

        ports.serve(1025, handler)
        with pytest.raises(PortError, match="already"):
            ports.serve(1025, handler)
        await ports.aclose()

    run(main())


def test_failing_handler_does_not_stop_the_listener(vmdir: Path) -> None:
    async def main() -> None:
        uds = vmdir / "v.sock"
        ports = HybridVsockHostPorts(uds)
        calls = 0

        async def flaky(stream: ByteStream) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("handler bug")
            await stream.send_all(b"second")
            await stream.aclose()

        ports.serve(1025, flaky)
        reader, writer = await dial(uds, 1025)
        assert await reader.read() == b""  # the failed handler's stream is closed for it
        await close(writer)
        reader, writer = await dial(uds, 1025)
        assert await reader.read() == b"second"
        await close(writer)
        await ports.aclose()

    run(main())


def test_guest_flood_of_streams_is_bounded_by_max_streams(vmdir: Path) -> None:
    """A guest opening streams without end must not grow the daemon's tasks and
    sockets without bound: past max_streams, a new stream is closed at once."""

    async def main() -> None:
        uds = vmdir / "v.sock"
        ports = HybridVsockHostPorts(uds, max_streams=2)
        gate = asyncio.Event()
        served = 0

        async def hold(stream: ByteStream) -> None:
            nonlocal served
            served += 1
            await stream.send_all(b"hi")
            await gate.wait()
            await stream.aclose()

        ports.serve(1025, hold)
        held = [await dial(uds, 1025) for _ in range(2)]
        for reader, _ in held:
            assert await reader.readexactly(2) == b"hi"
        reader, writer = await dial(uds, 1025)
        assert await reader.read() == b""  # refused: closed without a handler
        await close(writer)
        assert served == 2
        gate.set()
        for _, w in held:
            await close(w)
        await ports.aclose()

    run(main())


def test_aclose_cancels_handlers_and_unlinks_every_listener(vmdir: Path) -> None:
    async def main() -> None:
        uds = vmdir / "v.sock"
        ports = HybridVsockHostPorts(uds)
        started = asyncio.Event()
        cancelled = asyncio.Event()

        async def forever(stream: ByteStream) -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        ports.serve(1025, forever)
        ports.serve(1026, forever)
        reader, writer = await dial(uds, 1026)
        await started.wait()
        await ports.aclose()
        assert cancelled.is_set()
        assert await reader.read() == b""
        await close(writer)
        assert sorted(p.name for p in vmdir.iterdir()) == []
        with pytest.raises(PortError, match="closed"):
            ports.serve(1025, forever)

    run(main())


def test_stale_socket_is_replaced_but_other_files_are_not(vmdir: Path) -> None:
    async def main() -> None:
        import socket

        uds = vmdir / "v.sock"
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(vmdir / "v.sock_1025"))
        stale.close()
        (vmdir / "v.sock_1026").write_text("not a socket")
        ports = HybridVsockHostPorts(uds)

        async def handler(stream: ByteStream) -> None:
            await stream.send_all(b"fresh")
            await stream.aclose()

        ports.serve(1025, handler)
        reader, writer = await dial(uds, 1025)
        assert await reader.read() == b"fresh"
        await close(writer)
        with pytest.raises(PortError, match="cannot listen"):
            ports.serve(1026, handler)
        assert (vmdir / "v.sock_1026").read_text() == "not a socket"
        await ports.aclose()

    run(main())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_stream_from_another_user_is_closed_even_if_the_dir_was_opened() -> None:
    """If the VM's directory and socket were opened up by mistake, another local
    user still cannot feed the guest's boot-config or egress port: the peer's
    uid (SO_PEERCRED) must be ours, as the VMM's is."""
    # Not under pytest's tmp_path: its parents are closed to other users.
    vmdir = Path(tempfile.mkdtemp(prefix="tkbox-vsock-test-"))

    async def main() -> None:
        uds = vmdir / "v.sock"
        ports = HybridVsockHostPorts(uds)
        served = []

        async def handler(stream: ByteStream) -> None:
            served.append(True)
            await stream.send_all(b"served")
            await stream.aclose()

        ports.serve(1026, handler)
        vmdir.chmod(0o755)
        (vmdir / "v.sock_1026").chmod(0o666)
        child = (
            "import os, socket, sys\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            f"s.connect({str(vmdir / 'v.sock_1026')!r})\n"
            "sys.stdout.write(repr(s.recv(100)))\n"
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", child, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await proc.communicate()
        assert proc.returncode == 0
        assert out == b"b''"  # connected, then closed at once
        reader, writer = await dial(uds, 1026)  # our own user is still served
        assert await reader.read() == b"served"
        await close(writer)
        assert served == [True]
        vmdir.chmod(0o700)
        await ports.aclose()

    try:
        run(main())
    finally:
        shutil.rmtree(vmdir)
