"""`tkbox witness serve`: a C2SP tlog-witness.

    POST <prefix>/add-checkpoint        cosign a checkpoint consistent with the last one
    GET  <prefix>/<origin hash>/checkpoint   the last cosigned checkpoint of a log

`Witness.add_checkpoint` is the whole protocol, sans-IO (bytes in, status
and bytes out); the HTTP server around it is the standard library's.

The state of each log (size, root hash, the note) is in SQLite. The check of
the old size and the store of the new one are one `BEGIN IMMEDIATE`
transaction, committed (`synchronous=FULL`) before the cosignature is sent:
two concurrent submissions cannot both pass the check against the same old
size, and a crash never leaves a cosignature for a state that was lost.

    <home>/witness.key    PRIVATE+KEY+<name>+<id>+base64(0x04 || seed)  (0600)
    <home>/config.json    {"name": …, "logs": [<log verifier keys>]}
    <home>/witness.db     logs(origin PRIMARY KEY, size, root, note)
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import sqlite3
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tkbox.errors import HostError, UserError
from tkbox.formats import checkpoint as cpfmt
from tkbox.formats import cosignature, merkle, note
from tkbox.formats import witness as wfmt
from tkbox.formats.errors import FormatError
from tkbox.signer.config import write_private

log = logging.getLogger("tkbox.witness")

SCHEMA = """
CREATE TABLE IF NOT EXISTS logs (
    origin TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    root BLOB NOT NULL,
    note BLOB NOT NULL
);
"""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


class Witness:
    def __init__(self, signer: cosignature.CosignatureSigner, logs: list[note.Verifier],
                 db_path: Path) -> None:
        self.signer = signer
        self.logs: dict[str, list[note.Verifier]] = {}
        for v in logs:
            self.logs.setdefault(v.name, []).append(v)
        self.db = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def add_checkpoint(self, body: bytes) -> Answer:
        try:
            req = wfmt.parse_add_checkpoint(body)
            text, _ = note.split(req.checkpoint, max_size=wfmt.MAX_BODY)
            cp = cpfmt.parse(text)
        except FormatError as exc:
            return Answer(400, f"{exc}\n".encode())
        known = self.logs.get(cp.origin)
        if not known:
            return Answer(404, f"unknown log {cp.origin!r}\n".encode())
        try:
            note.open_note(req.checkpoint, note.Verifiers(known), max_size=wfmt.MAX_BODY)
        except FormatError as exc:
            return Answer(403, f"{exc.what}\n".encode())
        if req.old > cp.size:
            return Answer(400, f"old size {req.old} is beyond the checkpoint size {cp.size}\n"
                          .encode())
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                answer = self._check_and_store(req, cp)
                self.db.execute("COMMIT" if answer is None else "ROLLBACK")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
        if answer is not None:
            return answer
        sig = note.Signature(self.signer.name, self.signer.key_id, self.signer.sign(text.encode()))
        log.info("cosigned %s at size %d", cp.origin, cp.size)
        return Answer(200, sig.line().encode())

    def _check_and_store(self, req: wfmt.AddCheckpoint, cp: cpfmt.Checkpoint) -> Answer | None:
        row = self.db.execute("SELECT size, root FROM logs WHERE origin = ?",
                              (cp.origin,)).fetchone()
        size, root = (int(row[0]), bytes(row[1])) if row else (0, merkle.EMPTY_ROOT)
        if req.old != size:
            return Answer(409, f"{size}\n".encode(), wfmt.SIZE_CONTENT_TYPE)
        if cp.size == 0 and cp.root != merkle.EMPTY_ROOT:
            return Answer(422, b"an empty tree's root is SHA-256 of nothing\n")
        if req.old == 0:
            if req.proof:
                return Answer(422, b"old size 0 takes no consistency proof\n")
        elif req.old == cp.size:
            if cp.root != root:
                log.warning("%s: two roots for size %d (evidence kept in the log)", cp.origin,
                            cp.size)
                return Answer(422, b"a different root hash for the size already cosigned\n")
            if req.proof:
                return Answer(422, b"equal sizes take no consistency proof\n")
        else:
            try:
                merkle.verify_consistency(req.old, cp.size, req.proof, root, cp.root)
            except FormatError as exc:
                log.warning("%s: inconsistent checkpoint %d -> %d: %s", cp.origin, req.old,
                            cp.size, exc.what)
                return Answer(422, f"the consistency proof fails: {exc.what}\n".encode())
        self.db.execute(
            "INSERT INTO logs (origin, size, root, note) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(origin) DO UPDATE SET size = excluded.size, root = excluded.root, "
            "note = excluded.note",
            (cp.origin, cp.size, cp.root, req.checkpoint),
        )
        return None

    def latest(self, origin_hash: str) -> Answer:
        with self._lock:
            rows = self.db.execute("SELECT origin, note FROM logs").fetchall()
        for origin, raw in rows:
            if hashlib.sha256(str(origin).encode()).hexdigest() == origin_hash:
                text = bytes(raw)[: bytes(raw).index(b"\n\n") + 1]
                sig = note.Signature(self.signer.name, self.signer.key_id,
                                     self.signer.sign(text))
                return Answer(200, bytes(raw) + sig.line().encode())
        return Answer(404, b"this witness has not cosigned that log\n")


# --- home: key and configuration --------------------------------------------

KEY, CONFIG, DB = "witness.key", "config.json", "witness.db"


def init(home: Path, name: str | None = None) -> cosignature.CosignatureSigner:
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    if (home / KEY).exists():
        return load_key(home)
    name = name or f"tkbox.local/witness/{secrets.token_hex(6)}"
    if not note.valid_name(name):
        raise UserError(f"{name!r} cannot be a witness name (no spaces, no '+')")
    signer = cosignature.generate(name)
    write_private(home / KEY, (signer.skey() + "\n").encode())
    write_private(home / CONFIG, json.dumps({"name": name, "logs": []}, indent=2).encode())
    return signer


def load_key(home: Path) -> cosignature.CosignatureSigner:
    try:
        return cosignature.parse_skey((home / KEY).read_text().strip())
    except FileNotFoundError:
        raise UserError(f"no witness at {home}; run `tkbox witness init`") from None
    except FormatError as exc:
        raise HostError(f"{home / KEY}: {exc.what}") from None


def _config(home: Path) -> dict[str, Any]:
    try:
        obj = json.loads((home / CONFIG).read_text())
    except FileNotFoundError:
        raise UserError(f"no witness at {home}; run `tkbox witness init`") from None
    except (OSError, ValueError) as exc:
        raise HostError(f"{home / CONFIG}: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("logs"), list):
        raise HostError(f"{home / CONFIG}: not a witness configuration")
    return obj


def add_log(home: Path, vkey: str) -> str:
    try:
        v = note.parse_vkey(vkey)
    except FormatError as exc:
        raise UserError(f"bad log verifier key: {exc.what}") from None
    cfg = _config(home)
    logs = [x for x in cfg["logs"] if x != vkey]
    cfg["logs"] = [*logs, vkey]
    write_private(home / CONFIG, json.dumps(cfg, indent=2).encode())
    return v.name


def open_witness(home: Path) -> Witness:
    signer = load_key(home)
    cfg = _config(home)
    logs = [note.parse_vkey(str(v)) for v in cfg["logs"]]
    return Witness(signer, logs, home / DB)


class _Handler(BaseHTTPRequestHandler):
    witness: Witness
    server_version = "tkbox-witness"

    def _answer(self, a: Answer) -> None:
        self.send_response(a.status)
        self.send_header("Content-Type", a.content_type)
        self.send_header("Content-Length", str(len(a.body)))
        self.end_headers()
        self.wfile.write(a.body)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        if self.path.rstrip("/").rsplit("/", 1)[-1] != "add-checkpoint":
            self._answer(Answer(404, b"POST /add-checkpoint\n"))
            return
        try:
            n = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._answer(Answer(411, b"a Content-Length is needed\n"))
            return
        if not 0 <= n <= wfmt.MAX_BODY:
            self._answer(Answer(413, b"the request is too large\n"))
            return
        self._answer(self.witness.add_checkpoint(self.rfile.read(n)))

    def do_GET(self) -> None:  # noqa: N802
        parts = self.path.strip("/").split("/")
        if len(parts) >= 2 and parts[-1] == "checkpoint":
            self._answer(self.witness.latest(parts[-2]))
        else:
            self._answer(Answer(404, b"GET /<origin hash>/checkpoint\n"))

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("%s %s", self.address_string(), format % args)


def make_server(home: Path, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"witness": open_witness(home)})
    return ThreadingHTTPServer((host, port), handler)


def serve(home: Path, host: str, port: int) -> None:
    if host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("serving on %s: the witness is reachable from other hosts", host)
    try:
        server = make_server(home, host, port)
    except OSError as exc:
        raise HostError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    w = server.RequestHandlerClass.witness  # type: ignore[attr-defined]
    log.info("witness %s on http://%s:%d", note.key_tag(w.signer.name, w.signer.key_id), host,
             server.server_address[1])
    print(f"witness {w.signer.name} listening on http://{host}:{server.server_address[1]}",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
