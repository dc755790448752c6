"""The image a checkout's dev container names: read, never run; JSON with comments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tkbox.agents.devcontainer import image_of, strip_jsonc
from tkbox.errors import UserError

SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
JUNK = st.sampled_from(["", " ", "\n", "// note\n", "/* x */", "/* a\n b */", "\t// , ] }\n"])


def jsonc(value: Any, junk: st.DrawFn) -> str:
    """`value` as JSON with comments and white space between tokens, and a trailing comma
    now and then."""
    def j() -> str:
        return junk(JUNK)
    if isinstance(value, dict):
        items = [f"{j()}{json.dumps(k)}{j()}:{j()}{jsonc(v, junk)}{j()}" for k, v in value.items()]
        trail = "," if items and junk(st.booleans()) else ""
        return "{" + ",".join(items) + trail + j() + "}"
    if isinstance(value, list):
        items = [f"{j()}{jsonc(v, junk)}{j()}" for v in value]
        trail = "," if items and junk(st.booleans()) else ""
        return "[" + ",".join(items) + trail + j() + "]"
    return json.dumps(value)


@given(VALUES, st.data())
def test_jsonc_reads_as_the_json_it_encodes(value: Any, data: st.DataObject) -> None:
    text = jsonc(value, data.draw)
    assert json.loads(strip_jsonc(text)) == value


def write(tmp: Path, text: str, place: str = ".devcontainer/devcontainer.json") -> Path:
    p = tmp / place
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return tmp


def test_the_image_is_read_from_either_place(tmp_path: Path) -> None:
    assert image_of(tmp_path) is None
    ws = write(tmp_path, '{\n  // the team\'s image\n  "image": "python:3.12-slim",\n}')
    assert image_of(ws) == "python:3.12-slim"
    other = write(tmp_path / "b", '{"image": "node:22"}', ".devcontainer.json")
    assert image_of(other) == "node:22"


@pytest.mark.parametrize("text, why", [
    ('{"name": "x"}', "names no image: add \"image\""),
    ('{"build": {"dockerfile": "Dockerfile"}}', "builds its image (build), which tkbox does not"),
    ('{"dockerComposeFile": "c.yml", "service": "app"}', "builds its image (dockerComposeFile)"),
    ('{"image": "x; rm -rf /"}', "names an image tkbox cannot read"),
    ('{"image": ', "is not JSON with comments"),
    ('["image"]', "is not an object"),
    ('{"image": "a" /* never ends', "is not JSON with comments"),
])
def test_a_devcontainer_tkbox_cannot_use_is_one_line_naming_the_fix(
        tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(UserError) as e:
        image_of(write(tmp_path, text))
    assert why in str(e.value) and "\n" not in str(e.value)
    assert "--image" in str(e.value) or "add" in str(e.value)


def test_a_huge_devcontainer_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    ws = write(tmp_path, '{"image": "x", "pad": "' + "a" * (2 << 20) + '"}')
    with pytest.raises(UserError, match="larger than"):
        image_of(ws)
