"""A box is a real micro-VM with no network card, reached only through its ports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from e2e_stack import TKBOX, Box, Stack, fresh_name


def test_box_runs_its_own_kernel_with_only_loopback_and_no_route(box: Box) -> None:
    """The guest kernel is not the host's, there is no network card and no route out."""
    host_kernel = os.uname().release
    info = json.loads(box.stack.tk("inspect", box.name, "--json").stdout)
    r = box.sh("uname -r; echo ---; ls /sys/class/net; echo ---; cat /proc/net/route; "
               "echo ---; cat /proc/net/ipv6_route 2>/dev/null | grep -v ' lo$' | wc -l")
    kernel, nets, route, v6 = (part.strip() for part in r.stdout.split("---"))
    assert kernel == info["kernel"]
    assert kernel != host_kernel or info["accel"] == "kvm"
    assert nets.split() == ["lo"]
    assert route.splitlines()[1:] == []  # only the header: no IPv4 route at all
    assert v6 == "0"
    # Nothing answers outside the box, even by address.
    r = box.sh("curl -sS --noproxy '*' -m 5 http://10.0.2.2/ 2>&1; echo rc=$?", check=False)
    assert "rc=0" not in r.stdout


def test_write_to_usr_succeeds_and_is_gone_in_the_next_box(stack: Stack, box: Box,
                                                             workspace: Path) -> None:
    """The root image is read-only under a tmpfs overlay: changes vanish with the VM."""
    box.sh("echo mark > /usr/tkbox-mark && cat /usr/tkbox-mark")
    other = fresh_name("usr")
    stack.tk("run", "--name", other, "--workspace", str(workspace))
    try:
        r = stack.tk("exec", other, "--", "sh", "-c", "test -e /usr/tkbox-mark; echo $?")
        assert r.stdout.strip() == "1"
    finally:
        stack.tk("rm", "--force", other, check=False)


def test_no_credential_file_hook_or_git_credential_reaches_the_box(box: Box) -> None:
    """Credential files, .git/hooks and secrets in .git/config are never copied in."""
    r = box.sh("ls -a /workspace; echo ---; ls /workspace/.git; echo ---; "
               "cat /workspace/.git/config; echo ---; git -C /workspace config --list")
    listing, gitdir, config, listed = r.stdout.split("---")
    names = listing.split()
    for secret in (".env", "server.pem", ".ssh"):
        assert secret not in names
    for kept in ("src", "README.md", "data.bin", "link", ".git"):
        assert kept in names
    assert "hooks" not in gitdir.split()
    assert "hunter2" not in config and "user:" not in config
    # the remote's URL carried a credential, so its whole section was dropped;
    # what is left is a config git in the box reads
    assert "git.invalid" not in config and "core.repositoryformatversion=0" in listed


def test_patch_holds_exactly_the_workspace_changes(box: Box, tmp_path: Path) -> None:
    """Added, modified, deleted, binary, mode change and symlink; nothing else."""
    box.sh("cd /workspace && echo new > added.txt && echo more >> README.md && rm old.txt && "
           "printf '\\000\\001\\002' > data.bin && chmod +x run.sh && ln -s src/app.py applink && "
           "mkdir -p deep/er && echo x > deep/er/file && echo junk > /tmp/outside")
    box.stack.tk("stop", box.name)
    patch = box.stack.tk("patch", box.name).stdout
    # git itself agrees on what the patch changes.
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(box.workspace), str(copy)], check=True)
    (copy / ".env").unlink()
    (copy / "patch.diff").write_text(patch)
    subprocess.run(["git", "-C", str(copy), "apply", "--binary", "patch.diff"], check=True)
    (copy / "patch.diff").unlink()
    assert (copy / "added.txt").read_text() == "new\n"
    assert (copy / "README.md").read_text() == "readme\nmore\n"
    assert not (copy / "old.txt").exists()
    assert (copy / "data.bin").read_bytes() == b"\x00\x01\x02"
    assert os.access(copy / "run.sh", os.X_OK)
    assert os.readlink(copy / "applink") == "src/app.py"
    assert (copy / "deep/er/file").read_text() == "x\n"
    touched = sorted(line.split(" b/")[-1] for line in patch.splitlines()
                     if line.startswith("diff --git "))
    assert touched == ["README.md", "added.txt", "applink", "data.bin", "deep/er/file",
                       "old.txt", "run.sh"]
    assert "outside" not in patch


