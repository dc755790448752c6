"""Real clients (curl, git, pip) through the door to HTTPS origins on loopback.

The origins use a test CA; their names are mapped with an egress-hosts file;
127.0.0.1 is reached only through an egress permit, as an operator would set
for a mirror on the host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from netdoor_rig import NAMES, DoorThread, HTTPSOrigin, TestCA

from tkbox.doors.network import OperatorConfig

pytestmark = pytest.mark.integration

if shutil.which("curl") is None:
    pytest.skip("curl is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestCA, HTTPSOrigin, Path]]:
    d = tmp_path_factory.mktemp("netdoor")
    ca = TestCA(d)
    root = d / "www"
    root.mkdir()
    (root / "hello").write_text("hello through the door\n")
    hosts = d / "egress-hosts"
    hosts.write_text("# test mirrors\n127.0.0.1 " + " ".join(NAMES) + "\n")
    origin = HTTPSOrigin(root, ca)
    yield ca, origin, hosts
    origin.close()


def operator(hosts: Path, permit: bool = True) -> OperatorConfig:
    return OperatorConfig.from_flags(permit=["127.0.0.1/32"] if permit else [], hosts_file=hosts)


def curl(door: DoorThread, ca: TestCA, url: str, *extra: str) -> subprocess.Popen[str]:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.Popen(
        [
            "curl",
            "-sS",
            "--max-time",
            "60",
            "--proxy",
            door.proxy,
            "--cacert",
            str(ca.ca_pem),
            "-w",
            "\n%{http_code} %{http_connect}",
            *extra,
            url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_pending(door: DoorThread, n: int = 1) -> list[object]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pending = door.pending()
        if len(pending) >= n:
            return pending
        time.sleep(0.05)
    raise AssertionError("no approval became pending")


def test_curl_to_an_allowed_host_passes_and_is_recorded(
    site: tuple[TestCA, HTTPSOrigin, Path],
) -> None:
    ca, origin, hosts = site
    door = DoorThread([f"origin.test:{origin.port}"], operator(hosts))
    try:
        p = curl(door, ca, f"https://origin.test:{origin.port}/hello")
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert out.startswith("hello through the door\n") and out.rstrip().endswith("200 200")
        [d] = [r for r in door.records("tkbox.decision")]
        assert d["action"] == "Connect" and d["resource"]["addresses"] == ["127.0.0.1"]
        assert d["context"]["operator"] == ["permit 127.0.0.1/32"]
        [c] = door.wait_records("tkbox.complete")
        assert c["outcome"]["server_name"] == "origin.test" and c["outcome"]["bytes_down"] > 0
    finally:
        door.close()


def test_curl_to_a_host_not_allowed_waits_and_passes_once_approved(
    site: tuple[TestCA, HTTPSOrigin, Path],
) -> None:
    ca, origin, hosts = site
    door = DoorThread([], operator(hosts))
    try:
        p = curl(door, ca, f"https://origin.test:{origin.port}/hello")
        [pending] = wait_pending(door)
        assert pending.host == "origin.test" and pending.port == origin.port  # type: ignore[attr-defined]
        door.call(door.board.answer("demo", pending.id, allow=True))  # type: ignore[attr-defined]
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert out.startswith("hello through the door")
        states = [r["body"]["state"] for r in door.records("tkbox.approval")]
        assert states == ["pending", "approved"]
    finally:
        door.close()


def test_curl_to_a_host_not_allowed_fails_when_denied(
    site: tuple[TestCA, HTTPSOrigin, Path],
) -> None:
    ca, origin, hosts = site
    door = DoorThread([], operator(hosts))
    try:
        p = curl(door, ca, f"https://origin.test:{origin.port}/hello", "-v")
        [pending] = wait_pending(door)
        door.call(door.board.answer("demo", pending.id, allow=False))  # type: ignore[attr-defined]
        out, err = p.communicate(timeout=60)
        assert p.returncode != 0
        assert "403" in err and "denied by a person on the host" in err
    finally:
        door.close()


def test_curl_to_a_host_not_allowed_fails_after_the_wait(
    site: tuple[TestCA, HTTPSOrigin, Path],
) -> None:
    ca, origin, hosts = site
    door = DoorThread([], operator(hosts), wait_seconds=1.0)
    try:
        p = curl(door, ca, f"https://origin.test:{origin.port}/hello", "-v")
        out, err = p.communicate(timeout=60)
        assert p.returncode != 0 and "nobody answered approval 1 within 1 s" in err
        assert door.pending() == []
    finally:
        door.close()


def test_loopback_origin_is_refused_forever_without_the_permit(
    site: tuple[TestCA, HTTPSOrigin, Path],
) -> None:
    ca, origin, hosts = site
    door = DoorThread([f"origin.test:{origin.port}"], operator(hosts, permit=False))
    try:
        p = curl(door, ca, f"https://origin.test:{origin.port}/hello", "-v")
        out, err = p.communicate(timeout=60)
        assert p.returncode != 0 and "403" in err and "loopback" in err
        assert door.pending() == [] and door.records("tkbox.decision") == []
    finally:
        door.close()


def test_curl_with_sni_for_another_host_is_cut(site: tuple[TestCA, HTTPSOrigin, Path]) -> None:
    """Stops domain fronting with a real client: CONNECT other.test, SNI origin.test."""
    ca, origin, hosts = site
    door = DoorThread([f"other.test:{origin.port}"], operator(hosts))
    try:
        p = curl(
            door,
            ca,
            f"https://origin.test:{origin.port}/hello",
            "--connect-to",
            f"origin.test:{origin.port}:other.test:{origin.port}",
        )
        out, err = p.communicate(timeout=60)
        assert p.returncode != 0
        [c] = door.wait_records("tkbox.complete")
        assert c["outcome"]["ended"] == "refused" and "'origin.test'" in c["outcome"]["reason"]
    finally:
        door.close()


def test_plain_http_metadata_request_is_refused_with_the_reason(
    site: tuple[TestCA, HTTPSOrigin, Path],
) -> None:
    ca, origin, hosts = site
    door = DoorThread([], operator(hosts))
    try:
        p = curl(door, ca, "http://169.254.169.254/latest/meta-data/", "-i")
        out, err = p.communicate(timeout=60)
        assert "403 Forbidden" in out and "cloud metadata service" in out
    finally:
        door.close()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_clone_over_https_through_the_door(
    site: tuple[TestCA, HTTPSOrigin, Path], tmp_path: Path
) -> None:
    ca, origin, hosts = site
    www = Path(origin.server.RequestHandlerClass.keywords["directory"])  # type: ignore[attr-defined]
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", str(work)], check=True, env=env)
    (work / "README").write_text("cloned through the door\n")
    subprocess.run(["git", "-C", str(work), "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "one"], check=True, env=env)
    bare = www / "repo.git"
    if bare.exists():
        shutil.rmtree(bare)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, env=env)
    subprocess.run(["git", "-C", str(bare), "update-server-info"], check=True, env=env)
    door = DoorThread([f"git.test:{origin.port}"], operator(hosts))
    try:
        out = tmp_path / "clone"
        r = subprocess.run(
            [
                "git",
                "-c",
                f"http.proxy={door.proxy}",
                "-c",
                f"http.sslCAInfo={ca.ca_pem}",
                "clone",
                "-q",
                f"https://git.test:{origin.port}/repo.git",
                str(out),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert (out / "README").read_text() == "cloned through the door\n"
        assert {d["resource"]["host"] for d in door.records("tkbox.decision")} == {"git.test"}
    finally:
        door.close()


def _wheel(path: Path) -> None:
    dist = "tkboxprobe-0.1.dist-info"
    files = {
        "tkboxprobe/__init__.py": "",
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: tkboxprobe\nVersion: 0.1\n",
        f"{dist}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    files[f"{dist}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)


def test_pip_download_through_the_door(
    site: tuple[TestCA, HTTPSOrigin, Path], tmp_path: Path
) -> None:
    ca, origin, hosts = site
    www = Path(origin.server.RequestHandlerClass.keywords["directory"])  # type: ignore[attr-defined]
    (www / "packages").mkdir(exist_ok=True)
    _wheel(www / "packages" / "tkboxprobe-0.1-py3-none-any.whl")
    (www / "simple" / "tkboxprobe").mkdir(parents=True, exist_ok=True)
    (www / "simple" / "tkboxprobe" / "index.html").write_text(
        "<!DOCTYPE html><html><body>"
        '<a href="../../packages/tkboxprobe-0.1-py3-none-any.whl">'
        "tkboxprobe-0.1-py3-none-any.whl</a>"
        "</body></html>\n"
    )
    door = DoorThread([f"mirror.test:{origin.port}"], operator(hosts))
    try:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull}
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-cache-dir",
                "--disable-pip-version-check",
                "--proxy",
                door.proxy,
                "--cert",
                str(ca.ca_pem),
                "--index-url",
                f"https://mirror.test:{origin.port}/simple/",
                "-d",
                str(tmp_path / "dl"),
                "tkboxprobe",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert (tmp_path / "dl" / "tkboxprobe-0.1-py3-none-any.whl").exists()
        assert door.records("tkbox.egress.refused") == []
    finally:
        door.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_real_hello_retry_request_is_rechecked_and_passes(
    site: tuple[TestCA, HTTPSOrigin, Path],
) -> None:
    """A real HelloRetryRequest (client key share X25519, server P-256 only) goes through,
    and the door saw and checked the second ClientHello."""
    import socket

    ca, _origin, hosts = site
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            "openssl",
            "s_server",
            "-quiet",
            "-accept",
            f"127.0.0.1:{port}",
            "-cert",
            str(ca.cert_pem),
            "-key",
            str(ca.key_pem),
            "-groups",
            "P-256",
            "-tls1_3",
            "-www",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    door = DoorThread([f"origin.test:{port}"], operator(hosts))
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        r = subprocess.run(
            [
                "openssl",
                "s_client",
                "-quiet",
                "-proxy",
                f"127.0.0.1:{door.port}",
                "-connect",
                f"origin.test:{port}",
                "-servername",
                "origin.test",
                "-groups",
                "X25519:P-256",
                "-CAfile",
                str(ca.ca_pem),
                "-verify_return_error",
            ],
            input="GET / HTTP/1.0\r\n\r\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "HTTP/1.0 200 ok" in r.stdout, r.stderr
        [c] = door.wait_records("tkbox.complete")
        assert c["outcome"]["hello_retry"] is True and c["outcome"]["server_name"] == "origin.test"
    finally:
        door.close()
        server.terminate()
        server.wait(10)
