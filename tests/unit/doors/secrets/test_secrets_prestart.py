"""Before a box starts and before a command runs: no value goes into the box.

Attack stopped: a value that reaches the VM another way than through the door
(a file in the checkout, a command line, an environment value, stdin) would
make every guarantee of the door moot.
"""

from __future__ import annotations

import base64
import urllib.parse
from pathlib import Path

import pytest

from tkbox.doors.secrets.prestart import check_command, check_workspace, load_secrets
from tkbox.doors.secrets.spec import Secret
from tkbox.errors import Refused, UserError

GH = "ghp_PrestartValue12345"
AK = "sk-ant-OtherValue-98765"


def _secrets() -> list[Secret]:
    return load_secrets(["GH=env:X@api.example", "AK=env:Y@b.example;header=x-api-key"],
                        {"GH": GH, "AK": AK})


@pytest.mark.parametrize("content", [
    GH.encode(), GH.upper().encode(), base64.b64encode(b"x:" + GH.encode()),
    urllib.parse.quote(GH, safe="").encode(), GH.encode().hex().encode(),
])
def test_workspace_file_holding_a_value_refuses_the_box(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.py").write_bytes(b"TOKEN = '" + content + b"'\n")
    with pytest.raises(UserError) as e:
        check_workspace(_secrets(), tmp_path)
    assert "src/config.py" in e.value.message and "secret GH" in e.value.message
    assert GH not in e.value.message and GH[4:12] not in e.value.message


def test_clean_workspace_and_skipped_places(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("nothing here\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text(GH)  # .git is not scanned (never a value copied)
    (tmp_path / ".env").write_text(GH)  # a credential file: never copied, so not a refusal
    check_workspace(_secrets(), tmp_path)


@pytest.mark.parametrize("argv,env,stdin,where", [
    (["curl", "-H", f"Authorization: Bearer {GH}"], None, None, "command line"),
    (["sh"], {"TOKEN": AK}, None, "environment variable TOKEN"),
    (["sh"], None, b"export T=" + base64.b64encode(GH.encode()), "stdin"),
])
def test_command_holding_a_value_is_refused(argv: list[str], env: dict[str, str] | None,
                                            stdin: bytes | None, where: str) -> None:
    with pytest.raises(Refused) as e:
        check_command(_secrets(), argv, env, stdin)
    assert where in e.value.reason
    assert GH not in e.value.reason and AK not in e.value.reason


def test_command_with_placeholder_passes() -> None:
    s = _secrets()
    check_command(s, ["curl", "-H", f"Authorization: Bearer {s[0].placeholder.decode()}"],
                  None, None)


def test_values_sent_for_unknown_names_and_bad_inspect_refused() -> None:
    with pytest.raises(UserError):
        load_secrets([], {"GH": GH})
    with pytest.raises(UserError):
        load_secrets([], {}, inspect="everything")


def test_terminal_input_never_completes_a_value() -> None:
    """Attack: type the value into a terminal a key at a time."""
    from tkbox.doors.secrets.prestart import InputGuard

    g = InputGuard(_secrets())
    sent = b""
    with pytest.raises(Refused) as e:
        for ch in ("echo " + GH.upper()).encode():
            sent += g.feed(bytes([ch]))
    assert "secret GH" in e.value.reason
    assert sent == b"echo " + GH.upper().encode()[:3]


def test_terminal_input_near_misses_pass_whole() -> None:
    from tkbox.doors.secrets.prestart import InputGuard

    g = InputGuard(_secrets())
    typed = ("ls; " + GH[:10] + "X\n").encode()
    sent = b"".join(g.feed(bytes([c])) for c in typed)
    assert sent == typed
