"""`tkbox signer serve`: the signer process.

One asyncio loop serves the Unix socket. Each connection is read frame by
frame; a request is checked and its record staged synchronously, in the
order it came (so a run's chain follows the order of its requests), then a
task waits until the record is durable and answers. Pushes (hold, release,
quarantine) go to every connection that subscribed.

The peer's credentials (`SO_PEERCRED`) are read once per connection: a run
opened on it records `isolation: same-user` when the peer's uid is the
signer's own, `separate-user` otherwise. Holds, releases and quarantines are
taken only from the signer's own user (or root): the daemon cannot release
a hold it was put under.

With `--listen`, the same protocol is also served over TLS (`signer.remote`):
a run opened there records `isolation: remote` and the workload its
connection proved (a client certificate, or a workload-identity token checked
by `signer.oidc`). A remote connection writes only to the runs its own
principal opened, a token opens one run, and a connection that has proved
nothing may only `ping` and `auth`.

Logging: requests at debug level name the op and run only; bodies are never
logged.

One idea: the signer's serving loop, from a parsed request to its durable answer;
the parsing is `formats.wire`'s, the decisions `cedarpolicy`'s and the log `log`'s,
and what stays here (each op's staging, the remote checks, the pushes) shares the
loop's state.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tkbox import __version__
from tkbox._process import undumpable
from tkbox._tasks import TaskOwner
from tkbox.errors import InternalError, UserError
from tkbox.formats import bundle, note, record, wire, workload
from tkbox.formats.errors import FormatError
from tkbox.formats.wire import (
    Auth,
    Close,
    Complete,
    Decide,
    Event,
    Export,
    Hold,
    Open,
    Ping,
    Pushed,
    Quarantine,
    Release,
    Request,
    Status,
    Subscribe,
)
from tkbox.signer import config as config_mod
from tkbox.signer.cedarpolicy import Decision, PolicyEngine
from tkbox.signer.checkpoints import Checkpointer
from tkbox.signer.log import HOLD, QUARANTINE, RELEASE, Log, LogError
from tkbox.signer.policy_worker import NONE as NO_WORKERS
from tkbox.signer.policy_worker import PolicyWorkers, default_count
from tkbox.signer.remote import AUTH_DEADLINE, MAX_CONNECTIONS, RemoteConfig, certificate_identity
from tkbox.signer.store import open_store

if TYPE_CHECKING:
    from tkbox.signer.oidc import Identity, Verifier

log = logging.getLogger("tkbox.signer")

MAX_IN_FLIGHT = 256
MAX_UNREAD_PUSHES = 1 << 20  # bytes a subscriber may leave unread before it is dropped
EXPORT_PART = 512 * 1024
#: the push an operator's record is announced by
_PUSH: dict[str, Literal["hold", "release", "quarantine"]] = {
    HOLD: "hold", RELEASE: "release", QUARANTINE: "quarantine"}
#: kinds a client may not send as events: the signer writes these itself
RESERVED_KINDS = frozenset({record.OPEN, record.CLOSE, record.DECISION, record.COMPLETE, HOLD,
                            RELEASE, QUARANTINE})
#: what a remote connection that has proved nothing yet may ask
UNAUTHENTICATED = (Ping, Auth)


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int
    address: str = ""  # "ip:port" of a connection to the network listener; "" on the socket

    @property
    def remote(self) -> bool:
        return bool(self.address)


def peer_of(sock: socket.socket | None) -> Peer:
    if sock is None:
        return Peer(0, -1, -1)
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


class Refusal(Exception):
    """A request the signer will not take; one line for a person."""


@dataclass(frozen=True)
class Durable:
    """A handler's answer that may go out once `fut` (the record's durability) resolves.

    Answered from the future's callback: no task per request on the decision path."""

    fut: asyncio.Future[None]
    result: dict[str, Any]


