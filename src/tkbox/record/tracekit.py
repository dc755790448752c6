"""`TracekitSignerClient`: the `SignerClient` for a Tracekit (`tracekit-ai` 1.4.2) signer.

Teams who already record their agents with Tracekit put tkbox in front of
their own signer (`tkbox daemon --signer tracekit[:SOCKET]`) and verify runs
with `tracekit verify`. tkbox's own signer stays the default (docs/tracekit.md
says what each gives).

The wire is Tracekit's: newline-delimited JSON on its Unix socket, `hello`
first, the peer named by SO_PEERCRED. We speak it through Tracekit's own SDK
(`tracekit.sdk.client.Client`, one pipelined connection, request ids that make
a resent call idempotent), each blocking call in a worker thread.

How each crossing is recorded (`tool_call`):

- open run: `register_run`, then `observe` of `tkbox.run.open` with the facts;
- Bash: `decide` tool `Bash`, args `{command, cwd, env, argv, stdin_sha256}`
  (Tracekit's shell class reads `command`);
- Connect: `decide` tool `Connect`, args `{url: https://host:port, addresses}`
  (the `http` class, through POLICY);
- Write: `decide` tool `Write`, args `{file_path: /workspace/PATH,
  content_sha256, mode, …}` (the fs class);
- Approval: `decide` tool `tkbox.Approval`, args `{resource, context}`;
- complete: `complete` with the outcome as `result`;
- event KIND: `observe`, `source` = `KIND {body…}` (in clear, at most 256
  characters), `value` = the body (committed).

Tracekit has no generic event call: `observe` is the nearest, and its record
(`input.observed`) carries `source` in clear and the value as a salted
commitment (the content vault keeps the value itself when it is on). So the
kind and a one-line summary of every tkbox event are readable in the bundle,
and the whole body is bound to it.

Verdicts: `allow` is allowed; `deny` is refused; `ask` (a rule that wants a
person, or `TK-HOLD` on a held run) is refused too, since a tkbox door cannot
wait for a Tracekit approval. A `TK-HOLD` or `TK-QUARANTINE` answer is also a
push (the daemon pauses or kills the box at once).

Holds and quarantines: Tracekit pushes nothing to its clients. Its signer
POSTs its incident records (`run.held`, `run.resumed`, `run.quarantined`) to a
webhook through a durable outbox that polls its log every second, each body
signed `X-Tracekit-Signature: t=<unix s>,v1=<hex HMAC-SHA256(secret, "<t>." +
body)>` (tracekit/signer/webhook.py). `pushes()` serves that webhook on a
loopback port and turns each verified record into a `Push`; the decide answers
above are a second path for a box that is acting. The outbox is woken by
the write, so the bound is one POST after the record is durable (median 7 ms,
benchmarks/signer.py). Without a webhook (a system signer) `pushes()` reads
each open run's new records every POLL_S instead.

Each box is its own Tracekit identity. Tracekit makes every new run of a
held or quarantined owner (and attested principal) inherit the containment for
an hour; with one identity for the daemon, quarantining one box would contain
every box started after it. So with a setup from `init_dev` (whose token store
the daemon may write), `open_run` mints a bearer token `tkbox-<run>` in the
signer's token store (read again by the signer on every request) and the run's
run is registered over the signer's loopback HTTP listener as
`token:tkbox-<run>`, which then delegates it (`delegate_run`) to the daemon's
uid, whose calls go over the Unix socket (an HTTP round trip costs ~40 ms,
the socket ~1 ms; benchmarks/signer.py). Without one
(a system signer we cannot add tokens to) every run is the daemon's uid over
the Unix socket, and a quarantine is inherited until an operator resolves its
incident (docs/tracekit.md).

Export: Tracekit has no export call; `tracekit export --v2` reads the signer's
store, so it runs as the signer's user. With a config on this host that we can
read (`config`, a same-user signer) `export` runs it; otherwise it raises
`SignerUnavailable` naming the command to run as the signer's user.

Modules: this one is the client (`TracekitSignerClient`, `client_for`, the
`init` command); `tracekit_map` is the mapping and the webhook reader, pure
and sans-IO; `tracekit_setup` writes and reads the signer's configuration.
The client stays one module of about 600 lines: its calls, the per-box
identities, the webhook it serves and export share one connection and one
table of runs, and cutting it would spread that state over modules.

Errors: everything from Tracekit (its SignerUnavailable, RPCError,
Incompatible, a malformed answer) becomes tkbox's `SignerUnavailable`, one
line, fail closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tkbox._fs import write_atomic
from tkbox._tasks import TaskOwner
from tkbox.errors import HostError, SignerUnavailable, UserError
from tkbox.record.client import (
    JSON,
    Action,
    Export,
    Push,
    SignerClient,
    Verdict,
    unrecordable,
)
from tkbox.record.tracekit_map import (
    INCIDENT_PUSH,
    WEBHOOK_BODY_MAX,
    Contained,
    args_digest,
    event_source,
    is_final,
    read_answer,
    read_webhook,
    tool_call,
)
from tkbox.record.tracekit_setup import (
    BOX_TOKEN_TTL_S,
    Setup,
    init_dev,
    load_setup,
    tracekit_command,
    tracekit_home,
)

TRACEKIT_VERSION = "1.4.2"
EXPORT_TIMEOUT_S = 120.0
FINAL_WAIT_S = 30.0  # how long export waits for a closed run to become final
POLL_S = 0.5  # without a webhook, how often each open run's new records are read



# --- the client ------------------------------------------------------------------------


@dataclass
class _Run:
    token: str
    calls: dict[str, tuple[str, str]]  # decision id -> (tool call id, args digest)
    seen: int = 0  # the next run_seq the poller reads (no webhook)


class TracekitSignerClient(SignerClient):
    """The daemon's side of a Tracekit signer at `socket_path`.

    `config`: the signer's signer.yaml when this user may read its store (a
    same-user signer), for `export`; `webhook_port`/`webhook_secret`: where the
    signer POSTs its incident records (see the module docstring).
    """

    def __init__(self, socket_path: str | Path, *, config: Path | None = None,
                 webhook_port: int | None = None, webhook_secret: bytes | None = None,
                 setup: Setup | None = None, timeout: float = 10.0) -> None:
        try:
            from tracekit.sdk import client as tkclient
        except ImportError:
            raise HostError("--signer tracekit needs tracekit-ai 1.4.2: "
                            "pip install 'tracekit-ai==1.4.2'") from None
        self._tk = tkclient
        self.socket_path = Path(socket_path)
        self.config = config
        self.timeout = timeout
        self.webhook_port = webhook_port
        self.webhook_secret = webhook_secret
        self.setup = setup
        self._client: Any = None
        self._token_lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._closed: set[str] = set()
        self._ids = itertools.count(1)
        self._queue: asyncio.Queue[Push] | None = None
        self._server: asyncio.base_events.Server | None = None
        self._seen: set[tuple[str, str, str]] = set()

    @classmethod
    def from_setup(cls, setup: Setup, socket_path: Path | None = None) -> TracekitSignerClient:
        try:
            secret = setup.webhook_secret.read_bytes().strip()
        except OSError as exc:
            raise UserError(f"cannot read {setup.webhook_secret}: {exc.strerror}") from None
        return cls(socket_path or setup.socket, config=setup.config, setup=setup,
                   webhook_port=setup.webhook_port, webhook_secret=secret)

    # --- calls ---------------------------------------------------------------------

    def _sdk(self) -> Any:
        if self._client is None:
            self._client = self._tk.Client(str(self.socket_path), timeout=self.timeout)
        return self._client

    def _box_client(self, run_id: str) -> Any:
        """A new identity for one box: a token `tkbox-<run>` in the signer's
        token store, and an SDK client that presents it (module docstring)."""
        from tracekit.identity.token import TokenStore

        assert self.setup is not None
        name = "tkbox-" + "".join(ch if ch.isalnum() else "-" for ch in run_id.lower())[:40] \
            + "-" + os.urandom(4).hex()
        with self._token_lock:  # TokenStore.add reads, changes and rewrites the whole file
            token = TokenStore(str(self.setup.tokens)).add(name, BOX_TOKEN_TTL_S)
        path = self.setup.home / "boxes" / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        return self._tk.Client(f"http://127.0.0.1:{self.setup.http_port}", timeout=self.timeout,
                               token_file=str(path))

    async def _call(self, method: str, req: dict[str, Any],
                    client: Callable[[], Any] | None = None) -> dict[str, Any]:
        from tracekit.signer.rpc_schema import RPCError

        def go() -> Any:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the SDK warns on a version mismatch; we check it
                return (client or self._sdk)().call(method, req)

        try:
            answer = await asyncio.to_thread(go)
        except RPCError as exc:
            raise SignerUnavailable(f"the Tracekit signer refused {method}: "
                                    f"{exc.code}: {exc.message}") from None
        except (self._tk.SignerUnavailable, self._tk.Incompatible) as exc:
            self._reset()
            raise SignerUnavailable(f"the Tracekit signer at {self.socket_path} does not answer "
                                    f"({_one_line(exc)}); start it with `tracekit signer serve "
                                    "--config …`") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._reset()
            raise SignerUnavailable(f"the Tracekit signer call {method} failed "
                                    f"({_one_line(exc)})") from None
        if not isinstance(answer, dict):
            raise SignerUnavailable(f"the Tracekit signer's answer to {method} is malformed")
        return answer

    def _reset(self) -> None:
        c, self._client = self._client, None
        if c is not None:
            with contextlib.suppress(Exception):
                c.close()

    def _token_file(self, run_id: str) -> Path | None:
        """Where a run's (delegated) token is kept across daemon restarts: the
        setup's `boxes/` (0700), named by a digest of the run id; None without a setup."""
        if self.setup is None:
            return None
        return self.setup.home / "boxes" / (hashlib.sha256(run_id.encode()).hexdigest() + ".run")

    def _run(self, run_id: str) -> _Run:
        r = self._runs.get(run_id)
        if r is None and run_id not in self._closed:
            path = self._token_file(run_id)
            with contextlib.suppress(OSError, ValueError):
                if path is not None:  # opened by this daemon before a restart
                    r = self._runs[run_id] = _Run(path.read_text().strip(), {})
        if r is None or not r.token:
            raise SignerUnavailable(f"run {run_id} is not open at the Tracekit signer "
                                    "(not registered by this daemon)")
        return r

    def _req(self, run_id: str, **fields: Any) -> dict[str, Any]:
        return {"run_id": run_id, "run_token": self._run(run_id).token, **fields}

    async def _run_call(self, run_id: str, method: str, **fields: Any) -> dict[str, Any]:
        return await self._call(method, self._req(run_id, **fields))

    # --- SignerClient ----------------------------------------------------------------

    async def ping(self) -> JSON:
        status = await self._call("status", {})
        hello: dict[str, Any] = getattr(self._client, "hello", None) or {}
        if hello.get("version") != TRACEKIT_VERSION:
            raise SignerUnavailable(f"the Tracekit signer at {self.socket_path} is "
                                    f"{hello.get('version', '?')}; tkbox supports "
                                    f"{TRACEKIT_VERSION}")
        try:
            same = os.stat(self.socket_path).st_uid == os.getuid()
        except OSError:
            same = False
        signer = status["signer"] if isinstance(status.get("signer"), dict) else {}
        key = f"{signer.get('name', 'tracekit-signer')} {hello.get('version', '?')}"
        if self.config is not None:  # the log's verifier key, where init_dev put the store
            with contextlib.suppress(OSError):
                key = (self.config.parent / "data" / "log.vkey").read_text().split()[0]
        return {"key": str(key), "isolation": "same-user" if same else "separate-user",
                "backend": "tracekit", "version": hello.get("version")}

    async def open_run(self, run_id: str, facts: JSON) -> None:
        tf = self._token_file(run_id)
        if run_id in self._runs or run_id in self._closed or (tf is not None and tf.exists()):
            raise SignerUnavailable(f"run {run_id} exists already")
        box: Any = None
        if self.setup is not None:
            try:
                box = await asyncio.to_thread(self._box_client, run_id)
            except (OSError, ValueError) as exc:
                raise SignerUnavailable(f"cannot add run {run_id}'s identity to "
                                        f"{self.setup.tokens} ({_one_line(exc)})") from None
        try:
            ans = await self._call("register_run", {
                "request_id": os.urandom(16).hex(), "run_id": run_id,
                "agent": {"name": "tkbox", "version": _tkbox_version()},
                "principal": f"tkbox-run:{run_id}"}, (lambda: box) if box is not None else None)
            if ans.get("run_id") != run_id or not isinstance(ans.get("run_token"), str):
                raise SignerUnavailable(f"the Tracekit signer did not register run {run_id} "
                                        "as asked")
            token = ans["run_token"]
            if box is not None:
                # The box's identity owns the run; the daemon's uid acts for it over
                # the Unix socket (an HTTP round trip costs ~40 ms: Nagle and
                # delayed ACKs between Tracekit's server and http.client).
                d = await self._call("delegate_run", {"run_id": run_id, "run_token": token,
                                                      "identity": f"uid:{os.getuid()}"},
                                     lambda: box)
                if not isinstance(d.get("run_token"), str):
                    raise SignerUnavailable("the Tracekit signer's delegation is malformed")
                token = d["run_token"]
        finally:
            if box is not None:
                with contextlib.suppress(Exception):
                    box.close()
        self._runs[run_id] = _Run(token, {})
        path = self._token_file(run_id)
        if path is not None:
            try:
                # Whole or not at all: a daemon that restarts reads it back.
                write_atomic(path, token.encode(), 0o600)
            except HostError as exc:
                raise SignerUnavailable(f"cannot keep run {run_id}'s token in {path} "
                                        f"({exc})") from None
        await self.event(run_id, "tkbox.run.open", facts)

    async def decide(self, run_id: str, action: Action, resource: JSON, context: JSON) -> Verdict:
        tool, args = tool_call(action, resource, context)
        _check_recordable(args)
        tcid = f"tkbox-{next(self._ids)}-{os.urandom(4).hex()}"
        d = await self._run_call(run_id, "decide", tool_call_id=tcid, tool=tool,
                                 args_source="parsed", args=args)
        a = read_answer(tool, d)
        if a.push is not None:
            self._push(Push(a.push, run_id, a.reason))  # type: ignore[arg-type]
        if a.allowed:
            self._run(run_id).calls[a.decision_id] = (tcid, args_digest(tool, args))
        return Verdict(a.allowed, a.reason, a.decision_id)

    async def complete(self, run_id: str, decision_id: str, outcome: JSON) -> None:
        r = self._run(run_id)
        call = r.calls.pop(decision_id, None)
        if call is None:
            raise SignerUnavailable(f"decision {decision_id} of run {run_id} is not one this "
                                    "daemon was allowed")
        _check_recordable(dict(outcome))
        exit_ok = outcome.get("exit", 0) == 0 and not outcome.get("error")
        await self._run_call(run_id, "complete", tool_call_id=call[0], decision_id=decision_id,
                             args_digest=call[1], status="ok" if exit_ok else "error",
                             result=dict(outcome))

    async def event(self, run_id: str, kind: str, body: JSON) -> None:
        _check_recordable(dict(body))
        await self._run_call(run_id, "observe", source=event_source(kind, body),
                             trust="trusted", value=dict(body))

    async def close_run(self, run_id: str) -> None:
        if run_id in self._closed:  # an export that failed after closing is tried again
            return
        await self._run_call(run_id, "close_run", reason="tkbox: box exported")
        self._runs.pop(run_id, None)
        self._closed.add(run_id)
        path = self._token_file(run_id)
        if path is not None:
            with contextlib.suppress(OSError):
                path.write_text("")  # closed: kept empty, so the id stays used

    async def export(self, run_id: str) -> Export:
        if self.config is None:
            raise SignerUnavailable(
                "this Tracekit signer's store is not readable by the daemon (system mode); as "
                "the signer's user run: sudo -u tracekit-signer tracekit export --v2 --run "
                f"{run_id} --config /etc/tracekit/signer.yaml -o {run_id}.tkb && tracekit "
                f"signer trust --config /etc/tracekit/signer.yaml -o {run_id}.trust.json")
        return await asyncio.to_thread(self._export, run_id, self.config)

    def _export(self, run_id: str, config: Path) -> Export:
        tmp = Path(tempfile.mkdtemp(prefix="tkbox-tk-"))
        try:
            deadline = time.monotonic() + FINAL_WAIT_S
            while True:  # a closed run is final a grace period later
                p = _tracekit("export", "--v2", "--run", run_id, "--config", str(config),
                              "-o", str(tmp / "run.tkb"))
                if p.returncode == 0 and is_final((tmp / "run.tkb").read_bytes()):
                    break
                if time.monotonic() > deadline:
                    if p.returncode == 0:
                        raise SignerUnavailable(
                            f"run {run_id} is not final at the Tracekit signer "
                            f"{FINAL_WAIT_S:g} s after it closed; export it again later")
                    break
                time.sleep(0.5)
            if p.returncode != 0:
                raise SignerUnavailable(f"tracekit export of run {run_id} failed: "
                                        f"{_last_line(p.stderr or p.stdout)}")
            p = _tracekit("signer", "trust", "--config", str(config), "-o", str(tmp / "t.json"))
            if p.returncode != 0:
                raise SignerUnavailable(f"tracekit signer trust failed: {_last_line(p.stderr)}")
            trust = json.loads((tmp / "t.json").read_text())
            # Pinned witnesses are required, not only accepted: a bundle that
            # lost its cosignatures must not verify under this trust file.
            if isinstance(trust, dict) and trust.get("witnesses"):
                trust["witnesses_required"] = len(trust["witnesses"])
            return Export((tmp / "run.tkb").read_bytes(),
                          (json.dumps(trust, indent=2) + "\n").encode())
        except (OSError, ValueError) as exc:
            raise SignerUnavailable(f"tracekit export of run {run_id} failed: "
                                    f"{_one_line(exc)}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # --- pushes ------------------------------------------------------------------------

    def _push(self, p: Push) -> None:
        if self._queue is None:
            self._queue = asyncio.Queue()
        self._queue.put_nowait(p)

    async def pushes(self) -> AsyncIterator[Push]:
        """Holds, releases and quarantines: from decide answers and, with a
        webhook configured, from the signer's incident records as it POSTs them."""
        if self._queue is None:
            self._queue = asyncio.Queue()
        tasks = TaskOwner("tracekit pushes")  # the poller, ended with this iterator
        if self.webhook_port and self.webhook_secret:
            if self._server is None:
                try:
                    self._server = await asyncio.start_server(
                        self._serve_webhook, "127.0.0.1", self.webhook_port)
                except OSError as exc:
                    raise SignerUnavailable(f"cannot listen for Tracekit's webhook on "
                                            f"127.0.0.1:{self.webhook_port} "
                                            f"({_one_line(exc)})") from None
        else:  # no webhook (a system signer): read each open run's new records
            tasks.spawn(self._poll(), "poll")
        try:
            while True:
                yield await self._queue.get()
        finally:
            # It ends; a cancellation of our own consumer still goes through.
            await tasks.aclose()

    async def _poll(self) -> None:
        """Without a webhook: every POLL_S, `read` each open run from its last
        record and push its run.held, run.resumed and run.quarantined records."""
        while True:
            await asyncio.sleep(POLL_S)
            for run_id in list(self._runs):
                r = self._runs.get(run_id)
                if r is None or not r.token:
                    continue
                try:
                    ans = await self._run_call(run_id, "read", from_seq=r.seen, limit=1000)
                except SignerUnavailable:
                    continue
                events = ans.get("events")
                for e in events if isinstance(events, list) else []:
                    seq = e.get("run_seq") if isinstance(e, dict) else None
                    if not isinstance(seq, int) or seq < r.seen:
                        continue
                    r.seen = seq + 1
                    kind = INCIDENT_PUSH.get(str(e.get("type")))
                    data = e.get("data") if isinstance(e.get("data"), dict) else {}
                    if kind is not None:
                        why = data.get("reason")
                        self._push(Push(kind, run_id,  # type: ignore[arg-type]
                                        why if isinstance(why, str) else ""))

    async def _serve_webhook(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        status = 400
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (ln.partition(":") for ln in lines[1:] if ln)}
            n = int(headers.get("content-length", "-1"))
            if lines[0].startswith("POST ") and 0 <= n <= WEBHOOK_BODY_MAX \
                    and self.webhook_secret:
                body = await asyncio.wait_for(reader.readexactly(n), 10)
                try:
                    found = read_webhook(body, headers.get("x-tracekit-signature"),
                                         self.webhook_secret, time.time())
                    status = 200
                except SignerUnavailable:
                    status, found = 401, []
                for c in found:
                    key = (c.kind, c.run_id, c.incident)
                    if key in self._seen:  # the outbox delivers at least once
                        continue
                    self._seen.add(key)
                    reason = await self._reason(c)
                    self._push(Push(c.kind, c.run_id, reason))  # type: ignore[arg-type]
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ValueError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.write(f"HTTP/1.1 {status} -\r\ncontent-length: 0\r\n"
                             "connection: close\r\n\r\n".encode())
                await writer.drain()
                writer.close()

    async def _reason(self, c: Contained) -> str:
        """The operator's reason, from the run's record (the webhook carries none)."""
        r = self._runs.get(c.run_id)
        if r is None or c.run_seq is None:
            return f"incident {c.incident}"
        try:
            ans = await self._run_call(c.run_id, "read", from_seq=c.run_seq, limit=1)
            ev = (ans.get("events") or [{}])[0]
            why = ev.get("data", {}).get("reason")
            return why if isinstance(why, str) and why else f"incident {c.incident}"
        except (SignerUnavailable, AttributeError, IndexError):
            return f"incident {c.incident}"

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        self._reset()


# --- helpers ---------------------------------------------------------------------------


def _check_recordable(value: Mapping[str, Any] | dict[str, Any]) -> None:
    why = unrecordable(dict(value))
    if why:
        raise SignerUnavailable(f"cannot be recorded: {why} (records hold JSON objects, "
                                "strings, booleans and integers only)")


def _tracekit(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([*tracekit_command(), *args], capture_output=True, text=True,
                              timeout=EXPORT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise SignerUnavailable(f"tracekit {args[0]} did not finish in "
                                f"{EXPORT_TIMEOUT_S:g} s") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or exc.__class__.__name__


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no message"


def _tkbox_version() -> str:
    from tkbox import __version__

    return str(__version__)[:64]


SYSTEM_SOCKET = Path("/run/tracekit-signer/signer.sock")


async def client_for(spec: str, socket_override: Path | None = None
                     ) -> tuple[TracekitSignerClient, JSON]:
    """The daemon's `--signer tracekit[:SOCKET]`: the client and its ping.

    With a setup from `init_dev` in tracekit_home() (a same-user signer): its
    socket, webhook, per-box identities and export. Otherwise SOCKET (default
    the system signer's, /run/tracekit-signer/signer.sock) alone: decisions and
    records, holds seen in decide answers, export by the signer's user.
    """
    _, _, sock = spec.partition(":")
    setup = load_setup(tracekit_home())
    path = Path(sock) if sock else socket_override
    if setup is not None and (path is None or path == setup.socket):
        client = TracekitSignerClient.from_setup(setup)
    else:
        client = TracekitSignerClient(path or SYSTEM_SOCKET)
    try:
        who = await client.ping()
    except SignerUnavailable as exc:
        await client.aclose()
        raise SignerUnavailable(
            f"no Tracekit signer answers on {client.socket_path} ({exc}); start one with "
            "`python -m tkbox.record.tracekit init && tracekit signer serve --config "
            f"{tracekit_home() / 'signer.yaml'} &`") from None
    return client, who


def main(argv: list[str] | None = None) -> int:
    """`python -m tkbox.record.tracekit init [--home DIR] [--witness URL VKEY]`."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tkbox.record.tracekit")
    sub = ap.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init", help="write a same-user Tracekit signer config for tkbox")
    i.add_argument("--home", type=Path, default=None)
    i.add_argument("--webhook-port", type=int, default=None)
    i.add_argument("--witness", nargs=2, action="append", metavar=("URL", "VKEY"), default=[])
    a = ap.parse_args(argv)
    home = a.home or tracekit_home()
    try:
        old = load_setup(home)  # a second init keeps the ports the daemon and signer know
        s = init_dev(home, webhook_port=a.webhook_port or (old.webhook_port if old else None),
                     http_port=old.http_port if old else None,
                     witnesses=[{"url": u, "vkey": k, "class": "customer"} for u, k in a.witness])
    except (HostError, UserError) as exc:
        print(f"tkbox: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"wrote {s.config}\nnext: tracekit signer serve --config {s.config} &\n"
          f"      tkbox daemon --signer tracekit:{s.socket}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
