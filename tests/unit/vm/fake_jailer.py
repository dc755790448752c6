"""A fake Firecracker `jailer` for the launcher's process tests (run as root).

    fake_jailer.py --id ID --exec-file FILE --uid U --gid G [...] -- [FIRECRACKER ARGS]

It refuses, as the jailer's argument parser does (exit 1), any command line that
departs from the jailer's documented interface (`fc_jailer_doc.check`, read from
tests/testdata/firecracker/jailer-v1.16.1.md), then does what "Jailer Operation"
there says, except what a test cannot: it builds no namespace and makes no chroot
(the fake Firecracker it starts resolves its paths from the chroot directory, its
cwd), creates no cgroup (it records the values), makes no device node. In order:
close every descriptor but 0-2; clear the environment; create
`<chroot_base>/<exec_file_name>/<id>/root` (nothing if it exists); copy the exec
file into it; set RLIMIT_NOFILE; chown the chroot directory to the uid and gid;
setgroups, setgid, setuid; exec `<exec_file_name> --id=<id> --start-time-us=<n>
--start-time-cpu-us=<n>` and the arguments after `--`. What it was asked is
recorded in `<chroot_base>/fake-jailer-<id>.json`, written before it drops
privileges.

Test helper only (not shipped).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
from pathlib import Path

import fc_jailer_doc  # noqa: E402  (beside this script: sys.path[0])


def main() -> None:
    argv = [sys.argv[0], *sys.argv[1:]]
    problems = fc_jailer_doc.check(argv)
    if problems:
        print(f"Arguments parsing error: {'; '.join(problems)}", flush=True)
        sys.exit(1)
    os.closerange(3, 1 << 16)
    args = argv[1:]
    cut = args.index("--") if "--" in args else len(args)
    opts: dict[str, list[str]] = {}
    i = 0
    while i < cut:
        name = args[i][2:]
        takes = fc_jailer_doc.interface().options[name].takes_value
        opts.setdefault(name, []).append(args[i + 1] if takes else "")
        i += 2 if takes else 1
    forwarded = args[cut + 1:]
    vm_id, exec_file = opts["id"][0], opts["exec-file"][0]
    uid, gid = int(opts["uid"][0]), int(opts["gid"][0])
    base = opts.get("chroot-base-dir", ["/srv/jailer"])[0]
    chroot = fc_jailer_doc.chroot_dir(base, exec_file, vm_id)
    for key in list(os.environ):
        del os.environ[key]
    chroot.mkdir(parents=True, exist_ok=True)
    name = Path(exec_file).name
    shutil.copyfile(exec_file, chroot / name)
    os.chmod(chroot / name, 0o755)
    os.chown(chroot / name, uid, gid)
    for limit in opts.get("resource-limit", ["no-file=2048"]):
        res, _, value = limit.partition("=")
        if res == "no-file":
            resource.setrlimit(resource.RLIMIT_NOFILE, (int(value), int(value)))
    (Path(base) / f"fake-jailer-{vm_id}.json").write_text(json.dumps({
        "argv": argv, "cgroups": opts.get("cgroup", []),
        "cgroup_version": opts.get("cgroup-version", ["1"])[0],
        "parent_cgroup": opts.get("parent-cgroup", [name])[0], "chroot": str(chroot),
        "forwarded": forwarded}))
    os.chown(chroot, uid, gid)
    os.chdir(chroot)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    os.execve(f"./{name}", [f"./{name}", f"--id={vm_id}", "--start-time-us=0",
                            "--start-time-cpu-us=0", *forwarded], {})


if __name__ == "__main__":
    main()
