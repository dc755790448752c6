"""Checkpoints over the log, and their cosignatures from witnesses.

The signer signs a C2SP checkpoint only over durable leaves, and never two
that disagree (the log only grows). A witness is sent `add-checkpoint` with
the size it last cosigned for us (kept in the log's database) and a
consistency proof from there; a 409 tells us its real size and we retry
once. Each witness's cosignature is checked with its key before it is kept.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import httpx

from tkbox.errors import RemoteError
from tkbox.formats import checkpoint, cosignature, note
from tkbox.formats import witness as wfmt
from tkbox.formats.errors import FormatError
from tkbox.signer.config import WitnessConf
from tkbox.signer.log import Log


class WitnessError(RemoteError):
    """A witness did not cosign: it refused, answered with something that is not a
    cosignature by its key, or claims a tree beyond ours."""

log = logging.getLogger("tkbox.signer.checkpoints")


@dataclass
class Cosigned:
    size: int
    note: bytes  # the checkpoint with the log's signature and the cosignatures obtained
    cosigned_by: list[str]
    failures: dict[str, str]  # witness name -> why it did not cosign


class Checkpointer:
    def __init__(self, log_: Log, signer: note.Ed25519Signer, witnesses: list[WitnessConf],
                 timeout: float = 5.0) -> None:
        self.log = log_
        self.signer = signer
        self.witnesses = witnesses
        self.timeout = timeout
        self._locks = {w.name: asyncio.Lock() for w in witnesses}
        self._client: httpx.AsyncClient | None = None
        self.latest: Cosigned | None = None

    def sign(self, size: int) -> tuple[str, bytes]:
        """The checkpoint text at `size` (durable leaves only) and its log signature line."""
        if size > self.log.durable_size:
            raise ValueError("a checkpoint covers durable leaves only")
        cp = checkpoint.Checkpoint(self.signer.name, size, self.log.tree.root(size))
        text = cp.text()
        sig = note.Signature(self.signer.name, self.signer.key_id, self.signer.sign(text.encode()))
        return text, sig.line().encode()

    async def cosign(self, size: int | None = None) -> Cosigned:
        """A checkpoint at `size` (default: everything durable), cosigned by every witness
        that answers."""
        size = self.log.durable_size if size is None else size
        text, log_sig = self.sign(size)
        signed = text.encode() + b"\n" + log_sig
        lines: list[bytes] = []
        by: list[str] = []
        failures: dict[str, str] = {}
        results = await asyncio.gather(*(self._submit(w, size, signed) for w in self.witnesses),
                                       return_exceptions=True)
        for w, res in zip(self.witnesses, results, strict=True):
            if isinstance(res, BaseException):
                failures[w.name] = " ".join(str(res).split()) or res.__class__.__name__
                log.warning("witness %s did not cosign size %d: %s", w.name, size,
                            failures[w.name])
            else:
                lines.append(res)
                by.append(w.name)
        out = Cosigned(size, signed + b"".join(lines), by, failures)
        if not failures:
            self.log.save_checkpoint(size, out.note)
        self.latest = out
        return out

    async def _submit(self, w: WitnessConf, size: int, signed: bytes) -> bytes:
        verifier = w.verifier()
        async with self._locks[w.name]:
            old = self.log.witness_size(w.name)
            for _ in range(2):
                if old > size:
                    raise WitnessError(f"the witness has size {old}, beyond ours ({size}): "
                                       "is it witnessing another log under our name?")
                proof = self.log.tree.consistency_proof(old, size) if 0 < old else []
                body = wfmt.format_add_checkpoint(old, proof, signed)
                resp = await self._http().post(w.url.rstrip("/") + "/add-checkpoint",
                                               content=body)
                if resp.status_code == 409:
                    old = wfmt.parse_size(resp.content)
                    continue
                if resp.status_code != 200:
                    raise WitnessError(f"HTTP {resp.status_code}: {resp.text[:200]}")
                sigs = wfmt.parse_cosignatures(resp.content)
                mine = [s for s in sigs if (s.name, s.key_id) == (verifier.name, verifier.key_id)]
                if not mine:
                    raise WitnessError("the answer holds no cosignature by its key")
                text = signed[: signed.index(b"\n\n") + 1]
                if not verifier.verify(text, mine[0].raw) or cosignature.timestamp(mine[0]) == 0:
                    raise WitnessError("its cosignature does not verify")
                self.log.set_witness_size(w.name, size)
                return mine[0].line().encode()
            raise WitnessError("the witness kept answering 409")

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout, trust_env=False)
        return self._client

    async def run_periodically(self, interval: float) -> None:
        """Keep the witnesses current: submit whenever the log has grown."""
        if not self.witnesses or interval <= 0:
            return
        last = -1
        while True:
            await asyncio.sleep(interval)
            if self.log.durable_size != last:
                t = time.monotonic()
                try:
                    res = await self.cosign()
                except (FormatError, httpx.HTTPError, ValueError) as exc:
                    log.warning("checkpoint submission failed: %s", exc)
                    continue
                last = res.size
                log.debug("checkpoint %d cosigned by %s in %.0f ms", res.size,
                          ", ".join(res.cosigned_by) or "nobody", (time.monotonic() - t) * 1000)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
