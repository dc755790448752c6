"""The composite runner's parts, each against what GitHub documents: the expression
language (a strict subset: what it does not know is an error), the file commands'
format, and the paths and keys of the actions/cache stand-in."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from action.testing.composite import (
    ActionsCache,
    CompositeError,
    UsesContext,
    parse_file_command,
    resolve_paths,
    run_action,
)
from action.testing.expressions import (
    ExpressionError,
    Lenient,
    Strict,
    condition,
    evaluate,
    substitute,
    to_number,
)

CTX = {
    "inputs": Strict("the action's inputs", {"install": "true", "agent-command": "x",
                                             "empty": ""}),
    "steps": Strict("the steps context", {
        "run": Strict("step run", {"outputs": Lenient({"bundle": "/b.tkb"}),
                                   "outcome": "success", "conclusion": "success"})}),
    "env": Lenient({"A": "1"}),
}


def fns(failed: bool = False) -> dict[str, object]:
    return {"success": lambda: not failed, "failure": lambda: failed,
            "always": lambda: True, "cancelled": lambda: False}


@pytest.mark.parametrize(("expr", "value"), [
    ("inputs.install == 'true'", True),
    ("inputs.install == 'TRUE'", True),  # strings compare ignoring case
    ("inputs.INSTALL == 'true'", True),  # so do property names
    ("inputs.install != 'true'", False),
    ("inputs.agent-command", "x"),
    ("steps.run.outputs.bundle != ''", True),
    ("steps.run.outputs.missing == ''", True),  # an unset output is null, '' as text
    ("steps.run.outputs.missing", None),
    ("env.A == 1", True),  # another type: both as numbers
    ("env.NOPE", None),
    ("'' == 0", True),
    ("null == 0", True),
    ("true == 1", True),
    ("'abc' == 0", False),  # NaN equals nothing
    ("inputs.empty && 'no'", ""),  # && gives an operand
    ("inputs.install && 'yes'", "yes"),
    ("inputs.empty || 'fallback'", "fallback"),
    ("!inputs.empty", True),
    ("!inputs.install == false", True),  # ! binds tighter than ==
    ("(true || false) && !(false)", True),
    ("'it''s'", "it's"),
    ("0x10 == 16", True),
])
def test_expressions(expr: str, value: object):
    assert evaluate(expr, CTX, fns()) == value


@pytest.mark.parametrize(("expr", "said"), [
    ("inputs.nope", "has no 'nope'"),
    ("steps.other.outputs.x", "has no 'other'"),
    ("secrets.X", "no context named 'secrets'"),
    ("contains(inputs.install, 't')", "contains() is not a function"),
    ("hashFiles('x')", "hashFiles() is not a function"),
    ("inputs['install']", "'[' is not part"),
    ("1 < 2", "'<' is not part"),
    ("inputs.install ==", "is not part"),
    ("'unterminated", "cannot read"),
    ("(true", "expected ')'"),
])
def test_what_the_evaluator_does_not_know_is_an_error(expr: str, said: str):
    with pytest.raises(ExpressionError) as e:
        evaluate(expr, CTX, fns())
    assert said in str(e.value)


def test_if_implies_success_unless_it_names_a_status_function():
    assert condition("inputs.install == 'true'", CTX, fns()) is True
    assert condition("inputs.install == 'true'", CTX, fns(failed=True)) is False
    assert condition("always() && inputs.install == 'true'", CTX, fns(failed=True)) is True
    assert condition("failure()", CTX, fns(failed=True)) is True
    assert condition("${{ inputs.install == 'true' }}", CTX, fns()) is True
    assert condition(False, CTX, fns()) is False
    with pytest.raises(ExpressionError, match="always true"):
        condition("${{ inputs.install }} == 'false'", CTX, fns())


def test_substitution_puts_values_into_text():
    assert substitute("a ${{ inputs.install }} ${{ steps.run.outputs.nope }}b", CTX) == "a true b"
    assert substitute("${{ 1 == 1 }}", CTX) == "true"
    with pytest.raises(ExpressionError, match="unclosed"):
        substitute("a ${{ inputs.install", CTX)


def test_numbers_as_github_coerces_them():
    assert to_number(" 12 ") == 12 and to_number("") == 0 and to_number(None) == 0
    assert math.isnan(to_number("1x")) and math.isnan(to_number({}))


def test_file_commands_in_both_forms():
    text = ("a=1\nb=x=y\n\nlong<<EOF\nline 1\nline=2\nEOF\nempty=\n"
            "crlf<<END\r\nv\r\nEND\r\n")
    assert parse_file_command(text, "out") == [
        ("a", "1"), ("b", "x=y"), ("long", "line 1\nline=2"), ("empty", ""), ("crlf", "v")]


@pytest.mark.parametrize(("text", "said"), [
    ("x<<EOF\nnever closed\n", "matching delimiter not found"),
    ("no equals sign\n", "invalid format"),
    ("=value\n", "no name"),
    ("x<<\n", "no delimiter"),
])
def test_a_bad_file_command_is_an_error(text: str, said: str):
    with pytest.raises(CompositeError, match=said):
        parse_file_command(text, "GITHUB_OUTPUT")


def test_paths_resolve_as_actions_glob_does(tmp_path: Path):
    g = tmp_path / "home" / "guest"
    (g / "templates" / "t1").mkdir(parents=True)
    (g / "initramfs-1.cpio").write_text("i")
    (g / ".hidden").write_text("h")
    (g / "templates" / "t1" / "ram").write_text("r")
    (g / "accel.json").write_text("{}")
    got = resolve_paths(f"{g}/*\n!{g}/templates\n!{g}/accel.json\n", tmp_path, "/root")
    assert sorted(p.name for p in got) == [".hidden", "initramfs-1.cpio"]
    # a directory taken whole: a `!` line below it does not cut it (implicitDescendants
    # false), as a user of actions/cache might expect it to
    assert resolve_paths(f"{g}\n!{g}/templates\n", tmp_path, "/root") == [g]
    assert resolve_paths("home/guest/nothing*", tmp_path, "/root") == []
    with pytest.raises(CompositeError, match=r"\*\* is not modelled"):
        resolve_paths("home/**", tmp_path, "/root")


def cache_step(tmp: Path, cache: Path, path: str, key: str,
               restore_keys: str = "") -> tuple[ActionsCache, dict[str, str], UsesContext]:
    log: list[str] = []
    ctx = UsesContext(tmp, "/root", cache, log.append, {}, {})
    w = {k: v or "" for k, v in ActionsCache.inputs.items()}
    w.update({"path": path, "key": key, "restore-keys": restore_keys})
    return ActionsCache(), w, ctx


def test_the_cache_stand_in_keys_entries_by_key_and_paths(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "f").write_text("one")
    cache = tmp_path / "cache"
    cache.mkdir()
    a, w, ctx = cache_step(tmp_path, cache, str(data), "k-1")
    assert a.main(w, ctx) and "cache-hit" not in ctx.outputs  # a miss leaves it unset
    assert a.post(w, ctx)
    (data / "f").write_text("changed")
    (data / "g").write_text("new")
    b, w, ctx = cache_step(tmp_path, cache, str(data), "K-1")  # keys ignore case
    assert b.main(w, ctx) and ctx.outputs == {"cache-hit": "true"}
    assert (data / "f").read_text() == "one" and (data / "g").read_text() == "new"
    b.post(w, ctx)  # an exact hit is not saved again
    assert len(list(cache.glob("entry-*"))) == 1
    # the same key with other paths is another entry: a miss
    c, w, ctx = cache_step(tmp_path, cache, f"{data}\n{tmp_path}/other", "k-1")
    assert c.main(w, ctx) and "cache-hit" not in ctx.outputs
    # a restore key restores by prefix, and says it was not the exact key
    d, w, ctx = cache_step(tmp_path, cache, str(data), "k-2", restore_keys="k-")
    assert d.main(w, ctx) and ctx.outputs == {"cache-hit": "false"}


@pytest.mark.parametrize("key", ["", "a,b", "k" * 513])
def test_the_cache_stand_in_refuses_keys_actions_cache_refuses(tmp_path: Path, key: str):
    a, w, ctx = cache_step(tmp_path, tmp_path, str(tmp_path), key)
    with pytest.raises(CompositeError):
        a.main(w, ctx)


SYNTHETIC = """\
name: t
description: what the runner carries between steps
inputs:
  who:
    description: a name
    default: world
