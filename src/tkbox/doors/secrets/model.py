"""Reading the model name and token usage from a model API's response. Pure, streaming.

The body is read as it passes, never buffered whole. A document (an event's
data, or a JSON body) of at most `EVENT_HOLD` bytes is held until it ends and
parsed whole by the C JSON parser (`whole_documents`); a larger one streams
through a JSON lexer (`_Lexer`) that keeps the path of object keys from the
document's root and captures only the scalar values at the paths the API
table (`SHAPES`) names, each bounded. Both read exactly the same (tests feed
every document both ways). Memory per body: one held document, the container
kinds of the open document (at most `MAX_DEPTH`), a few keys, and the captured
values of one document (at most `MAX_CAPTURE` bytes each): `HELD_MAX` in all.

Framing, sniffed from the body's first byte that is not white space (or a BOM):

- `{` or `[`: JSON. A sequence of JSON values; an object is one document, and a
  top-level array's object elements are each one document (Gemini's
  `streamGenerateContent` without `alt=sse` answers a JSON array, element by
  element, as it generates them). A value that is not JSON ends the reading.
- anything else: server-sent events (WHATWG HTML, "Server-sent events",
  §9.2.6 "Interpreting an event stream"): lines end with CRLF, LF or CR; a line
  `data:VALUE` (one leading space dropped) adds VALUE to the event's data, the
  data lines of one event joined by LF; a blank line ends the event; comments
  (`:`) and other fields are skipped. Each event's data is one document; an
  event that is not whole JSON (Chat Completions' `data: [DONE]`) is none, and
  a held event in which no marker of any shape can be (`_MAYBE`: no marker
  value as a JSON string, no marker key, no `\\u` escape) is passed over
  unparsed (the text deltas that make up most of a stream).

Which API a document is, and where its model and counts are, is decided by the
table, never from a member found elsewhere: a document is a shape's when its
marker path holds one of the shape's values (`type: message_start`, `object:
chat.completion.chunk`, `type: response.completed`, a `modelVersion` string...);
the shape names the paths of its model name and of its token counts, and the
names tkbox records them under:

- `anthropic.messages` (Messages API): `type` message (the answer), message_start
  (its `message`), message_delta; model `model`; counts under `usage`:
  input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens.
- `openai.responses` (Responses API): `object` response, or an event whose `type` is
  response.created, .in_progress, .queued, .completed, .incomplete or .failed (its
  `response`); model `model`; counts under `usage`: input_tokens, output_tokens,
  total_tokens, input_tokens_details.cached_tokens (recorded as
  cache_read_input_tokens), output_tokens_details.reasoning_tokens (reasoning_tokens).
- `openai.chat` (Chat Completions): `object` chat.completion or chat.completion.chunk
  (the last chunk carries `usage` when asked with `stream_options.include_usage`);
  model `model`; counts under `usage`: prompt_tokens (input_tokens),
  completion_tokens (output_tokens), total_tokens, prompt_tokens_details.cached_tokens,
  completion_tokens_details.reasoning_tokens.
- `gemini.generate` (`generateContent`, `streamGenerateContent`): a `modelVersion`
  string, or a `usageMetadata.promptTokenCount`; model `modelVersion`; counts under
  `usageMetadata`: promptTokenCount (input_tokens), candidatesTokenCount
  (output_tokens: the answer, thoughts not included), totalTokenCount,
  cachedContentTokenCount, thoughtsTokenCount (reasoning_tokens).

Across the documents of one body: the first recognized document sets the API
(a document of another API is then not read); the first model name wins; each
count's last value wins (Anthropic's `message_delta` and Gemini's chunks carry
running totals, the Responses API's final event and Chat Completions' last
chunk carry the whole call's). A count is a canonical non-negative integer of at
most 12 digits; a model name 1 to 128 printable ASCII characters once decoded.
Anything else at those paths is not recorded.

`fields()` gives `api` (`unknown` when no document was recognized: then no
model and no counts, whatever members the body had), `model` and `usage` when
read, and `incomplete: true` when the body ended inside a document (a stream
cut short), or a JSON body stopped being JSON: the counts are then those of the
documents read whole.

One idea: reading a model API's response as it streams; the incremental JSON
lexer is here because it reads only the paths the API shapes ask for
(`_wanted`), and nothing else uses it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Path = tuple[str, ...]

MAX_DEPTH = 512  # containers open at once; deeper is not read
MAX_KEY = 256  # bytes of a key kept (a key tkbox reads fits, each character escaped)
MAX_CAPTURE = 1024  # bytes of a captured string or number kept (a model name's escapes)
MAX_BARE = 256  # bytes of a number or literal kept (a longer one is no count)
EVENT_HOLD = 8192  # bytes of one event (or a small body) parsed whole
MAX_FIELD = 16  # bytes of an SSE field name


@dataclass(frozen=True)
class Shape:
    """One kind of document of one API, and where its model name and counts are."""

    api: str
    marker: Path
    values: frozenset[str] | None  # the marker's values; None: any string or count
    root: Path = ()  # where the API's object sits in the document
    model: str | None = "model"
    usage: Path = ("usage",)
    counts: dict[Path, str] = field(default_factory=dict)  # under usage -> tkbox's name


_ANTHROPIC: dict[Path, str] = {
    ("input_tokens",): "input_tokens", ("output_tokens",): "output_tokens",
    ("cache_creation_input_tokens",): "cache_creation_input_tokens",
    ("cache_read_input_tokens",): "cache_read_input_tokens"}
_RESPONSES: dict[Path, str] = {
    ("input_tokens",): "input_tokens", ("output_tokens",): "output_tokens",
    ("total_tokens",): "total_tokens",
    ("input_tokens_details", "cached_tokens"): "cache_read_input_tokens",
    ("output_tokens_details", "reasoning_tokens"): "reasoning_tokens"}
_CHAT: dict[Path, str] = {
    ("prompt_tokens",): "input_tokens", ("completion_tokens",): "output_tokens",
    ("total_tokens",): "total_tokens",
    ("prompt_tokens_details", "cached_tokens"): "cache_read_input_tokens",
    ("completion_tokens_details", "reasoning_tokens"): "reasoning_tokens"}
_GEMINI: dict[Path, str] = {
    ("promptTokenCount",): "input_tokens", ("candidatesTokenCount",): "output_tokens",
    ("totalTokenCount",): "total_tokens",
    ("cachedContentTokenCount",): "cache_read_input_tokens",
    ("thoughtsTokenCount",): "reasoning_tokens"}
_RESPONSE_EVENTS = frozenset({"response.created", "response.in_progress", "response.queued",
                              "response.completed", "response.incomplete", "response.failed"})

#: Every document tkbox reads, first match wins (the module docstring's list).
SHAPES: tuple[Shape, ...] = (
    Shape("anthropic.messages", ("type",), frozenset({"message"}), counts=_ANTHROPIC),
    Shape("anthropic.messages", ("type",), frozenset({"message_start"}), ("message",),
          counts=_ANTHROPIC),
    Shape("anthropic.messages", ("type",), frozenset({"message_delta"}), model=None,
          counts=_ANTHROPIC),
    Shape("openai.responses", ("object",), frozenset({"response"}), counts=_RESPONSES),
    Shape("openai.responses", ("type",), _RESPONSE_EVENTS, ("response",), counts=_RESPONSES),
    Shape("openai.chat", ("object",), frozenset({"chat.completion", "chat.completion.chunk"}),
          counts=_CHAT),
    Shape("gemini.generate", ("modelVersion",), None, model="modelVersion",
          usage=("usageMetadata",), counts=_GEMINI),
    Shape("gemini.generate", ("usageMetadata", "promptTokenCount"), None, model="modelVersion",
          usage=("usageMetadata",), counts=_GEMINI),
)
APIS = tuple(dict.fromkeys(s.api for s in SHAPES))


def _wanted(shapes: tuple[Shape, ...]) -> frozenset[Path]:
    out: set[Path] = set()
    for s in shapes:
        out.add(s.marker)
        if s.model is not None:
            out.add(s.root + (s.model,))
        out.update(s.root + s.usage + c for c in s.counts)
    return frozenset(out)


WANTED = _wanted(SHAPES)
PREFIXES = frozenset(p[:i] for p in WANTED for i in range(1, len(p)))
#: the most a reader holds between two chunks, whatever the body (`ModelUsage.held`)
HELD_MAX = MAX_DEPTH + MAX_KEY + MAX_BARE + MAX_CAPTURE * (len(WANTED) + 1) + MAX_FIELD + \
    EVENT_HOLD + 3

_WS = re.compile(rb"[ \t\r\n]+")
_PLAIN = re.compile(rb'[^"\\]+')  # a run of a string's bytes that are not " or \
_SKIP = re.compile(rb'[^"{}\[\]]+')  # inside a container nobody reads: all but these
_BARE = re.compile(rb"[-+.0-9A-Za-z]+")
_LINE = re.compile(rb"[^\r\n]+")
_LINES = re.compile(rb"([^\r\n]*)(\r\n|\r|\n)")  # a whole line and its end
_COUNT = re.compile(rb"0|[1-9][0-9]{0,11}")  # fullmatch: a canonical count
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_MODEL = re.compile(r"[\x20-\x7e]{1,128}")



def _past(run: re.Pattern[bytes], data: bytes, i: int) -> int:
    """Where the run of `run` starting at `i` ends (`i` when there is none)."""
    m = run.match(data, i)
    return m.end() if m else i


# lexer states
_TOP, _VALUE, _AFTER, _KEY, _COLON, _STRING, _BARE_TOKEN, _SKIPPING, _BROKEN = range(9)
_OPEN, _CLOSE = b"{[", b"}]"


class _Lexer:
    """A streaming JSON lexer that hands each whole document's captured values to
    `done`; see the module docstring. Pure: bytes in, callbacks out."""

    def __init__(self, done: Callable[[dict[Path, object]], None]) -> None:
        self.done = done
        self.reset()

    def reset(self) -> None:
        self.state = _TOP
        self.kinds = bytearray()  # open containers: '{' or '['
        self.paths: list[Path | None] = []  # each container's path (None: not read)
        self.doc_depth = 0  # the depth of the open document's root (0: none)
        self.doclist = False  # the top-level value is an array of documents
        self.first = False  # a container just opened (it may close at once)
        self.vpath: Path | None = None  # the path of the value that comes next
        self.key = bytearray()
        self.key_over = False
        self.str_key = False
        self.str_after = _AFTER
        self.cap: bytearray | None = None  # a wanted string's raw bytes
        self.esc = False
        self.bare = bytearray()
        self.bare_over = False
        self.skip_base = 0
        self.doc: dict[Path, object] = {}

    @property
    def idle(self) -> bool:
        """Between documents (nothing half-read)."""
        return self.state == _TOP and not self.kinds

    @property
    def held(self) -> int:
        return len(self.kinds) + len(self.key) + len(self.bare) + len(self.cap or b"") + \
            sum(len(str(v)) for v in self.doc.values())

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            st = self.state
            if st == _STRING:
                i = self._string(data, i, n)
            elif st == _SKIPPING:
                i = _past(_SKIP, data, i)
                if i < n:
                    i = self._skip_byte(data[i], i)
            elif st == _BARE_TOKEN:
                j = _past(_BARE, data, i)
                if not self.bare_over:
                    self.bare += data[i:j]
                    if len(self.bare) > MAX_BARE:
                        self.bare_over = True  # no count is this long: read as none
                        self.bare.clear()
                i = j
                if i < n:
                    self._bare_end()
            elif st == _BROKEN:
                return
            else:
                i = _past(_WS, data, i)
                if i < n:
                    i = self._token(data[i], i)

    # -- structure -------------------------------------------------------------------

    def _token(self, c: int, i: int) -> int:
        st = self.state
        if st == _TOP:
            if c == 0x7B:  # {
                self._push(c, (), doc=True)
                return i + 1
            if c == 0x5B:  # [
                self.doclist = True
                self._push(c, None)
                self.state = _VALUE
                return i + 1
            self._broken()  # a top-level scalar is no document
            return i + 1
        if st == _KEY:
            if c == 0x22:  # "
                self._start_string(key=True)
                return i + 1
            if c == 0x7D and self.first:  # } of {}
                self._pop(c)
                return i + 1
            self._broken()
            return i + 1
        if st == _COLON:
            if c == 0x3A:
                self.state = _VALUE
                return i + 1
            self._broken()
            return i + 1
        if st == _AFTER:
            if c == 0x2C:  # ,
                if self.kinds[-1] == 0x7B:
                    self.state, self.first = _KEY, False
                else:
                    self.state, self.first = _VALUE, False
                return i + 1
            if c in _CLOSE:
                self._pop(c)
                return i + 1
            self._broken()
            return i + 1
        # _VALUE
        if c == 0x5D and self.first and self.kinds and self.kinds[-1] == 0x5B:  # [] ends
            self._pop(c)
            return i + 1
        path = self._value_path()
        if c == 0x22:
            self.vpath = path
            self._start_string(key=False)
            return i + 1
        if c == 0x7B:
            if self.doclist and len(self.kinds) == 1:
                self._push(c, (), doc=True)
            else:
                self._push(c, path if path is not None and path in PREFIXES else None)
            return i + 1
        if c == 0x5B:
            self._push(c, None)
            return i + 1
        if c in b"-0123456789tfn":
            self.vpath = path
            self.bare.clear()
            self.bare_over = False
            self.state = _BARE_TOKEN
            return i
        self._broken()
        return i + 1

    def _value_path(self) -> Path | None:
        if self.kinds and self.kinds[-1] == 0x7B:
            return self.vpath
        return None

    def _push(self, c: int, path: Path | None, doc: bool = False) -> None:
        if len(self.kinds) >= MAX_DEPTH:
            self._broken()
            return
        self.kinds.append(c)
        self.paths.append(path)
        if doc:
            self.doc_depth = len(self.kinds)
            self.doc = {}
        if path is None and not doc and not (self.doclist and len(self.kinds) == 1):
            # nobody reads below here: brackets and strings only, at C speed
            self.skip_base = len(self.kinds) - 1
            self.state = _SKIPPING
            return
        self.state = _KEY if c == 0x7B else _VALUE
        self.first = True
        self.vpath = None

    def _pop(self, c: int) -> None:
        if not self.kinds or self.kinds[-1] != c - 2:  # '}' - 2 == '{', ']' - 2 == '['
            self._broken()
            return
        depth = len(self.kinds)
        self.kinds.pop()
        self.paths.pop()
        if depth == self.doc_depth:
            self.doc_depth = 0
            doc, self.doc = self.doc, {}
            self.done(doc)
        if not self.kinds:
            self.doclist = False
            self.state = _TOP
        else:
            self.state = _AFTER
            self.first = False

    def _skip_byte(self, c: int, i: int) -> int:
        if c == 0x22:
            self._start_string(key=False, after=_SKIPPING)
            return i + 1
        if c in _OPEN:
            if len(self.kinds) >= MAX_DEPTH:
                self._broken()
                return i + 1
            self.kinds.append(c)
            self.paths.append(None)
            return i + 1
        # a closing bracket
        if self.kinds[-1] != c - 2:
            self._broken()
            return i + 1
        self.kinds.pop()
        self.paths.pop()
        if len(self.kinds) == self.skip_base:
            if not self.kinds:
                self.state = _TOP
                self.doclist = False
            else:
                self.state, self.first = _AFTER, False
        return i + 1

    # -- strings, numbers, literals ----------------------------------------------------

    def _start_string(self, *, key: bool, after: int = _AFTER) -> None:
        self.state = _STRING
        self.str_key = key
        self.str_after = _COLON if key else after
        self.esc = False
        if key:
            self.key.clear()
            self.key_over = self.paths[-1] is None
            self.cap = None
        else:
            self.cap = bytearray() if after == _AFTER and self.vpath in WANTED else None

    def _keep(self, chunk: bytes) -> None:
        if self.str_key:
            if not self.key_over:
                self.key += chunk
                if len(self.key) > MAX_KEY:
                    self.key_over = True
                    self.key.clear()
        elif self.cap is not None:
            self.cap += chunk
            if len(self.cap) > MAX_CAPTURE:
                self.cap = None
                self.doc[self.vpath or ()] = None

    def _string(self, data: bytes, i: int, n: int) -> int:
        if self.esc:
            self._keep(data[i:i + 1])
            self.esc = False
            i += 1
        while i < n:
            j = _past(_PLAIN, data, i)
            if j > i:
                self._keep(data[i:j])
            if j >= n:
                return n
            if data[j] == 0x22:  # the closing quote
                self._string_end()
                return j + 1
            # a backslash: it and the byte it escapes are kept raw, decoded at the end
            if j + 1 < n:
                self._keep(data[j:j + 2])
                i = j + 2
            else:
                self._keep(data[j:j + 1])
                self.esc = True
                return n
        return n

    def _string_end(self) -> None:
        if self.str_key:
            parent = self.paths[-1]
            key = None if self.key_over else _decode(bytes(self.key))
            p = parent + (key,) if parent is not None and key is not None else None
            self.vpath = p if p is not None and (p in WANTED or p in PREFIXES) else None
            self.state = _COLON
            return
        if self.cap is not None and self.vpath is not None:
            self.doc[self.vpath] = _decode(bytes(self.cap))
        self.cap = None
        self.state = self.str_after
        if self.state == _AFTER:
            self.first = False

    def _bare_end(self) -> None:
        tok = bytes(self.bare)
        self.bare.clear()
        if self.bare_over:
            self.bare_over = False
            if self.vpath is not None and self.vpath in WANTED:
                self.doc[self.vpath] = None
            self.state, self.first = _AFTER, False
            return
        if tok not in (b"true", b"false", b"null") and not _NUMBER.fullmatch(tok):
            self._broken()
            return
        if self.vpath is not None and self.vpath in WANTED:
            self.doc[self.vpath] = int(tok) if _COUNT.fullmatch(tok) else None
        self.state, self.first = _AFTER, False

    def _broken(self) -> None:
        self.state = _BROKEN
        self.kinds.clear()
        self.paths.clear()
        self.cap = None
        self.bare.clear()
        self.doc = {}

    def end(self) -> bool:
        """The input ended (an event, or the body): True when nothing was half-read. A
        token that ends with the input (`1` as a whole event's data) is whole."""
        if self.state == _BARE_TOKEN:
            self._bare_end()
        whole = self.idle
        self.reset()
        return whole


class _NotJSON(ValueError):
    pass


def _no_constant(name: str) -> object:
    raise _NotJSON(name)  # NaN, Infinity: not JSON


class _NotCount:
    """A number at a count's path that is not a canonical count."""


_NOT_COUNT = _NotCount()


def _int(text: str) -> object:
    return int(text) if _COUNT.fullmatch(text.encode()) else _NOT_COUNT


Getter = Callable[[Path], object]


def whole_documents(raw: bytes) -> list[Getter] | None:
    """The documents of `raw` read whole (the C JSON parser), each as a getter of the
    value at a path, as the lexer would capture it; None when `raw` is not one JSON
    value of at most `MAX_DEPTH` levels (the caller then streams it through the lexer)."""
    if raw.count(b"{") + raw.count(b"[") > MAX_DEPTH:
        return None  # perhaps deeper than the lexer reads
    try:
        text = raw.decode("utf-8")
        # "-0" is a number no count is: only then is every integer checked as it is read
        value = (_CHECKED if b"-0" in raw else _DECODER).decode(text)
    except (ValueError, RecursionError):
        return None
    items = value if isinstance(value, list) else [value]
    return [functools.partial(_at, item) for item in items if isinstance(item, dict)]


def _at(item: dict[str, Any], path: Path) -> object:
    """The value at `path`, as the lexer captures one: a string, a count, None for
    another scalar, `_MISSING` for none or a container."""
    node: object = item
    for key in path:
        if not isinstance(node, dict):
            return _MISSING
        node = node.get(key, _MISSING)
    if node is _MISSING or isinstance(node, dict | list):
        return _MISSING
    if isinstance(node, str):
        return node
    if isinstance(node, int) and not isinstance(node, bool):
        return node if 0 <= node < 10**12 else None
    return None  # true, false, null, a number that is no count


_DECODER = json.JSONDecoder(parse_constant=lambda t: _no_constant(t))
_CHECKED = json.JSONDecoder(parse_int=lambda t: _int(t), parse_float=lambda t: _NOT_COUNT,
                            parse_constant=lambda t: _no_constant(t))
_MISSING = object()


def _dispatch() -> dict[Path, dict[str, int] | int]:
    """Marker path -> (its value -> the first shape's index), or the index of the
    first shape any string or count there marks."""
    out: dict[Path, dict[str, int] | int] = {}
    for idx, shape in enumerate(SHAPES):
        if shape.values is None:
            out.setdefault(shape.marker, idx)
        else:
            table = out.setdefault(shape.marker, {})
            assert isinstance(table, dict)
            for v in shape.values:
                table.setdefault(v, idx)
    return out


_DISPATCH = _dispatch()
#: what any document of a known shape holds: a marker value as a whole JSON string,
#: an any-value marker's key, or an escape (which could spell either)
_MAYBE = re.compile(b"|".join(sorted(
    {re.escape(json.dumps(v).encode()) for s in SHAPES for v in (s.values or ())}
    | {re.escape(json.dumps(s.marker[-1]).encode()) for s in SHAPES if s.values is None}))
    + rb"|\\u")


def shape_of(get: Getter) -> Shape | None:
    """The first shape (in `SHAPES`' order) whose marker the document holds."""
    best: int | None = None
    for path, rule in _DISPATCH.items():
        v = get(path)
        if isinstance(rule, int):
            idx = rule if isinstance(v, str | int) and v is not _MISSING else None
        else:
            idx = rule.get(v) if isinstance(v, str) else None
        if idx is not None and (best is None or idx < best):
            best = idx
    return None if best is None else SHAPES[best]


def _decode(raw: bytes) -> str | None:
    """A JSON string's raw bytes (between its quotes), decoded; None if not valid."""
    try:
        out = json.loads(b'"' + raw + b'"')
    except ValueError:
        return None
    return out if isinstance(out, str) else None


class ModelUsage:
    """Feed response body chunks; call `finish()` at its end; read `fields()`."""

    def __init__(self) -> None:
        self.api: str | None = None
        self.model: str | None = None
        self.usage: dict[str, int] = {}
        self.incomplete = False
        self._lexer = _Lexer(self._document)
        self._mode = ""  # "", "json" or "sse"
        self._lead = b""  # a BOM's first bytes, while the framing is unknown
        # SSE: the line's state
        self._line = "start"  # start, field, value-start, data, skip
        self._field = bytearray()
        self._cr = False  # the last byte was CR: a LF now is part of that line end
        self._data = False  # the event has data
        self._finished = False
        # an event's data (or a JSON body) while it is small enough to be parsed whole
        self._hold = bytearray()
        self._over = False  # it was not: it streams through the lexer

    @property
    def held(self) -> int:
        """Bytes this reader holds (bounded whatever the body: tests check it)."""
        return self._lexer.held + len(self._field) + len(self._lead) + len(self._hold)

    # -- the documents -----------------------------------------------------------------

    def _document(self, doc: dict[Path, object]) -> None:
        self._read(doc.get)

    def _read(self, get: Getter) -> None:
        """One whole document, by its getter of the value at a path."""
        shape = shape_of(get)
        if shape is None:
            return
        if self.api is None:
            self.api = shape.api
        elif shape.api != self.api:
            return  # another API's document in this body: not read
        if shape.model is not None and self.model is None:
            name = get(shape.root + (shape.model,))
            if isinstance(name, str) and _MODEL.fullmatch(name):
                self.model = name
        for sub, key in shape.counts.items():
            value = get(shape.root + shape.usage + sub)
            if isinstance(value, int) and not isinstance(value, bool):
                self.usage[key] = value

    # -- framing -----------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if self._finished or not data:
            return
        if not self._mode:
            data = self._lead + data
            self._lead = b""
            k = 0
            while k < len(data):
                if data[k:k + 3] == b"\xef\xbb\xbf":
                    k += 3
                elif data[k] in b" \t\r\n":
                    k += 1
                elif b"\xef\xbb\xbf".startswith(data[k:]):
                    self._lead = data[k:]  # perhaps a BOM cut short
                    return
                else:
                    break
            if k >= len(data):
                return
            self._mode = "json" if data[k] in b"{[" else "sse"
            data = data[k:]
        if self._mode == "json":
            self._take(data)
        else:
            self._sse(data)

    def _take(self, data: bytes) -> None:
        """A document's bytes: held while the whole is small, else streamed."""
        if self._over:
            self._lexer.feed(data)
            return
        self._hold += data
        if len(self._hold) > EVENT_HOLD:
            self._over = True
            held = bytes(self._hold)
            self._hold.clear()
            self._lexer.feed(held)

    def _end(self, *, sift: bool = False) -> tuple[bool, bool]:
        """The held or streamed input ended: (nothing was half-read, it stopped being
        JSON somewhere). `sift`: a held event that cannot be any shape's document (no
        marker in it, in any spelling) is passed over unparsed."""
        if not self._over:
            raw = bytes(self._hold)
            self._hold.clear()
            if sift and not _MAYBE.search(raw):
                return True, False
            docs = whole_documents(raw)
            if docs is not None:
                for get in docs:
                    self._read(get)
                return True, False
            self._lexer.feed(raw)  # not one JSON value: as the lexer reads it
        self._over = False
        broken = self._lexer.state == _BROKEN
        return self._lexer.end(), broken

    def _sse(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            if self._cr:
                self._cr = False
                if data[i] == 0x0A:
                    i += 1
                    continue
            if self._line == "start":
                # the whole lines in this chunk, read at once (the byte-wise path below
                # reads a line that a chunk's end cuts). Searched only up to the last
                # line end: past it every start position would scan to the chunk's end
                # and fail, quadratic in a chunk without one.
                last = max(data.rfind(b"\n", i), data.rfind(b"\r", i))
                for m in _LINES.finditer(data, i, last + 1):
                    line = m.group(1)
                    if not line:
                        if self._data:
                            self._event_end()  # a blank line
                    elif line[:5] == b"data:":
                        if self._data:
                            self._take(b"\n")  # data lines of one event: joined by LF
                        self._data = True
                        value = line[6:] if line[5:6] == b" " else line[5:]
                        if value:
                            self._take(value)
                    elif line == b"data":  # an empty value
                        if self._data:
                            self._take(b"\n")
                        self._data = True
                    # another field, or a comment: nothing to read
                    i = m.end()
                    if i == n and m.group(2) == b"\r":
                        self._cr = True  # a LF may begin the next chunk
                if i >= n:
                    break
            if self._line in ("data", "skip"):
                j = _past(_LINE, data, i)
                if self._line == "data" and j > i:
                    self._take(data[i:j])
                i = j
                if i < n:
                    self._line_end(data[i])
                    i += 1
                continue
            c = data[i]
            if c in b"\r\n":
                self._line_end(c)
                i += 1
                continue
            if self._line == "start":
                if c == 0x3A:  # a comment
                    self._line = "skip"
                    i += 1
                    continue
                self._line = "field"
                self._field.clear()
            if self._line == "field":
                if c == 0x3A:
                    self._line = "value-start"
                else:
                    self._field.append(c)
                    if len(self._field) > MAX_FIELD:
                        self._line = "skip"
                i += 1
                continue
            # value-start: one space is dropped, then the value
            if self._field == b"data":
                if self._data:
                    self._take(b"\n")  # data lines of one event are joined by LF
                self._data = True
                self._line = "data"
            else:
                self._line = "skip"
            if c == 0x20:
                i += 1

    def _line_end(self, c: int) -> None:
        if c == 0x0D:
            self._cr = True
        if self._line == "start":  # a blank line: the event ends
            if self._data:
                self._event_end()
        elif self._line in ("field", "value-start") and self._field == b"data":
            # `data` or `data:` alone: an empty value
            if self._data:
                self._take(b"\n")
            self._data = True
        self._line = "start"

    def _event_end(self) -> None:
        # an event that is not whole JSON (`data: [DONE]`, or JSON that does not end
        # before the event does) is no document: nothing is read from it
        self._data = False
        self._end(sift=True)

    def finish(self) -> None:
        """The body ended: whatever is half-read stays unread, and says so."""
        if self._finished:
            return
        self._finished = True
        if self._mode == "json":
            whole, broken = self._end()
            if not whole or broken:
                self.incomplete = True
        elif self._mode == "sse" and self._data:
            # the stream ended without the event's blank line: a document already whole
            # is read; one half-read is not, and says so
            self._data = False
            whole, broken = self._end()
            if not whole and not broken:
                self.incomplete = True

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"api": self.api or "unknown"}
        if self.model is not None:
            out["model"] = self.model
        if self.usage:
            out["usage"] = dict(sorted(self.usage.items()))
        if self.incomplete:
            out["incomplete"] = True
        return out
