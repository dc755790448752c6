"""What the secrets door does to one request and one response. Pure.

`TunnelRules(host, port, secrets)` is made once per intercepted tunnel. For a
request head (method, target, headers) it:

1. refuses a `Host` that is not the tunnel's host, and a target that is not
   origin-form (an origin may route on either, so a request could otherwise
   reach a host the door never checked); the `Host` sent on is the tunnel's
   canonical `host[:port]`, not the guest's spelling of it;
2. refuses a request body it cannot read (`Content-Encoding` other than
   identity), since a compressed body hides anything from the scanner, and
   one framed both by `Content-Length` and `Transfer-Encoding` (RFC 9112
   §6.1: a server honouring the length would smuggle the rest);
3. for each header bound to a secret of this host *and port* (443 unless the
   spec names another), swaps the placeholder (`swap.swap`) and notes a use;
   the original header value may hold nothing else of any secret. On any
   other port of a bound host nothing is swapped: the placeholder there is a
   leak like the placeholder sent to a host it is not bound to, and the
   refusal says which ports the secret is bound to;
4. scans the target and every other header (name and value) for any secret's
   value or placeholder, in every form (`scan`): a hit is a `SecretLeak`;
5. asks for an unencoded response (`Accept-Encoding: identity`) so the
   redactor can read it, and drops `Expect` (the door answers 100 itself).

Bodies are scanned by a `LeakScanner` from `body_scanner()`; trailers by
`trailers()`, which also drops the fields a trailer may not carry (a second
`Host`, framing, `Content-Encoding`) before they are sent on;
responses are redacted by `Redactor`s from `redactor()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tkbox.doors.network.names import Host, HostNameError, format_authority, normalize_name
from tkbox.doors.secrets.leaks import Hit, LeakScanner, Pattern, Redactor, patterns, scan_once
from tkbox.doors.secrets.spec import Secret, show_bind
from tkbox.doors.secrets.swap import swap
from tkbox.errors import GuestError, Refused

Headers = list[tuple[bytes, bytes]]
MAX_WHERE = 80
#: request trailer fields never sent on (`TunnelRules.trailers`; `Proxy-*` too)
NOT_TRAILERS = frozenset({
    b"host", b"content-length", b"transfer-encoding", b"trailer", b"content-encoding",
    b"connection", b"keep-alive", b"te", b"upgrade", b"expect",
})


class SecretLeak(Refused):
    """A request carried a secret's value or placeholder where it may not go."""

    def __init__(self, hit: Hit, host: str, where: str, hint: str = "") -> None:
        self.hit, self.host, self.where = hit, host, where[:MAX_WHERE]
        what = ("it may go only in the bound header to its bound hosts and ports"
                if hit.kind == "placeholder" else "the value may never leave the box")
        what += hint
        super().__init__(
            f"refused: the {hit.kind} of secret {hit.name} was found in the {self.where} "
            f"of a request to {host} ({hit.form}{', escaped' if hit.decoded else ''}); {what}"
        )

    def record(self) -> dict[str, object]:
        """The `tkbox.secret.leak` body: names, never bytes of the value."""
        return {"name": self.hit.name, "host": self.host, "where": self.where,
                "kind": self.hit.kind, "form": self.hit.form, "escaped": self.hit.decoded}


class BadTunnelRequest(GuestError):
    """A request the door refuses to carry on an intercepted tunnel (not a leak)."""


@dataclass(frozen=True)
class Use:
    name: str
    host: str
    header: str


def _where_header(name: bytes) -> str:
    text = name.decode("ascii", "replace")
    return f"header {text[:48]}"


