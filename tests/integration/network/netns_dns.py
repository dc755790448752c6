"""A host resolver with a `search` domain, made for one process and nothing else.

Run as a program inside fresh network and mount namespaces (`unshare --net
--mount`, with `--user --map-root-user` when not root); `run_in_namespaces`
does that. In there:

- the loopback interface is brought up; it is the namespace's only
  interface, so nothing this program sends can leave the machine;
- a private copy of `/etc/resolv.conf` (`nameserver 127.0.0.1`, `search
  corp.example`, `ndots:1`) and of `/etc/nsswitch.conf` (`hosts: dns`, so no
  hosts file, `systemd-resolved` or other module answers) is bind-mounted
  over the real ones, visible to this process only (and an empty directory
  over `nscd`'s socket, if there is one, so no cache outside answers);
- a tiny DNS server on 127.0.0.1:53 answers `intranet.corp.example` with a
  public address and every other name with NXDOMAIN, and notes each name it
  was asked.

Then each name in `argv` is looked up twice: by plain `getaddrinfo` (the
control: it shows the search domain is in force) and by the door's
`SystemResolver`. One JSON object goes to stdout. The program refuses to
touch anything unless its namespaces differ from the ones it was started
from (passed as `--outer NET MNT`).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

SEARCH_DOMAIN = "corp.example"
#: the address the search domain's `intranet` has: public, so it passes the door's checks
COMPLETED = {"intranet.corp.example": "8.8.4.4"}

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def dns_answer(query: bytes, table: dict[str, str]) -> tuple[str, bytes]:
    """(the name asked, the answer) for one DNS query over UDP (RFC 1035 §4.1):
    an A record for a name in `table`, no data for its other types, NXDOMAIN
    for every other name."""
    qid = struct.unpack("!H", query[:2])[0]
    i, labels = 12, []
    while query[i]:
        labels.append(query[i + 1 : i + 1 + query[i]].decode("ascii"))
        i += 1 + query[i]
    qtype = struct.unpack("!H", query[i + 1 : i + 3])[0]
    question = query[12 : i + 5]
    name = ".".join(labels).lower()
    addr = table.get(name)
    if addr is None:  # QR, RD, RA; RCODE 3 (NXDOMAIN)
        return name, struct.pack("!6H", qid, 0x8183, 1, 0, 0, 0) + question
    if qtype != 1:  # NOERROR, no answers
        return name, struct.pack("!6H", qid, 0x8180, 1, 0, 0, 0) + question
    record = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + socket.inet_aton(addr)
    return name, struct.pack("!6H", qid, 0x8180, 1, 1, 0, 0) + question + record


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, _SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _bind(source: Path, target: str) -> None:
    subprocess.run(["mount", "--bind", str(source), target], check=True)  # noqa: S603, S607


def _namespaces() -> tuple[str, str]:
    return os.readlink("/proc/self/ns/net"), os.readlink("/proc/self/ns/mnt")


def main(argv: list[str]) -> int:
    if argv[:1] != ["--outer"] or len(argv) < 3:
        print("usage: netns_dns.py --outer NET MNT NAME...", file=sys.stderr)
        return 2
    outer, names = (argv[1], argv[2]), argv[3:]
    net, mnt = _namespaces()
    if net == outer[0] or mnt == outer[1]:
        print("refused: not in fresh network and mount namespaces", file=sys.stderr)
        return 3
    _loopback_up()
    private = Path(tempfile.mkdtemp())
    (private / "resolv.conf").write_text(
        f"nameserver 127.0.0.1\nsearch {SEARCH_DOMAIN}\noptions ndots:1 attempts:1 timeout:1\n")
    (private / "nsswitch.conf").write_text("hosts: dns\n")
    (private / "empty").mkdir()
    _bind(private / "resolv.conf", "/etc/resolv.conf")
    _bind(private / "nsswitch.conf", "/etc/nsswitch.conf")
    for nscd in ("/run/nscd", "/var/run/nscd"):
        if os.path.isdir(nscd):
            _bind(private / "empty", nscd)

    asked: list[str] = []
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 53))

    def serve() -> None:
        while True:
            query, peer = server.recvfrom(4096)
            name, reply = dns_answer(query, COMPLETED)
            asked.append(name)
            server.sendto(reply, peer)

    threading.Thread(target=serve, daemon=True).start()

    from tkbox.doors.network.resolver import ResolveError, SystemResolver

    async def door(name: str) -> Any:
        try:
            return [str(a) for a in await SystemResolver(timeout=5).resolve(name, 80)]
        except ResolveError as exc:
            return {"error": exc.message}

    out: dict[str, Any] = {"plain": {}, "door": {}, "asked": {}}
    for name in names:
        try:
            infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
            out["plain"][name] = sorted({str(i[4][0]) for i in infos})
        except OSError as exc:
            out["plain"][name] = {"error": str(exc)}
        before = len(asked)
        out["door"][name] = asyncio.run(door(name))
        out["asked"][name] = asked[before:]
    print(json.dumps(out))
    shutil.rmtree(private, ignore_errors=True)
    return 0


def run_in_namespaces(names: list[str], src: Path) -> dict[str, Any] | None:
    """`main` for `names` in fresh namespaces; None if this host cannot make them."""
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("mount") is None:
        return None
    cmd = [unshare, "--net", "--mount"]
    if os.geteuid() != 0:
        cmd[1:1] = ["--user", "--map-root-user"]
    if subprocess.run([*cmd, "true"], capture_output=True).returncode != 0:  # noqa: S603
        return None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(src), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(  # noqa: S603
        [*cmd, sys.executable, __file__, "--outer", *_namespaces(), *names],
        capture_output=True, text=True, env=env, timeout=60, check=False)
    if done.returncode != 0:
        raise AssertionError(f"netns_dns.py failed ({done.returncode}): {done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
