"""Booted templates: what keys them, when one is used, and what a box says it had.

No VM here: the key and the store are plain files and JSON. The guest's reseed is
tested against a fake ioctl (the mechanism); the restore itself (fresh entropy
per box, the host's clock, the box's own disks) runs on real VMs in
tests/e2e/test_template.py. On this host that e2e property also held with the
reseed disabled (TCG's RDRAND draws host randomness, and the restored guest's
clock jump triggers the kernel's own reseed), so the unit tests here are what
fail without the mechanism.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import struct
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tkbox.vm import qemu, template
from tkbox.vm.base import Disk, VMSpec


@pytest.fixture
def spec(tmp_path: Path) -> VMSpec:
    (tmp_path / "vmlinux").write_bytes(b"kernel-1")
    (tmp_path / "initrd").write_bytes(b"initramfs-1")
    return VMSpec(name="t", kernel=tmp_path / "vmlinux", initramfs=tmp_path / "initrd",
                  workdir=tmp_path / "w", disks=(Disk(tmp_path / "r", True, "root"),
                                                 Disk(tmp_path / "l", True, "lower"),
                                                 Disk(tmp_path / "u", False, "upper")))


def key(spec: VMSpec, vmm: str = "QEMU emulator version 7.2.22") -> template.Key:
    return template.make_key(spec, vmm, qemu.template_argv(spec, "tcg", "qemu-system-x86_64"))


def test_key_ignores_per_box_paths_but_not_the_machine(spec: VMSpec, tmp_path: Path) -> None:
    """Two boxes of the same machine share a template; their own disks and directories,
    and the path by which they reach the kernel and initramfs, are not part of it."""
    (tmp_path / "link").symlink_to(tmp_path)
    other = dataclasses.replace(spec, name="other", workdir=tmp_path / "w2",
                                kernel=tmp_path / "link" / "vmlinux",
                                initramfs=tmp_path / "link" / "initrd",
                                disks=tuple(dataclasses.replace(d, path=tmp_path / f"x{i}")
                                            for i, d in enumerate(spec.disks)))
    assert key(spec).digest == key(other).digest


@pytest.mark.parametrize("change", ["memory", "vcpus", "layout", "read_only", "vmm",
                                    "kernel", "initramfs", "cmdline"])
def test_key_changes_with_everything_that_shapes_the_saved_guest(spec: VMSpec,
                                                                  change: str) -> None:
    """A stale template (another kernel, initramfs, memory size, vCPU count, QEMU,
    device layout or command line) is never restored: it has another key."""
    before = key(spec)
    vmm = "QEMU emulator version 7.2.22"
    if change == "memory":
        spec = dataclasses.replace(spec, memory_mib=2048)
    elif change == "vcpus":
        spec = dataclasses.replace(spec, vcpus=2)
    elif change == "layout":
        spec = dataclasses.replace(spec, disks=spec.disks[:2])
    elif change == "read_only":
        spec = dataclasses.replace(spec, disks=(*spec.disks[:2],
                                                dataclasses.replace(spec.disks[2],
                                                                    read_only=True)))
    elif change == "vmm":
        vmm = "QEMU emulator version 8.2.0"
    elif change == "kernel":
        spec.kernel.write_bytes(b"kernel-2, same path")
    elif change == "initramfs":
        spec.initramfs.write_bytes(b"initramfs-2, same path, longer")
    elif change == "cmdline":
        spec = dataclasses.replace(spec, cmdline="tkbox.debug=1")
    after = key(spec, vmm)
    assert after.digest != before.digest
    assert after.differences(before.parts)


def test_template_argv_parks_the_guest_and_restore_argv_is_the_same_machine(
        spec: VMSpec) -> None:
    """The template writes its memory through to the RAM file; a box maps the same
    file private (its writes are its own) and waits for the device state."""
    cold = qemu.build_argv(spec, "tcg")
    wiring = replace(qemu.placeholder_wiring(spec), ram="/t/ram")
    parked = qemu.build_argv(spec, "tcg", wiring=wiring, template=True, share_ram=True)
    restored = qemu.build_argv(spec, "tcg", wiring=wiring, template=True, incoming=True)
    assert "tkbox.template=1" in parked[parked.index("-append") + 1]
    assert "tkbox.template=1" not in cold[cold.index("-append") + 1]
    assert "-object" not in cold and "-incoming" not in cold
    backend = parked[parked.index("-object") + 1]
    assert backend == "memory-backend-file,id=ram,size=1024M,mem-path=/t/ram,share=on"
    assert restored[restored.index("-object") + 1] == backend.replace("share=on", "share=off")
    assert restored[-2:] == ["-incoming", "defer"]
    assert [a for a in restored[:-2] if "share=" not in a] == \
        [a for a in parked if "share=" not in a]


def test_missing_template_is_a_cold_boot_that_says_why_and_builds_one(spec: VMSpec,
                                                                      tmp_path: Path) -> None:
    store = template.TemplateStore(tmp_path / "templates")
    found = store.lookup(key(spec))
    assert found.state is None and found.build
    assert found.reason.startswith("cold boot: no template yet")


def test_committed_template_is_restored_and_a_changed_input_names_what_changed(
        spec: VMSpec, tmp_path: Path) -> None:
    store = template.TemplateStore(tmp_path / "templates")
    k = key(spec)
    with store.building(k) as d:
        assert d is not None
        saved = d / "partial"
        saved.write_bytes(b"state")
        (d / "ram.partial").write_bytes(b"ram")
        store.commit(d, k, saved, d / "ram.partial", 1.0)
    found = store.lookup(k)
    assert found.state == store.root / k.digest / "state"
    assert found.reason == f"restored from template {k.digest[:12]}"
    assert (found.state.stat().st_mode & 0o777) == 0o600
    assert ((found.state.parent / "ram").stat().st_mode & 0o777) == 0o600
    (found.state.parent / "ram").unlink()
    assert store.lookup(k).state is None  # a template without its memory is no template
    (found.state.parent / "ram").write_bytes(b"ram")
    assert (store.root.stat().st_mode & 0o777) == 0o700
    with store.building(k) as again:
        assert again is None  # built already: nothing to do
    spec.initramfs.write_bytes(b"a new guest build")
    stale = store.lookup(key(spec))
    assert stale.state is None and stale.build
    assert "initramfs changed" in stale.reason


def test_template_whose_metadata_does_not_match_its_key_is_not_restored(
        spec: VMSpec, tmp_path: Path) -> None:
    """A state file next to metadata of other inputs (a half-written or tampered
    template) means a cold boot and a rebuild, never a restore."""
    store = template.TemplateStore(tmp_path / "templates")
    k = key(spec)
    with store.building(k) as d:
        assert d is not None
        (d / "partial").write_bytes(b"state")
        (d / "ram.partial").write_bytes(b"ram")
        store.commit(d, template.Key({**k.parts, "memory_mib": 4096}), d / "partial",
                     d / "ram.partial", 1.0)
    found = store.lookup(k)
    assert found.state is None and found.build
    assert "does not match its key (memory_mib)" in found.reason
    (store.root / k.digest / "meta.json").unlink()
    assert store.lookup(k).state is None


def test_templates_can_be_turned_off(spec: VMSpec, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store = template.TemplateStore(tmp_path / "templates")
    monkeypatch.setenv("TKBOX_TEMPLATE", "0")
    found = store.lookup(key(spec))
    assert found.state is None and not found.build
    assert "disabled" in found.reason


class _Ioctls:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[int, bytes | None]] = []
        self.fail = fail

    def __call__(self, fd: int, request: int, arg: bytes | None = None) -> bytes:
        if self.fail:
            raise PermissionError(1, "Operation not permitted")
        self.calls.append((request, arg))
        return b""


def test_guest_credits_the_host_seed_and_forces_a_reseed(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """The mechanism behind fresh entropy per box: the boot config's seed is
    credited to the kernel (RNDADDENTROPY, its size in bits) and the generator is
    reseeded at once (RNDRESEEDCRNG), not at the kernel's next interval."""
    from tkbox.guest import boot as agent

    ioctls = _Ioctls()
    monkeypatch.setattr(agent.fcntl, "ioctl", ioctls)
    monkeypatch.setattr(agent.os, "open", lambda *a, **k: 99)
    monkeypatch.setattr(agent.os, "close", lambda fd: None)
    seed = bytes(range(64))
    agent.reseed(seed, required=True)
    assert ioctls.calls == [(agent.RNDADDENTROPY, struct.pack("ii", 64 * 8, 64) + seed),
                            (agent.RNDRESEEDCRNG, None)]


