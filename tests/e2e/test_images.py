"""A box boots exactly the image a real registry (on loopback, over TLS) serves.

The image is built and pushed by the test: a busybox layer, then a layer with
a whiteout, an opaque directory and a hard link. The box must see exactly what
the OCI image spec says, and the run records the manifest digest it booted.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_stack import Stack, fresh_name, make_home, stack_env

from tkbox.image.testing import LayerBuilder, LocalRegistry, ScratchCA, push_image

BUSYBOX = Path("/bin/busybox")
APPLETS = ["sh", "ls", "cat", "echo", "test", "stat", "true", "mkdir", "rm"]


@pytest.fixture(scope="module")
def registry_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str, str]]:
    if not BUSYBOX.is_file() or not shutil.which("docker-registry"):
        pytest.skip("busybox-static and docker-registry are installed by scripts/setup.sh")
    tmp = tmp_path_factory.mktemp("reg")
    ca = ScratchCA.create(tmp / "ca")
    reg = LocalRegistry(tmp / "registry", ca).start()
    base = LayerBuilder().dir("bin").file("bin/busybox", BUSYBOX.read_bytes(), mode=0o755)
    for a in APPLETS:
        base.symlink(f"bin/{a}", "busybox")
    base.dir("etc").file("etc/gone", b"removed by layer 2\n").dir("opt").dir("opt/dir")
    base.file("opt/dir/old", b"hidden by the opaque dir\n").file("opt/keep", b"kept\n")
    top = (LayerBuilder().whiteout("etc/gone").opaque("opt/dir")
           .file("opt/dir/new", b"from layer 2\n").hardlink("opt/link", "opt/keep"))
    cfg_layer = (LayerBuilder().dir("opt/tools").dir("opt/tools/bin")
                 .file("opt/tools/bin/hello", b"#!/bin/sh\necho hello-from-the-image\n",
                       mode=0o755)
                 .file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"
                                     b"agent:x:1234:1234:agent:/home/agent:/bin/sh\n")
                 .file("etc/group", b"root:x:0:\nagent:x:1234:\nextra:x:777:agent\n"))
    for a in ("id", "touch", "pwd", "env"):
        cfg_layer.symlink(f"bin/{a}", "busybox")
    with reg.client() as c:
        pushed = push_image(c, "test/bb", "1", [base.tar(), top.tar()], compression="gzip")
        push_image(c, "test/cfg", "1", [base.tar(), cfg_layer.tar()], compression="gzip",
                   config={"Env": ["PATH=/opt/tools/bin:/usr/bin:/bin", "GREETING=image",
                                   "COLOR=blue"],
                           "User": "agent", "WorkingDir": "/srv", "Cmd": ["/bin/sh"]})
        push_image(c, "test/ghost", "1", [base.tar(), cfg_layer.tar()], compression="gzip",
                   config={"Env": ["PATH=/usr/bin:/bin"], "User": "ghost"})
    home = make_home(tmp)
    env = {**stack_env(home), "SSL_CERT_FILE": str(ca.ca_pem)}
    s = Stack(home, env)
    s.start_signer()
    s.start_daemon()
    yield s, f"{reg.host}/test/bb:1", pushed.digest
    for name in list(s.procs):
        s.stop(name)
    reg.stop()


def test_box_boots_a_pulled_image_and_sees_exactly_its_flattened_layers(
        registry_stack: tuple[Stack, str, str], workspace: Path) -> None:
    s, ref, digest = registry_stack
    name = fresh_name("img")
    s.tk("run", "--name", name, "--workspace", str(workspace), "--image", ref, timeout=600)
    try:
        info = s.tkjson("inspect", name)
        assert info["image_digest"] == digest  # type: ignore[index]
        r = s.tk("exec", name, "--", "sh", "-c",
                 "ls /opt/dir; echo ---; test -e /etc/gone; echo gone=$?; "
                 "cat /opt/link; stat -c %h /opt/keep")
        listing, rest = r.stdout.split("---\n")
        assert listing.split() == ["new"]  # the opaque directory hides "old"
        assert "gone=1" in rest  # the whiteout removed it
        assert "kept\n2\n" in rest  # a hard link: same content, two links
    finally:
        s.tk("rm", "--force", name, check=False)


def test_an_image_the_registry_does_not_have_is_a_one_line_error(
        registry_stack: tuple[Stack, str, str], workspace: Path) -> None:
    s, ref, _ = registry_stack
    r = s.tk("run", "--name", fresh_name("img"), "--workspace", str(workspace),
             "--image", ref.replace("test/bb:1", "test/missing:1"), check=False)
    assert r.returncode != 0 and r.stderr.startswith("tkbox: error:")


def test_a_box_runs_an_image_as_its_author_meant_it(
        registry_stack: tuple[Stack, str, str], workspace: Path) -> None:
    """The image's Env (PATH included) and User apply, the box's --env on top; the
    workspace belongs to that user, commands start in /workspace, and the run records
    what it applied."""
    s, ref, _ = registry_stack
    name = fresh_name("cfg")
    s.tk("run", "--name", name, "--workspace", str(workspace), "--env", "GREETING=box",
         "--image", ref.replace("test/bb:1", "test/cfg:1"), timeout=600)
    try:
        r = s.tk("exec", name, "--", "sh", "-c",
                 "hello; echo $GREETING $COLOR $HOME; id -u; id -g; id -G; pwd; "
                 "touch /workspace/made-by-agent && stat -c %u:%g /workspace/made-by-agent; "
                 "echo ok > /workspace/README.md && cat /workspace/README.md; "
                 "touch /etc/nope 2>/dev/null; echo etc=$?")
        lines = r.stdout.splitlines()
        assert lines[0] == "hello-from-the-image"  # found through the image's PATH
        assert lines[1] == "box blue /home/agent"  # --env over the image's Env; the user's HOME
        assert lines[2:4] == ["1234", "1234"]
        assert sorted(lines[4].split()) == ["1234", "777"]  # supplementary groups
        assert lines[5] == "/workspace"  # not the image's WorkingDir (see runconfig)
        assert lines[6] == "1234:1234" and lines[7] == "ok"
        assert lines[8] == "etc=1"  # the rest of the image is root's, as the image made it
        info = s.tkjson("inspect", name)
        applied = info["image_config"]  # type: ignore[index]
        assert applied["user"] == "agent" and applied["run_as"]["uid"] == 1234
        assert applied["env_names"] == ["COLOR", "GREETING", "PATH"]
        assert applied["working_dir"] == "/srv"
        s.tk("stop", name)
        patch = s.tk("patch", name).stdout
        assert "made-by-agent" in patch and "+ok" in patch
    finally:
        s.tk("rm", "--force", name, check=False)


def test_an_image_whose_user_does_not_exist_is_refused_with_a_reason(
        registry_stack: tuple[Stack, str, str], workspace: Path) -> None:
    s, ref, _ = registry_stack
    name = fresh_name("nouser")
    r = s.tk("run", "--name", name, "--workspace", str(workspace),
             "--image", ref.replace("test/bb:1", "test/ghost:1"), check=False, timeout=600)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("tkbox: error:") and "'ghost'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert s.tk("inspect", name, check=False).returncode != 0  # nothing left behind