@dataclass(eq=False)
class Conn:
    peer: Peer
    writer: asyncio.StreamWriter
    subscribed: bool = False
    identity: Identity | None = None  # what a remote connection proved (cert, then token)
    certificate: Identity | None = None  # its client certificate, if it presented one
    # the answers that wait on more than the log (an export, an operator's request, a
    # decision a policy worker evaluates), each a task of this connection's
    tasks: TaskOwner = field(default_factory=lambda: TaskOwner("signer connection", log))
    waiting: set[asyncio.Future[Any]] = field(default_factory=set)  # answers not yet sent

    _out: list[bytes] = field(default_factory=list)
    _flush_soon: bool = False

    def send(self, msg: wire.Answer | Pushed) -> None:
        """Queue one answer; the answers of one turn of the loop go in one write
        (32 requests in flight answered by one group commit: one syscall, not 32)."""
        if self.writer.is_closing():
            return
        self._out.append(wire.encode(msg.to_wire()))
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_soon = False
        out, self._out = self._out, []
        if out and not self.writer.is_closing():
            self.writer.write(b"".join(out))


class Signer:
    def __init__(self, cfg: config_mod.Config, socket_path: Path,
                 on_fatal: Callable[[str], None] | None = None, policy_workers: int = 0,
                 remote: RemoteConfig | None = None, store: str | None = None) -> None:
        self.cfg = cfg
        self.socket_path = socket_path
        self.remote = remote
        self.oidc: Verifier | None = None
        if remote is not None and remote.issuers:
            from tkbox.signer.oidc import Verifier

            self.oidc = Verifier(remote.issuers)
        self._tls_server: asyncio.AbstractServer | None = None
        self._remote_conns = 0
        self.key = cfg.signer()
        # The log's store: `--store postgresql://…`, else the home's SQLite file.
        self.log = Log(open_store(store) if store else cfg.db_path, on_fatal=on_fatal)
        self.policy = PolicyEngine(cfg.policy_path)
        # New requests evaluated in other processes, while the loop goes on (policy_worker.py)
        self.workers = PolicyWorkers(cfg.policy_path, policy_workers, self.policy.packs) \
            if policy_workers > 0 else None
        self.checkpoints = Checkpointer(self.log, self.key, cfg.witnesses)
        self.trust = cfg.trust(self.key.verifier())
        self.conns: set[Conn] = set()
        self._conn_tasks: set[asyncio.Task[None]] = set()
        self.uid = os.getuid()
        self._server: asyncio.AbstractServer | None = None
        self._tasks = TaskOwner("signer", log)

    # --- serving -------------------------------------------------------------

    async def start(self) -> None:
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if path.exists() or path.is_symlink():
            if await _answers(path):
                raise _already_serving(path)
            path.unlink()
        old = os.umask(0o177 if self.cfg.mode == "dev" else 0o117)
        try:
            self._server = await asyncio.start_unix_server(self._serve_conn, path=str(path),
                                                           limit=wire.MAX_FRAME + 4)
        finally:
            os.umask(old)
        if self.remote is not None:
            try:
                await self._listen(self.remote)
            except BaseException:  # the socket goes too: a signer serves both or neither
                self._server.close()
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                raise
        if self.workers is not None:
            self.workers.start()
        log.info("signer %s serving on %s (log size %d, %d policy workers)",
                 note.key_tag(self.key.name, self.key.key_id), path, self.log.tree.size,
                 0 if self.workers is None else self.workers.count)

    async def serve_forever(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            self._tasks.spawn(self.checkpoints.run_periodically(self.cfg.checkpoint_interval),
                              "checkpoints")
            await stop.wait()
        finally:
            await self._tasks.aclose()
            await self.aclose()

    async def _listen(self, rc: RemoteConfig) -> None:
        try:
            self._tls_server = await asyncio.start_server(
                self._serve_tls_conn, rc.host, rc.port, ssl=rc.context(),
                limit=wire.MAX_FRAME + 4, ssl_handshake_timeout=AUTH_DEADLINE)
        except OSError as exc:
            raise UserError(f"cannot listen on {rc.host}:{rc.port}: "
                            f"{exc.strerror or exc}") from None
        port = self.tls_port
        log.info("signer listening on %s:%d over TLS (%s)", rc.host, port, ", ".join(
            (["client certificates from " + str(rc.client_ca)] if rc.client_ca else [])
            + [f"tokens of {i.url} for {i.audience}" for i in rc.issuers]))
        print(f"signer listening on https://{rc.host}:{port}", file=sys.stderr, flush=True)

    @property
    def tls_port(self) -> int | None:
        server = self._tls_server
        if not isinstance(server, asyncio.Server) or not server.sockets:
            return None
        return int(server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._tls_server is not None:
            self._tls_server.close()
        for c in list(self.conns):
            c.writer.close()
        # Let each connection see its EOF and end by itself: on Python 3.11 a handler
        # cancelled by asyncio.run()'s teardown is logged as an error by asyncio.
        if self._conn_tasks:
            await asyncio.wait(list(self._conn_tasks), timeout=2)
        if self.workers is not None:
            await self.workers.aclose()
        await self.log.wait_durable()
        await self.checkpoints.aclose()
        if self.oidc is not None:
            await self.oidc.aclose()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self.log.close()

    async def _serve_conn(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            peer = peer_of(writer.get_extra_info("socket"))
        except OSError:
            writer.close()
            return
        await self._serve(Conn(peer, writer), reader, writer)

    async def _serve_tls_conn(self, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
        """A connection to the network listener, its TLS handshake done (a client
        certificate, if any, already verified against the pinned CA)."""
        addr = writer.get_extra_info("peername")
        address = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else "?"
        if self._remote_conns >= MAX_CONNECTIONS:
            log.warning("%s: %d remote connections already; closing", address,
                        self._remote_conns)
            writer.close()
            return
        conn = Conn(Peer(0, -1, -1, address), writer)
        try:
            conn.certificate = conn.identity = certificate_identity(
                writer.get_extra_info("ssl_object"))
        except (ValueError, OSError):
            writer.close()
            return
        self._remote_conns += 1
        # A connection that proves nothing within the deadline is closed.
        def unproven() -> None:
            if conn.identity is None:
                writer.close()

        deadline = asyncio.get_running_loop().call_later(AUTH_DEADLINE, unproven)
        try:
            await self._serve(conn, reader, writer)
        finally:
            deadline.cancel()
            self._remote_conns -= 1

    async def _serve(self, conn: Conn, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        peer = conn.peer
        self.conns.add(conn)
        task = asyncio.current_task()
        if task is not None:
            self._conn_tasks.add(task)
            task.add_done_callback(self._conn_tasks.discard)
        decoder = wire.Decoder()
        slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                decoder.feed(data)
                while (frame := decoder.next()) is not None:
                    await slots.acquire()
                    self._dispatch(conn, frame, slots)
                await writer.drain()
        except wire.WireError as exc:
            log.warning("peer %s: %s; closing the connection", _who(peer), exc)
        except (ConnectionError, OSError):
            pass
        finally:
            self.conns.discard(conn)
            if conn.waiting:  # every request read is answered, then the connection ends
                await asyncio.wait(set(conn.waiting))
            await conn.tasks.aclose()
            conn.flush()
            writer.close()

    def _dispatch(self, conn: Conn, frame: dict[str, Any], slots: asyncio.Semaphore) -> None:
        """Parse the frame into its request (wire.parse_request, once, here), check who
        may ask it, then stage it; answer now, once durable, or from a task."""
        try:
            req = wire.parse_request(frame)
        except wire.BadSignerRequest as exc:
            conn.send(wire.Refused(-1 if exc.id is None else exc.id, str(exc)))
            slots.release()
            return
        rid = req.id
        log.debug("peer %s: %s %s", _who(conn.peer), req.OP, getattr(req, "run", ""))
        try:
            if conn.peer.remote:
                self._check_remote(conn, req)  # who may do what, before anything
            elif isinstance(req, Decide | Complete | Event | Close):
                self._check_local(req.run)
            result = self._handle(conn, req)  # checks and stages synchronously
        except (Refusal, LogError, wire.WireError) as exc:
            conn.send(wire.Refused(rid, str(exc)))
            slots.release()
            return
        except Exception as exc:  # noqa: BLE001 - our bug: answer "failed", keep serving
            log.exception("%s failed", req.OP)
            conn.send(wire.Failed(rid, f"{req.OP} failed in the signer: "
                                       f"{exc.__class__.__name__}"))
            slots.release()
            return
        if isinstance(result, dict):
            conn.send(wire.Ok(rid, result))
            slots.release()
            return
        if isinstance(result, Durable):
            answer = result.result
            conn.waiting.add(result.fut)

            def durable(fut: asyncio.Future[None]) -> None:
                conn.waiting.discard(fut)
                slots.release()
                exc = None if fut.cancelled() else fut.exception()
                if fut.cancelled() or isinstance(exc, LogError):
                    conn.send(wire.Refused(rid, str(exc or "the signer is stopping")))
                elif exc is not None:
                    log.error("%s failed: %s", req.OP, exc.__class__.__name__)
                    conn.send(wire.Failed(rid, f"{req.OP} failed in the signer: "
                                               f"{exc.__class__.__name__}"))
                else:
                    conn.send(wire.Ok(rid, answer))

            result.fut.add_done_callback(durable)
            return

        async def finish(awaitable: Awaitable[dict[str, Any]]) -> None:
            try:
                res = await awaitable
                if "_parts" in res:
                    parts: list[bytes] = res.pop("_parts")
                    conn.send(wire.Ok(rid, res))
                    for i, part in enumerate(parts):
                        conn.send(wire.Part(rid, i, base64.b64encode(part).decode()))
                        conn.flush()
                        await conn.writer.drain()
                else:
                    conn.send(wire.Ok(rid, res))
            except (Refusal, LogError, wire.WireError) as exc:
                conn.send(wire.Refused(rid, str(exc)))
            except Exception as exc:  # noqa: BLE001 - answer, then let the log decide
                log.exception("%s failed", req.OP)
                conn.send(wire.Failed(rid, f"{req.OP} failed in the signer: "
                                           f"{exc.__class__.__name__}"))
            finally:
                slots.release()

        task = conn.tasks.spawn(finish(result), req.OP)
        conn.waiting.add(task)
        task.add_done_callback(conn.waiting.discard)

    def _handle(self, conn: Conn, req: Request
                ) -> Durable | Awaitable[dict[str, Any]] | dict[str, Any]:
        """The request's handler; the most frequent first."""
        match req:
            case Decide():
                return self._decide(conn, req)
            case Event():
                return self._event(req)
            case Complete():
                return self._complete(req)
            case Open():
                return self._open(conn, req)
            case Close():
                return self._append(req.run, record.CLOSE, {})
            case Ping():
                return self._ping(conn)
            case Status():
                return self._status(conn)
            case Export():
                return self._export(req)
            case Hold():
                return self._admin(conn, req.run, req.reason, HOLD)
            case Release():
                return self._admin(conn, req.run, req.reason, RELEASE)
            case Quarantine():
                return self._admin(conn, req.run, req.reason, QUARANTINE)
            case Subscribe():
                return self._subscribe(conn)
            case Auth():
                return self._auth(conn, req)

    # --- requests ------------------------------------------------------------

    def _isolation(self, conn: Conn) -> str:
        if conn.peer.remote:
            return "remote"
        return "same-user" if conn.peer.uid == self.uid else "separate-user"

    def _check_remote(self, conn: Conn, req: Request) -> None:
        """A remote connection: it has proved who it is, and writes only to its own runs
        (the principal of the identity that opened them); a token opens one run."""
        ident = conn.identity
        if ident is None:
            if not isinstance(req, UNAUTHENTICATED):
                raise Refusal(f"{req.OP}: authenticate first (a client certificate from the "
                              "signer's CA, or a workload token with auth)")
            return
        match req:
            case Open():
                if ident.jti is not None and ident.jti in self.log.jtis:
                    raise Refusal(f"this workload token opened run {self.log.jtis[ident.jti]} "
                                  "already: a token opens one run (replayed?); ask its issuer "
                                  "for a fresh one")
            case Decide() | Complete() | Event() | Close() | Export():
                r = self.log.runs.get(req.run)
                if r is not None and r.owner != ident.principal:
                    raise Refusal(f"run {req.run} belongs to another workload: this connection "
                                  f"({workload.describe(ident.workload)}) writes only to its "
                                  "own runs")
            case Status():
                raise Refusal("status is for the signer's own host; ping says who it is")
            case _:
                pass

    def _check_local(self, run: str) -> None:
        """A run a remote workload opened takes records from that workload only."""
        r = self.log.runs.get(run)
        if r is not None and r.owner:
            raise Refusal(f"run {run} belongs to a remote workload; it takes records only "
                          "over the network listener, from that workload")

    async def _auth(self, conn: Conn, req: Auth) -> dict[str, Any]:
        """A workload token (`signer.oidc`): the connection becomes its workload."""
        if not conn.peer.remote:
            raise Refusal("auth is for the network listener; the socket's peer is its uid")
        if self.oidc is None:
            raise Refusal("this signer takes no workload tokens (no --oidc-issuer); present a "
                          "client certificate")
        from tkbox.signer.oidc import TokenRefused

        try:
            ident = await self.oidc.verify(req.token)
        except TokenRefused as exc:
            log.warning("peer %s: token refused: %s", _who(conn.peer), exc)
            raise Refusal(f"token refused: {exc}") from None
        if conn.certificate is not None:  # both: the token names the workload
            ident.workload = {**ident.workload,
                              "certificate": conn.certificate.workload["certificate"]}
        conn.identity = ident
        log.info("peer %s: %s", _who(conn.peer), workload.describe(ident.workload))
        return {"workload": workload.describe(ident.workload), "time_ms": _now_ms()}

    def _ping(self, conn: Conn) -> dict[str, Any]:
        return {"key": note.key_tag(self.key.name, self.key.key_id), "origin": self.key.name,
                "vkey": self.key.verifier().vkey(), "isolation": self._isolation(conn),
                "uid": self.uid, "peer_uid": conn.peer.uid, "version": __version__,
                "time_ms": _now_ms()}

    def _status(self, conn: Conn) -> dict[str, Any]:
        states: dict[str, int] = {}
        for r in self.log.runs.values():
            states[r.state] = states.get(r.state, 0) + 1
        latest = self.checkpoints.latest
        return {
            **self._ping(conn),
            "size": self.log.tree.size,
            "durable": self.log.durable_size,
            "undumpable": undumpable(),
            "runs": states,
            "held": sorted(r.run for r in self.log.runs.values() if r.state == "held"),
            "quarantined": sorted(r.run for r in self.log.runs.values()
                                  if r.state == "quarantined"),
            "policy": self.policy.digest,
            "policy_error": self.policy.error(),
            "policy_workers": NO_WORKERS if self.workers is None else self.workers.status(),
            "witnesses": [w.name for w in self.cfg.witnesses],
            "listen": None if self.remote is None or self.tls_port is None else
            f"https://{self.remote.host}:{self.tls_port}",
            "remote_connections": self._remote_conns,
            "store": self.log.path,
            "last_cosigned": None if latest is None else {
                "size": latest.size, "by": latest.cosigned_by, "failures": latest.failures},
        }

    def _append(self, run: str, kind: str, body: dict[str, Any],
                result: dict[str, Any] | None = None) -> Durable:
        rec, fut = self.log.stage(run, kind, body)
        return Durable(fut, {"seq": rec.seq, **(result or {})})

    def _open(self, conn: Conn, req: Open) -> Durable:
        body = {
            "facts": req.facts,
            "isolation": self._isolation(conn),
            "peer": {"uid": conn.peer.uid, "gid": conn.peer.gid, "pid": conn.peer.pid},
            "signer": {"uid": self.uid, "version": __version__, "mode": self.cfg.mode},
            "policy": self.policy.digest,
        }
        if conn.peer.remote:  # who recorded it, as checked here (formats/workload.py)
            assert conn.identity is not None  # _check_remote
            body["peer"] = {"address": conn.peer.address}
            body["workload"] = conn.identity.workload
        return self._append(req.run, record.OPEN, body)

    def _decide(self, conn: Conn, req: Decide) -> Durable | Awaitable[dict[str, Any]]:
        run, action, resource, context = req.run, req.action, req.resource, req.context
        r = self.log.check(run, record.DECISION)
        if r.state in ("held", "quarantined"):
            d = _operator_refusal(run, r.state, r.reason)
        elif self.workers is not None and self.workers.ready():
            key, hit = self.policy.cached(run, action, resource, context)
            if hit is None:  # a new request: a worker evaluates it while the loop goes on
                return self._decide_elsewhere(run, action, resource, context, key,
                                              self.policy.generation)
            d = hit
        else:
            d = self.policy.decide(run, action, resource, context)
        return self._stage_decision(run, action, resource, context, d)

    def _stage_decision(self, run: str, action: str, resource: dict[str, Any],
                        context: dict[str, Any], d: Decision) -> Durable:
        body = {"action": action, "resource": resource, "context": context, **d.record_body()}
        rec, fut = self.log.stage(run, record.DECISION, body)
        return Durable(fut, {"allowed": d.allowed, "reason": d.reason,
                             "decision": f"{run}/{rec.seq}"})

    async def _decide_elsewhere(self, run: str, action: str, resource: dict[str, Any],
                                context: dict[str, Any], key: bytes | None,
                                generation: int) -> dict[str, Any]:
        """A new request evaluated by a policy worker (policy_worker.py), then recorded
        as on the loop. The run is checked again once the answer is back: held or
        quarantined meanwhile, the request is refused; closed, it is not recorded."""
        assert self.workers is not None
        d = await self.workers.decide(run, action, resource, context)
        if d is None:  # no worker answered: evaluated here, as without workers
            d = self.policy.evaluate(run, action, resource, context)
        self.policy.keep(key, d, generation)
        r = self.log.check(run, record.DECISION)
        if r.state in ("held", "quarantined"):
            d = _operator_refusal(run, r.state, r.reason)
        staged = self._stage_decision(run, action, resource, context, d)
        await staged.fut
        return staged.result

    def _complete(self, req: Complete) -> Durable:
        run, did = req.run, req.decision
        r = self.log.check(run, record.COMPLETE)
        prefix, _, seq_s = did.rpartition("/")
        if prefix != run or not seq_s.isdigit() or int(seq_s) not in r.decisions:
            raise Refusal(f"{did!r} is not a decision of run {run}")
        seq = int(seq_s)
        if not r.decisions[seq]:
            raise Refusal(f"decision {did} was a refusal; there is nothing to complete")
        if seq in r.completed:
            raise Refusal(f"decision {did} is completed already")
        return self._append(run, record.COMPLETE, {"decision": seq, "outcome": req.outcome})

    def _event(self, req: Event) -> Durable:
        if req.kind in RESERVED_KINDS:  # its shape was checked at the edge (wire.py)
            raise Refusal(f"{req.kind!r} cannot be an event kind (a dotted lowercase name "
                          "such as tkbox.gap, and not one the signer writes itself)")
        return self._append(req.run, req.kind, req.body)

    def _admin(self, conn: Conn, run: str, reason: str, kind: str
               ) -> Awaitable[dict[str, Any]]:
        if conn.peer.uid not in (self.uid, 0):
            raise Refusal("only the signer's own user may hold, release or quarantine a run")
        rec, fut = self.log.stage(run, kind, {"reason": reason, "by_uid": conn.peer.uid})
        push = Pushed(_PUSH[kind], run, reason)

        async def durable_then_push() -> dict[str, Any]:
            await fut
            self.push(push)
            return {"seq": rec.seq}

        return durable_then_push()

    def _subscribe(self, conn: Conn) -> dict[str, Any]:
        conn.subscribed = True
        # A daemon that (re)subscribes learns the runs that are held or quarantined now.
        loop = asyncio.get_running_loop()
        for r in self.log.runs.values():
            if r.state in ("held", "quarantined") and self._may_see(conn, r.run):
                kind: Literal["hold", "quarantine"] = \
                    "hold" if r.state == "held" else "quarantine"
                loop.call_soon(conn.send, Pushed(kind, r.run, r.reason))
        return {}

    def _may_see(self, conn: Conn, run: str) -> bool:
        """A remote connection hears of its own runs only."""
        if not conn.peer.remote:
            return True
        r = self.log.runs.get(run)
        return r is not None and conn.identity is not None and r.owner == conn.identity.principal

    def push(self, msg: Pushed) -> None:
        for c in list(self.conns):
            if not c.subscribed or not self._may_see(c, msg.run):
                continue
            if c.writer.transport.get_write_buffer_size() > MAX_UNREAD_PUSHES:
                log.warning("peer %s does not read its pushes; dropping it", _who(c.peer))
                c.writer.close()
                continue
            c.send(msg)

    def _export(self, req: Export) -> Awaitable[dict[str, Any]]:
        run = req.run
        r = self.log.runs.get(run)
        if r is None:
            raise Refusal(f"run {run} is not known to this signer")
        if r.state != "closed":
            raise Refusal(f"run {run} is {r.state}; close it before exporting")
        return self._export_closed(run)

    async def _export_closed(self, run: str) -> dict[str, Any]:
        await self.log.wait_durable()
        data = await self.export(run)
        parts = [data[i : i + EXPORT_PART] for i in range(0, len(data), EXPORT_PART)]
        return {"trust": base64.b64encode(self.trust).decode(), "parts": len(parts),
                "size": len(data), "_parts": parts}

    async def export(self, run: str) -> bytes:
        """The bundle of a closed run, at a freshly cosigned checkpoint."""
        leaves = await asyncio.to_thread(self.log.run_leaves, run)
        cos = await self.checkpoints.cosign()
        pol = bundle.parse_trust(self.trust).policy
        if not pol.satisfied(cos.cosigned_by):
            why = "; ".join(f"{n}: {e}" for n, e in cos.failures.items()) or "no witness answered"
            raise Refusal(f"export of {run}: the witnesses did not cosign enough for the trust "
                          f"file's policy ({why}); try again when they answer")
        entries = [(idx, raw, self.log.tree.inclusion_proof(idx, cos.size)) for idx, raw in leaves]
        b = bundle.build(run, entries, cos.note)
        data = b.encode()
        _self_check(data, self.trust)
        return data


def _self_check(data: bytes, trust: bytes) -> None:
    """Verify what we export: an export that does not verify is our bug."""
    from tkbox.verify.core import verify_bundle

    try:
        verify_bundle(data, trust)
    except FormatError as exc:
        raise InternalError(f"the bundle the signer built does not verify: {exc}") from None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _who(peer: Peer) -> str:
    return peer.address if peer.remote else f"pid {peer.pid}"


async def _answers(path: Path) -> bool:
    try:
        _, w = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), 1.0)
    except (OSError, TimeoutError):
        return False
    w.close()
    return True


def _operator_refusal(run: str, state: str, reason: str) -> Decision:
    return Decision(False, f"run {run} is {state} by the signer's operator"
                    + (f": {reason}" if reason else ""))


async def serve(cfg: config_mod.Config, socket_path: Path,
                policy_workers: int | None = None, remote: RemoteConfig | None = None,
                store: str | None = None) -> None:
    """Serve until SIGTERM or SIGINT; `policy_workers` None: one per core beyond
    the loop's own (`policy_worker.default_count`)."""
    # Before the log is opened: a second signer must not touch the first one's log.
    if await _answers(socket_path):
        raise _already_serving(socket_path)
    workers = default_count() if policy_workers is None else policy_workers
    await Signer(cfg, socket_path, policy_workers=workers, remote=remote,
                 store=store).serve_forever()


def _already_serving(path: Path) -> UserError:
    return UserError(f"a signer already answers on {path}: stop it first, or give this "
                     "one another home (TKBOX_HOME)")