def test_restored_guest_without_a_seed_or_a_reseed_refuses_to_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: a boot config without fresh entropy (or a kernel that refuses it) would
    leave a restored box on the template's generator state, shared with every other
    box from that template. It must not start; a cold boot may go on."""
    from tkbox.guest import boot as agent

    monkeypatch.setattr(agent.os, "open", lambda *a, **k: 99)
    monkeypatch.setattr(agent.os, "close", lambda fd: None)
    monkeypatch.setattr(agent.fcntl, "ioctl", _Ioctls())
    for bad in (None, b"", b"short", "not bytes" * 10):
        with pytest.raises(RuntimeError, match="no entropy seed"):
            agent.reseed(bad, required=True)
        agent.reseed(bad, required=False)
    monkeypatch.setattr(agent.fcntl, "ioctl", _Ioctls(fail=True))
    with pytest.raises(RuntimeError, match="cannot reseed"):
        agent.reseed(bytes(64), required=True)
    agent.reseed(bytes(64), required=False)



def _commit(store: template.TemplateStore, k: template.Key) -> Path:
    with store.building(k) as d:
        assert d is not None
        (d / "s.partial").write_bytes(b"state")
        (d / "r.partial").write_bytes(b"ram")
        return store.commit(d, k, d / "s.partial", d / "r.partial", 1.0).parent


def _age(d: Path, days: float) -> None:
    """`d` and its files as if last touched `days` ago."""
    t = time.time() - days * 86400
    for p in [*d.iterdir(), d]:
        os.utime(p, (t, t))


def test_templates_no_box_used_for_two_weeks_go_when_another_is_built(
        spec: VMSpec, tmp_path: Path) -> None:
    """Each guest build, memory size or QEMU makes a new key: without pruning, the old
    templates (170 MiB each) pile up for ever."""
    store = template.TemplateStore(tmp_path / "templates")
    old, used, building = (key(spec, f"QEMU {v}") for v in ("1", "2", "3"))
    for k in (old, used, building):
        _commit(store, k)
    for k in (old, used, building):
        _age(store.root / k.digest, 20)
    assert store.lookup(used).state is not None  # a restore marks it used
    other = store.root / "not-a-template"
    other.mkdir()
    _age(other, 20)
    with open(store.root / f".{building.digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another daemon is building it
        _commit(store, key(spec, "QEMU 4"))
    left = {p.name for p in store.root.iterdir() if not p.name.startswith(".")}
    assert left == {used.digest, building.digest, key(spec, "QEMU 4").digest,
                    "not-a-template"}
    assert store.lookup(old).state is None and store.lookup(used).state is not None
    # the one kept is kept even when it is old itself
    _age(store.root / used.digest, 20)
    assert store.prune(used) == [building.digest]
