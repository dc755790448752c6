"""Test doubles of the secrets door's peers. Nothing in tkbox imports this module.

`H2Origin`: an HTTP/2 origin stand-in on loopback over TLS, written with the `h2`
library, serving scripted answers (its own thread and loop), for the door's
integration tests, e2e tests in real boxes, and users' own tests.

ALPN: `h2` and `http/1.1` are offered; a connection that chose HTTP/1.1 gets a
one-line `426`-style answer (the tests here only need h2). It records every
request (method, path, authority, headers, body, trailers) in `log`, and answers
by path:

- `/echo`: the request's fields and body as JSON (a host that reflects a value:
  the box must get it back redacted);
- `/split/<n>`: `text` (set by the test) as the body, in DATA frames of n bytes,
  with a field `x-echo-header: <text>` and a trailer `x-echo-trailer: <text>`;
- `/v1/messages`: an Anthropic Messages stand-in (JSON);
- `/slow`: answers after `slow_seconds`;
- `/big/<n>`: n MiB of zeros, as fast as the door's windows let it (`big_sent`);
- `/attack/<kind>`: the origin misbehaves on that connection: `settings` (a
  SETTINGS storm), `ping` (a PING storm), `continuation` (a header block that
  never ends), `reset` (RST_STREAM on every stream it is sent);
- anything else: `ok`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
from hyperframe.frame import ContinuationFrame, HeadersFrame, PingFrame, SettingsFrame

from tkbox._tasks import TaskOwner


class H2Origin:
    def __init__(self, cert: Path, key: Path) -> None:
        self.log: list[dict[str, Any]] = []
        self.text = b""
        self.slow_seconds = 0.0
        self.connections = 0
        self.big_sent = 0
        self.loop = asyncio.new_event_loop()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        self.ctx = ctx
        ready = threading.Event()

        self._stopping: asyncio.Event | None = None

        async def serve() -> None:
            self._stopping = asyncio.Event()
            self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0,
                                                     ssl=self.ctx)
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()
            await self._stopping.wait()
            self.server.close()
            # the connections' handlers (started by the server) end with the origin
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            if rest:
                await asyncio.wait(rest)

        def main() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(serve())

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()
        ready.wait(10)

    def close(self) -> None:
        if self._stopping is not None:
            self.loop.call_soon_threadsafe(self._stopping.set)
        self.thread.join(10)
        self.loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        proto = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        if proto != "h2":
            writer.write(b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 0\r\n"
                         b"connection: close\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding=None))
        conn.initiate_connection()
        conn.increment_flow_control_window(4 * 1024 * 1024)
        writer.write(conn.data_to_send())
        requests: dict[int, dict[str, Any]] = {}
        answers = TaskOwner("h2 origin answers")  # this connection's; end with it
        attacked = False
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if attacked:
                    # its raw frames went past `h2`, whose state no longer matches
                    # (the door's SETTINGS ACKs would be errors to it): read on until
                    # the door ends the connection, so the door reads the whole flood
                    # and never meets a reset this stand-in made
                    continue
                try:
                    events = conn.receive_data(data)
                except Exception:  # noqa: BLE001 - a stand-in: the door's GOAWAY or garbage
                    break
                for ev in events:
                    if isinstance(ev, h2.events.RequestReceived):
                        hdrs = {k: v for k, v in ev.headers}
                        requests[ev.stream_id] = {
                            "method": hdrs[b":method"].decode(),
                            "path": hdrs[b":path"].decode(),
                            "authority": hdrs.get(b":authority", b"").decode(),
                            "headers": [(k.decode(), v.decode("latin-1"))
                                        for k, v in ev.headers], "body": b"",
                            "trailers": [], "stream": ev.stream_id}
                        path = requests[ev.stream_id]["path"]
                        if path.startswith("/attack/"):
                            await self._attack(conn, writer, ev.stream_id, path[8:])
                            attacked = path[8:] != "reset"
                    elif isinstance(ev, h2.events.DataReceived):
                        r = requests.get(ev.stream_id)
                        if r is not None:
                            r["body"] += ev.data
                        conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    elif isinstance(ev, h2.events.TrailersReceived):
                        r = requests.get(ev.stream_id)
                        if r is not None:
                            r["trailers"] = [(k.decode(), v.decode("latin-1"))
                                             for k, v in ev.headers]
                    elif isinstance(ev, h2.events.StreamEnded):
                        r = requests.pop(ev.stream_id, None)
                        if r is not None:
                            self.log.append(r)
                            answers.spawn(self._answer(conn, writer, r), "answer")
                    elif isinstance(ev, h2.events.StreamReset):
                        requests.pop(ev.stream_id, None)
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        finally:
            await answers.aclose()
            writer.close()

    async def _answer(self, conn: h2.connection.H2Connection, writer: asyncio.StreamWriter,
                      r: dict[str, Any]) -> None:
        sid, path = r["stream"], r["path"]
        trailers: list[tuple[bytes, bytes]] | None = None
        frame = 16384
        ctype = b"text/plain"
        if path.startswith("/echo"):
            body = json.dumps({"headers": r["headers"], "authority": r["authority"],
                               "body": r["body"].decode("latin-1"),
                               "trailers": r["trailers"]}).encode()
            ctype = b"application/json"
        elif path.startswith("/split/"):
            body = self.text
            frame = max(1, int(path[7:].split("?")[0]))
            trailers = [(b"x-echo-trailer", self.text[:200])]
        elif path.startswith("/v1/messages"):
            req = json.loads(r["body"] or b"{}")
            body = json.dumps({"id": "msg_1", "type": "message", "role": "assistant",
                               "model": req.get("model", "m"), "content": [],
                               "usage": {"input_tokens": 11, "output_tokens": 7}}).encode()
            ctype = b"application/json"
        elif path.startswith("/big/"):
            await self._big(conn, writer, sid, int(path[5:]))
            return
        elif path.startswith("/slow"):
            await asyncio.sleep(self.slow_seconds)
            body = b"slow\n"
        else:
            body = b"ok\n"
        head = [(b":status", b"200"), (b"content-type", ctype)]
        if path.startswith("/split/"):
            head.append((b"x-echo-header", self.text[:200]))
        if trailers is None:
            head.append((b"content-length", str(len(body)).encode()))
        else:
            head.append((b"trailer", b"x-echo-trailer"))
        try:
            conn.send_headers(sid, head, end_stream=False)
            for i in range(0, len(body), frame):
                while conn.local_flow_control_window(sid) < min(frame, len(body) - i):
                    writer.write(conn.data_to_send())
                    await writer.drain()
                    await asyncio.sleep(0.005)
                conn.send_data(sid, body[i:i + frame])
                if frame < 64:
                    writer.write(conn.data_to_send())  # each its own write: split on the wire
                    await writer.drain()
            if trailers is not None:
                conn.send_headers(sid, trailers, end_stream=True)
            else:
                conn.end_stream(sid)
            writer.write(conn.data_to_send())
            await writer.drain()
        except Exception:  # noqa: BLE001 - the door reset the stream or left
            return

    async def _big(self, conn: h2.connection.H2Connection, writer: asyncio.StreamWriter,
                   sid: int, mib: int) -> None:
        """`mib` MiB of zeros, sent as fast as the door's windows let it."""
        chunk = b"\0" * 16384
        left = mib << 20
        self.big_sent = 0
        try:
            conn.send_headers(sid, [(b":status", b"200"),
                                    (b"content-length", str(left).encode())])
            while left:
                if conn.local_flow_control_window(sid) < len(chunk):
                    writer.write(conn.data_to_send())
                    await writer.drain()
                    await asyncio.sleep(0.01)
                    continue
                conn.send_data(sid, chunk)
                left -= len(chunk)
                self.big_sent += len(chunk)
            conn.end_stream(sid)
            writer.write(conn.data_to_send())
            await writer.drain()
        except Exception:  # noqa: BLE001 - the door reset the stream or left
            return

    async def _attack(self, conn: h2.connection.H2Connection, writer: asyncio.StreamWriter,
                      sid: int, kind: str) -> None:
        """Misbehave on this connection, writing raw frames past `h2`."""
        writer.write(conn.data_to_send())
        if kind == "settings":
            for _ in range(5000):
                f = SettingsFrame(0)
                f.settings = {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100}
                writer.write(f.serialize())
        elif kind == "ping":
            for i in range(5000):
                writer.write(PingFrame(0, opaque_data=i.to_bytes(8, "big")).serialize())
        elif kind == "continuation":
            h = HeadersFrame(sid)
            h.data = b"\x88"  # :status 200, from the static table; END_HEADERS never comes
            writer.write(h.serialize())
            for _ in range(10000):
                c = ContinuationFrame(sid)
                c.data = b"\x40\x01a\x01b" * 100
                writer.write(c.serialize())
        elif kind == "reset":
            conn.reset_stream(sid)
            writer.write(conn.data_to_send())
        await writer.drain()
