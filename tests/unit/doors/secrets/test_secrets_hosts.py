"""Which hosts a box's secrets door reads: bound, model hosts, everything under inspect all."""

from __future__ import annotations

import pytest

from tkbox.doors.secrets.hosts import read_hosts
from tkbox.doors.secrets.spec import Secret, SecretSpec
from tkbox.errors import UserError

FIXED = {"anthropic": ("api.anthropic.com",), "openai": ("api.openai.com",),
         "claude-code": ("api.anthropic.com", "claude.ai"), "pypi": ("index.example",)}


def expand(name: str) -> tuple[str, ...] | None:
    return FIXED.get(name)


def _secret(*hosts: str) -> Secret:
    return Secret(SecretSpec("GH", "env", "X", hosts), b"v" * 12, b"tkbox_GH_x")


def test_binding_allows_443_and_is_read() -> None:
    h = read_hosts(["pypi"], [_secret("api.github.example")], "", expand=expand)
    assert "api.github.example:443" in h.allow
    assert h.bound == {"api.github.example"} and h.inspect == frozenset()
    assert h.models == frozenset()


def test_model_hosts_only_when_reachable() -> None:
    h = read_hosts(["anthropic", "other.example"], [], "", expand=expand)
    assert h.models == {"api.anthropic.com"} and h.any
    assert not read_hosts(["other.example"], [], "", expand=expand).any


def test_inspect_all_reads_every_allowed_name_never_an_address() -> None:
    h = read_hosts(["pypi", "10.1.2.3:8080", "a.example:22"], [], "all", expand=expand)
    assert h.inspect == {"index.example", "a.example"}


def test_marked_model_hosts_must_be_allowed() -> None:
    h = read_hosts(["llm.example"], [], "", ["LLM.example."], expand=expand)
    assert h.models == {"llm.example"}
    with pytest.raises(UserError) as e:
        read_hosts([], [], "", ["llm.example"], expand=expand)
    assert "add --allow llm.example" in e.value.message