outputs:
  said:
    description: the greeting
    value: ${{ steps.greet.outputs.said }}
runs:
  using: composite
  steps:
    - id: setup
      shell: bash
      run: |
        mkdir -p "$RUNNER_TEMP/bin"
        printf '#!/bin/sh\\necho "hi from the path"\\n' > "$RUNNER_TEMP/bin/tool"
        chmod +x "$RUNNER_TEMP/bin/tool"
        echo "$RUNNER_TEMP/bin" >> "$GITHUB_PATH"
        { echo 'MULTI<<END'; echo 'one'; echo 'two'; echo 'END'; } >> "$GITHUB_ENV"
        echo "::add-mask::s3cret-value"
        echo "the value is s3cret-value"
        echo "### from setup" >> "$GITHUB_STEP_SUMMARY"
    - id: greet
      shell: bash
      env:
        WHO: ${{ inputs.who }}
        FROM_ENV: ${{ env.MULTI }}
      run: |
        tool
        test "$MULTI" = "$(printf 'one\\ntwo')"
        test "$FROM_ENV" = "$MULTI"
        echo "said=hello $WHO" >> "$GITHUB_OUTPUT"
        echo "- greeted $WHO" >> "$GITHUB_STEP_SUMMARY"
    - id: flaky
      shell: bash
      continue-on-error: true
      run: echo "::warning::about to fail" && exit 3
    - id: after
      shell: sh
      run: echo "ran after a failure that was allowed"
    - id: broken
      shell: bash
      run: exit 1
    - id: skipped
      shell: bash
      run: echo never
    - id: cleanup
      if: failure() && steps.broken.outcome == 'failure'
      shell: python
      run: print("cleaning up after", "${{ steps.broken.conclusion }}")
