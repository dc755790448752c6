"""The proxy's request-head parser: shapes it accepts, attacks it refuses."""

from __future__ import annotations

import pytest

from tkbox.doors.network.request import (
    MAX_HEAD,
    MAX_HEADERS,
    MAX_LINE,
    BadRequest,
    ProxyRequest,
    RequestHeadParser,
    answer,
)

POST_HEAD = b"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\n"


def parse(raw: bytes, split: int | None = None) -> ProxyRequest:
    p = RequestHeadParser()
    chunks = [raw] if split is None else [raw[i : i + split] for i in range(0, len(raw), split)]
    req = None
    for c in chunks:
        req = p.feed(c)
        if req is not None:
            break
    assert req is not None
    return req


def refused(raw: bytes, status: int = 400) -> BadRequest:
    with pytest.raises(BadRequest) as info:
        p = RequestHeadParser()
        assert p.feed(raw) is not None or p.feed(b"") is not None
    assert info.value.status == status
    return info.value


def test_connect_is_a_tunnel_request() -> None:
    req = parse(b"CONNECT Example.ORG:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n")
    assert (req.kind, req.host.name, req.port) == ("connect", "example.org", 443)


def test_connect_split_at_every_byte_gives_the_same_request() -> None:
    raw = b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\nUser-Agent: x\r\n\r\nTLS"
    for n in range(1, len(raw)):
        p = RequestHeadParser()
        req = None
        for i in range(0, len(raw), n):
            req = req or p.feed(raw[i : i + n])
        assert req is not None and req.host.name == "example.org"


