"""Firecracker's jailer interface, read from its documentation (tests/testdata/
firecracker/jailer-v1.16.1.md, pinned; its one edit is in tests/testdata/SOURCES.md),
and a check of a jailer command line against it.

What is read, not restated: the "Jailer Usage" synopsis (each option, whether it is
required, whether it takes a value), which options may be given more than once,
the `<name>=<value>` formats, the resources `--resource-limit` knows, the cgroup
versions, the id's rule (alphanumerics and hyphens, its maximum length), the chroot
layout, and that the jailer passes `--id` to Firecracker itself. `check(argv)`
returns every way `argv` departs from that (an empty list: none).

Test helper only (not shipped); the fake jailer (`fake_jailer.py`) runs the same
check on the command line it is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "testdata" / "firecracker" / "jailer-v1.16.1.md"


@dataclass(frozen=True)
class Option:
    name: str
    required: bool
    takes_value: bool
    repeatable: bool


@dataclass(frozen=True)
class Interface:
    options: dict[str, Option]
    resources: tuple[str, ...]
    cgroup_versions: tuple[str, ...]
    id_max: int
    chroot_layout: str
    passes_id: bool


def _section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    if m is None:
        raise AssertionError(f"the jailer's doc has no section {title!r}")
    return m.group(1)


@cache
def interface(doc: Path = DOC) -> Interface:
    text = doc.read_text(encoding="utf-8")
    usage = _section(text, "Jailer Usage")
    block = re.search(r"```bash\n(.*?)```", usage, re.S)
    assert block, "no synopsis in the Jailer Usage section"
    options: dict[str, Option] = {}
    for m in re.finditer(r"(\[)?--([a-z][a-z-]*)(?: <([a-z_=]+)>)?(\])?", block.group(1)):
        name = m.group(2)
        options[name] = Option(name, required=m.group(1) is None, takes_value=bool(m.group(3)),
                               repeatable=False)
    # "This argument can be used multiple times": the bullet of the option it names.
    for bullet in re.split(r"\n- ", usage):
        m = re.search(r"`--([a-z-]+)`", bullet)
        if m and m.group(1) in options and "multiple times" in " ".join(bullet.split()):
            o = options[m.group(1)]
            options[o.name] = Option(o.name, o.required, o.takes_value, True)
    resources = tuple(re.findall(r"^  - `([a-z-]+)`:", usage, re.M))
    flat = " ".join(usage.split())
    versions = tuple(re.findall(r'"([0-9])" for cgroup-v[0-9]', flat))
    id_max = int(re.search(r"maximum length is currently (\d+)", flat).group(1))  # type: ignore[union-attr]
    layout = re.search(r"`(<chroot_base>/<exec_file_name>/<id>/root)`", text)
    assert layout, "no chroot layout in the doc"
    passes_id = "jailer already passes `--id`" in " ".join(text.split())
    return Interface(options, resources, versions, id_max, layout.group(1), passes_id)


def check(argv: list[str], doc: Path = DOC) -> list[str]:
    """Every way `argv` (the jailer's, argv[0] included) departs from the doc."""
    iface = interface(doc)
    problems: list[str] = []
    args = argv[1:]
    forwarded: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, forwarded = args[:cut], args[cut + 1:]
    seen: dict[str, list[str | None]] = {}
    i = 0
    while i < len(args):
        word = args[i]
        if not word.startswith("--") or word[2:] not in iface.options:
            problems.append(f"unknown option {word!r}")
            i += 1
            continue
        opt = iface.options[word[2:]]
        value = None
        if opt.takes_value:
            if i + 1 >= len(args):
                problems.append(f"--{opt.name} has no value")
                break
            value = args[i + 1]
            i += 1
        seen.setdefault(opt.name, []).append(value)
        i += 1
    for opt in iface.options.values():
        if opt.required and opt.name not in seen:
            problems.append(f"--{opt.name} is required")
        if len(seen.get(opt.name, [])) > 1 and not opt.repeatable:
            problems.append(f"--{opt.name} is given more than once")
    for value in seen.get("id", []):
        if not (value and len(value) <= iface.id_max and re.fullmatch(r"[A-Za-z0-9-]+", value)):
            problems.append(f"--id {value!r}: alphanumerics and hyphens, at most "
                            f"{iface.id_max} characters")
    for name in ("uid", "gid"):
        for value in seen.get(name, []):
            if not (value or "").isdigit():
                problems.append(f"--{name} {value!r} is not a number")
    for value in seen.get("exec-file", []) + seen.get("chroot-base-dir", []):
        if not (value or "").startswith("/"):
            problems.append(f"{value!r} is not an absolute path")
    for value in seen.get("cgroup-version", []):
        if value not in iface.cgroup_versions:
            problems.append(f"--cgroup-version {value!r}: one of {iface.cgroup_versions}")
    for value in seen.get("cgroup", []):
        if not re.fullmatch(r"[a-z_]+\.[a-z_.]+=\S.*", value or ""):
            problems.append(f"--cgroup {value!r} is not <cgroup_file>=<value>")
    for value in seen.get("resource-limit", []):
        res, eq, limit = (value or "").partition("=")
        if not eq or res not in iface.resources or not limit.isdigit():
            problems.append(f"--resource-limit {value!r} is not <resource>=<value> with a "
                            f"resource of {iface.resources}")
    for value in seen.get("parent-cgroup", []):
        parts = (value or "").split("/")
        if (value or "").startswith("/") or any(p in ("", ".", "..") for p in parts):
            problems.append(f"--parent-cgroup {value!r} is not a relative path")
    if iface.passes_id and any(a == "--id" or a.startswith("--id=") for a in forwarded):
        problems.append("--id after '--': the jailer passes it to Firecracker itself")
    return problems


def chroot_dir(chroot_base: str, exec_file: str, vm_id: str) -> Path:
    """The chroot the doc's layout names for these values."""
    layout = interface().chroot_layout
    return Path(layout.replace("<chroot_base>", chroot_base.rstrip("/"))
                .replace("<exec_file_name>", Path(exec_file).name).replace("<id>", vm_id))
