"""Pure parts of the SDK, the agent job and the image layer merge: no daemon, no VM."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import httpx
import pytest

from tkbox.agents.image import merge
from tkbox.agents.job import _claude_result
from tkbox.errors import GuestError, HostError, Refused, SignerUnavailable, UserError
from tkbox.sdk import error_from, run_body, secret_specs, secret_values


@pytest.mark.parametrize("kind, cls", [("UserError", UserError), ("Refused", Refused),
                                       ("GuestError", GuestError), ("PatchRefused", Refused),
                                       ("SignerUnavailable", SignerUnavailable),
                                       ("Whatever", HostError)])
def test_daemon_errors_become_the_error_they_name(kind: str, cls: type) -> None:
    resp = httpx.Response(400, json={"error": {"type": kind, "message": "it said\nno"}})
    err = error_from(resp)
    assert type(err) is cls and str(err) == "it said no"


def test_a_non_json_error_is_a_one_line_user_error() -> None:
    err = error_from(httpx.Response(502, text="<html>\nbad gateway\n</html>"))
    assert isinstance(err, UserError) and "\n" not in str(err) and "502" in str(err)


def test_secret_references_pass_and_values_are_refused_without_echo() -> None:
    assert secret_specs({"GH": "env:GH_TOKEN@api.github.com"}) == \
        ["GH=env:GH_TOKEN@api.github.com"]
    assert secret_specs(["K=file:/run/k@h.test;header=x-api-key"]) == \
        ["K=file:/run/k@h.test;header=x-api-key"]
    for bad in ({"K": "sk-live-abcdef"}, {"K": "env:NOHOST"}, ["K"], {"bad name": "env:X@h"}):
        with pytest.raises(UserError) as e:
            secret_specs(bad)  # type: ignore[arg-type]
        assert "sk-live-abcdef" not in str(e.value)


def test_secret_values_are_read_here_and_a_missing_one_is_named_not_shown() -> None:
    assert secret_values(["K=env:MYKEY@h.test"], {"MYKEY": "v4lue-123456789"}) == \
        {"K": "v4lue-123456789"}
    with pytest.raises(UserError, match="MYKEY is not set"):
        secret_values(["K=env:MYKEY@h.test"], {})


def test_run_body_sends_values_only_with_their_references(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MYKEY", "v4lue-123456789")
    b = run_body(name="n", image="i", workspace=tmp_path, secrets={"K": "env:MYKEY@h.test"})
    assert b["secrets"] == ["K=env:MYKEY@h.test"] and b["secret_values"] == {
        "K": "v4lue-123456789"}
    b = run_body(name=None, image="i", workspace=tmp_path)
    assert "secrets" not in b and "secret_values" not in b and b["name"] == ""


def test_claude_result_reads_only_known_fields_of_the_last_result_line() -> None:
    out = b"noise\n" + json.dumps({"type": "result", "subtype": "success", "is_error": False,
                                  "num_turns": 4, "usage": {"input_tokens": 1},
                                  "evil": "x" * 10}).encode()
    r = _claude_result(out)
    assert r == {"subtype": "success", "is_error": False, "num_turns": 4,
                 "usage": {"input_tokens": 1}}
    assert _claude_result(b"not json\n[1]\n") is None


def _tar(path: Path, members: list[tuple[str, bytes | None, bytes]]) -> None:
    with tarfile.open(path, "w") as t:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = (data or b"").decode()
                t.addfile(info)
            elif data is not None:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            else:
                t.addfile(info)


def test_merge_puts_the_layer_on_top_of_the_base(tmp_path: Path) -> None:
    _tar(tmp_path / "base.tar", [("./usr/local/bin", None, tarfile.DIRTYPE),
                                 ("./etc/os-release", b"debian\n", tarfile.REGTYPE),
                                 ("./usr/local/bin/claude", b"old", tarfile.REGTYPE)])
    _tar(tmp_path / "layer.tar", [("usr/local/bin/claude", b"../lib/x", tarfile.SYMTYPE),
                                  ("usr/local/lib/x", b"new", tarfile.REGTYPE)])
    merge(tmp_path / "base.tar", tmp_path / "layer.tar", tmp_path / "out.tar")
    with tarfile.open(tmp_path / "out.tar") as t:
        names = [m.name for m in t.getmembers()]
        assert names.count("usr/local/bin/claude") == 1 and "./usr/local/bin/claude" not in names
        assert t.getmember("usr/local/bin/claude").issym()
        assert t.extractfile("usr/local/lib/x").read() == b"new"  # type: ignore[union-attr]


@pytest.mark.parametrize("name, kind", [
    ("etc/passwd", tarfile.REGTYPE),                 # outside usr/local
    ("usr/local/../../etc/shadow", tarfile.REGTYPE),  # climbing out
    ("/usr/local/bin/x", tarfile.REGTYPE),            # absolute
    ("usr/local/bin/dev", tarfile.CHRTYPE),           # a device node
    ("usr/local/bin/h", tarfile.LNKTYPE),             # a hard link to anything
])
def test_merge_refuses_a_layer_from_a_hostile_box(tmp_path: Path, name: str, kind: bytes):
    """The layer is the output of a box; it may only add files under usr/local/."""
    _tar(tmp_path / "base.tar", [("./etc/os-release", b"debian\n", tarfile.REGTYPE)])
    _tar(tmp_path / "layer.tar", [(name, b"x" if kind == tarfile.REGTYPE else None, kind)])
    with pytest.raises(HostError, match="refused"):
        merge(tmp_path / "base.tar", tmp_path / "layer.tar", tmp_path / "out.tar")
    assert not (tmp_path / "out.tar").exists(), "nothing half-written"
