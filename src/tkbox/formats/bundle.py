"""The `.tkb` bundle and the `.trust.json` trust file (docs/bundle-format.md).

A bundle is every record of one closed run, each as a C2SP tlog-proof entry
(the record in its `extra` line), and one checkpoint they all lead to:

    "tkbox-bundle/v1" LF
    "run " <run id> LF
    "records " <k, decimal> LF
    k times:
        "c2sp.org/tlog-proof@v1" LF
        "extra " <base64 of the record's canonical JSON> LF
        "index " <the record's leaf index in the log> LF
        <base64 hash> LF ...            (its RFC 6962 audit path at the checkpoint's size)
    LF
    <checkpoint: signed note, with the log's signature and witness cosignatures>

Entry j, a blank line and the checkpoint make a standard tlog-proof file for
record j (`Bundle.tlog_proof`), whose leaf hash is SHA-256(0x00 || extra).

The trust file is canonical JSON (RFC 8785) followed by one LF:

    {"format":"tkbox-trust/v1","independent":[<witness names>],"policy":"<tlog-policy text>"}

`policy` names the signer's log key and its witnesses (C2SP tlog-policy);
`independent` lists the witnesses run by someone other than the signer's
operator (they make the assurance `witnessed` rather than `local`).
"""

from __future__ import annotations

import binascii
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from tkbox.formats import _strict, canonjson
from tkbox.formats import tlogpolicy as policy_mod
from tkbox.formats.errors import FormatError
from tkbox.formats.merkle import HASH_SIZE
from tkbox.formats.proof import HEADER as PROOF_HEADER
from tkbox.formats.proof import MAX_PATH, Entry, Lines, read_entry
from tkbox.formats.record import MAX_RECORD, valid_run_id

MAGIC = "tkbox-bundle/v1"
TRUST_FORMAT = "tkbox-trust/v1"
MAX_BUNDLE = 256 << 20
MAX_RECORDS = 1_000_000
MAX_TRUST = 256 * 1024
MAX_CHECKPOINT = 64 * 1024


@dataclass(frozen=True)
class Bundle:
    run: str
    entries: tuple[Entry, ...]
    checkpoint: bytes

    def encode(self) -> bytes:
        head = f"{MAGIC}\nrun {self.run}\nrecords {len(self.entries)}\n"
        return (head + "".join(e.text() for e in self.entries) + "\n").encode() + self.checkpoint

    def tlog_proof(self, j: int) -> bytes:
        """Record j's entry as a standalone C2SP tlog-proof file."""
        return self.entries[j].text().encode() + b"\n" + self.checkpoint


def build(run: str, records: Sequence[tuple[int, bytes, Sequence[bytes]]],
          checkpoint: bytes) -> Bundle:
    """A bundle from (leaf index, record bytes, audit path) triples, in run order."""
    entries = tuple(Entry(i, tuple(path), raw) for i, raw, path in records)
    return Bundle(run, entries, checkpoint)


def parse(data: bytes) -> Bundle:
    """Parse a bundle's structure (verification is `tkbox.verify`'s)."""
    lines, run, count = _head(data)
    fast = _read_entries_fast(lines, count)
    entries: list[Entry] = fast if fast is not None else []
    entries += _entries(lines, count, len(entries))
    return Bundle(run, tuple(entries), _tail(lines, count))


def check(data: bytes) -> bytes:
    """What `parse` checks, and its checkpoint, in memory bounded whatever the bundle
    (nothing kept of an entry once it is read, no line longer than any a bundle may
    hold copied out): the FormatError `parse` would raise, if any."""
    lines, _, count = _head(data, cache=False)
    for _ in _entries(lines, count):
        pass
    return _tail(lines, count)


def entries_of(data: bytes) -> tuple[str, Iterator[Entry]]:
    """The run of a bundle that `check` accepts, and its entries, read one at a time."""
    lines, run, count = _head(data)
    return run, _entries(lines, count)


