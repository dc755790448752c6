"""Fuzzing the secrets door's parsers and scanners.

Promise of each target: for any input, the `--secret` parser returns a spec or
raises `UserError` (never another exception) with a one-line message; the
scanner, redactor, swap, model-usage reader and request rules never raise
anything but their own refusals, and their buffers stay within their bounds.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.doors.secrets.leaks import LeakScanner, Redactor, patterns
from tkbox.doors.secrets.model import HELD_MAX, ModelUsage
from tkbox.doors.secrets.rules import BadTunnelRequest, SecretLeak, TunnelRules
from tkbox.doors.secrets.spec import Secret, SecretSpec, parse_spec
from tkbox.doors.secrets.swap import swap
from tkbox.errors import UserError

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VALUE = b"ghp_FuzzValue123456"
PH = b"tkbox_GH_0123456789abcdef0123456789abcdef"
PATS = patterns([("GH", "value", VALUE), ("GH", "placeholder", PH)])

_spec_parts = st.sampled_from(["GH", "=", "env:", "file:", "@", ",", ";", "header=", "x-api-key",
                               "VAR", "api.example", "10.0.0.1", "[::1]", "*.x", "/p", " ",
                               "\n", "é", "", "host"])


@FUZZ
@given(st.one_of(st.text(max_size=300), st.lists(_spec_parts, max_size=14).map("".join)))
def test_secret_flag_parser_only_raises_user_error(text: str) -> None:
    try:
        spec = parse_spec(text)
    except UserError as exc:
        assert "\n" not in exc.message and len(exc.message) < 600
        return
    assert spec.hosts and all(h == h.lower() for h in spec.hosts)


@FUZZ
@given(st.lists(st.binary(max_size=5000), max_size=8))
def test_scanner_and_redactor_take_any_bytes_in_bounded_memory(chunks: list[bytes]) -> None:
    sc = LeakScanner(PATS)
    r = Redactor(patterns([("GH", "value", VALUE)], for_redaction=True))
    total = 0
    for c in chunks:
        sc.feed(c)
        total += len(r.feed(c))
        assert len(sc._tail) <= sc.keeps
        assert len(r._buf) <= r.hold
    total += len(r.feed(b"", final=True))
    assert total == sum(map(len, chunks))


@FUZZ
@given(st.binary(max_size=400))
def test_swap_takes_any_header(value: bytes) -> None:
    out = swap(value, PH, VALUE)
    assert out is None or VALUE in out or b"Basic" in out[:6] or out[:5].lower() == b"basic"


@FUZZ
@given(st.lists(st.binary(max_size=3000), max_size=6))
def test_model_usage_takes_any_body(chunks: list[bytes]) -> None:
    m = ModelUsage()
    for c in chunks:
        m.feed(c)
        assert m.held <= HELD_MAX
    m.finish()
    f = m.fields()
    assert len(f.get("model", "")) <= 128
    assert set(f) <= {"api", "model", "usage", "incomplete"}


_json_bits = st.sampled_from([
    b"{", b"}", b"[", b"]", b":", b",", b" ", b"\n", b"\r\n", b"\r", b'"', b"\\", b"data:",
    b"data: ", b"event: x", b": c", b'"type"', b'"message_start"', b'"message"', b'"model"',
    b'"usage"', b'"input_tokens"', b'"output_tokens"', b'"object"', b'"response"',
    b'"chat.completion"', b'"prompt_tokens"', b'"modelVersion"', b'"usageMetadata"',
    b'"promptTokenCount"', b'"m-1"', b"12", b"0", b"-3", b"1.5", b"true", b"null",
    b"\xef\xbb\xbf", b"\\u0041", b"[DONE]"])


@FUZZ
@given(st.lists(_json_bits, max_size=80).map(b"".join), st.lists(st.integers(0, 400),
                                                                 max_size=8))
def test_model_usage_reads_the_same_however_the_body_is_split(body: bytes,
                                                              cuts: list[int]) -> None:
    """Where the chunks of a body fall never changes what is read from it."""
    whole = ModelUsage()
    whole.feed(body)
    whole.finish()
    split = ModelUsage()
    at = 0
    for c in sorted(min(c, len(body)) for c in cuts):
        split.feed(body[at:c])
        at = c
        assert split.held <= HELD_MAX
    split.feed(body[at:])
    split.finish()
    assert split.fields() == whole.fields()


_hdr = st.tuples(st.sampled_from([b"Host", b"Authorization", b"X-A", b"Content-Encoding"]),
                 st.one_of(st.binary(max_size=80), st.just(b"api.example"),
                           st.just(b"Bearer " + PH)))


@FUZZ
@given(st.binary(max_size=200), st.lists(_hdr, max_size=6))
def test_request_rules_only_refuse_with_their_errors(target: bytes,
                                                     headers: list[tuple[bytes, bytes]]) -> None:
    rules = TunnelRules("api.example", 443, [Secret(SecretSpec("GH", "env", "X",
                                                               ("api.example",)), VALUE, PH)])
    try:
        out, _ = rules.request(b"GET", target, headers)
    except (SecretLeak, BadTunnelRequest):
        return
    assert all(PH not in v for _, v in out)


@FUZZ
@given(st.lists(_json_bits, max_size=80).map(b"".join))
def test_model_usage_parsed_whole_or_streamed_reads_the_same(body: bytes) -> None:
    """A small event is parsed whole by the C JSON parser, a large one streamed through
    the lexer: for any body, both ways read the same."""
    from tkbox.doors.secrets import model

    whole = ModelUsage()
    whole.feed(body)
    whole.finish()
    saved = model.EVENT_HOLD
    model.EVENT_HOLD = 0
    try:
        streamed = ModelUsage()
        streamed.feed(body)
        streamed.finish()
    finally:
        model.EVENT_HOLD = saved
    assert streamed.fields() == whole.fields()