class TunnelRules:
    def __init__(self, host: str, port: int, secrets: Sequence[Secret], *,
                 plain: bool = False) -> None:
        # `plain`: the rules of a plain-http proxy request (`check_plain`), where nothing
        # is ever swapped, on whatever port it names
        self.host, self.port, self.plain = host, port, plain
        # The Host the origin gets: the tunnel's own name and port, never the guest's
        # spelling of them (an origin matching names exactly would serve another site).
        self.authority = format_authority(Host(host), port, 443).encode("ascii")
        self.secrets = list(secrets)
        self.bound = {h.encode(): s for s in self.secrets if s.spec.bound_to(host, port)
                      for h in s.spec.headers}
        # Secrets bound to this host but not swapped here (on other ports only, or any
        # port when plain): their refusal says where they go.
        self._elsewhere = {s.name: [show_bind(h, p) for h, p in s.spec.binds if h == host]
                           for s in self.secrets
                           if host in s.spec.hosts
                           and (plain or not s.spec.bound_to(host, port))}
        self.scan_patterns: list[Pattern] = patterns(
            [(s.name, "value", s.value) for s in self.secrets]
            + [(s.name, "placeholder", s.placeholder) for s in self.secrets])
        self.redact_patterns: list[Pattern] = patterns(
            [(s.name, "value", s.value) for s in self.secrets], for_redaction=True)

    def body_scanner(self) -> LeakScanner:
        return LeakScanner(self.scan_patterns)

    def redactor(self) -> Redactor:
        return Redactor(self.redact_patterns)

    def leak(self, hit: Hit, where: str) -> SecretLeak:
        """The refusal of `hit` found in `where` of a request on this tunnel."""
        hint = ""
        if hit.kind == "placeholder" and hit.name in self._elsewhere:
            binds = ", ".join(self._elsewhere[hit.name])
            if self.plain:
                # No binding makes plain http swap: naming a port here would only send
                # the operator to open one for nothing.
                hint = (f" (it is swapped only at {binds}, over TLS; nothing is ever "
                        "swapped into a plain http:// request: use https://)")
            else:
                hint = (f" (it is swapped only at {binds}, not on port {self.port}; to swap "
                        f"it here, bind it as @{self.host}:{self.port})")
        return SecretLeak(hit, self.host, where, hint)

    def _check(self, data: bytes, where: str, allowed: frozenset[tuple[str, str]] = frozenset()
               ) -> None:
        for hit in scan_once(self.scan_patterns, data):
            if (hit.name, hit.kind) not in allowed:
                raise self.leak(hit, where)

    def _check_all(self, items: Sequence[tuple[bytes, str]], where: str) -> None:
        """Each (bytes, where) item checked as `_check` does, with one scan of them all
        joined; only on a hit is each looked at, to say where. A hit only across
        items (a placeholder split between two headers) is a leak of `where`."""
        hits = scan_once(self.scan_patterns, b"\r\n".join(data for data, _ in items))
        if not hits:
            return
        for data, item_where in items:
            self._check(data, item_where)
        raise self.leak(hits[0], where)

    def _host_ok(self, value: bytes) -> bool:
        text = value.decode("ascii", "replace").strip()
        name, _, port = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
        if port and (not port.isdigit() or int(port) != self.port):
            return False
        try:
            return normalize_name(name) == self.host
        except HostNameError:
            return False

    def request(self, method: bytes, target: bytes, headers: Headers
                ) -> tuple[Headers, list[Use]]:
        """The headers to send on (swapped) and the uses; SecretLeak or BadTunnelRequest."""
        hosts = [v for n, v in headers if n.lower() == b"host"]
        if len(hosts) != 1 or not self._host_ok(hosts[0]):
            shown = hosts[0][:64].decode("ascii", "replace") if hosts else "none"
            raise BadTunnelRequest(
                f"refused: the request's Host ({shown}) is not the tunnel's host "
                f"{self.host}; one tunnel carries requests for its own host only")
        if not (target.startswith(b"/") or (target == b"*" and method == b"OPTIONS")):
            # An absolute-form target takes precedence over Host (RFC 9112 §3.2.2).
            raise BadTunnelRequest(
                "refused: a request inside a tunnel must have an origin-form target "
                "(/path); an absolute URL could name another host")
        names = {n.lower() for n, _ in headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            # RFC 9112 §6.1: a server may take either; one that honours Content-Length
            # would read the rest of a chunked body as another request (smuggling).
            raise BadTunnelRequest(
                "refused: a request with both Content-Length and Transfer-Encoding is "
                "ambiguous (RFC 9112 section 6.1); send one")
        self._check(target, "URL")
        self._check(method, "method")
        out: Headers = []
        uses: list[Use] = []
        # One scan of every header not bound here; only on a hit is each one scanned, to
        # say where (the usual request is clean, and this is its cost).
        # (Accept-Encoding and Expect are dropped, not sent: not scanned.)
        unbound = b"\r\n".join(n + b": " + v for n, v in headers
                                if n.lower() not in self.bound
                                and n.lower() not in (b"accept-encoding", b"expect"))
        joined_hits = scan_once(self.scan_patterns, unbound)
        clean = not joined_hits
        for name, value in headers:
            low = name.lower()
            if low == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                raise BadTunnelRequest(
                    f"refused: a request body with Content-Encoding "
                    f"{value[:32].decode('ascii', 'replace')} cannot be read for secrets; "
                    "send it unencoded")
            if low in (b"accept-encoding", b"expect"):
                continue
            secret = self.bound.get(low)
            if secret is not None:
                self._check(name, _where_header(name))
                new = swap(value, secret.placeholder, secret.value)
                if new is not None:
                    # The placeholder (in any form: Basic is base64) is what is swapped;
                    # anything else of any secret in the same header is a leak.
                    rest = value.replace(secret.placeholder, b"")
                    self._check(rest, _where_header(name) + " (beside the placeholder)",
                                frozenset({(secret.name, "placeholder")}))
                    out.append((name, new))
                    uses.append(Use(secret.name, self.host, low.decode("ascii")))
                    continue
            if not clean or secret is not None:
                self._check(name + b": " + value, _where_header(name))
            if low == b"host":  # checked above to name the tunnel's host: sent canonical
                value = self.authority
            out.append((name, value))
        if joined_hits:
            # No header alone holds it: it was split between headers.
            raise self.leak(joined_hits[0], "headers (split between them)")
        out.append((b"accept-encoding", b"identity"))
        return out, uses

    def check_plain(self, method: bytes, target: bytes, headers: Headers) -> None:
        """A plain-http head: nothing is swapped there, so any hit is a leak."""
        self._check(target, "URL")
        self._check(method, "method")
        self._check_all([(name + b": " + value, _where_header(name)) for name, value in headers],
                        "headers (split between them)")

    def trailers(self, headers: Headers) -> Headers:
        """A request's trailers, scanned (SecretLeak), and those to send on: without the
        fields a trailer may not carry (RFC 9110 section 6.5.1) that the door decides in
        the head, routing, framing, encoding and connection control (`NOT_TRAILERS`). A
        `Host` there would be a second Host beside the tunnel's canonical one, a
        `Content-Encoding` would tell the origin the body the scanner read was encoded."""
        self._check_all([(name + b": " + value, "trailer " + _where_header(name))
                         for name, value in headers], "trailers (split between them)")
        return [(n, v) for n, v in headers
                if n.lower() not in NOT_TRAILERS and not n.lower().startswith(b"proxy-")]

    def redact_headers(self, headers: Headers) -> tuple[Headers, int]:
        """Response headers with every value form replaced, in names and values; and how
        many were. A name keeps its length and stays a token (`*` is a token character)."""
        out: Headers = []
        count = 0
        for name, value in headers:
            pair = []
            for part in (name, value):
                # every header: a form may be escaped, so no quick look for the needles
                r = Redactor(self.redact_patterns)
                part = r.feed(part, final=True)
                count += r.count
                pair.append(part)
            out.append((pair[0], pair[1]))
        return out, count
