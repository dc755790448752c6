"""The image a checkout's dev container names, read and never run.

A checkout that says what its development environment is says it in
`.devcontainer/devcontainer.json` or `.devcontainer.json` (the Development
Container Specification, containers.dev). tkbox reads one key of it, `image`, so
an agent's box runs in the image the project's own people use. Nothing else of the
file is acted on: no `features`, no lifecycle commands (`postCreateCommand` and
the like would be code the checkout chose, run with the box's rights before the
agent starts), no `build` (a Dockerfile is a build tkbox does not run: give
`--image` instead), no `dockerComposeFile`.

The file is JSON with comments (JSONC: `//` and `/* */` comments, trailing
commas). The standard library reads JSON only, so the comments and trailing
commas are removed here, outside strings, before `json.loads`; the file is bounded
(`MAX_BYTES`) before it is read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tkbox.errors import UserError

MAX_BYTES = 1 << 20
PLACES = (".devcontainer/devcontainer.json", ".devcontainer.json")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$")


def strip_jsonc(text: str) -> str:
    """JSON with comments and trailing commas -> JSON (strings left as they are)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise ValueError("a comment that never ends")
            i = j + 2
        elif c == ",":
            j = _past_blanks(text, i + 1)  # a trailing comma: dropped
            if j >= n or text[j] not in "}]":
                out.append(c)
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _past_blanks(text: str, j: int) -> int:
    """The index of the next character that is neither white space nor in a comment."""
    n = len(text)
    while j < n:
        if text[j] in " \t\r\n":
            j += 1
        elif text.startswith("//", j):
            k = text.find("\n", j)
            j = n if k < 0 else k
        elif text.startswith("/*", j):
            k = text.find("*/", j + 2)
            if k < 0:
                raise ValueError("a comment that never ends")
            j = k + 2
        else:
            break
    return j


def find(checkout: Path) -> Path | None:
    for place in PLACES:
        p = checkout / place
        if p.is_file():
            return p
    return None


def image_of(checkout: Path) -> str | None:
    """The image the checkout's dev container names; None when it has none; a UserError
    naming the fix for one tkbox cannot use."""
    path = find(checkout)
    if path is None:
        return None
    shown = path.relative_to(checkout)
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise UserError(f"{shown} is larger than {MAX_BYTES >> 10} KiB; give --image")
    try:
        doc = json.loads(strip_jsonc(raw.decode("utf-8")))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"{shown} is not JSON with comments ({str(exc)[:120]}); fix it or "
                        "give --image") from None
    if not isinstance(doc, dict):
        raise UserError(f"{shown} is not an object; fix it or give --image")
    image = doc.get("image")
    if isinstance(image, str) and image.strip():
        if not _IMAGE.match(image.strip()):
            raise UserError(f"{shown} names an image tkbox cannot read: "
                            f"{image.strip()[:80]!r}; give --image")
        return image.strip()
    built = [k for k in ("build", "dockerFile", "dockerfile", "dockerComposeFile") if k in doc]
    if built:
        raise UserError(f"{shown} builds its image ({built[0]}), which tkbox does not do: "
                        "give --image with an image to pull (or push the built one and "
                        "name it in 'image')")
    raise UserError(f"{shown} names no image: add \"image\": \"REFERENCE\" to it, or give "
                    "--image")
