"""QEMU's template restore, on real VMs: a good template restores, and a template
whose state does not load is dropped and the VM boots cold, saying why. Either
way QEMU runs in its seccomp sandbox with an empty environment."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from tkbox import paths
from tkbox.image.initramfs import build
from tkbox.image.kernel import find_kernel
from tkbox.protocol.ports import PORT_BOOT, Ports
from tkbox.protocol.streams import ByteStream
from tkbox.vm.base import VMSpec
from tkbox.vm.qemu import QemuLauncher, decide_accel
from tkbox.vm.template import TemplateStore


def _confined(pid: int) -> None:
    """QEMU `pid` is in a seccomp filter and holds none of the daemon's environment."""
    status = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    assert status["Seccomp"].strip() == "2", status["Seccomp"]  # SECCOMP_MODE_FILTER
    assert Path(f"/proc/{pid}/environ").read_bytes() == b""


def test_a_template_that_does_not_load_is_dropped_and_the_vm_boots_cold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What a CI job's environment holds: QEMU, the process a guest that escapes a
    # device model lands in, must not be given it.
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-canary-not-for-qemu")
    kernel = find_kernel()
    cache = paths.private_dir(paths.guest_build())
    guest = build(cache, kernel=kernel)
    store = TemplateStore(tmp_path / "templates")
    launcher = QemuLauncher(decide_accel(kernel.version, cache), templates=store,
                            build_templates=False)
    work = Path(tempfile.mkdtemp(prefix="tkr-", dir="/tmp"))

    def spec(name: str) -> VMSpec:
        return VMSpec(name=name, kernel=guest.kernel, initramfs=guest.initramfs,
                      workdir=work / name, memory_mib=512)

    async def start_and_reach(name: str) -> tuple[str, str]:
        reached = asyncio.Event()

        async def boot(stream: ByteStream) -> None:
            reached.set()
            await stream.aclose()

        def serve(ports: Ports) -> None:
            ports.serve(PORT_BOOT, boot)

        vm = await launcher.start(spec(name), before_boot=serve)
        try:
            await asyncio.wait_for(reached.wait(), 300)  # the guest runs: it asked on 1026
            _confined(vm.proc.pid)
        finally:
            await vm.kill()
        return vm.start_kind, vm.start_reason

    async def main() -> None:
        state = await launcher.build_template(spec("template"))
        assert state is not None and state.is_file()
        kind, reason = await start_and_reach("good")
        assert kind == "template", reason
        with open(state, "r+b") as f:  # a state cut short: QEMU cannot load it
            f.truncate(max(1, state.stat().st_size // 3))
        kind, reason = await start_and_reach("bad")
        assert kind == "cold" and "did not restore" in reason, (kind, reason)
        await launcher.aclose()

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(work, ignore_errors=True)
