"""The remote signer client's settings: each mistake one line before anything connects,
and a token that is not a token is never sent."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from tkbox.errors import SignerUnavailable, UserError
from tkbox.record import remote
from tkbox.record.remote import (
    EnvToken,
    FileToken,
    GithubToken,
    RemoteSignerClient,
    parse_url,
    token_source,
)


def test_a_remote_signer_is_an_https_url_with_a_host() -> None:
    assert parse_url("https://signer.example:7390") == ("signer.example", 7390)
    assert parse_url("https://127.0.0.1") == ("127.0.0.1", 443)
    for bad in ("http://signer:1", "https://", "https://u:p@h:1", "https://h:1/path",
                "https://h:x", "signer:7390", "https://h:1?q"):
        with pytest.raises(UserError) as info:
            parse_url(bad)
        assert "\n" not in str(info.value)
        assert "p@" not in str(info.value) or bad == "https://u:p@h:1"


def test_token_sources() -> None:
    assert token_source("github:aud") == GithubToken("aud")
    assert token_source("file:/x") == FileToken(Path("/x"))
    assert token_source("env:TOK") == EnvToken("TOK")
    for bad in ("github:", "x:y", "file", ""):
        with pytest.raises(UserError):
            token_source(bad)


def test_a_client_must_say_who_the_daemon_is(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="needs to know who this daemon is"):
        RemoteSignerClient("https://h:1", ca=None)
    with pytest.raises(UserError, match="go together"):
        RemoteSignerClient("https://h:1", ca=None, cert=tmp_path / "c", token=EnvToken("T"))


def test_an_empty_or_oversized_token_is_refused_before_it_is_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "t"
    f.write_text("")
    with pytest.raises(SignerUnavailable, match="is empty"):
        asyncio.run(FileToken(f).get())
    monkeypatch.setenv("TOK", "x" * 20000)
    with pytest.raises(SignerUnavailable, match="not a token"):
        asyncio.run(EnvToken("TOK").get())
    with pytest.raises(SignerUnavailable, match="cannot read the workload token"):
        asyncio.run(FileToken(tmp_path / "missing").get())
    monkeypatch.delenv("ACTIONS_ID_TOKEN_REQUEST_URL", raising=False)
    with pytest.raises(SignerUnavailable, match="id-token: write"):
        asyncio.run(GithubToken("aud").get())


class _Transport:
    def abort(self) -> None:
        # as asyncio's TLS transport once its connection is lost: its protocol is gone
        raise AttributeError("'NoneType' object has no attribute '_abort'")


class _Writer:
    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.transport = _Transport()

    def close(self) -> None:
        pass

    async def wait_closed(self) -> None:
        raise self.error


@pytest.mark.parametrize("error", [ConnectionResetError(104, "reset by peer"),
                                   ssl.SSLError("bad record mac"), BrokenPipeError()])
def test_a_connection_that_broke_while_closing_is_not_aborted(error: BaseException) -> None:
    # the signer resets a daemon it refuses; closing the broken TLS connection must
    # not end `tkbox daemon` with asyncio's AttributeError instead of its refusal
    asyncio.run(remote._closed(_Writer(error)))  # type: ignore[arg-type]