"""


def test_the_runner_carries_env_path_outputs_and_summaries_between_steps(tmp_path: Path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "action.yml").write_text(SYNTHETIC)
    ws = tmp_path / "ws"
    ws.mkdir()
    r = run_action(tmp_path / "a", {"who": "tkbox"}, workspace=ws,
                   runner_temp=tmp_path / "temp", cache_dir=tmp_path / "cache")
    assert [(s.id, s.outcome, s.conclusion) for s in r.steps] == [
        ("setup", "success", "success"), ("greet", "success", "success"),
        ("flaky", "failure", "success"), ("after", "success", "success"),
        ("broken", "failure", "failure"), ("skipped", "skipped", "skipped"),
        ("cleanup", "success", "success")]
    assert not r.ok and r.outputs == {"said": "hello tkbox"}
    assert "hi from the path" in r.log and "cleaning up after failure" in r.log
    assert "the value is ***" in r.log and "s3cret-value" not in r.log
    assert r.summary == "### from setup\n- greeted tkbox\n"
    assert r.env == {"MULTI": "one\ntwo"} and r.path == [str(tmp_path / "temp" / "bin")]
    assert ("warning", "about to fail") in r.annotations


def test_the_runner_refuses_inputs_the_action_does_not_declare(tmp_path: Path):
    (tmp_path / "action.yml").write_text(SYNTHETIC)
    with pytest.raises(CompositeError, match="does not declare"):
        run_action(tmp_path / "action.yml", {"whom": "x"}, workspace=tmp_path,
                   runner_temp=tmp_path / "t", cache_dir=tmp_path / "c")
