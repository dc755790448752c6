"""The commands door's pure core: what a `Bash` decision is asked about.

Only commands started from the host run (CLI, SDK, MCP server, Action). Each
is one `Bash` decision before it starts: the shell-quoted command line, the
working directory, the per-command environment and the SHA-256 of stdin. A
per-command environment may not set names that change what runs without
showing in the command line; those are refused here, before the signer is
asked, with the name that was refused.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from typing import Any

from tkbox.errors import Refused, UserError

#: exact names that change what runs (loader, shell start-up, search paths)
FORBIDDEN_NAMES = frozenset({
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_BIND_NOW", "PATH", "BASH_ENV", "ENV",
    "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS", "CDPATH", "GLOBIGNORE",
    "ZDOTDIR", "HOME", "SHELL", "TMPDIR", "GCONV_PATH", "HOSTALIASES", "LOCPATH",
    "NLSPATH", "MALLOC_CHECK_", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS",
    "CLASSPATH", "GEM_HOME", "GEM_PATH", "BUNDLE_GEMFILE", "GOFLAGS", "CARGO_HOME",
    "RUSTC_WRAPPER", "RUSTFLAGS", "CC", "CXX", "LDFLAGS", "CFLAGS", "MAKEFLAGS",
    "EDITOR", "VISUAL", "PAGER", "SSH_ASKPASS", "SUDO_ASKPASS", "HTTP_PROXY", "HTTPS_PROXY",
    "http_proxy", "https_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT",
})
#: prefixes of names that steer interpreters and tools
FORBIDDEN_PREFIXES = ("LD_", "GIT_", "PYTHON", "NODE_", "NPM_CONFIG_", "PERL5", "PERL_",
                      "RUBY", "BASH_FUNC_", "DYLD_", "LUA_", "PIP_", "UV_", "CONDA",
                      "JULIA_", "R_", "PHP_", "DOTNET_", "COMPlus_")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_ARGV = 4096
MAX_ARG = 128 * 1024
MAX_ENV = 256
MAX_STDIN = 16 * 1024 * 1024


@dataclass(frozen=True)
class BashRequest:
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    stdin_sha256: str | None

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def resource(self) -> dict[str, Any]:
        return {"command": self.command}

    def context(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "cwd": self.cwd, "env": dict(sorted(self.env.items())),
                "stdin_sha256": self.stdin_sha256}


def env_name_refusal(name: str) -> str | None:
    """Why `name` may not be set per command, or None."""
    if not _NAME.match(name):
        return f"{name!r} is not a valid environment variable name"
    upper = name.upper()
    if name in FORBIDDEN_NAMES or upper in FORBIDDEN_NAMES:
        return f"{name} changes what runs without showing in the command line"
    if upper.startswith(tuple(p.upper() for p in FORBIDDEN_PREFIXES)):
        return f"{name} steers an interpreter or tool without showing in the command line"
    return None


def build_request(argv: list[str], cwd: str | None, env: dict[str, str] | None,
                  stdin: bytes | None) -> BashRequest:
    """Validate a command from the host; raises UserError (malformed) or Refused."""
    if not argv or len(argv) > MAX_ARGV:
        raise UserError("give a command to run after '--', e.g. tkbox exec demo -- ls")
    for a in argv:
        if not isinstance(a, str) or "\0" in a or len(a) > MAX_ARG:
            raise UserError("command arguments must be strings without NUL bytes, "
                            f"at most {MAX_ARG} bytes each")
    cwd = cwd or "/workspace"
    if not cwd.startswith("/") or "\0" in cwd:
        raise UserError(f"working directory {cwd!r} must be an absolute path in the box")
    env = dict(env or {})
    if len(env) > MAX_ENV:
        raise UserError(f"at most {MAX_ENV} environment variables per command")
    for k, v in env.items():
        why = env_name_refusal(k)
        if why:
            raise Refused(f"refused: {why}; set it in the command line instead "
                          f"(e.g. sh -c '{k}=... cmd')")
        if "\0" in v or len(v) > MAX_ARG:
            raise UserError(f"environment value of {k} is too long or holds a NUL byte")
    if stdin is not None and len(stdin) > MAX_STDIN:
        raise UserError(f"stdin is larger than {MAX_STDIN // (1024 * 1024)} MiB")
    digest = hashlib.sha256(stdin).hexdigest() if stdin is not None else None
    return BashRequest(tuple(argv), cwd, env, digest)
