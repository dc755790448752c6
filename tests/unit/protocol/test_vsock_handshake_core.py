"""The sans-IO core of the hybrid vsock handshake: `CONNECT <port>\\n` / `OK <n>\\n`.

Byte-level behaviour from tests/testdata/firecracker/VSOCK-NOTES.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tkbox.protocol.ports import PortError
from tkbox.protocol.vsock import (
    MAX_REPLY_LINE,
    MAX_U32,
    check_port,
    check_unix_path,
    encode_connect,
    listener_path,
    parse_connect_reply,
)


def test_connect_line_is_the_documented_bytes() -> None:
    # VSOCK-NOTES.md: `CONNECT 52\n` is 43 4F 4E 4E 45 43 54 20 35 32 0A.
    assert encode_connect(52) == bytes.fromhex("434f4e4e4543542035320a")
    assert encode_connect(1024) == b"CONNECT 1024\n"
    assert encode_connect(MAX_U32) == b"CONNECT 4294967295\n"


@pytest.mark.parametrize("port", [-1, MAX_U32 + 1, True, 1024.0, "1024", None])
def test_connect_refuses_ports_that_are_not_u32(port: object) -> None:
    with pytest.raises(PortError, match="vsock port must be"):
        encode_connect(port)  # type: ignore[arg-type]
    with pytest.raises(PortError):
        check_port(port)


def test_ok_line_gives_the_host_port_and_nothing_left() -> None:
    assert parse_connect_reply(b"OK 1073741824\n", 1024) == (1073741824, b"")
    assert parse_connect_reply(b"OK 0\n", 1024) == (0, b"")
    assert parse_connect_reply(b"OK 4294967295\n", 1024) == (MAX_U32, b"")


def test_bytes_after_the_ok_line_belong_to_the_stream() -> None:
    assert parse_connect_reply(b"OK 1073741824\nhello\n\x00world", 1024) == (
        1073741824,
        b"hello\n\x00world",
    )
    # Even a second OK line is payload: the VMM injects exactly one line.
    assert parse_connect_reply(b"OK 7\nOK 8\n", 1024) == (7, b"OK 8\n")


@pytest.mark.parametrize("partial", [b"", b"O", b"OK", b"OK ", b"OK 10737"])
def test_incomplete_line_asks_for_more(partial: bytes) -> None:
    assert parse_connect_reply(partial, 1024) is None


@pytest.mark.parametrize(
    "line",
    [
        b"ok 5\n",  # Firecracker writes upper case; nothing else is accepted
        b"OK\n",
        b"OK \n",
        b"OK  5\n",
        b"OK 5 \n",
        b"OK 5\r\n",
        b"OK +5\n",
        b"OK -1\n",
        b"OK 05\n",
        b"OK 0x10\n",
        b"OK 4294967296\n",
        b"OK \xd9\xa5\n",  # ARABIC-INDIC DIGIT FIVE: a digit to str.isdigit, not to us
        b"ERR connection refused\n",
        b"\n",
        b"CONNECT 1024\n",
    ],
)
def test_malformed_reply_is_refused_with_port_error(line: bytes) -> None:
    with pytest.raises(PortError, match="not 'OK <port>'"):
        parse_connect_reply(line, 1024)


def test_reply_without_newline_within_the_bound_is_refused() -> None:
    """An endless line from the socket must not make the host buffer without bound."""
    with pytest.raises(PortError, match="no newline"):
        parse_connect_reply(b"O" * MAX_REPLY_LINE, 1024)
    # The newline has to be inside the bound, even if it arrived in the same read.
    with pytest.raises(PortError, match="no newline"):
        parse_connect_reply(b"O" * MAX_REPLY_LINE + b"\n", 1024)


@given(st.binary(max_size=200))
def test_any_reply_bytes_parse_or_raise_port_error_only(data: bytes) -> None:
    try:
        result = parse_connect_reply(data, 7)
    except PortError:
        return
    if result is None:
        assert b"\n" not in data[:MAX_REPLY_LINE] and len(data) < MAX_REPLY_LINE
    else:
        port, rest = result
        # Accepted only in canonical form: it prints back as the bytes it came from.
        assert data == b"OK %d\n" % port + rest
        assert 0 <= port <= MAX_U32


def test_guest_to_host_listener_is_uds_path_underscore_port() -> None:
    # VSOCK-NOTES.md: uds_path "./v.sock" and port 52 give "./v.sock_52".
    assert listener_path(Path("/run/vm/v.sock"), 52) == Path("/run/vm/v.sock_52")
    assert listener_path(Path("v.sock"), 1025) == Path("v.sock_1025")


def test_unix_socket_path_over_107_bytes_is_refused_with_advice() -> None:
    check_unix_path(Path("/" + "a" * 106))
    with pytest.raises(PortError, match="shorter TKBOX_HOME"):
        check_unix_path(Path("/" + "a" * 107))
