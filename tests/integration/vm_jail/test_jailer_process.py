"""`tkbox-jailer` (src/tkbox/vm/jailer.c) run for real: it refuses a malformed command
line, builds a cell as root and, unprivileged, in a user namespace, and ends as the
program it ran ended. The programs run in the cells here are the host's own `sh`
and `cat` (with their libraries, as `plan_for` finds them); tests/e2e/test_vmm_cell.py
runs a probe as QEMU itself is run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tkbox.vm import jail
from tkbox.vm.jail import JAIL_FAILED, Jail, JailConfig, build_jailer, plan_for

pytestmark = [pytest.mark.integration,
              # a chroot (fresh-check's root) can make no cell: CI and hosts are not chroots
              pytest.mark.skipif(jail.chroot_problem() is not None,
                                 reason=str(jail.chroot_problem()))]

SH = "/bin/sh"


@pytest.fixture(scope="module")
def jailer() -> Iterator[Path]:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    d = Path(tempfile.mkdtemp(prefix="tkjl-"))
    os.chmod(d, 0o755)  # an unprivileged user runs it too
    built = build_jailer(d)
    os.chmod(built, 0o755)
    yield built
    shutil.rmtree(d, ignore_errors=True)


def run(argv: list[str], user: int | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    pre = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"] if user else []
    return subprocess.run([*pre, *argv], capture_output=True, text=True, timeout=60, env={},
                          check=False, **kw)  # type: ignore[call-overload]


def cell_argv(jailer: Path, root: Path, program: list[str], *, uid: int | None) -> list[str]:
    plan = plan_for(SH)  # the cell holds sh and what it loads
    head = [str(jailer), "--root", str(root)]
    head += ["--uid", str(uid), "--gid", str(uid)] if uid is not None else ["--userns"]
    return [*head, *plan.args(), "--dev", "null", "--", *program]


@pytest.mark.parametrize(("args", "said"), [
    ([], "--root is required"),
    (["--root", "/tmp/x", "--", "/bin/true"], "give --uid and --gid (root), or --userns"),
    (["--root", "/tmp/x", "--userns", "--uid", "5", "--gid", "5", "--", "/bin/true"],
     "give --uid and --gid"),
    (["--root", "/tmp/../etc", "--userns", "--", "/bin/true"], "not a plain path"),
    (["--root", "tmp", "--userns", "--", "/bin/true"], "not an absolute path"),
    (["--root", "/tmp/x", "--userns", "--bind", "/etc", "/a/./b", "--", "/bin/true"],
     "not a plain path"),
    (["--root", "/tmp/x", "--userns", "--dev", "sda", "--", "/bin/true"], "--dev takes"),
    (["--root", "/tmp/x", "--uid", "-1", "--gid", "5", "--", "/bin/true"], "not a number"),
    (["--root", "/tmp/x", "--userns", "--frobnicate", "--", "/bin/true"], "unknown"),
    (["--root", "/tmp/x", "--userns", "--", "true"], "absolute path"),
    (["--root", "/tmp/x", "--userns"], "no program after --"),
])
def test_a_malformed_command_line_is_refused_before_anything_is_done(
        jailer: Path, args: list[str], said: str) -> None:
    r = run([str(jailer), *args])
    assert r.returncode == JAIL_FAILED
    assert said in r.stderr and r.stderr.startswith("tkbox-jailer: usage: ")


#: Shell builtins only: the cell holds `sh` and its libraries, no other program.
FACTS = ("while read -r k v; do case $k in Uid:|CapEff:|NoNewPrivs:) echo \"$k $v\";; "
         "esac; done < /proc/self/status; echo root: /*; set -- /proc/[0-9]*; "
         "echo procs: $#; read -r c < /proc/1/comm; echo pid1: $c; "
         "(read -r h < /etc/hostname) 2>/dev/null || echo etc: none; "
         "(echo x > /written) 2>/dev/null || echo root: read-only")


def facts(out: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def test_as_root_the_program_runs_alone_as_its_uid_in_its_own_root(
        jailer: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root mode needs root")
    r = run(cell_argv(jailer, tmp_path, [SH, "-c", FACTS], uid=61182))
    assert r.returncode == 0, r.stderr
    f = facts(r.stdout)
    assert f["Uid"].split() == ["61182"] * 4
    assert f["CapEff"] == "0000000000000000" and f["NoNewPrivs"] == "1"
    assert r.stdout.count("root: ") == 2 and "root: read-only" in r.stdout
    shown = [line for line in r.stdout.splitlines() if line.startswith("root: /")][0]
    assert set(shown[len("root: "):].split()) <= {"/dev", "/etc", "/lib", "/lib64", "/proc",
                                                  "/usr", "/bin", "/sbin"}
    assert f["procs"] == "1" and f["pid1"] == "sh"  # alone, PID 1 of its namespace
    assert f["etc"] == "none"  # the host's /etc is not there


def test_the_jailer_ends_as_its_program_ended(jailer: Path, tmp_path: Path) -> None:
    """The daemon sees the VMM's own end: its status, or the signal that killed it
    (the kernel's OOM killer sends SIGKILL from outside the cell)."""
    if os.geteuid() != 0:
        pytest.skip("the root mode needs root")
    assert run(cell_argv(jailer, tmp_path, [SH, "-c", "exit 7"], uid=61182)).returncode == 7
    with subprocess.Popen(cell_argv(jailer, tmp_path, [SH, "-c", "echo up; read x"],
                                    uid=61182), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, env={}) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
            pid = proc.pid
            child = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
            os.kill(child, signal.SIGKILL)
            assert proc.wait(30) == -signal.SIGKILL
        finally:
            proc.kill()
    missing = run(cell_argv(jailer, tmp_path, ["/no/such/program"], uid=61182))
    assert missing.returncode == JAIL_FAILED
    assert "tkbox-jailer: execve /no/such/program: No such file or directory" in missing.stderr


def test_unprivileged_the_cell_is_a_user_namespace_of_the_daemons_own_uid(
        jailer: Path, tmp_path: Path) -> None:
    """An unprivileged daemon gets the same namespaces and root, in a user namespace
    that maps only its own uid: on the host the program keeps that uid."""
    if os.geteuid() != 0:
        pytest.skip("the test switches to an unprivileged user")
    if (why := jail.userns_problem()) is not None:
        pytest.skip(why)
    nobody = 65534
    root = Path(tempfile.mkdtemp(prefix="tkjl-cell-"))  # a path nobody can walk to
    try:
        os.chmod(root, 0o755)
        os.chown(root, nobody, nobody)
        r = run(cell_argv(jailer, root, [SH, "-c", FACTS], uid=None), user=nobody)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    f = facts(r.stdout)
    assert f["Uid"].split() == [str(nobody)] * 4
    assert f["CapEff"] == "0000000000000000" and f["NoNewPrivs"] == "1"
    assert f["procs"] == "1" and f["etc"] == "none" and "root: read-only" in r.stdout


def test_the_daemons_decision_names_each_part_a_cell_lacks() -> None:
    """What `tkbox doctor` and the daemon say: a root mode without a cgroup says so."""
    j = Jail("root", JailConfig(), Path("/j"), None, ["no cgroup: x"])
    assert j.summary().startswith("jailed: a uid of its own from 61000-61183, its own mount, "
                                  "PID, IPC, UTS and network namespaces and root, no "
                                  "capabilities, no cgroup; no cgroup: x")
    off = jail.decide(JailConfig(mode="off"), "/usr/bin/true", Path("/nonexistent"))
    assert off.mode == "off" and off.summary() == "not jailed: --vmm-jail off"


def test_the_program_inherits_only_the_descriptors_named_for_it(jailer: Path,
                                                                tmp_path: Path) -> None:
    """The VMM gets its disks and sockets (`--fd`); the uid's lease (`--hold-fd`), held
    by the jailer, and every other descriptor the jailer had stay out of the cell."""
    if os.geteuid() != 0:
        pytest.skip("the root mode needs root")
    handed = os.open(tmp_path / "disk", os.O_RDWR | os.O_CREAT, 0o600)
    lease = os.open(tmp_path / "lease", os.O_RDWR | os.O_CREAT, 0o600)
    stray = os.open(tmp_path / "stray", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        argv = cell_argv(jailer, tmp_path,
                         [SH, "-c", "for f in /proc/self/fd/*; do echo ${f##*/}; done"],
                         uid=61182)
        argv[1:1] = ["--fd", str(handed), "--hold-fd", str(lease)]
        r = run(argv, pass_fds=(handed, lease, stray))
    finally:
        for fd in (handed, lease, stray):
            os.close(fd)
    assert r.returncode == 0, r.stderr
    fds = {int(x) for x in r.stdout.split()}
    # 0-2, the one handed, and the one the shell's glob itself has open on the directory.
    assert {0, 1, 2, handed} <= fds and len(fds - {0, 1, 2, handed}) <= 1, fds
    assert lease not in fds and stray not in fds


def test_a_uid_range_holding_an_account_is_named_not_used(tmp_path: Path) -> None:
    """`--vmm-uids` over an account of the host (nobody, 65534) must never hand a VMM
    that uid: `auto` falls back to what else the host allows and says why; `on`
    refuses to start."""
    if os.geteuid() != 0:
        pytest.skip("the root mode needs root")
    from tkbox.errors import HostError
    from tkbox.vm.qemu import qemu_binary

    config = JailConfig(uids=(65000, 65535))
    j = jail.decide(config, qemu_binary(), tmp_path)
    assert j.mode != "root"
    assert "holds uid 65534 of account" in j.summary(), j.summary()
    with pytest.raises(HostError, match="holds uid 65534 of account"):
        jail.decide(JailConfig(mode="on", uids=(65000, 65535)), qemu_binary(), tmp_path)
