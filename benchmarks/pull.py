"""Pull + flatten of one image from a loopback registry: tkbox vs skopeo + umoci, one run.

    .venv/bin/python benchmarks/pull.py [--synthetic] [--runs N]

Starts Debian's docker-registry on 127.0.0.1 over TLS (a throwaway CA), pushes
one image, then measures, each on an empty cache:

- tkbox: `ImageStore.pull` (download, verify every blob, flatten, pack the
  squashfs root disk with tar2sqfs);
- baseline: `skopeo copy docker://... oci:DIR` then `umoci raw unpack --rootless`
  (download, verify, extract the layers to a directory);

and prints tkbox's time as a ratio to the baseline's, plus the time to a ready
root disk when the image is cached already (`ImageStore.resolve`), and tkbox's
pull of the same image as `docker.io/bench/image:v1` through docker.io's mirror
(`--registry-mirror docker.io=https://127.0.0.1:PORT --registry-mirror-only`, the
same registry) as a ratio to its direct pull: what the mirror path costs.

The image is the store's `tkbox/default` layer if it exists (a real Debian
root filesystem), else a synthetic one (`--synthetic`): three gzip layers,
~40 MB, many small files, whiteouts and hard links.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tkbox.image.mirrors import Settings, load
from tkbox.image.store import ImageStore
from tkbox.image.testing import LayerBuilder, LocalRegistry, ScratchCA, push_image


def synthetic_layers() -> list[bytes]:
    rnd = os.urandom
    base = LayerBuilder()
    for d in range(40):
        base.dir(f"usr/lib/pkg{d}")
        for f in range(100):
            base.file(f"usr/lib/pkg{d}/f{f}.py", (b"import os\nprint('x')\n" * 20) + rnd(64))
    base.file("usr/lib/blob.bin", rnd(8 * 1024 * 1024))
    base.file("usr/bin/tool", rnd(2 * 1024 * 1024), mode=0o755)
    base.hardlink("usr/bin/tool2", "usr/bin/tool")
    mid = LayerBuilder().opaque("usr/lib/pkg3").whiteout("usr/lib/pkg4")
    for f in range(2000):
        mid.file(f"opt/app/m{f}.txt", b"hello world\n" * 50)
    mid.file("opt/app/data.bin", rnd(6 * 1024 * 1024))
    top = LayerBuilder().file("etc/config", b"x=1\n").whiteout("usr/bin/tool")
    return [base.tar(), mid.tar(), top.tar()]


def default_layer() -> list[bytes] | None:
    try:
        with ImageStore() as s:
            image = s.inspect("tkbox/default")
            return [s.blob_path(d).read_bytes() for d in image.layers]
    except Exception:  # noqa: BLE001 - no store or no image: fall back to synthetic
        return None


def timed(fn: object) -> float:
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    for tool in ("docker-registry", "skopeo", "umoci", "tar2sqfs"):
        if not shutil.which(tool):
            print(f"{tool} is missing; apt-get install it", file=sys.stderr)
            return 2
    layers = None if args.synthetic else default_layer()
    what = "tkbox/default" if layers else "synthetic"
    if layers is None:
        layers = synthetic_layers()
    work = Path(tempfile.mkdtemp(prefix="tkbox-bench-pull-"))
    reg = LocalRegistry(work / "reg", ScratchCA.create(work / "tls")).start()
    try:
        with reg.client() as c:
            pushed = push_image(c, "bench/image", "v1", layers, compression="gzip")
        size = sum(len(b) for _, b in pushed.layers)
        ref = f"{reg.host}/bench/image:v1"
        certs = work / "certs"
        certs.mkdir()
        shutil.copy(reg.ca.ca_pem, certs / "ca.crt")
        tk: list[float] = []
        base: list[float] = []
        mirrored: list[float] = []
        through = load(Settings((f"docker.io=https://{reg.host}",), mirror_only=True))
        for i in range(args.runs):
            root = work / f"store{i}"

            def tkbox_pull(root: Path = root) -> None:
                with ImageStore(root, ca_bundle=reg.ca.ca_pem) as s:
                    asyncio.run(s.pull(ref))

            def baseline(i: int = i) -> None:
                lay = work / f"oci{i}"
                subprocess.run(["skopeo", "copy", "--quiet", f"--src-cert-dir={certs}",
                                f"docker://{ref}", f"oci:{lay}:v1"], check=True)
                subprocess.run(["umoci", "raw", "unpack", "--rootless", "--image",
                                f"{lay}:v1", str(work / f"rootfs{i}")], check=True,
                               stderr=subprocess.DEVNULL)

            def mirror_pull(root: Path = work / f"mstore{i}") -> None:
                with ImageStore(root, ca_bundle=reg.ca.ca_pem, registries=through) as s:
                    asyncio.run(s.pull("docker.io/bench/image:v1"))

            base.append(timed(baseline))
            tk.append(timed(tkbox_pull))
            mirrored.append(timed(mirror_pull))
        with ImageStore(work / "store0", ca_bundle=reg.ca.ca_pem) as s:
            cached = min(timed(lambda s=s: asyncio.run(s.resolve(ref))) for _ in range(5))
            disk = s.inspect(ref).size
    finally:
        reg.stop()
        shutil.rmtree(work, ignore_errors=True)
    t, b, m = statistics.median(tk), statistics.median(base), statistics.median(mirrored)
    print(f"image: {what}, {len(layers)} layers, {size / 1e6:.1f} MB compressed; "
          f"root disk {disk / 1e6:.1f} MB")
    print(f"tkbox pull+flatten+squashfs:      {t:7.2f} s")
    print(f"skopeo copy + umoci raw unpack:   {b:7.2f} s")
    print(f"ratio tkbox / baseline:           {t / b:7.2f}")
    print(f"tkbox pull through a mirror:      {m:7.2f} s (ratio to direct: {m / t:.2f})")
    print(f"ready root disk, image cached:    {cached * 1000:7.1f} ms "
          f"(ratio to a cold tkbox pull: {cached / t:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
