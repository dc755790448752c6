"""A box of a Docker Hub image, named as a person writes it (`NAME:TAG`), pulled through
docker.io's mirror on loopback: `tkbox daemon --registry-mirror docker.io=https://127.0.0.1:PORT
--registry-mirror-only`, a real registry (Debian's docker-registry) over TLS as the mirror.

The daemon pulls for the box, and the run's open record names the mirror and the digest it
answered; the CLI's own pulls (`tkbox run`'s, `tkbox image pull`'s) take the daemon's settings.
The image store is shared with the host's (e2e_stack), so the name is removed before and
after: each pull is a pull, not a cached name.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_stack import Stack, export_verified, fresh_name, make_home, stack_env

from tkbox.image.testing import LayerBuilder, LocalRegistry, Pushed, ScratchCA, push_image
from tkbox.sdk import Client

BUSYBOX = Path("/bin/busybox")
NAME = "tkbox-e2e-mirror"
KEY = f"docker.io/library/{NAME}:1"


@pytest.fixture(scope="module")
def mirror_stack(tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[Stack, LocalRegistry, Pushed]]:
    if not BUSYBOX.is_file() or not shutil.which("docker-registry"):
        pytest.skip("busybox-static and docker-registry are installed by scripts/setup.sh")
    tmp = tmp_path_factory.mktemp("mirror")
    ca = ScratchCA.create(tmp / "ca")
    reg = LocalRegistry(tmp / "registry", ca).start()
    layer = LayerBuilder().dir("bin").file("bin/busybox", BUSYBOX.read_bytes(), mode=0o755)
    for applet in ("sh", "cat"):
        layer.symlink(f"bin/{applet}", "busybox")
    layer.dir("etc").file("etc/from-the-mirror", b"pulled through the mirror\n")
    with reg.client() as c:
        pushed = push_image(c, f"library/{NAME}", "1", [layer.tar()])
    home = make_home(tmp)
    s = Stack(home, {**stack_env(home), "SSL_CERT_FILE": str(ca.ca_pem)})
    s.start_signer()
    s.start_daemon("--registry-mirror", f"docker.io=https://{reg.host}",
                   "--registry-mirror-only")
    s.tk("image", "rm", KEY, check=False)
    yield s, reg, pushed
    s.tk("image", "rm", KEY, check=False)
    for name in list(s.procs):
        s.stop(name)
    reg.stop()


def test_a_box_boots_a_docker_hub_name_pulled_through_the_daemons_mirror(
        mirror_stack: tuple[Stack, LocalRegistry, Pushed], workspace: Path,
        tmp_path: Path) -> None:
    s, reg, pushed = mirror_stack
    via = {"registry": "docker.io", "endpoint": f"https://{reg.host}/v2", "mirror": True,
           "answered": pushed.digest}
    name = fresh_name("mirror")
    try:
        # through the SDK, as `tkbox agent` does: the daemon itself pulls
        with Client(s.home / "run" / "daemon.sock") as c:
            c.run(image=f"{NAME}:1", workspace=workspace, name=name)
        assert s.tk("exec", name, "--", "cat", "/etc/from-the-mirror").stdout == \
            "pulled through the mirror\n"
        assert s.tkjson("inspect", name)["image_digest"] == pushed.digest  # type: ignore[index]
        s.tk("stop", name)
        recs = export_verified(s, name, tmp_path)
        opened = next(r["body"] for r in recs if r["kind"] == "tkbox.run.open")
        assert opened["facts"]["image_digest"] == pushed.digest
        assert opened["facts"]["image_pulled_from"] == via
    finally:
        s.tk("rm", "--force", name, check=False)
    # `tkbox run` pulls in the CLI first (a bar per layer), as the daemon would: the workspace
    # is refused by the daemon only after that pull, so no box is booted for this check
    s.tk("image", "rm", KEY)
    r = s.tk("run", "--name", fresh_name("mirror"), "--workspace", str(tmp_path / "missing"),
             "--image", f"{NAME}:1", check=False)
    assert r.returncode == 2 and "does not exist" in r.stderr
    assert s.tkjson("image", "inspect", KEY)["pulled_from"] == via  # type: ignore[index]
    # `tkbox image pull`, no flags: the daemon's settings; a tag is asked again
    out = s.tk("image", "pull", f"{NAME}:1").stdout
    assert f"from https://{reg.host}/v2 (a mirror of docker.io, which answered " \
           f"{pushed.digest})" in out
