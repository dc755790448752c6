"""RFC 8785 canonical JSON: ours against the `rfc8785` package, and strictness."""

from __future__ import annotations

import json

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from tkbox.formats import FormatError, canonjson

_ints = st.integers(min_value=-canonjson.MAX_SAFE_INT, max_value=canonjson.MAX_SAFE_INT)
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
_values = st.recursive(
    st.none() | st.booleans() | _ints | _text,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_text, inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_same_bytes_as_rfc8785(value: object) -> None:
    ours = canonjson.dumps(value)
    assert ours == rfc8785.dumps(value)
    assert canonjson.loads(ours) == value


@pytest.mark.parametrize("data", [
    b'{"b":1,"a":2}',  # not sorted
    b'{"a": 1}',  # whitespace
    b'{"a":1,"a":1}',  # duplicate name
    b'{"a":1.0}', b'{"a":1e3}', b'[NaN]', b'[-0]', b'[01]',
    b'["\\u0041"]',  # an escape that is not needed
    b'["\\/"]',
    b'[9007199254740992]',  # beyond 2^53 - 1
    b'["\xff"]', b'["\\ud800"]', b"[1]\n", b"", b"[" * 100000,
])
def test_non_canonical_json_is_refused(data: bytes) -> None:
    with pytest.raises(FormatError):
        canonjson.loads(data)


def test_utf16_key_order() -> None:
    """RFC 8785 §3.2.3 sorts by UTF-16 code units: U+1F600 sorts before U+FFFF."""
    value = {"\uffff": 1, "\U0001f600": 2, "a": 3}
    assert canonjson.dumps(value) == rfc8785.dumps(value)
    assert json.loads(canonjson.dumps(value)) == value


@settings(max_examples=300, deadline=None)
@given(_values)
def test_fast_path_writes_exactly_what_the_reference_encoder_writes(value: object) -> None:
    """The stdlib C encoder is used only where it gives the same bytes as `_value`."""
    slow: list[str] = []
    canonjson._value(value, slow, 0)
    assert canonjson.dumps(value) == "".join(slow).encode()


@pytest.mark.parametrize(("data", "says"), [
    (b'{"a":1,"a":1}', "duplicate object member"),
    (b'{"a":1.5}', "is not an integer"),
    (b'{"b":1,"a":2}', "not in RFC 8785 canonical form"),
])
def test_refusals_still_say_what_is_wrong(data: bytes, says: str) -> None:
    """The fast reader hands anything it cannot print back to the slow one, which names it."""
    with pytest.raises(FormatError, match=says):
        canonjson.loads(data, where="here")


def test_values_the_fast_path_does_not_take_are_still_refused_or_encoded() -> None:
    class Sub(str):
        pass

    assert canonjson.dumps({"a": Sub("x"), "b": (1, True, None)}) == b'{"a":"x","b":[1,true,null]}'
    for bad in ({1: 2}, [1.0], [1 << 60], {"a": {"b": set()}}, ["\ud800"]):
        with pytest.raises(FormatError):
            canonjson.dumps(bad)
    deep: object = 1
    for _ in range(canonjson.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(FormatError, match="nested deeper"):
        canonjson.dumps(deep)


@pytest.mark.parametrize("depth", range(canonjson.MAX_DEPTH - 2, canonjson.MAX_DEPTH + 3))
@pytest.mark.parametrize("leaf", [1, "s", None, True, [], {}, [1], {"a": "b"}, ["x", [2]]])
def test_fast_path_and_reference_agree_at_the_depth_limit(depth: int, leaf: object) -> None:
    """The C encoder's check (`_plain`) takes a value exactly when the reference
    encoder does, at and around MAX_DEPTH, nested in lists and in objects."""
    for wrap in (lambda v: [v], lambda v: {"k": v}):
        value = leaf
        for _ in range(depth):
            value = wrap(value)
        slow: list[str] = []
        try:
            canonjson._value(value, slow, 0)
        except FormatError:
            assert not canonjson._plain(value, 0)
            with pytest.raises(FormatError, match="nested deeper"):
                canonjson.dumps(value)
        else:
            assert canonjson.dumps(value) == "".join(slow).encode()
