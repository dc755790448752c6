"""C2SP tlog-policy: which logs, which witnesses, and how many must cosign.

    log <vkey> [<url>]
    witness <name> <vkey> [<url>]
    group <name> all|any|<k> <member> ...
    quorum <name>|none

Lines end in LF; fields are separated by runs of spaces or tabs; blank lines
and lines starting with `#` are ignored; the only octets allowed are 09, 0A,
20-7E and 80-FF. Witnesses and groups share one namespace, a group or quorum
names only what earlier lines defined (no cycles), a member appears once per
group, `none` is never a member, exactly one quorum line, and no public key
appears twice. Log keys must be a checkpoint signature type (Ed25519, 0x01,
is the one tkbox verifies); witness keys a cosignature type (0x04 here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tkbox.formats import _strict, cosignature, note
from tkbox.formats.errors import FormatError

MAX_POLICY = 64 * 1024
MAX_ENTRIES = 256  # of each of logs, witnesses, groups (C2SP: at least 32)


@dataclass(frozen=True)
class Group:
    name: str
    threshold: int
    members: tuple[str, ...]


@dataclass
class Policy:
    logs: list[note.Verifier] = field(default_factory=list)
    log_urls: dict[str, str] = field(default_factory=dict)  # vkey tag -> url
    witnesses: dict[str, cosignature.CosignatureVerifier] = field(default_factory=dict)
    witness_urls: dict[str, str] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    quorum: str = "none"

    def satisfied(self, cosigned: Iterable[str], name: str | None = None) -> bool:
        """Whether `name` (default: the quorum) holds, given the witnesses that cosigned."""
        have = set(cosigned)
        name = self.quorum if name is None else name
        if name == "none":
            return True
        # Once each, in the order defined (a group names only what came before it):
        # a group reached by many paths is not evaluated again on each (exponential
        # in a trust file that nests groups pairwise).
        held = {w: w in have for w in self.witnesses}
        for g in self.groups.values():
            held[g.name] = sum(held[m] for m in g.members) >= g.threshold
        return held[name]

    def witness_verifiers(self) -> list[cosignature.CosignatureVerifier]:
        return list(self.witnesses.values())

    def text(self) -> str:
        """The policy as C2SP tlog-policy text (stable order)."""
        out = []
        for v in self.logs:
            vkey = v.vkey() if isinstance(v, note.Ed25519Verifier) else ""
            url = self.log_urls.get(note.key_tag(v.name, v.key_id))
            out.append(f"log {vkey}" + (f" {url}" if url else ""))
        for name, w in self.witnesses.items():
            url = self.witness_urls.get(name)
            out.append(f"witness {name} {w.vkey()}" + (f" {url}" if url else ""))
        for g in self.groups.values():
            out.append(f"group {g.name} {g.threshold} {' '.join(g.members)}")
        out.append(f"quorum {self.quorum}")
        return "".join(line + "\n" for line in out)


def _fail(what: str, line: int) -> FormatError:
    return FormatError("policy.malformed", f"policy line {line}", what)


def _fields(line: str) -> list[str]:
    return line.replace("\t", " ").split()


def parse(data: bytes) -> Policy:
    if len(data) > MAX_POLICY:
        raise FormatError("policy.malformed", "policy", f"more than {MAX_POLICY} bytes")
    for i, b in enumerate(data):
        if not (b in (0x09, 0x0A) or 0x20 <= b <= 0x7E or b >= 0x80):
            line = data.count(b"\n", 0, i) + 1
            raise _fail(f"byte 0x{b:02x} is not allowed in a policy", line)
    if data and not data.endswith(b"\n"):
        raise FormatError("policy.malformed", "policy", "the last line does not end in a newline")
    text = _strict.utf8(data, "policy.malformed", "policy")
    pol = Policy()
    keys: set[bytes] = set()
    quorum_seen = False
    for n, raw in enumerate(text.split("\n")[:-1] if text else [], 1):
        f = _fields(raw)
        if not f or f[0].startswith("#"):
            continue
        kind = f[0]
        if kind == "log":
            if len(f) not in (2, 3):
                raise _fail("a log line is 'log <vkey> [<url>]'", n)
            v = _vkey(f[1], n, log=True)
            _unique_key(keys, v.public_key, n)
            if len(pol.logs) == MAX_ENTRIES:
                raise _fail(f"more than {MAX_ENTRIES} logs", n)
            pol.logs.append(v)
            if len(f) == 3:
                pol.log_urls[note.key_tag(v.name, v.key_id)] = f[2]
        elif kind == "witness":
            if len(f) not in (3, 4):
                raise _fail("a witness line is 'witness <name> <vkey> [<url>]'", n)
            name = f[1]
            _new_name(pol, name, n)
            w = _vkey(f[2], n, log=False)
            _unique_key(keys, w.public_key, n)
            if len(pol.witnesses) == MAX_ENTRIES:
                raise _fail(f"more than {MAX_ENTRIES} witnesses", n)
            assert isinstance(w, cosignature.CosignatureVerifier)
            pol.witnesses[name] = w
            if len(f) == 4:
                pol.witness_urls[name] = f[3]
        elif kind == "group":
            if len(f) < 4:
                raise _fail("a group line is 'group <name> all|any|<k> <member> ...'", n)
            name, k_s, members = f[1], f[2], tuple(f[3:])
            _new_name(pol, name, n)
            for m in members:
                if m == "none":
                    raise _fail("'none' cannot be a group member", n)
                if m not in pol.witnesses and m not in pol.groups:
                    raise _fail(f"{_strict.show(m)} is not a witness or group defined above", n)
            if len(set(members)) != len(members):
                raise _fail("a member appears twice in one group", n)
            if k_s == "all":
                k = len(members)
            elif k_s == "any":
                k = 1
            else:
                k = _strict.decimal(k_s, "policy.malformed", f"policy line {n}")
                if not 1 <= k <= len(members):
                    raise _fail(f"threshold {k} is not between 1 and {len(members)}", n)
            if len(pol.groups) == MAX_ENTRIES:
                raise _fail(f"more than {MAX_ENTRIES} groups", n)
            pol.groups[name] = Group(name, k, members)
        elif kind == "quorum":
            if len(f) != 2:
                raise _fail("a quorum line is 'quorum <name>'", n)
            if quorum_seen:
                raise _fail("a second quorum line", n)
            if f[1] != "none" and f[1] not in pol.witnesses and f[1] not in pol.groups:
                raise _fail(f"{_strict.show(f[1])} is not a witness or group defined above", n)
            pol.quorum = f[1]
            quorum_seen = True
        else:
            raise _fail(f"unknown line kind {_strict.show(kind)}", n)
    if not quorum_seen:
        raise FormatError("policy.malformed", "policy", "no quorum line")
    return pol


def _vkey(
    vkey: str, n: int, *, log: bool
) -> note.Ed25519Verifier | cosignature.CosignatureVerifier:
    try:
        _, _, typed = note.split_vkey(vkey)
        if log:
            if typed[0] != note.ALG_ED25519:
                raise _fail(f"log key type 0x{typed[0]:02x} is not supported (Ed25519, 0x01)", n)
            v = note.parse_vkey(vkey)
            assert isinstance(v, note.Ed25519Verifier)
            return v
        if typed[0] != cosignature.ALG_COSIGNATURE_V1:
            raise _fail(f"witness key type 0x{typed[0]:02x} is not supported "
                        "(Ed25519 cosignature/v1, 0x04)", n)
        return cosignature.parse_vkey(vkey)
    except FormatError as exc:
        if exc.code == "policy.malformed":
            raise
        raise _fail(f"bad verifier key: {exc.what}", n) from None


def _unique_key(keys: set[bytes], key: bytes, n: int) -> None:
    if key in keys:
        raise _fail("the same public key appears twice", n)
    keys.add(key)


def _new_name(pol: Policy, name: str, n: int) -> None:
    if name == "none" or name in pol.witnesses or name in pol.groups:
        raise _fail(f"the name {_strict.show(name)} is taken", n)


def build(
    log: note.Ed25519Verifier,
    witnesses: Mapping[str, tuple[cosignature.CosignatureVerifier, str]],
    threshold: int | None = None,
) -> Policy:
    """A policy for one log and its witnesses: `threshold` of them (default all)."""
    pol = Policy(logs=[log])
    for name, (w, url) in witnesses.items():
        pol.witnesses[name] = w
        if url:
            pol.witness_urls[name] = url
    if not witnesses:
        pol.quorum = "none"
    elif len(witnesses) == 1 and threshold in (None, 1):
        pol.quorum = next(iter(witnesses))
    else:
        k = len(witnesses) if threshold is None else threshold
        pol.groups["witnesses"] = Group("witnesses", k, tuple(witnesses))
        pol.quorum = "witnesses"
    return parse(pol.text().encode())  # what we write is what we read
