"""What a box's saved patch is, for `box.json`, the API and the run's `tkbox.patch` record.

The guest computes the patch (`tkbox.guest.diff`); the host keeps what arrived
(`tkbox.daemon.guest_client.PatchProgress`): the whole files, the changes set apart
(left out, each with its path, size, SHA-256 and why) and, when the diff did not
finish, that the patch is partial and why. Everything here came from the guest and
is bounded again before it is kept or recorded.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tkbox.daemon.guest_client import PatchProgress
from tkbox.guest.diff import WHY

JSON = dict[str, Any]
#: set-apart entries named one by one in the run's record (the rest are counted)
RECORDED_APART = 100
RECORDED_PATH = 512  # characters of a path in the record


def patch_info(data: bytes, progress: PatchProgress, cut: str | None) -> JSON:
    """The box's `patch` field: its digest and size, the guest's counts, what was set
    apart, and `partial` (with `error`) when the diff was cut off."""
    counts = _apart_counts(progress)
    info: JSON = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                  "stats": progress.stats, "partial": cut is not None,
                  "set_apart": [a.to_json() for a in progress.set_apart],
                  "apart": counts}
    if cut is not None:
        info["error"] = cut[:500]
    return info


def _apart_counts(progress: PatchProgress) -> dict[str, JSON]:
    """Set-apart changes by why: count and bytes. The guest's own totals when it sent
    them (it lists at most `rpc.MAX_APART`), else what it listed."""
    out: dict[str, JSON] = {}
    for why in WHY:
        count, size = progress.stats.get(f"apart_{why}"), progress.stats.get(
            f"apart_{why}_bytes")
        listed = [a for a in progress.set_apart if a.why == why]
        if isinstance(count, int) and isinstance(size, int) and count >= len(listed):
            n, b = count, size
        else:
            n, b = len(listed), sum(a.size for a in listed)
        if n:
            out[why] = {"count": n, "bytes": b}
    return out


def patch_record(info: JSON | None) -> JSON:
    """The `tkbox.patch` record: counts, the first `RECORDED_APART` set-apart changes
    (path, size, hash, why) and the totals, bounded whatever the guest sent."""
    info = info or {}
    stats = info.get("stats") or {}
    rec: JSON = {"sha256": info.get("sha256", ""), "bytes": info.get("bytes", 0),
                 "partial": bool(info.get("partial"))}
    if info.get("partial"):
        rec["error"] = str(info.get("error", ""))[:500]
    for key in ("added", "modified", "deleted"):
        if isinstance(stats.get(key), int):
            rec[key] = stats[key]
    listed = info.get("set_apart") or []
    rec["set_apart"] = [{"path": str(a["path"])[:RECORDED_PATH], "change": a["change"],
                         "size": a["size"], "sha256": a["sha256"], "why": a["why"]}
                        for a in listed[:RECORDED_APART]]
    apart = info.get("apart") or {}
    rec["set_apart_count"] = sum(int(v["count"]) for v in apart.values())
    rec["set_apart_bytes"] = sum(int(v["bytes"]) for v in apart.values())
    return rec


def apart_lines(info: JSON | None, limit: int = 20) -> list[str]:
    """One line a person reads per set-apart change (the first `limit`), then the rest
    counted: for `tkbox stop`, `tkbox patch` and the Action's summary."""
    info = info or {}
    listed = info.get("set_apart") or []
    lines = [f"{a['path']} ({a['change']}, {a['size']} bytes, sha256 "
             f"{(a['sha256'] or 'not hashed')[:16]}): {WHY_TEXT.get(a['why'], a['why'])}"
             for a in listed[:limit]]
    total = sum(int(v["count"]) for v in (info.get("apart") or {}).values())
    if total > len(lines):
        lines.append(f"and {total - len(lines)} more")
    return lines


#: why a change was set apart, for a person
WHY_TEXT = {
    "ignored": "the checkout's git ignores it",
    "file-too-large": "larger than the per-file limit of 64 MiB",
    "patch-too-large": "the patch reached its limit (the largest changes are left out)",
}


def box_apart(result: JSON, info: JSON | None) -> None:
    """Add to an apply's report (`ApplyReport.to_json()`) what the box's patch left out:
    a `set apart` row for each change left out for its size (the apply cannot write
    what it never received), a note counting those the checkout ignores (apply would
    set them apart too), and a note when the patch is partial."""
    info = info or {}
    rows = [{"path": a["path"], "kind": a["change"], "status": "set apart",
             "reason": f"not in the box's patch: {WHY_TEXT.get(a['why'], a['why'])} "
                       f"({a['size']} bytes)",
             "mode": None, "sha256": a["sha256"] or None}
            for a in info.get("set_apart") or [] if a["why"] != "ignored"]
    result["files"].extend(rows)
    counts = result.setdefault("counts", {})
    counts["set apart"] = counts.get("set apart", 0) + len(rows)
    notes = result.setdefault("notes", [])
    apart = info.get("apart") or {}
    sized = sum(int(v["count"]) for k, v in apart.items() if k != "ignored")
    if sized > len(rows):
        notes.append(f"{sized - len(rows)} more changes were left out of the box's patch "
                     "for their size ('tkbox inspect' lists the first ones)")
    if "ignored" in apart:
        n, b = apart["ignored"]["count"], apart["ignored"]["bytes"]
        notes.append(f"{n} changes the checkout's git ignores ({b} bytes) were left out of "
                     "the box's patch")
    if info.get("partial"):
        notes.append(f"the box's patch is partial ({str(info.get('error', ''))[:200]}): it "
                     "holds only the files that arrived whole")