@dataclass(frozen=True)
class Located:
    """Where a bundle's parts lie (`locate`): its entries are `data[start:end + 1]`,
    its checkpoint `data[end + 2:]`."""

    run: str
    count: int
    start: int
    end: int
    checkpoint: bytes


def locate(data: bytes) -> Located | None:
    """The checkpoint, found without reading the entries: the bytes after the first
    blank line that follows the three header lines (entries hold no blank line), if
    those lines are as `parse` takes them and the checkpoint is within its size;
    else None. For any bundle `parse` accepts, this is its checkpoint."""
    try:
        lines, run, count = _head(data)
    except FormatError:
        return None
    start = lines.pos
    end = data.find(b"\n\n", start - 1)
    if end < start or not 0 < len(data) - end - 2 <= MAX_CHECKPOINT:
        return None
    return Located(run, count, start, end, data[end + 2 :])


# A line longer than this is read as a `proof.LongLine` (its first bytes only): four
# times the longest line a bundle holds, an extra line ("extra " and the base64 of
# MAX_RECORD bytes), so that a long line's first bytes are longer than any line.
_MAX_LINE = 512 * 1024


def _head(data: bytes, cache: bool = True) -> tuple[Lines, str, int]:
    """The header lines: the reader after them, the run id and the record count."""
    if len(data) > MAX_BUNDLE:
        raise FormatError("bundle.size", "bundle", f"{len(data)} bytes, more than {MAX_BUNDLE}")
    lines = Lines(data, "bundle", "bundle.malformed", max_line=_MAX_LINE, cache=cache)
    magic = lines.next("the bundle header")
    if magic != MAGIC:
        raise lines.fail(f"not a tkbox bundle: expected {MAGIC!r}, found {_strict.show(magic)}",
                         code="bundle.magic")
    run = lines.keyword("run", "the run line")
    if not valid_run_id(run):
        raise lines.fail("the run id is not 1-128 of [A-Za-z0-9._:-]")
    count = _strict.decimal(lines.keyword("records", "the records line"), "bundle.malformed",
                            lines.where(), maximum=MAX_RECORDS)
    if count == 0:
        raise lines.fail("a run has at least its open and close records")
    return lines, run, count


def _entries(lines: Lines, count: int, first: int = 0) -> Iterator[Entry]:
    """Entries `first` to `count` - 1, read line by line, each yielded as it is read."""
    for j in range(first, count):
        nxt = lines.peek()
        if nxt != PROOF_HEADER:
            if nxt is None:
                raise FormatError("bundle.truncated", lines.where(lines.line + 1),
                                  f"the bundle ends after {j} of its {count} records")
            raise FormatError("bundle.count", lines.where(lines.line + 1),
                              f"the bundle says {count} records but holds {j}")
        try:
            entry = read_entry(lines, max_extra=MAX_RECORD)
        except FormatError as exc:
            raise FormatError(exc.code, exc.where, f"record {j}: {exc.what}") from None
        if entry.extra is None:
            raise lines.fail(f"record {j} has no extra line (the record itself)")
        yield entry


def _tail(lines: Lines, count: int) -> bytes:
    """After the last entry: the blank line, then the checkpoint (returned)."""
    nxt = lines.peek()
    if nxt == PROOF_HEADER:
        raise FormatError("bundle.count", lines.where(lines.line + 1),
                          f"the bundle says {count} records but holds more")
    if lines.next("the blank line before the checkpoint") != "":
        raise lines.fail("expected the blank line before the checkpoint")
    size = len(lines.data) - lines.pos  # (measured before it is copied out)
    if not size:
        raise FormatError("bundle.truncated", lines.where(lines.line + 1),
                          "the bundle ends where the checkpoint should be")
    if size > MAX_CHECKPOINT:
        raise lines.fail(f"the checkpoint is larger than {MAX_CHECKPOINT} bytes")
    return lines.rest()


