"""The commands door refuses environments that change what runs unseen."""

from __future__ import annotations

import hashlib

import pytest

from tkbox.doors.commands.core import build_request, env_name_refusal
from tkbox.errors import Refused, UserError


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "ld_preload", "PATH",
                                  "BASH_ENV", "ENV", "GIT_SSH_COMMAND", "GIT_CONFIG_GLOBAL",
                                  "PYTHONPATH", "PYTHONSTARTUP", "NODE_OPTIONS", "PERL5OPT",
                                  "RUBYOPT", "BASH_FUNC_ls%%", "PROMPT_COMMAND", "IFS",
                                  "HTTPS_PROXY", "SSL_CERT_FILE", "PIP_INDEX_URL"])
def test_names_that_steer_execution_are_refused(name: str) -> None:
    with pytest.raises(Refused) as exc:
        build_request(["true"], None, {name: "x"}, None)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("name", ["CI", "DEBUG", "MY_SETTING", "LANG", "TZ"])
def test_ordinary_names_pass(name: str) -> None:
    assert env_name_refusal(name) is None
    assert build_request(["true"], None, {name: "1"}, None).env == {name: "1"}


def test_the_decision_shows_the_shell_quoted_command_and_stdin_digest() -> None:
    req = build_request(["sh", "-c", "echo 'a b'; ls"], "/workspace/src", {"CI": "1"}, b"in")
    assert req.resource() == {"command": "sh -c 'echo '\"'\"'a b'\"'\"'; ls'"}
    ctx = req.context()
    assert ctx["cwd"] == "/workspace/src" and ctx["env"] == {"CI": "1"}
    assert ctx["stdin_sha256"] == hashlib.sha256(b"in").hexdigest()


@pytest.mark.parametrize("argv, cwd", [([], None), (["a\0b"], None), (["ls"], "relative"),
                                        (["ls"], "/a\0")])
def test_malformed_commands_are_user_errors(argv: list[str], cwd: str | None) -> None:
    with pytest.raises(UserError):
        build_request(argv, cwd, None, None)