def test_bytes_after_the_head_are_kept_for_the_tunnel() -> None:
    p = RequestHeadParser()
    assert (
        p.feed(b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n\x16\x03\x01")
        is not None
    )
    assert p.leftover == b"\x16\x03\x01"


def test_absolute_form_is_rewritten_to_origin_form_without_hop_by_hop_headers() -> None:
    req = parse(
        b"GET http://example.org/a/b?c=d HTTP/1.1\r\nHost: example.org\r\n"
        b"Proxy-Authorization: Basic eA==\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\n"
        b"Accept: */*\r\n\r\n"
    )
    assert (req.kind, req.host.name, req.port, req.path) == ("http", "example.org", 80, "/a/b?c=d")
    names = [n for n, _ in req.headers]
    assert b"proxy-authorization" not in names and b"x-drop" not in names
    assert (b"connection", b"close") in req.headers and (b"accept", b"*/*") in req.headers


def test_host_header_that_differs_from_the_absolute_url_is_refused() -> None:
    """Stops asking the allowlist about one host while the origin serves another."""
    e = refused(b"GET http://allowed.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n")
    assert "differs" in e.message
    refused(b"GET http://allowed.example/ HTTP/1.1\r\nHost: allowed.example:8080\r\n\r\n")
    refused(b"CONNECT allowed.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n")
    parse(b"GET http://allowed.example:80/ HTTP/1.1\r\nHost: ALLOWED.example\r\n\r\n")


@pytest.mark.parametrize(("target", "host", "canonical"), [
    (b"http://example.org/", b"example.org", b"example.org"),
    (b"http://EXAMPLE.Org/", b"Example.ORG", b"example.org"),
    (b"http://example.org./", b"EXAMPLE.org.", b"example.org"),
    (b"http://example.org:80/", b"example.org:80", b"example.org"),
    (b"http://example.org/", b"example.org.:80", b"example.org"),
    (b"http://example.org/", b" \t Example.Org.:80 \t ", b"example.org"),
    (b"http://Example.Org.:8080/", b"EXAMPLE.ORG:8080", b"example.org:8080"),
    (b"http://XN--BCHER-KVA.example/", b"xn--bcher-kva.EXAMPLE.", b"xn--bcher-kva.example"),
    (b"http://134744072/", b"8.8.8.8:80", b"8.8.8.8"),
    (b"http://[2001:4860:0:0::8888]:8080/", b"[2001:4860::8888]:8080", b"[2001:4860::8888]:8080"),
])
def test_relayed_host_is_the_canonical_authority_never_the_guests_bytes(
    target: bytes, host: bytes, canonical: bytes
) -> None:
    """Stops a server that matches names exactly from routing the guest's spelling
    (`EXAMPLE.org.:80`, checked as `example.org`) to another site: the request carries
    exactly one Host, first, written from the host and port the door decided on."""
    req = parse(b"GET " + target + b" HTTP/1.1\r\nHost:" + host + b"\r\nAccept: */*\r\n\r\n")
    assert req.headers[0] == (b"host", canonical)
    assert [v for n, v in req.headers if n == b"host"] == [canonical]
    assert req.path == "/"


def test_missing_or_duplicate_host_is_refused() -> None:
    refused(b"GET http://a.example/ HTTP/1.1\r\n\r\n")
    refused(b"GET http://a.example/ HTTP/1.0\r\n\r\n")
    refused(b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\n\r\n")


def test_smuggling_duplicate_content_length_is_refused() -> None:
    """Stops CL.CL desync: h11 would merge identical duplicates silently."""
    e = refused(POST_HEAD + b"Content-Length: 4\r\nContent-Length: 4\r\n\r\n")
    assert "smuggling" in e.message
    refused(POST_HEAD + b"Content-Length: 4\r\ncontent-length: 5\r\n\r\n")


def test_smuggling_chunked_plus_content_length_is_refused() -> None:
    """Stops CL.TE / TE.CL desync."""
    e = refused(POST_HEAD + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert "smuggling" in e.message


def test_smuggling_odd_transfer_encodings_are_refused() -> None:
    refused(
        POST_HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n",
        501,
    )
    refused(POST_HEAD + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n")
    refused(POST_HEAD + b"Transfer-Encoding : chunked\r\n\r\n")


def test_smuggling_obs_fold_and_bare_lf_are_refused() -> None:
    """Stops header continuation lines and LF-only framing that parsers read differently."""
    assert (
        "folding"
        in refused(
            b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nX: a\r\n b\r\n\r\n"
        ).message
    )
    refused(b"GET http://a.example/ HTTP/1.1\nHost: a.example\r\n\r\n")
    refused(b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\rX: y\r\n\r\n")
    refused(b"GET http://a.example/ HTTP/1.1\r\nHost: a.ex\x00ample\r\n\r\n")
    refused(b"\r\nGET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n")


def test_request_line_beyond_the_limit_is_refused_before_the_head_ends() -> None:
    """Stops unbounded buffering of a request line that never ends."""
    p = RequestHeadParser()
    with pytest.raises(BadRequest) as info:
        p.feed(b"GET http://a.example/" + b"a" * MAX_LINE)
    assert info.value.status == 414


def test_header_line_beyond_the_limit_is_refused() -> None:
    refused(
        b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nX: " + b"a" * MAX_LINE + b"\r\n\r\n",
        431,
    )


def test_too_many_headers_are_refused() -> None:
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_HEADERS + 1))
    refused(b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n" + many + b"\r\n", 431)


def test_head_beyond_the_limit_is_refused_while_streaming() -> None:
    p = RequestHeadParser()
    p.feed(b"GET http://a.example/ HTTP/1.1\r\n")
    with pytest.raises(BadRequest) as info:
        for _ in range(MAX_HEAD // 100 + 2):
            p.feed(b"X: " + b"a" * 95 + b"\r\n")
    assert info.value.status == 431


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /relative HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"GET https://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"GET ftp://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"GET http://user:pw@a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"GET http://a.example/#frag HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"CONNECT a.example HTTP/1.1\r\n\r\n",
        b"CONNECT a.example:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
        b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nUpgrade: websocket\r\n\r\n",
        b"GET http://a.example/ HTTP/2.0\r\nHost: a.example\r\n\r\n",
        b"GET http://0x7f.1.2.3.4/ HTTP/1.1\r\nHost: 0x7f.1.2.3.4\r\n\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
    ],
)
def test_anything_but_connect_and_absolute_http_is_refused(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        p = RequestHeadParser()
        p.feed(raw)


def test_one_request_per_connection() -> None:
    p = RequestHeadParser()
    assert p.feed(b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n") is not None
    with pytest.raises(BadRequest):
        p.feed(b"more")


def test_answer_carries_the_reason_in_status_header_and_body() -> None:
    out = answer(403, "refused: x is\r\nnot allowed")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert b"X-Tkbox-Reason: refused: x is??not allowed" in head
    assert body == b"refused: x is??not allowed\n"