@dataclass(frozen=True)
class Scanned:
    """A bundle read in one pass for the verifier, its audit paths left in place.

    `paths[j]` is where record j's audit path lies in `data`, the bundle itself:
    `data[start:end]` is its lines, each with its LF, neither copied out nor
    decoded. Nothing in it is trusted: the verifier compares it with the
    canonical text of the path it rebuilt (`merkle.Rebuilt`), which checks every
    byte, and reads through `parse` (which names the fault) whenever anything
    differs.
    """

    run: str
    indexes: list[int]
    extras: list[bytes]
    paths: list[tuple[int, int]]
    checkpoint: bytes
    data: bytes


def scan(data: bytes, *, keep: bool = True, at: Located | None = None) -> Scanned | None:
    """The bundle as `Scanned` if it is laid out exactly as `encode` writes it, else
    None (then `parse` reads it and says what is wrong). Whatever `scan` accepts,
    `parse` accepts with the same run, indexes, records and checkpoint, provided
    each path text is a sequence of canonical base64 hash lines (the verifier's
    comparison makes sure of that).

    One pass along the bundle, entry after entry, copying out only each record
    (decoded from base64): the audit paths, three quarters of a bundle, stay
    where they are. With `keep` False, not even the records are kept (the lists
    of the `Scanned` are empty): only whether the bundle is laid out so. `at`
    is `locate(data)`, when it is known."""
    at = at or locate(data)
    if at is None:
        return None
    run, count, start, end, checkpoint = at.run, at.count, at.start, at.end, at.checkpoint
    # (The entries need no check that they are ASCII: each part of one below is
    # compared with base64 or digits, and each path with canonical base64 lines.)
    head = PROOF_HEADER.encode() + b"\n"
    if not data.startswith(head, start):
        return None
    max_extra_text = (MAX_RECORD + 2) // 3 * 4
    # at most MAX_PATH canonical hash lines (what the verifier compares a path with)
    max_path_text = MAX_PATH * ((HASH_SIZE + 2) // 3 * 4 + 1)
    a2b, b2a = binascii.a2b_base64, binascii.b2a_base64
    find, starts = data.find, data.startswith
    indexes: list[int] = []
    extras: list[bytes] = []
    paths: list[tuple[int, int]] = []
    pos = start + len(head)  # where the entry after its header starts
    try:
        for k in range(count):
            nxt = find(head, pos)  # the next entry's header: none after the last entry
            if (nxt < 0) != (k == count - 1) or pos > end:
                return None  # fewer or more headers than records, or one in the checkpoint
            stop = end + 1 if nxt < 0 else nxt  # the last entry ends at the blank line
            e1 = find(b"\n", pos, stop)
            e2 = find(b"\n", e1 + 1, stop) if e1 >= 0 else -1
            if e2 < 0 or not starts(b"extra ", pos) or not starts(b"index ", e1 + 1) or \
                    e1 - pos - 6 > max_extra_text or stop - e2 - 1 > max_path_text or \
                    e2 - e1 - 7 > 20:  # (each length checked before the part is copied)
                return None
            digits = data[e1 + 7 : e2]
            if not digits.isdigit() or (digits[0] == 48 and len(digits) > 1):  # b"0"
                return None
            extra = data[pos + 6 : e1]
            raw = a2b(extra, strict_mode=True)
            i = int(digits)
            if b2a(raw, newline=False) != extra or i > _strict.UINT64_MAX:
                return None  # not canonical base64, or beyond what `parse` takes
            if keep:
                extras.append(raw)
                indexes.append(i)
                paths.append((e2 + 1, stop))
            pos = nxt + len(head)
    except (ValueError, binascii.Error):
        return None
    return Scanned(run, indexes, extras, paths, checkpoint, data)


def _read_entries_fast(lines: Lines, count: int) -> list[Entry] | None:
    """All `count` entries at once, from the text up to the blank line; None if
    anything is not exactly as `read_entry` accepts it, and then the line-by-line
    reader runs and names the fault. Same acceptance, fewer steps per line."""
    data, start = lines.data, lines.pos
    end = data.find(b"\n\n", start - 1)
    if end < start:
        return None
    try:
        rows = data[start : end + 1].decode("utf-8").split("\n")[:-1]
    except UnicodeDecodeError:
        return None
    hashes = lines.hashes
    known = hashes.get
    entries: list[Entry] = []
    i, n = 0, len(rows)
    max_extra_text = (MAX_RECORD + 2) // 3 * 4
    try:
        for _ in range(count):
            if i + 2 >= n or rows[i] != PROOF_HEADER:
                return None
            extra, index = rows[i + 1], rows[i + 2]
            if not extra.startswith("extra ") or len(extra) - 6 > max_extra_text or \
                    not index.startswith("index "):
                return None
            raw = _strict.b64(extra[6:], "bundle.malformed", "")
            idx = _strict.decimal(index[6:], "bundle.malformed", "")
            i += 3
            path: list[bytes] = []
            while i < n and (line := rows[i]) != PROOF_HEADER:
                h = known(line)
                if h is None:
                    h = hashes[line] = _strict.b64(line, "bundle.malformed", "",
                                                   length=HASH_SIZE)
                path.append(h)
                if len(path) > MAX_PATH:
                    return None
                i += 1
            entries.append(Entry(idx, tuple(path), raw))
    except FormatError:
        return None
    if i != n:
        return None
    lines.pos, lines.line = end + 1, lines.line + n
    return entries


# --- the trust file -------------------------------------------------------


@dataclass(frozen=True)
class Trust:
    policy: policy_mod.Policy
    independent: frozenset[str]

    def encode(self) -> bytes:
        return make_trust(self.policy, self.independent)


def make_trust(pol: policy_mod.Policy, independent: Iterable[str] = ()) -> bytes:
    obj = {"format": TRUST_FORMAT, "independent": sorted(set(independent)),
           "policy": pol.text()}
    data = canonjson.dumps(obj) + b"\n"
    parse_trust(data)  # what we write is what we read
    return data


def _tfail(what: str, code: str = "trust.malformed") -> FormatError:
    return FormatError(code, "trust file", what)


def parse_trust(data: bytes) -> Trust:
    if len(data) > MAX_TRUST:
        raise _tfail(f"{len(data)} bytes, more than {MAX_TRUST}")
    if not data.endswith(b"\n"):
        raise _tfail("a trust file is canonical JSON and one newline")
    obj = canonjson.loads(data[:-1], max_size=MAX_TRUST, where="trust file")
    if not isinstance(obj, dict) or obj.get("format") != TRUST_FORMAT:
        raise _tfail(f"not a {TRUST_FORMAT} trust file")
    if set(obj) != {"format", "independent", "policy"}:
        raise _tfail("a trust file has exactly format, independent and policy")
    text, independent = obj["policy"], obj["independent"]
    if not isinstance(text, str):
        raise _tfail("policy is not a string")
    if not isinstance(independent, list) or not all(isinstance(n, str) for n in independent):
        raise _tfail("independent is not a list of witness names")
    if independent != sorted(set(independent)):
        raise _tfail("independent is not sorted and unique")
    try:
        pol = policy_mod.parse(text.encode())
    except FormatError as exc:
        raise FormatError("trust.policy", f"trust file, {exc.where}", exc.what) from None
    if len(pol.logs) != 1:
        raise _tfail(f"the policy names {len(pol.logs)} logs; a tkbox trust file names one",
                     "trust.policy")
    for n in independent:
        if n not in pol.witnesses:
            raise _tfail(f"independent names {_strict.show(n)}, which is not a witness")
    return Trust(pol, frozenset(independent))
