"""`tkbox cp`: a file across the boundary, in either direction, decided and recorded.

Each copy is one `Write` decision (path, size, hash, where it goes) and its
completion. A copy out never lands in the box's own checkout: code changes
return only through `tkbox stop` and `tkbox apply`.
"""

from __future__ import annotations

import hashlib
import io
import os
from typing import Any

from tkbox.daemon import lifecycle
from tkbox.daemon.box import Box
from tkbox.daemon.core import ManagerCore
from tkbox.daemon.guest_client import GuestClient
from tkbox.doors.secrets import prestart
from tkbox.errors import (
    Refused,
    SignerUnavailable,
    TkboxError,
    UserError,
)
from tkbox.guest import rpc


class CopyVerbs(ManagerCore):
    """cp into and out of a running box."""

    def _running(self, name: str, verb: str) -> tuple[Box, GuestClient]:
        box = self.get(name)
        if not lifecycle.takes_crossings(box.state) or box.guest is None:
            raise UserError(f"cannot {verb} box {name}: it is {box.state}; files cross only "
                            f"while a box runs. {lifecycle.HINTS.get(box.state, '')}")
        return box, box.guest

    async def _decide_copy(self, box: Box, direction: str, box_path: str, data: bytes,
                           mode: int, host_path: str) -> str | None:
        """One `Write` decision for a copy across the boundary (None when unrecorded)."""
        if box.unrecorded:
            return None
        resource = {"path": box_path, "sha256": hashlib.sha256(data).hexdigest(),
                    "mode": f"{0o100000 | (mode & 0o777):o}"}
        context = {"copy": direction, "host_path": host_path[:4096], "size": len(data)}
        try:
            verdict = await self.signer.decide(box.run_id, "Write", resource, context)
        except SignerUnavailable as exc:
            raise Refused(f"refused: the signer did not answer, so nothing crosses ({exc}); "
                          "start it with 'tkbox signer serve'") from None
        if not verdict.allowed:
            raise Refused(f"refused by the signer: {verdict.reason}")
        return verdict.decision_id

    async def _complete_copy(self, box: Box, decision_id: str | None, ok: bool,
                             error: str = "") -> None:
        if decision_id is None:
            return
        try:
            await self.signer.complete(box.run_id, decision_id,
                                       {"written": ok, "error": error[:300]})
        except TkboxError as exc:
            self._gap(box, {"reason": f"completion not recorded: {exc}"})
            await self.contain(box, f"a completion could not be recorded ({exc})")

    async def copy_in(self, name: str, box_path: str, data: bytes, mode: int,
                      host_path: str) -> dict[str, Any]:
        """`tkbox cp LOCAL BOX:PATH`: a crossing into the box, decided and recorded."""
        box, guest = self._running(name, "copy into")
        path = box_path_of(box_path)
        if len(data) > rpc.MAX_FILE:
            raise UserError(f"{host_path} is larger than {rpc.MAX_FILE} bytes; copy it into the "
                            "workspace before the box starts instead")
        try:
            # The path first: the second message names it.
            prestart.refuse_values(box.secrets, path.encode("utf-8", "surrogateescape"),
                                   "the path copied to")
            prestart.refuse_values(box.secrets, data, f"the file copied to {path[:200]}")
        except Refused as exc:
            await self.record(box, "tkbox.command.refused", {"reason": str(exc)[:500]})
            raise
        decision = await self._decide_copy(box, "in", path, data, mode, host_path)
        try:
            await guest.write_file(path, data, mode=mode)
        except TkboxError as exc:
            await self._complete_copy(box, decision, False, str(exc))
            raise
        await self._complete_copy(box, decision, True)
        return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    async def copy_out(self, name: str, box_path: str, host_path: str) -> tuple[bytes, str]:
        """`tkbox cp BOX:PATH LOCAL`: the file is read whole, then decided and recorded
        (path, size, hash, where it goes) before a byte of it leaves the daemon.

        Code changes still return only through `tkbox apply`: a destination inside the
        box's own checkout is refused.
        """
        box, guest = self._running(name, "copy out of")
        path = box_path_of(box_path)
        ws = os.path.realpath(box.info.workspace)
        dest = os.path.realpath(host_path)
        if dest == ws or dest.startswith(ws.rstrip("/") + "/"):
            raise UserError(f"{host_path} is inside the box's checkout; changes to it return "
                            f"only through 'tkbox stop {name}' and 'tkbox apply {name}'")
        buf = io.BytesIO()
        await guest.read_file(path, buf)
        data = buf.getvalue()
        decision = await self._decide_copy(box, "out", path, data, 0o644, dest)
        await self._complete_copy(box, decision, True)
        return data, path


def box_path_of(path: str) -> str:
    """A path in the box as given to `tkbox cp`: absolute, or relative to /workspace;
    normalised, at most 4,096 bytes, no NUL."""
    if not path or "\x00" in path or len(path.encode()) > 4096:
        raise UserError(f"{path[:80]!r} is not a path in the box; give /abs/path or a path "
                        "relative to /workspace")
    full = path if path.startswith("/") else f"/workspace/{path}"
    norm = os.path.normpath(full)
    if norm == "/":
        raise UserError("give a file in the box, not its root directory")
    return norm
