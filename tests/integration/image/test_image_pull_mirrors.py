"""Pulls through mirrors: a real registry (Debian's docker-registry) on loopback over TLS with
a test CA, and stand-in mirrors in front of it (`StandInMirror`) where a mirror must have a
path prefix or must lie.

Docker Hub's names are pulled as a person writes them (`NAME:TAG`, so
`docker.io/library/NAME:TAG`) with docker.io's mirror on loopback. No test reaches beyond
loopback: an audit hook refuses, and records, every name lookup and connection that is not
to 127.0.0.1 (`loopback_only`), so a pull that tried Docker Hub itself fails and shows it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tkbox.errors import RegistryError, TkboxError, UserError
from tkbox.image import oci
from tkbox.image.mirrors import Settings, load
from tkbox.image.store import ImageStore
from tkbox.image.testing import (
    LayerBuilder,
    LocalRegistry,
    ScratchCA,
    StandInMirror,
    free_port,
    push_image,
    push_index,
)

pytestmark = pytest.mark.integration

REPO = "library/tkbox-mirror-test"  # as docker.io names `tkbox-mirror-test`
NAME = "tkbox-mirror-test"


# --- nothing but loopback ---------------------------------------------------------------

_DIALLED: list[Any] = []
_ACTIVE = [False]
_LOOPBACK = ("127.0.0.1", b"127.0.0.1")


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _ACTIVE[0]:
        return
    if event == "socket.getaddrinfo":
        _DIALLED.append(args[0])
        if args[0] not in _LOOPBACK:
            raise OSError(f"test: {args[0]!r} is not loopback; refused")
    elif event == "socket.connect" and isinstance(args[1], tuple):
        _DIALLED.append(args[1][0])
        if args[1][0] not in _LOOPBACK:
            raise OSError(f"test: {args[1][0]!r} is not loopback; refused")


sys.addaudithook(_hook)  # audit hooks cannot be removed: it acts only while a test asks


@pytest.fixture
def dialled() -> Iterator[list[Any]]:
    """Every host this process looks up or connects to while the test runs; anything but
    127.0.0.1 is refused."""
    _DIALLED.clear()
    _ACTIVE[0] = True
    try:
        yield _DIALLED
    finally:
        _ACTIVE[0] = False


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    d = tmp_path_factory.mktemp("registry")
    reg = LocalRegistry(d, ScratchCA.create(d / "tls")).start()
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def images(registry: LocalRegistry) -> dict[str, Any]:
    """`library/tkbox-mirror-test:1` (a manifest), `:multi` (an index), and `other:1`."""
    with registry.client() as c:
        one = push_image(c, REPO, "1", [LayerBuilder().file("which", b"one\n").tar()])
        amd = push_image(c, REPO, None, [LayerBuilder().file("which", b"amd64\n").tar()])
        arm = push_image(c, REPO, None, [LayerBuilder().file("which", b"arm\n").tar()],
                         architecture="arm64")
        index = push_index(c, REPO, "multi", [(arm, "linux", "arm64", "v8"),
                                              (amd, "linux", "amd64", None)])
        other = push_image(c, "library/other", "1",
                           [LayerBuilder().file("which", b"other\n").tar()])
    return {"one": one, "amd": amd, "index": index, "other": other}


@pytest.fixture
def mirror(registry: LocalRegistry) -> Iterator[StandInMirror]:
    m = StandInMirror(registry).start()
    yield m
    m.stop()


def store_for(tmp_path: Path, registry: LocalRegistry, *mirrors: str, only: bool = False,
              config: Path | None = None, ca: bool = True) -> ImageStore:
    async def no_wait(_: float) -> None:
        return None

    return ImageStore(tmp_path / "images", ca_bundle=registry.ca.ca_pem if ca else None,
                      registries=load(Settings(tuple(mirrors), only,
                                               str(config) if config else None)),
                      sleep=no_wait)


def left_behind(store: ImageStore, *digests: str) -> list[str]:
    """What a refused pull left in the store: names, root disks, temporaries, the digests."""
    out = [f"name {k}" for k in store.names.read()]
    out += [f"disk {p.name}" for p in store.root.glob("disks/sha256/*")]
    out += [f"tmp {p.name}" for p in store.root.glob("tmp/*/*")]
    out += [f"blob {d}" for d in digests if store.has_blob(d)]
    return out


# --- through a mirror -------------------------------------------------------------------------


def test_docker_hub_short_name_is_pulled_through_its_mirror_and_nothing_else(
        registry: LocalRegistry, images: dict[str, Any], mirror: StandInMirror,
        tmp_path: Path, dialled: list[Any]) -> None:
    """`NAME:TAG` is docker.io/library/NAME:TAG, asked of docker.io's mirror on loopback
    only; the name keeps the mirror and the digest it answered."""
    with store_for(tmp_path, registry, f"docker.io={mirror.url}") as store:
        image = asyncio.run(store.pull(f"{NAME}:1"))
        assert image.ref == f"docker.io/{REPO}:1"
        assert image.digest == images["one"].digest
        assert image.pulled_from == {"registry": "docker.io", "endpoint": mirror.url + "/v2",
                                     "mirror": True, "answered": images["one"].digest}
        assert store.inspect(f"{NAME}:1").pulled_from == image.pulled_from  # kept
    assert set(dialled) == {"127.0.0.1"}, dialled  # Docker Hub itself was never asked
    assert mirror.requests[0] == f"/v2/{REPO}/manifests/1?ns=docker.io"  # containerd's ns
    assert all("?ns=docker.io" in r for r in mirror.requests)


def test_an_index_by_digest_through_a_mirror_yields_exactly_that_digest(
        registry: LocalRegistry, images: dict[str, Any], mirror: StandInMirror,
        tmp_path: Path, dialled: list[Any]) -> None:
    with store_for(tmp_path, registry, f"docker.io={mirror.url}", only=True) as store:
        image = asyncio.run(store.pull(f"{NAME}@{images['index']}"))
    assert image.digest == images["amd"].digest and image.index_digest == images["index"]
    assert image.pulled_from is not None and image.pulled_from["answered"] == images["index"]
    assert set(dialled) == {"127.0.0.1"}


@pytest.mark.parametrize("root, override", [("/docker-hub/v2", False),
                                            ("/v2/hub-proxy", True)])
def test_a_mirror_under_a_path_prefix_as_proxies_serve_one(
        registry: LocalRegistry, images: dict[str, Any], tmp_path: Path, root: str,
        override: bool, dialled: list[Any]) -> None:
    """Artifactory and Nexus put their API under a path (`/docker-hub/v2`), Harbor's proxy
    projects after `/v2` (`/v2/hub-proxy`, hosts.toml's `override_path`): both as containerd
    asks them."""
    m = StandInMirror(registry, root=root).start()
    try:
        if override:
            certs = tmp_path / "certs.d"
            (certs / "docker.io").mkdir(parents=True)
            (certs / "docker.io" / "hosts.toml").write_text(textwrap.dedent(f'''\
                [host."https://{m.host}{root}"]
                  capabilities = ["pull", "resolve"]
                  override_path = true
                '''))
            store = store_for(tmp_path, registry, config=certs, only=True)
        else:
            store = store_for(tmp_path, registry, f"docker.io=https://{m.host}/docker-hub",
                              only=True)
        with store:
            image = asyncio.run(store.pull(f"{NAME}:multi"))
        assert image.digest == images["amd"].digest
        assert image.pulled_from is not None
        assert image.pulled_from["endpoint"] == f"https://{m.host}{root}"
        assert m.requests and all(r.startswith(f"{root}/{REPO}/") for r in m.requests)
    finally:
        m.stop()
    assert set(dialled) == {"127.0.0.1"}


def test_containerd_hosts_toml_with_its_own_ca(
        registry: LocalRegistry, images: dict[str, Any], mirror: StandInMirror,
        tmp_path: Path, dialled: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A certs.d directory as containerd reads it: the mirror trusted through the CA that
    its hosts.toml names (a path relative to the file), not through any other trust."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    certs = tmp_path / "certs.d"
    (certs / "docker.io").mkdir(parents=True)
    (certs / "docker.io" / "mirror-ca.pem").write_bytes(registry.ca.ca_pem.read_bytes())
    (certs / "docker.io" / "hosts.toml").write_text(textwrap.dedent(f'''\
        server = "https://registry-1.docker.io"

        [host."https://{mirror.host}"]
          capabilities = ["pull", "resolve"]
          ca = "mirror-ca.pem"
        '''))
    with store_for(tmp_path, registry, config=certs, ca=False) as store:
        image = asyncio.run(store.pull(f"docker.io/{REPO}:1"))
    assert image.digest == images["one"].digest
    assert image.pulled_from is not None and image.pulled_from["mirror"] is True
    assert set(dialled) == {"127.0.0.1"}
    # without the CA of hosts.toml, the same mirror does not verify: the pull stops there
    (certs / "docker.io" / "hosts.toml").write_text(
        f'[host."https://{mirror.host}"]\n  capabilities = ["pull", "resolve"]\n')
    with store_for(tmp_path / "2", registry, config=certs, ca=False) as store, \
            pytest.raises(RegistryError, match=f"certificate of {mirror.host} does not verify.*"
                                               "ca = \"FILE\" in hosts.toml.*fix the mirror"):
        asyncio.run(store.pull(f"docker.io/{REPO}:1"))


def test_the_cli_pulls_through_the_mirror_its_flags_name(
        registry: LocalRegistry, images: dict[str, Any], mirror: StandInMirror,
        tmp_path: Path) -> None:
    """`tkbox image pull NAME:TAG --registry-mirror docker.io=URL` in its own process, with
    the same audit hook: only loopback is asked, and the output names the mirror."""
    log = tmp_path / "dialled.json"
    wrapper = textwrap.dedent(f"""\
        import json, sys
        seen = []
        def hook(event, args):
            if event == "socket.getaddrinfo":
                seen.append(str(args[0]))
            elif event == "socket.connect" and isinstance(args[1], tuple):
                seen.append(str(args[1][0]))
            else:
                return
            with open({str(log)!r}, "w") as f:
                json.dump(seen, f)
            if seen[-1] not in ("127.0.0.1", "b'127.0.0.1'"):
                raise OSError("not loopback")
        sys.addaudithook(hook)
        from tkbox.cli.main import main
        sys.argv = ["tkbox"] + sys.argv[1:]
        main()
        """)
    env = {**os.environ, "TKBOX_HOME": str(tmp_path / "home"),
           "SSL_CERT_FILE": str(registry.ca.ca_pem)}
    p = subprocess.run([sys.executable, "-c", wrapper, "image", "pull", f"{NAME}:1",
                        "--registry-mirror", f"docker.io={mirror.url}",
                        "--registry-mirror-only"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"pulled docker.io/{REPO}:1" in p.stdout
    assert f"from {mirror.url}/v2 (a mirror of docker.io, which answered " \
           f"{images['one'].digest})" in p.stdout
    assert set(json.loads(log.read_text())) == {"127.0.0.1"}


# --- a mirror is not trusted for content --------------------------------------------------------


def test_a_mirror_that_answers_another_digest_is_refused_and_nothing_is_kept(
        registry: LocalRegistry, images: dict[str, Any], tmp_path: Path,
        dialled: list[Any]) -> None:
    """Asked for one digest, the mirror sends another image's manifest (with its own
    Docker-Content-Digest, so the header agrees with the bytes): refused by the digest
    asked for, in one line naming the mirror and the fix; nothing stays in the store."""
    one, other = images["one"], images["other"]

    def swap(path: str, status: int, headers: dict[str, str],
             body: bytes) -> tuple[int, dict[str, str], bytes]:
        if path.endswith(f"/manifests/{one.digest}"):
            return 200, {"content-type": oci.OCI_MANIFEST,
                         "docker-content-digest": other.digest}, other.manifest
        return status, headers, body

    m = StandInMirror(registry, rewrite=swap).start()
    try:
        with store_for(tmp_path, registry, f"docker.io={m.url}") as store:
            with pytest.raises(RegistryError) as e:
                asyncio.run(store.pull(f"{NAME}@{one.digest}"))
            msg = str(e.value)
            assert "\n" not in msg
            assert f"on the mirror {m.url}/v2 sent a manifest that hashes to {other.digest}, " \
                   f"not the {one.digest} asked for" in msg
            assert "a mirror is not trusted for content" in msg
            assert "fix the mirror or remove it (--registry-mirror docker.io=…)" in msg
            assert left_behind(store, one.digest, other.digest,
                               *(d for d, _ in other.layers)) == []
    finally:
        m.stop()
    assert set(dialled) == {"127.0.0.1"}  # refused: not fallen back to Docker Hub


def test_a_mirror_whose_manifest_does_not_hash_to_the_digest_it_claims_is_refused(
        registry: LocalRegistry, images: dict[str, Any], tmp_path: Path,
        dialled: list[Any]) -> None:
    """A tag answered with a Docker-Content-Digest the bytes do not hash to."""
    one, other = images["one"], images["other"]

    def claim(path: str, status: int, headers: dict[str, str],
              body: bytes) -> tuple[int, dict[str, str], bytes]:
        if path.endswith("/manifests/1"):
            return status, {**headers, "docker-content-digest": other.digest}, body
        return status, headers, body

    m = StandInMirror(registry, rewrite=claim).start()
    try:
        with store_for(tmp_path, registry, f"docker.io={m.url}") as store:
            with pytest.raises(RegistryError, match=(
                    f"on the mirror {m.url}/v2: the manifest hashes to {one.digest} but the "
                    f"mirror says '{other.digest}'; refused: a mirror is not trusted for "
                    "content; fix the mirror or remove it")):
                asyncio.run(store.pull(f"{NAME}:1"))
            assert left_behind(store, one.digest, other.digest) == []
    finally:
        m.stop()
    assert set(dialled) == {"127.0.0.1"}


def test_a_mirror_that_serves_a_layer_with_other_bytes_is_refused(
        registry: LocalRegistry, images: dict[str, Any], tmp_path: Path,
        dialled: list[Any]) -> None:
    one = images["one"]
    layer = one.layers[0][0]

    def corrupt(path: str, status: int, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        if path.endswith(f"/blobs/{layer}"):
            return status, headers, body[:-1] + bytes([body[-1] ^ 1])
        return status, headers, body

    m = StandInMirror(registry, rewrite=corrupt).start()
    try:
        with store_for(tmp_path, registry, f"docker.io={m.url}") as store:
            with pytest.raises(RegistryError, match=(
                    f"blob {layer} failed verification.*; fix the mirror {m.url}/v2 or "
                    r"remove it \(--registry-mirror docker.io=…\), then pull again")):
                asyncio.run(store.pull(f"{NAME}:1"))
            assert left_behind(store, layer) == []
    finally:
        m.stop()


# --- a mirror that is down ------------------------------------------------------------------


def test_a_mirror_that_is_down_passes_the_pull_to_the_next(
        registry: LocalRegistry, images: dict[str, Any], mirror: StandInMirror,
        tmp_path: Path, dialled: list[Any]) -> None:
    down = f"https://127.0.0.1:{free_port()}"
    with store_for(tmp_path, registry, f"docker.io={down}", f"docker.io={mirror.url}",
                   only=True) as store:
        image = asyncio.run(store.pull(f"{NAME}:multi"))
    assert image.digest == images["amd"].digest
    assert image.pulled_from is not None and image.pulled_from["endpoint"] == mirror.url + "/v2"
    assert set(dialled) == {"127.0.0.1"}


def test_a_registry_is_asked_itself_after_its_mirror_fails(
        registry: LocalRegistry, images: dict[str, Any], tmp_path: Path,
        dialled: list[Any]) -> None:
    """Without --registry-mirror-only the registry itself comes after its mirrors."""
    down = f"https://127.0.0.1:{free_port()}"
    with store_for(tmp_path, registry, f"{registry.host}={down}") as store:
        image = asyncio.run(store.pull(f"{registry.host}/{REPO}:1"))
    assert image.digest == images["one"].digest
    assert image.pulled_from == {"registry": registry.host,
                                 "endpoint": f"https://{registry.host}/v2", "mirror": False,
                                 "answered": images["one"].digest}


def test_when_the_mirror_and_the_registry_are_both_down_one_line_names_both(
        registry: LocalRegistry, tmp_path: Path, dialled: list[Any]) -> None:
    mirror_port, registry_port = free_port(), free_port()
    with store_for(tmp_path, registry,
                   f"127.0.0.1:{registry_port}=https://127.0.0.1:{mirror_port}") as store:
        with pytest.raises(RegistryError) as e:
            asyncio.run(store.pull(f"127.0.0.1:{registry_port}/{REPO}:1"))
        msg = str(e.value)
        assert "\n" not in msg
        assert f"the mirror https://127.0.0.1:{mirror_port}/v2 could not be reached" in msg
        assert f"127.0.0.1:{registry_port} could not be reached" in msg
        assert "check the mirrors (--registry-mirror" in msg
        assert left_behind(store) == []


def test_a_mirror_without_the_image_passes_the_tag_on_and_not_found_names_every_endpoint(
        registry: LocalRegistry, images: dict[str, Any], mirror: StandInMirror,
        tmp_path: Path, dialled: list[Any]) -> None:
    """A mirror answering 404 is not the last word; when all do, the error is a UserError
    (the name is wrong), naming each endpoint asked."""
    empty = StandInMirror(registry, root="/nothing/v2").start()  # 404s every path it is asked

    def missing(path: str, status: int, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        return 404, {}, b""

    empty.rewrite = missing
    try:
        with store_for(tmp_path, registry, f"docker.io={empty.url}",
                       f"docker.io={mirror.url}", only=True) as store:
            assert asyncio.run(store.pull(f"{NAME}:1")).digest == images["one"].digest
            with pytest.raises(UserError, match=(
                    "not found on any of 2 endpoints .*the mirror .*/nothing/v2: .*not found.*"
                    f"the mirror {mirror.url}/v2: .*not found")):
                asyncio.run(store.pull(f"{NAME}:no-such-tag"))
    finally:
        empty.stop()
    assert set(dialled) == {"127.0.0.1"}


def test_bad_settings_are_one_line_errors(tmp_path: Path) -> None:
    certs = tmp_path / "certs.d"
    (certs / "docker.io").mkdir(parents=True)
    (certs / "docker.io" / "hosts.toml").write_text(
        '[host."https://mirror.test"]\nskip_verify = true\n')
    with pytest.raises(UserError, match="tkbox does not skip TLS checks"):
        load(Settings(config=str(certs)))
    (certs / "docker.io" / "hosts.toml").write_text('[host."https://mirror.test"]\nca = "no"\n')
    with pytest.raises(UserError, match="cannot read the CA"):
        load(Settings(config=str(certs)))
    (certs / "docker.io" / "hosts.toml").unlink()
    with pytest.raises(UserError, match="has no hosts.toml"):
        load(Settings(config=str(certs)))
    with pytest.raises(UserError, match="no such directory"):
        load(Settings(config=str(tmp_path / "missing")))
    dj = tmp_path / "daemon.json"
    dj.write_text(json.dumps({"registry-mirrors": ["https://m.test"], "debug": True}))
    table = load(Settings(config=str(dj)))
    assert [e.url for e in table.endpoints("docker.io")] == [
        "https://m.test/v2", "https://registry-1.docker.io/v2"]
    with pytest.raises(TkboxError, match="configured twice"):
        load(Settings(("docker.io=https://n.test",), config=str(dj)))


# --- the daemon's settings are the CLI's ----------------------------------------------------

TKBOX = [sys.executable, "-m", "tkbox.cli"]


def cli_env(home: Path, ca: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TKBOX_")}
    env.update({"TKBOX_HOME": str(home), "PYTHONUNBUFFERED": "1", "SSL_CERT_FILE": str(ca)})
    return env


@pytest.mark.parametrize("args, why", [
    (["--registry-mirror", "docker.io=http://mirror.internal"], "plain http"),
    (["--registry-mirror", "https://mirror.internal"], "must be REGISTRY=URL"),
    (["--registry-mirror-only"], "needs a mirror"),
    (["--registry-config", "/nonexistent/certs.d"], "no such directory"),
])
def test_daemon_refuses_bad_registry_settings_before_it_starts(
        tmp_path: Path, args: list[str], why: str) -> None:
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    done = subprocess.run([*TKBOX, "daemon", "--unrecorded", *args],
                          env=cli_env(home, Path("/dev/null")), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tkbox: error: ") and why in lines[0], lines
    assert not (home / "run" / "daemon.sock").exists()


def test_image_pull_goes_where_the_running_daemon_pulls(
        registry: LocalRegistry, images: dict[str, Any], mirror: StandInMirror,
        tmp_path: Path) -> None:
    """A daemon started with a mirror shows its settings in /v1/info; `tkbox image pull`
    without flags then pulls through that mirror, and a flag of its own replaces them."""
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    env = cli_env(home, registry.ca.ca_pem)
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*TKBOX, "daemon", "--unrecorded", "--registry-mirror",
                                 f"docker.io={mirror.url}", "--registry-mirror-only"],
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        from tkbox.sdk import Client

        sock = home / "run" / "daemon.sock"
        deadline = time.monotonic() + 90
        while not sock.exists():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        with Client(sock) as c:
            assert c.info()["registries"] == {"mirrors": [f"docker.io={mirror.url}"],
                                              "mirror_only": True, "config": None}
        assert f"tkbox: registry docker.io: mirror {mirror.url}/v2\n" in log.read_text()
        p = subprocess.run([*TKBOX, "image", "pull", f"{NAME}:1", "--json"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        pulled = json.loads(p.stdout.splitlines()[-1])
        assert pulled["digest"] == images["one"].digest
        assert pulled["pulled_from"] == {"registry": "docker.io", "endpoint": mirror.url + "/v2",
                                         "mirror": True, "answered": images["one"].digest}
        # a flag of its own replaces the daemon's settings: here, a mirror that is down
        down = f"https://127.0.0.1:{free_port()}"
        p = subprocess.run([*TKBOX, "image", "pull", f"{NAME}:1", "--registry-mirror",
                            f"docker.io={down}", "--registry-mirror-only"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 4 and f"the mirror {down}/v2 could not be reached" in p.stderr
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
