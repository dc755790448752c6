"""Stand-ins for the guest agent's side of the RPC, for tests of the host above it.

`answer_diff` answers a `diff` request as the real agent does (`tkbox.guest.agent`,
`tkbox.guest.rpc`): the changed paths asked about when the host asks, then the
set-apart entries, the patch, a `mark` after it, and `end`. A fake guest that only
has a patch to give calls it; one that attacks the host writes its own frames.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tkbox.guest import rpc
from tkbox.protocol.framing import FramedStream

__all__ = ["answer_diff", "patch_paths"]

_HEADER = re.compile(rb"^diff --git a/(\S+) b/", re.M)


def patch_paths(patch: bytes) -> list[bytes]:
    """The (unquoted) paths a patch's `diff --git` headers name, once each, sorted."""
    return sorted(set(_HEADER.findall(patch)))


async def answer_diff(fs: FramedStream, req: dict[str, Any], patch: bytes, *,
                      stats: dict[str, Any] | None = None,
                      apart: Sequence[dict[str, Any]] = ()) -> set[bytes]:
    """Answer one `diff` request with `patch` (one whole unit); the paths the host said
    its checkout ignores (empty when it did not ask)."""
    ignored: set[bytes] = set()
    if req.get("ask_ignored"):
        paths = patch_paths(patch)
        if paths:
            await fs.send({"ev": "paths", "data": b"\x00".join(paths) + b"\x00"})
        await fs.send({"ev": "paths_end", "count": len(paths)})
        answer = await fs.receive()
        bits = answer.get("bits", b"") if answer else b""
        ignored = {p for i, p in enumerate(paths) if bits[i >> 3] & (1 << (i & 7))}
    for a in apart:
        await fs.send({"ev": "apart", **a})
    for i in range(0, len(patch), rpc.CHUNK):
        await fs.send({"ev": "data", "data": patch[i:i + rpc.CHUNK]})
    if patch:
        await fs.send({"ev": "mark"})
    await fs.send({"ev": "end", "stats": stats or {}})
    return ignored