def test_exec_streams_output_passes_stdin_and_returns_status(box: Box) -> None:
    """Two prints with a sleep between arrive apart; stdin goes in; the status comes out."""
    with subprocess.Popen([*TKBOX, "exec", box.name, "--", "sh", "-c",
                           "echo one; sleep 3; echo two; exit 7"],
                          env=box.stack.env, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        t1 = time.monotonic()
        second = proc.stdout.readline()
        t2 = time.monotonic()
        assert (first, second) == (b"one\n", b"two\n")
        assert t2 - t1 > 2.0
        assert proc.wait(60) == 7
    r = box.stack.tk("exec", "-i", box.name, "--", "sh", "-c", "wc -c; cat >/dev/null",
                     input=b"x" * 300_000)
    assert r.stdout.strip() == "300000"


def test_ctrl_c_on_the_client_stops_the_command(box: Box) -> None:
    """SIGINT to `tkbox exec` reaches the command in the box and the client returns."""
    with subprocess.Popen([*TKBOX, "exec", box.name, "--", "sh", "-c",
                           "trap 'echo got-int; exit 9' INT; echo ready; "
                           "while true; do sleep 0.2; done"],
                          env=box.stack.env, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()
        assert proc.wait(60) == 9
    assert b"got-int" in rest
    # and nothing of it is left running
    r = box.sh("ps -eo args | grep -c 'sleep 0.2' || true")
    assert int(r.stdout.strip()) <= 1  # only the grep itself


def test_two_boxes_do_not_see_each_others_files_output_or_ports(stack: Stack,
                                                                 workspace: Path) -> None:
    a, b = fresh_name("iso"), fresh_name("iso")
    procs = [subprocess.Popen([*TKBOX, "run", "--name", n, "--workspace", str(workspace)],
                              env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for n in (a, b)]
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
        stack.tk("exec", a, "--", "sh", "-c", "echo only-a > /workspace/a.txt; echo a > /tmp/t")
        stack.tk("exec", a, "--", "sh", "-c",
                 "nohup python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 2")
        rb = stack.tk("exec", b, "--", "sh", "-c",
                      "ls /workspace/a.txt /tmp/t 2>&1; curl -s --noproxy '*' -m 3 "
                      "http://127.0.0.1:8765/ >/dev/null; echo curl=$?", check=False)
        assert "No such file" in rb.stdout and "only-a" not in rb.stdout
        assert "curl=0" not in rb.stdout
        ra = stack.tk("exec", a, "--", "sh", "-c",
                      "curl -s --noproxy '*' -m 3 http://127.0.0.1:8765/ >/dev/null; echo curl=$?")
        assert "curl=0" in ra.stdout
    finally:
        for n in (a, b):
            stack.tk("rm", "--force", n, check=False)


def test_bad_input_gets_one_line_errors_and_leaves_nothing(stack: Stack, workspace: Path,
                                                          box: Box, tmp_path: Path) -> None:
    """Unknown image, name in use, missing workspace, unknown box: clear, non-zero, clean."""
    before = sorted(p.name for p in (stack.home / "boxes").iterdir())
    cases = [
        (["run", "--name", fresh_name("bad"), "--workspace", str(workspace),
          "--image", "tkbox/no-such-image"], "image"),
        (["run", "--name", box.name, "--workspace", str(workspace)], "exists already"),
        (["run", "--name", fresh_name("bad"), "--workspace", str(tmp_path / "missing")],
         "does not exist"),
        (["run", "--name", "Bad Name", "--workspace", str(workspace)], "not valid"),
        (["exec", "no-such-box", "--", "true"], "no box named"),
        (["stop", "no-such-box"], "no box named"),
    ]
    for args, needle in cases:
        r = stack.tk(*args, check=False)
        assert r.returncode != 0, args
        msg = r.stderr.strip()
        assert msg.startswith("tkbox: error:") and needle in msg, (args, msg)
        assert len(msg.replace("\n", " ")) < 400
    after = sorted(p.name for p in (stack.home / "boxes").iterdir())
    assert after == before


def test_daemon_that_is_not_running_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "TKBOX_HOME": str(tmp_path)}
    r = subprocess.run([*TKBOX, "ls"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "daemon is not running" in r.stderr and "tkbox daemon" in r.stderr


def test_apply_writes_the_patch_and_holds_back_sensitive_files(box: Box) -> None:
    """`tkbox apply` writes what the signer allowed and holds back CI files unasked."""
    box.sh("cd /workspace && echo fixed > src/app.py && mkdir -p .github/workflows && "
           "echo 'on: push' > .github/workflows/evil.yml && echo new > added.txt")
    box.stack.tk("stop", box.name)
    r = box.stack.tk("apply", box.name, "--dry-run", "--json", check=False)
    assert r.returncode == 6  # held back: a person must look (docs/exit-status.md)
    dry = json.loads(r.stdout)
    assert not (box.workspace / "added.txt").exists()
    r = box.stack.tk("apply", box.name, "--json", check=False)
    assert r.returncode == 6
    report = json.loads(r.stdout)
    status = {f["path"]: f["status"] for f in report["files"]}  # type: ignore[index]
    assert status["src/app.py"] == "applied" and status["added.txt"] == "applied"
    assert status[".github/workflows/evil.yml"] == "held back"
    assert (box.workspace / "src/app.py").read_text() == "fixed\n"
    assert not (box.workspace / ".github").exists()
    assert dry["dry_run"] is True  # type: ignore[index]


def test_a_box_without_a_name_gets_one_and_stops_at_its_timeout(stack: Stack, workspace: Path,
                                                                 tmp_path: Path) -> None:
    """`tkbox run` without --name picks a name and prints it; --timeout stops the box by
    itself (its patch kept), and the record says why."""
    r = stack.tk("run", "--workspace", str(workspace), "--timeout", "20s", "--json")
    info = json.loads(r.stdout[r.stdout.index("\n{") + 1:] if "\n{" in r.stdout else r.stdout)
    name = info["name"]
    assert name.startswith("box-") and info["timeout_s"] == 20
    try:
        deadline = time.monotonic() + 180
        while stack.tkjson("inspect", name)["state"] != "stopped":  # type: ignore[index]
            assert time.monotonic() < deadline, "the box did not stop at its timeout"
            time.sleep(1)
        assert "--timeout of 20 s" in stack.tkjson("inspect", name)["error"]  # type: ignore[index]
        stack.tk("patch", name)  # the patch was saved, as by tkbox stop
        stack.tk("export", name, "-o", str(tmp_path / "t.tkb"))
        v = json.loads(stack.tk("verify", str(tmp_path / "t.tkb"), "--trust",
                                str(tmp_path / "t.trust.json"), "--json").stdout)
        assert v["kinds"]["tkbox.timeout"] == 1
    finally:
        stack.tk("rm", "--force", name, check=False)
    human = stack.tk("run", "--workspace", str(workspace), "--timeout", "0", check=False)
    assert human.returncode == 2 and "--timeout" in human.stderr


def test_cp_copies_one_file_each_way_as_a_recorded_crossing(box: Box, tmp_path: Path) -> None:
    """`tkbox cp`: in and out of a running box, each copy decided and recorded (path, size,
    hash, where it went); never into the box's own checkout (changes return by apply)."""
    local = tmp_path / "in.txt"
    local.write_bytes(b"hello from the host\n")
    s = box.stack
    s.tk("cp", str(local), f"{box.name}:notes/in.txt")
    assert box.sh("cat /workspace/notes/in.txt").stdout == "hello from the host\n"
    box.sh("head -c 300000 /dev/urandom > /tmp/out.bin; sha256sum /tmp/out.bin > /tmp/sum")
    want = box.sh("cut -d' ' -f1 /tmp/sum").stdout.strip()
    s.tk("cp", f"{box.name}:/tmp/out.bin", str(tmp_path))
    got = (tmp_path / "out.bin").read_bytes()
    import hashlib
    assert hashlib.sha256(got).hexdigest() == want and len(got) == 300000
    assert (tmp_path / "out.bin").stat().st_mode & 0o777 == 0o600  # guest bytes: not executable
    r = s.tk("cp", f"{box.name}:/workspace/README.md", str(box.workspace / "README.md"),
             check=False)
    assert r.returncode == 2 and "tkbox apply" in r.stderr
    assert (box.workspace / "README.md").read_text() == "readme\n"
    r = s.tk("cp", f"{box.name}:/nope", str(tmp_path), check=False)
    assert r.returncode == 4 and r.stderr.startswith("tkbox: error:")
    assert s.tk("cp", "a", "b", check=False).returncode == 2
    s.tk("stop", box.name)
    s.tk("export", box.name, "-o", str(tmp_path / "cp.tkb"))
    s.tk("report", str(tmp_path / "cp.tkb"), "--trust", str(tmp_path / "cp.trust.json"),
         "-o", str(tmp_path / "cp.html"))
    from tkbox.formats import bundle, record
    recs = [record.parse(e.extra) for e in bundle.parse((tmp_path / "cp.tkb").read_bytes()).entries
            if e.extra is not None]
    copies = [r.body for r in recs if r.kind == "tkbox.decision" and r.body["action"] == "Write"]
    assert [(c["context"]["copy"], c["resource"]["path"]) for c in copies] == [
        ("in", "/workspace/notes/in.txt"), ("out", "/tmp/out.bin")]
    assert copies[1]["resource"]["sha256"] == want
    assert copies[1]["context"]["host_path"] == str((tmp_path / "out.bin").resolve())
