"""`tkbox.model.call`'s model name and token counts, read from each API's responses as
they stream by: the recorded shapes of each API, streamed and not, split at every
byte, cut short at every byte; and shapes the table does not know, which are
recorded as unknown, never guessed from.

Every test runs twice: as the door reads (an event or small body parsed whole by
the C JSON parser, a larger one streamed through the lexer), and with every
document streamed through the lexer (`EVENT_HOLD` 0): both must read the same."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tkbox.doors.secrets import model
from tkbox.doors.secrets.model import HELD_MAX, MAX_DEPTH, ModelUsage


@pytest.fixture(autouse=True, params=["as-the-door-reads", "all-streamed"])
def hold(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.param == "all-streamed":
        monkeypatch.setattr(model, "EVENT_HOLD", 0)


def sse(events: list[tuple[str | None, Any]], eol: str = "\n") -> bytes:
    out = ""
    for name, data in events:
        if name is not None:
            out += f"event: {name}{eol}"
        text = data if isinstance(data, str) else json.dumps(data)
        out += f"data: {text}{eol}{eol}"
    return out.encode()


def read(body: bytes, cuts: tuple[int, ...] = (), finish: bool = True) -> dict[str, Any]:
    m = ModelUsage()
    at = 0
    for c in (*cuts, len(body)):
        m.feed(body[at:c])
        at = c
    if finish:
        m.finish()
    assert m.held <= HELD_MAX
    return m.fields()


# ---- recorded shapes, one per API and way of answering --------------------------------
# Each as the API's reference documents it (event names, members, where usage is),
# with text that holds the same member names inside strings, which must not be read.

ANTHROPIC_JSON = json.dumps({
    "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-9",
    "content": [{"type": "text", "text": 'say "usage": {"input_tokens": 999}'}],
    "stop_reason": "end_turn", "stop_sequence": None,
    "usage": {"input_tokens": 25, "output_tokens": 9, "cache_creation_input_tokens": 0,
              "cache_read_input_tokens": 17}}).encode()

ANTHROPIC_SSE = sse([
    ("message_start", {"type": "message_start", "message": {
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-9",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 472, "output_tokens": 2, "cache_read_input_tokens": 100}}}),
    ("ping", {"type": "ping"}),
    ("content_block_start", {"type": "content_block_start", "index": 0,
                             "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
        "type": "text_delta", "text": '{"model": "fake", "output_tokens": 1}'}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                       "usage": {"output_tokens": 89}}),
    ("message_stop", {"type": "message_stop"}),
])

RESPONSE = {"id": "resp_1", "object": "response", "created_at": 1741476542,
            "status": "completed", "model": "gpt-6.1-2026-04-01", "output": [
                {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "annotations": [],
                              "text": '"usage": {"input_tokens": 1}'}]}],
            "tools": [{"type": "function", "name": "f", "parameters": {
                "type": "object", "properties": {"model": {"type": "string"}}}}],
            "usage": {"input_tokens": 328, "input_tokens_details": {"cached_tokens": 64},
                      "output_tokens": 52, "output_tokens_details": {"reasoning_tokens": 16},
                      "total_tokens": 380}}
RESPONSES_JSON = json.dumps(RESPONSE).encode()
RESPONSES_SSE = sse([
    ("response.created", {"type": "response.created", "sequence_number": 0, "response": {
        **RESPONSE, "status": "in_progress", "output": [], "usage": None}}),
    ("response.in_progress", {"type": "response.in_progress", "sequence_number": 1,
                              "response": {**RESPONSE, "status": "in_progress", "output": [],
                                           "usage": None}}),
    ("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 2,
                                    "output_index": 0, "item": {
                                        "type": "custom_tool_call", "id": "ctc_1",
                                        "call_id": "call_1", "name": "exec", "input": ""}}),
    ("response.custom_tool_call_input.delta", {
        "type": "response.custom_tool_call_input.delta", "sequence_number": 3,
        "item_id": "ctc_1", "output_index": 0, "delta": 'text("usage")'}),
    ("response.output_text.delta", {"type": "response.output_text.delta",
                                    "sequence_number": 4, "item_id": "msg_1",
                                    "output_index": 0, "content_index": 0,
                                    "delta": '{"total_tokens": 7}'}),
    ("response.completed", {"type": "response.completed", "sequence_number": 5,
                            "response": RESPONSE}),
])
RESPONSES_FIELDS = {"api": "openai.responses", "model": "gpt-6.1-2026-04-01",
                    "usage": {"cache_read_input_tokens": 64, "input_tokens": 328,
                              "output_tokens": 52, "reasoning_tokens": 16,
                              "total_tokens": 380}}

CHAT = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1741569952,
        "model": "gpt-5.1-mini-2026-01-01", "choices": [{
            "index": 0, "message": {"role": "assistant", "content": '"prompt_tokens": 3',
                                    "refusal": None}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
                  "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                  "completion_tokens_details": {"reasoning_tokens": 4, "audio_tokens": 0}},
        "service_tier": "default"}
CHAT_JSON = json.dumps(CHAT).encode()
_CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1741569952,
          "model": "gpt-5.1-mini-2026-01-01", "system_fingerprint": "fp_1"}
CHAT_SSE = sse([
    (None, {**_CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                   "finish_reason": None}], "usage": None}),
    (None, {**_CHUNK, "choices": [{"index": 0, "delta": {"content": "usage"},
                                   "finish_reason": None}], "usage": None}),
    (None, {**_CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": None}),
    (None, {**_CHUNK, "choices": [], "usage": CHAT["usage"]}),
    (None, "[DONE]"),
])
CHAT_FIELDS = {"api": "openai.chat", "model": "gpt-5.1-mini-2026-01-01",
               "usage": {"cache_read_input_tokens": 0, "input_tokens": 19,
                         "output_tokens": 10, "reasoning_tokens": 4, "total_tokens": 29}}

GEMINI_CHUNKS = [
    {"candidates": [{"content": {"role": "model", "parts": [
        {"functionCall": {"name": "read_file", "args": {"usageMetadata": {
            "promptTokenCount": 1}}}}]}, "index": 0}],
     "usageMetadata": {"promptTokenCount": 654, "totalTokenCount": 654,
                       "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 654}]},
     "modelVersion": "gemini-3.5-flash", "responseId": "r1"},
    {"candidates": [{"content": {"role": "model", "parts": [{"text": "done"}]},
                     "finishReason": "STOP", "index": 0}],
     "usageMetadata": {"promptTokenCount": 654, "candidatesTokenCount": 43,
                       "totalTokenCount": 733, "thoughtsTokenCount": 36,
                       "cachedContentTokenCount": 512},
     "modelVersion": "gemini-3.5-flash", "responseId": "r1"},
]
GEMINI_JSON = json.dumps(GEMINI_CHUNKS[-1]).encode()
GEMINI_SSE = sse([(None, c) for c in GEMINI_CHUNKS], eol="\r\n")  # ?alt=sse: CRLF
GEMINI_ARRAY = ("[" + "\n,\r\n".join(json.dumps(c, indent=2) for c in GEMINI_CHUNKS)
                + "]").encode()  # streamGenerateContent without alt=sse
GEMINI_FIELDS = {"api": "gemini.generate", "model": "gemini-3.5-flash",
                 "usage": {"cache_read_input_tokens": 512, "input_tokens": 654,
                           "output_tokens": 43, "reasoning_tokens": 36,
                           "total_tokens": 733}}

RECORDED = {
    "anthropic-json": (ANTHROPIC_JSON, {
        "api": "anthropic.messages", "model": "claude-sonnet-9",
        "usage": {"cache_creation_input_tokens": 0, "cache_read_input_tokens": 17,
                  "input_tokens": 25, "output_tokens": 9}}),
    "anthropic-sse": (ANTHROPIC_SSE, {
        "api": "anthropic.messages", "model": "claude-sonnet-9",
        "usage": {"cache_read_input_tokens": 100, "input_tokens": 472,
                  "output_tokens": 89}}),
    "responses-json": (RESPONSES_JSON, RESPONSES_FIELDS),
    "responses-sse": (RESPONSES_SSE, RESPONSES_FIELDS),
    "chat-json": (CHAT_JSON, CHAT_FIELDS),
    "chat-sse": (CHAT_SSE, CHAT_FIELDS),
    "gemini-json": (GEMINI_JSON, GEMINI_FIELDS),
    "gemini-sse": (GEMINI_SSE, GEMINI_FIELDS),
    "gemini-array": (GEMINI_ARRAY, GEMINI_FIELDS),
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_each_api_is_read_whole_and_split_at_every_byte(name: str) -> None:
    body, want = RECORDED[name]
    assert read(body) == want
    for i in range(len(body) + 1):
        assert read(body, (i,)) == want, f"split at {i}"
    assert read(body, tuple(range(1, len(body)))) == want, "one byte a chunk"


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_an_aborted_stream_records_what_its_whole_documents_said(name: str) -> None:
    """Cut at every byte: never an error, never a count or name the body did not hold
    whole, and `incomplete` wherever the cut fell inside a document."""
    body, want = RECORDED[name]
    full_usage = want["usage"]
    for i in range(len(body)):
        got = read(body[:i])
        assert got["api"] in ("unknown", want["api"]), i
        assert got.get("model") in (None, want["model"]), i
        for k, v in got.get("usage", {}).items():
            # a running total read before the cut is a real earlier value; else the final
            assert k in full_usage and (v == full_usage[k] or name.startswith(
                ("anthropic-sse", "gemini"))), (i, k, v)
        assert set(got) <= {"api", "model", "usage", "incomplete"}


def test_a_stream_cut_before_its_usage_event_says_so() -> None:
    cut = RESPONSES_SSE.index(b"event: response.completed") + 40
    got = read(RESPONSES_SSE[:cut])
    assert got == {"api": "openai.responses", "model": "gpt-6.1-2026-04-01",
                   "incomplete": True}
    cut = CHAT_SSE.index(b'"choices": []') + 5
    assert read(CHAT_SSE[:cut]) == {"api": "openai.chat", "model": "gpt-5.1-mini-2026-01-01",
                                    "incomplete": True}
    # a whole event whose blank line never came was read (its JSON was whole)
    assert read(ANTHROPIC_SSE.rstrip(b"\n")) == RECORDED["anthropic-sse"][1]


# ---- shapes the table does not know are recorded, never guessed from ------------------

@pytest.mark.parametrize("body", [
    b'{"model": "gpt-x", "usage": {"input_tokens": 5, "output_tokens": 6}}',
    b'{"error": {"message": "model gpt-x not found", "type": "invalid_request_error"}}',
    b'<html>502 Bad Gateway</html>',
    b'data: {"model": "m", "usage": {"prompt_tokens": 3}}\n\n',
    b'{"type": "content_block_delta", "usage": {"output_tokens": 3}, "model": "m"}',
    b'',
])
def test_an_unknown_shape_records_no_model_and_no_counts(body: bytes) -> None:
    assert read(body) == {"api": "unknown"}


def test_members_in_the_wrong_place_are_not_read() -> None:
    body = json.dumps({"type": "message_delta",
                       "delta": {"usage": {"output_tokens": 999}, "model": "fake"},
                       "usage": {"output_tokens": 5}, "content": [{"model": "fake2"}]})
    assert read(body.encode()) == {"api": "anthropic.messages", "usage": {"output_tokens": 5}}
    # a member's name escaped in a string, or spelled with escapes, is decoded first
    esc = b'{"object": "chat.completion", "mo\\u0064el": "gpt-\\u0078", "usage": ' \
          b'{"prompt_tokens": 1, "completion_tokens": 2}, "x": "\\"model\\": \\"y\\""}'
    assert read(esc) == {"api": "openai.chat", "model": "gpt-x",
                         "usage": {"input_tokens": 1, "output_tokens": 2}}


@pytest.mark.parametrize("value", [b'"12"', b"-1", b"1.5", b"1e3", b"-0", b"1234567890123",
                                   b"true", b"null", b"{}", b"[3]"])
def test_a_count_that_is_not_a_canonical_count_is_not_recorded(value: bytes) -> None:
    body = b'{"object": "chat.completion", "model": "m", "usage": {"prompt_tokens": ' + \
        value + b', "completion_tokens": 2}}'
    assert read(body) == {"api": "openai.chat", "model": "m",
                          "usage": {"output_tokens": 2}}
    # and a number JSON does not allow (a leading zero) is no JSON: nothing is read
    assert read(body.replace(value, b"007", 1)) == {"api": "unknown", "incomplete": True}


@pytest.mark.parametrize("name", ["x" * 129, "a\\u0000b", "caf\\u00e9", "", "a\\nb"])
def test_a_model_name_that_is_not_printable_ascii_is_not_recorded(name: str) -> None:
    body = b'{"object": "response", "model": "' + name.encode() + b'", "usage": ' \
           b'{"input_tokens": 1}}'
    assert read(body) == {"api": "openai.responses", "usage": {"input_tokens": 1}}


def test_the_first_api_sets_the_body_and_another_api_is_not_read() -> None:
    body = sse([(None, {"object": "chat.completion.chunk", "model": "a", "usage": None}),
                (None, {"type": "message_delta", "usage": {"output_tokens": 9}}),
                (None, {"object": "chat.completion.chunk", "model": "b",
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1}})])
    assert read(body) == {"api": "openai.chat", "model": "a",
                          "usage": {"input_tokens": 1, "output_tokens": 1}}


# ---- framing --------------------------------------------------------------------------

@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_server_sent_events_with_any_line_end_comments_and_split_data(eol: str) -> None:
    doc = json.dumps(GEMINI_CHUNKS[-1])
    half = doc.index(", ", len(doc) // 2) + 1  # a data line ends where JSON allows a LF
    body = (f": keep-alive{eol}retry: 10{eol}id: 1{eol}event: x{eol}"
            f"data:{doc[:half]}{eol}data:{doc[half:]}{eol}{eol}").encode()
    assert read(body) == GEMINI_FIELDS
    for i in range(len(body) + 1):
        assert read(body, (i,)) == GEMINI_FIELDS, i


def test_a_bom_and_leading_white_space_before_json() -> None:
    body = b"\xef\xbb\xbf \r\n" + CHAT_JSON
    for i in range(6):
        assert read(body, (i,)) == CHAT_FIELDS


def test_json_that_breaks_off_stops_the_reading_and_says_so() -> None:
    body = CHAT_JSON + b" ] " + GEMINI_JSON
    assert read(body) == {**CHAT_FIELDS, "incomplete": True}


def test_deep_nesting_and_long_tokens_stay_bounded() -> None:
    deep = b'{"object": "response", "model": "m", "x": ' + b"[" * (MAX_DEPTH * 4) + \
        b"]" * (MAX_DEPTH * 4) + b', "usage": {"input_tokens": 3}}'
    # too deep to read: the document is not read at all (it never ended for the reader)
    assert read(deep) == {"api": "unknown", "incomplete": True}
    shallow = b'{"object": "response", "model": "m", "x": ' + b"[" * 100 + b"]" * 100 + \
        b', "usage": {"input_tokens": 3}}'
    assert read(shallow, tuple(range(1, len(shallow), 7))) == {
        "api": "openai.responses", "model": "m", "usage": {"input_tokens": 3}}
    for big in (b'"' + b"k" * 100_000 + b'"', b"1" * 100_000, b'"' + b"\\n" * 50_000 + b'"'):
        body = b'{"object": "response", "model": ' + big + b', "usage": {"input_tokens": 3}}'
        got = read(body, tuple(range(1000, len(body), 1000)))
        assert got.get("model") is None and got["api"] in ("openai.responses", "unknown")
