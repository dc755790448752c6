"""Run a composite action's `action.yml` the way GitHub's runner does, on this machine.

CI cannot run GitHub, so this runs the Action's own file, step by step, with what the
runner does between steps (GitHub Docs: "Metadata syntax for GitHub Actions",
"Workflow commands for GitHub Actions"; the runner's file-command parser):

- inputs: the `with:` values, else each input's default; an input the action does not
  declare, or a required one without a value, is an error;
- `${{ }}` in `name`, `if`, `run`, `shell`, `env`, `with`, `working-directory`,
  `continue-on-error` and the outputs' `value`, over the contexts `github`, `inputs`,
  `steps`, `env`, `runner` and `job` (`expressions`: a strict subset; anything it
  does not know is an error, not a pass);
- `if:` evaluated, `success()` implied when no status function is named; a failed
  step fails the action and skips what follows unless its `if:` says otherwise;
  `continue-on-error`;
- `run:` steps: `shell` is required (as in composite actions) and run as the runner
  runs it (`bash --noprofile --norc -eo pipefail FILE`, `sh -e FILE`, `python FILE`),
  in `working-directory` (default the workspace), with the step's `env:` on top of
  the job's;
- file commands: each step gets fresh `GITHUB_OUTPUT`, `GITHUB_ENV`, `GITHUB_PATH`,
  `GITHUB_STEP_SUMMARY` and `GITHUB_STATE` files, read after it (`name=value` and
  the heredoc `name<<DELIM` form; a missing delimiter is an error); outputs become
  `steps.<id>.outputs`, env lines reach the later steps' environment and the `env`
  context, path lines go in front of `PATH`, summaries are joined into the job's;
- workflow commands on stdout: `::error`, `::warning`, `::notice` become annotations,
  `::add-mask::` values are masked in the log;
- `uses:` steps: only actions this module models (`STAND_INS`), pinned by the full
  commit the stand-in was written from, checked at their boundary: every input known
  to that version of the action, required ones present, values checked as the action
  checks them; then run by the stand-in (a local `actions/cache` that restores and,
  in its post step at the end of the job, saves `path` by `key` in a cache directory;
  `actions/upload-artifact`, which needs its files to exist);
- post steps, last first, after the action's steps, each with its `post-if`.

`run_action` returns the action's outputs, the job summary, the annotations and each
step's outcome and time, for tests and for `benchmarks/first_try.py`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .expressions import ExpressionError, Lenient, Strict, condition, substitute

__all__ = ["ActionRun", "CompositeError", "StepRun", "run_action"]


class CompositeError(Exception):
    """The action's file, or a step's file command or `uses:` boundary, is wrong."""


@dataclass
class StepRun:
    """One step as the runner ran it (or skipped it)."""

    index: int
    name: str
    id: str | None
    kind: str  # "run", "uses" or "post"
    outcome: str = "skipped"  # success, failure or skipped (before continue-on-error)
    conclusion: str = "skipped"  # after continue-on-error
    seconds: float = 0.0
    outputs: dict[str, str] = field(default_factory=dict)
    log: str = ""


@dataclass
class ActionRun:
    ok: bool  # the job's status after the action's steps (post steps do not change it)
    outputs: dict[str, str]
    summary: str
    steps: list[StepRun]
    posts: list[StepRun]
    log: str
    annotations: list[tuple[str, str]]  # (error|warning|notice, message)
    env: dict[str, str]  # what GITHUB_ENV set, for later steps of the job
    path: list[str]  # what GITHUB_PATH put in front of PATH, first first
    seconds: float

    def timings(self) -> list[tuple[str, float]]:
        """(name, seconds) of every step that ran, post steps included, in order."""
        return [(s.name, s.seconds) for s in (*self.steps, *self.posts)
                if s.outcome != "skipped"]

    def step(self, key: str) -> StepRun:
        """A step by its id, else by the start of its name."""
        for s in self.steps:
            if s.id == key or s.name.startswith(key):
                return s
        raise KeyError(key)


# --- file commands --------------------------------------------------------------------


def parse_file_command(text: str, what: str) -> list[tuple[str, str]]:
    """`name=value` and `name<<DELIM ... DELIM` lines, as the runner reads them."""
    out: list[tuple[str, str]] = []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    i = 0
    while i < len(lines):
        line = lines[i].removesuffix("\r")
        i += 1
        if line == "":
            continue
        eq, hd = line.find("="), line.find("<<")
        if eq >= 0 and (hd < 0 or eq < hd):
            key, value = line[:eq], line[eq + 1:]
        elif hd >= 0:
            key, delim = line[:hd], line[hd + 2:]
            if delim == "":
                raise CompositeError(f"{what}: {key}<< has no delimiter")
            body: list[str] = []
            while True:
                if i >= len(lines):
                    raise CompositeError(f"{what}: matching delimiter not found: {delim!r}")
                cur = lines[i].removesuffix("\r")
                i += 1
                if cur == delim:
                    break
                body.append(cur)
            value = "\n".join(body)
        else:
            raise CompositeError(f"{what}: invalid format {line[:80]!r}")
        if key == "":
            raise CompositeError(f"{what}: a line with no name: {line[:80]!r}")
        out.append((key, value))
    return out


_COMMAND = re.compile(r"^::(error|warning|notice|add-mask|debug|group|endgroup)"
                      r"(?: [^:]*)?::(.*)$")


def _unescape(data: str) -> str:
    return data.replace("%0D", "\r").replace("%0A", "\n").replace("%25", "%")


# --- paths as actions/cache and actions/upload-artifact resolve them ------------------


def resolve_paths(patterns: str, workspace: Path, home: str) -> list[Path]:
    """Existing paths matching the non-`!` lines, without those matching a `!` line.

    As @actions/glob with `implicitDescendants: false` (actions/cache): a directory
    matched is taken whole (a `!` line below it does not cut it), `*`, `?` and `[]`
    match within one path segment, dot files included; `**` is not modelled."""
    include: list[str] = []
    exclude: list[str] = []
    for raw in patterns.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        line = line[1:] if neg else line
        if "**" in line:
            raise CompositeError(f"path {raw!r}: ** is not modelled by this runner")
        if line.startswith("~"):
            line = home + line[1:]
        p = line if line.startswith("/") else str(workspace / line)
        (exclude if neg else include).append(os.path.normpath(p))
    found: list[Path] = []
    for pat in include:
        for hit in _glob(pat):
            if not any(_matches(ex, str(hit)) for ex in exclude) and hit not in found:
                found.append(hit)
    return found


def _glob(pattern: str) -> list[Path]:
    parts = Path(pattern).parts
    current = [Path(parts[0])]
    for seg in parts[1:]:
        nxt: list[Path] = []
        for base in current:
            if any(c in seg for c in "*?["):
                if base.is_dir():
                    nxt += sorted(base / n for n in os.listdir(base) if fnmatch.fnmatchcase(n, seg))
            elif os.path.lexists(base / seg):
                nxt.append(base / seg)
        current = nxt
    return [p for p in current if os.path.lexists(p)]


def _matches(pattern: str, path: str) -> bool:
    a, b = Path(pattern).parts, Path(path).parts
    return len(a) == len(b) and all(fnmatch.fnmatchcase(y, x) for x, y in zip(a, b, strict=True))


# --- the stand-ins for the actions a composite action may use -------------------------


@dataclass
class UsesContext:
    workspace: Path
    home: str
    cache_dir: Path
    log: Callable[[str], None]
    state: dict[str, str]  # this step's state, kept for its post step
    outputs: dict[str, str]


class StandIn:
    """A model of one version of an action, at its boundary."""

    repo = ""
    sha = ""  # the full commit the model was written from
    version = ""
    inputs: Mapping[str, str | None] = {}  # name -> default (None: no default)
    required: tuple[str, ...] = ()
    post_if: str | None = None

    def main(self, w: dict[str, str], ctx: UsesContext) -> bool:
        raise NotImplementedError

    def post(self, w: dict[str, str], ctx: UsesContext) -> bool:
        return True


def _bool_input(w: dict[str, str], name: str) -> bool:
    v = w.get(name, "false").strip().lower()
    if v not in ("true", "false", ""):
        raise CompositeError(f"input {name} must be true or false, not {v!r}")
    return v == "true"


class ActionsCache(StandIn):
    """actions/cache v4.3.0 (`action.yml`, `src/restoreImpl.ts`, `src/saveImpl.ts`).

    An entry is found by its key (exactly, ignoring case, then each `restore-keys`
    line as a prefix, newest first) and its version, which hashes the `path` lines, so
    the same key with other paths is another entry, as on GitHub. `cache-hit` is
    `true` for the exact key, `false` for a restore key, unset when nothing matched.
    The post step (`post-if: success()`) saves unless the exact key was restored;
    entries are immutable: a key saved once is not saved again."""

    repo, version = "actions/cache", "v4.3.0"
    sha = "0057852bfaa89a56745cba8c7296529d2fc39830"
    inputs = {"path": None, "key": None, "restore-keys": "", "upload-chunk-size": "",
              "enableCrossOsArchive": "false", "fail-on-cache-miss": "false",
              "lookup-only": "false", "save-always": "false"}
    required = ("path", "key")
    post_if = "success()"

    def _check(self, w: dict[str, str]) -> tuple[str, str]:
        key = w["key"]
        if not key.strip():
            raise CompositeError("actions/cache: key is empty")
        if len(key) > 512 or "," in key:
            raise CompositeError(f"actions/cache: key {key[:80]!r} is longer than 512 "
                                 "characters or holds a comma")
        if not w["path"].strip():
            raise CompositeError("actions/cache: path is empty")
        if _bool_input(w, "save-always") or _bool_input(w, "lookup-only") \
                or _bool_input(w, "enableCrossOsArchive"):
            raise CompositeError("actions/cache: save-always, lookup-only and "
                                 "enableCrossOsArchive are not modelled")
        lines = [x.strip() for x in w["path"].splitlines() if x.strip()]
        version = hashlib.sha256("|".join([*lines, "zstd-without-long", "1.0"]).encode())
        return key, version.hexdigest()

    def _entries(self, ctx: UsesContext, version: str) -> list[dict[str, Any]]:
        out = []
        for meta in ctx.cache_dir.glob("entry-*/meta.json"):
            m = json.loads(meta.read_text())
            if m["version"] == version:
                m["dir"] = str(meta.parent)
                out.append(m)
        return sorted(out, key=lambda m: -float(m["created"]))

    def main(self, w: dict[str, str], ctx: UsesContext) -> bool:
        key, version = self._check(w)
        ctx.state["primary"] = key
        entries = self._entries(ctx, version)
        hit = next((e for e in entries if e["key"].lower() == key.lower()), None)
        if hit is None:
            for prefix in (x.strip() for x in w["restore-keys"].splitlines() if x.strip()):
                hit = next((e for e in entries if e["key"].lower().startswith(prefix.lower())),
                           None)
                if hit:
                    break
        if hit is None:
            if _bool_input(w, "fail-on-cache-miss"):
                ctx.log(f"Failed to restore cache entry. Input key: {key}")
                return False
            ctx.log(f"Cache not found for input keys: {key}")
            return True
        files = Path(hit["dir"]) / "files"
        for root in hit["roots"]:
            src = files / root.lstrip("/")
            if src.is_dir() and not src.is_symlink():
                shutil.copytree(src, root, symlinks=True, dirs_exist_ok=True)
            else:
                Path(root).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, root, follow_symlinks=False)
        ctx.state["matched"] = hit["key"]
        exact = hit["key"].lower() == key.lower()
        ctx.outputs["cache-hit"] = "true" if exact else "false"
        ctx.log(f"Cache restored from key: {hit['key']}")
        return True

    def post(self, w: dict[str, str], ctx: UsesContext) -> bool:
        key, version = self._check(w)
        if ctx.state.get("matched", "").lower() == key.lower():
            ctx.log(f"Cache hit occurred on the primary key {key}, not saving cache.")
            return True
        roots = resolve_paths(w["path"], ctx.workspace, ctx.home)
        if not roots:
            ctx.log("Warning: Path Validation Error: Path(s) specified in the action for "
                    "caching do(es) not exist, hence no cache is being saved.")
            return True
        if any(e["key"] == key for e in self._entries(ctx, version)):
            ctx.log(f"Warning: Failed to save: Unable to reserve cache with key {key}, "
                    "another job may be creating this cache.")
            return True
        entry = ctx.cache_dir / f"entry-{hashlib.sha256((key + version).encode()).hexdigest()[:24]}"
        tmp = entry.with_name(entry.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        for root in roots:
            dst = tmp / "files" / str(root).lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            if root.is_dir() and not root.is_symlink():
                shutil.copytree(root, dst, symlinks=True)
            else:
                shutil.copy2(root, dst, follow_symlinks=False)
        (tmp / "meta.json").write_text(json.dumps({
            "key": key, "version": version, "roots": [str(r) for r in roots],
            "created": time.time()}))
        tmp.rename(entry)
        ctx.log(f"Cache saved with key: {key}")
        return True


class UploadArtifact(StandIn):
    """actions/upload-artifact v4.6.2 (`action.yml`): the files named by `path` must
    exist (else `if-no-files-found` says warn, error or ignore); the name is checked as
    v4 checks it; one name once a job. The files are copied to
    `<cache dir>/artifacts/<name>/` for tests to read."""

    repo, version = "actions/upload-artifact", "v4.6.2"
    sha = "ea165f8d65b6e75b540449e92b4886f43607fa02"
    inputs = {"name": "artifact", "path": None, "if-no-files-found": "warn",
              "retention-days": "0", "compression-level": "6", "overwrite": "false",
              "include-hidden-files": "false"}
    required = ("path",)
    _BAD_NAME = re.compile(r'["\\:<>|*?\r\n/]')

    def main(self, w: dict[str, str], ctx: UsesContext) -> bool:
        name = w["name"]
        if not name or self._BAD_NAME.search(name):
            raise CompositeError(f"actions/upload-artifact: name {name!r} is not valid")
        mode = w["if-no-files-found"]
        if mode not in ("warn", "error", "ignore"):
            raise CompositeError(f"actions/upload-artifact: if-no-files-found {mode!r}")
        if not re.fullmatch(r"\d", w["compression-level"] or "6"):
            raise CompositeError("actions/upload-artifact: compression-level is 0-9")
        files = [p for p in resolve_paths(w["path"], ctx.workspace, ctx.home) if p.is_file()]
        if not files:
            msg = f"No files were found with the provided path: {w['path'].strip()}."
            ctx.log(("Error: " if mode == "error" else "Warning: ") + msg
                    if mode != "ignore" else msg)
            return mode != "error"
        dest = ctx.cache_dir / "artifacts" / name
        if dest.exists() and not _bool_input(w, "overwrite"):
            ctx.log(f"Error: an artifact named {name!r} exists already in this job")
            return False
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for f in files:
            shutil.copy2(f, dest / f.name)
        ctx.outputs.update({"artifact-id": str(len(list(dest.parent.iterdir()))),
                            "artifact-url": f"file://{dest}"})
        ctx.log(f"Artifact {name} has been successfully uploaded: {len(files)} files")
        return True


STAND_INS: dict[str, type[StandIn]] = {c.repo: c for c in (ActionsCache, UploadArtifact)}

_STEP_KEYS = {"name", "id", "if", "run", "shell", "env", "working-directory", "uses", "with",
              "continue-on-error"}
_SHELLS = {"bash": ["bash", "--noprofile", "--norc", "-eo", "pipefail"], "sh": ["sh", "-e"],
           "python": [sys.executable]}


# --- the runner -----------------------------------------------------------------------


def _load(action: Path) -> dict[str, Any]:
    path = action / "action.yml" if action.is_dir() else action
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        raise CompositeError(f"{path}: not a mapping")
    unknown = set(doc) - {"name", "description", "author", "inputs", "outputs", "runs",
                          "branding"}
    if unknown:
        raise CompositeError(f"{path}: unknown top-level keys {sorted(unknown)}")
    runs = doc.get("runs") or {}
    if runs.get("using") != "composite" or not isinstance(runs.get("steps"), list):
        raise CompositeError(f"{path}: runs.using must be composite, with steps")
    for i, step in enumerate(runs["steps"]):
        if not isinstance(step, dict):
            raise CompositeError(f"step {i + 1} is not a mapping")
        extra = set(step) - _STEP_KEYS
        if extra:
            raise CompositeError(f"step {i + 1}: keys a composite step cannot have: "
                                 f"{sorted(extra)}")
        if ("run" in step) == ("uses" in step):
            raise CompositeError(f"step {i + 1}: needs exactly one of run and uses")
        if "run" in step and "shell" not in step:
            raise CompositeError(f"step {i + 1}: a composite run step needs shell")
        if "uses" in step and ({"run", "shell", "working-directory"} & set(step)):
            raise CompositeError(f"step {i + 1}: a uses step takes with and env, not "
                                 "run, shell or working-directory")
    ids = [s["id"] for s in runs["steps"] if "id" in s]
    if len(ids) != len(set(ids)):
        raise CompositeError("two steps share an id")
    for name, o in (doc.get("outputs") or {}).items():
        if not isinstance(o, dict) or "value" not in o:
            raise CompositeError(f"output {name}: a composite output needs a value")
    doc["_path"] = str(path)
    return doc


def _str(v: Any, what: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float | str):
        return str(v)
    raise CompositeError(f"{what}: expected a string, got {type(v).__name__}")


def run_action(action: Path, inputs: Mapping[str, str], *, workspace: Path, runner_temp: Path,
               cache_dir: Path, env: Mapping[str, str] | None = None,
               os_env: Mapping[str, str] | None = None,
               github: Mapping[str, str] | None = None,
               runner_environment: str = "self-hosted", step_timeout: float = 1800,
               echo: Callable[[str], None] | None = None) -> ActionRun:
    """Run `action` (its folder or its action.yml) as one step of a job on a fresh
    runner whose temporary folder is `runner_temp` and whose cache service keeps its
    entries in `cache_dir`.

    `inputs` are the calling step's `with:`, `env` its `env:` (the `env` context),
    `os_env` the runner machine's environment (default this process's, less
    GITHUB_*/RUNNER_*/INPUT_*), `runner_environment` GitHub's `self-hosted` or
    `github-hosted`: the second lets the Action change the machine as it does a
    runner that is the job's own (a udev rule opening /dev/kvm to every user), so
    give it only on such a machine. Raises
    `CompositeError` for a mistake in the file; a step that fails is a result (`ok`
    False), not an error."""
    doc = _load(action)
    action_dir = Path(doc["_path"]).parent
    declared = doc.get("inputs") or {}
    unknown = set(inputs) - set(declared)
    if unknown:
        raise CompositeError(f"inputs the action does not declare: {sorted(unknown)}")
    ins: dict[str, str] = {}
    for name, spec in declared.items():
        spec = spec or {}
        if name in inputs:
            ins[name] = inputs[name]
        elif "default" in spec:
            ins[name] = _str(spec["default"], f"input {name}'s default")
        elif spec.get("required"):
            raise CompositeError(f"input {name} is required and has no default")
        else:
            ins[name] = ""
    runner_temp.mkdir(parents=True, exist_ok=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    base_os = dict(os_env if os_env is not None else {
        k: v for k, v in os.environ.items()
        if not k.startswith(("GITHUB_", "RUNNER_", "INPUT_", "ACTIONS_"))})
    home = base_os.get("HOME", str(Path.home()))
    gh = Strict("the github context", {
        "action_path": str(action_dir), "action_ref": "", "action_repository": "",
        "workspace": str(workspace), "repository": "owner/repo", "repository_owner": "owner",
        "ref": "refs/heads/main", "sha": "0" * 40, "event_name": "workflow_dispatch",
        "run_id": "1", "run_number": "1", "run_attempt": "1", "job": "job",
        "server_url": "https://github.com", "actor": "someone", "token": "",
        **(github or {})})
    runner = Strict("the runner context", {
        "os": "Linux", "arch": "X64", "temp": str(runner_temp), "name": "runner",
        "tool_cache": str(runner_temp / "_tool"), "environment": runner_environment,
        "debug": ""})
    job_env: dict[str, str] = dict(env or {})
    set_env: dict[str, str] = {}
    prepend: list[str] = []
    masks: list[str] = []
    annotations: list[tuple[str, str]] = []
    log_lines: list[str] = []
    summaries: list[str] = []
    steps_ctx: dict[str, Any] = Strict("the steps context (steps run so far, by id)", {})
    runs: list[StepRun] = []
    posts: list[tuple[StandIn, dict[str, str], UsesContext, StepRun]] = []
    failed = [False]
    t_start = time.monotonic()
    files_dir = runner_temp / "_runner_file_commands"
    files_dir.mkdir(parents=True, exist_ok=True)

    def functions(status_failed: bool) -> dict[str, Callable[[], bool]]:
        return {"success": lambda: not status_failed, "failure": lambda: status_failed,
                "always": lambda: True, "cancelled": lambda: False}

    def contexts(step_env: Mapping[str, str] | None = None) -> dict[str, Any]:
        return {"github": gh, "inputs": Strict("the action's inputs", ins),
                "steps": steps_ctx, "runner": runner,
                "env": Lenient({**job_env, **set_env, **(step_env or {})}),
                "job": Strict("the job context", {
                    "status": "failure" if failed[0] else "success"})}

    def sub(v: Any, what: str, step_env: Mapping[str, str] | None = None) -> str:
        try:
            return substitute(_str(v, what), contexts(step_env), functions(failed[0]))
        except ExpressionError as exc:
            raise CompositeError(f"{what}: {exc}") from None

    def say(line: str) -> None:
        for m in masks:
            line = line.replace(m, "***")
        log_lines.append(line)
        if echo:
            echo(line)

    def commands(text: str) -> None:
        for line in text.splitlines():
            m = _COMMAND.match(line)
            if not m:
                continue
            kind, data = m.group(1), _unescape(m.group(2))
            if kind == "add-mask" and data:
                masks.append(data)
            elif kind in ("error", "warning", "notice"):
                annotations.append((kind, data))

    for index, step in enumerate(doc["runs"]["steps"], 1):
        sid = step.get("id")
        kind = "uses" if "uses" in step else "run"
        default_name = f"Run {step['uses']}" if kind == "uses" else str(step["run"]).split(
            "\n")[0][:60]
        name = sub(step.get("name", default_name), f"step {index}'s name")
        rec = StepRun(index, name, sid, kind)
        runs.append(rec)
        try:
            go = condition(step.get("if", "success()"), contexts(), functions(failed[0]))
        except ExpressionError as exc:
            raise CompositeError(f"step {index} ({name}): if: {exc}") from None
        if not go:
            say(f"--- skipped: {name}")
            if sid:
                steps_ctx[sid] = Strict(f"step {sid}", {
                    "outputs": Lenient(), "outcome": "skipped", "conclusion": "skipped"})
            continue
        say(f"--- {name}")
        step_env = {k: sub(v, f"step {index}'s env.{k}")
                    for k, v in (step.get("env") or {}).items()}
        paths = {n: files_dir / f"{n.lower()}_{index}" for n in
                 ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY",
                  "GITHUB_STATE")}
        for p in paths.values():
            p.write_text("")
        t0 = time.monotonic()
        ok = True
        outputs: dict[str, str] = {}
        if kind == "run":
            shell = sub(step["shell"], f"step {index}'s shell")
            if shell not in _SHELLS:
                raise CompositeError(f"step {index}: shell {shell!r} is not modelled "
                                     f"({', '.join(_SHELLS)})")
            script = files_dir / f"step_{index}.{'py' if shell == 'python' else 'sh'}"
            script.write_text(sub(step["run"], f"step {index}'s run", step_env))
            cwd = Path(sub(step.get("working-directory", str(workspace)),
                           f"step {index}'s working-directory"))
            proc_env = {**base_os, **job_env, **set_env, **step_env,
                        "PATH": os.pathsep.join([*prepend, base_os.get("PATH", "")]),
                        "CI": "true", "GITHUB_ACTIONS": "true",
                        "GITHUB_WORKSPACE": str(workspace), "GITHUB_ACTION_PATH": str(action_dir),
                        "RUNNER_TEMP": str(runner_temp), "RUNNER_OS": "Linux",
                        "RUNNER_ARCH": "X64", "RUNNER_TOOL_CACHE": str(runner_temp / "_tool"),
                        "RUNNER_ENVIRONMENT": runner_environment,
                        **{k: str(p) for k, p in paths.items()}}
            try:
                proc = subprocess.run([*_SHELLS[shell], str(script)], cwd=cwd, env=proc_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, timeout=step_timeout)
                out, code = proc.stdout.decode(errors="replace"), proc.returncode
            except subprocess.TimeoutExpired as exc:
                out = (exc.stdout or b"").decode(errors="replace") if isinstance(
                    exc.stdout, bytes) else ""
                out += f"\nthe step ran past {step_timeout} s and was stopped"
                code = -1
            ok = code == 0
            commands(out)
            for line in out.splitlines():
                say(line)
            if not ok:
                say(f"Error: Process completed with exit code {code}.")
            where = f"step {index} ({name})"
            outputs = dict(parse_file_command(paths["GITHUB_OUTPUT"].read_text(),
                                              f"{where}: GITHUB_OUTPUT"))
            for k, v in parse_file_command(paths["GITHUB_ENV"].read_text(),
                                           f"{where}: GITHUB_ENV"):
                if k.upper() == "NODE_OPTIONS":
                    raise CompositeError(f"{where}: GITHUB_ENV may not set NODE_OPTIONS")
                set_env[k] = v
            for line in paths["GITHUB_PATH"].read_text().splitlines():
                if line.strip():
                    if line in prepend:
                        prepend.remove(line)
                    prepend.insert(0, line)
            summary = paths["GITHUB_STEP_SUMMARY"].read_text()
            if summary:
                summaries.append(summary)
        else:
            ref = str(step["uses"])
            repo, _, sha = ref.partition("@")
            cls = STAND_INS.get(repo)
            if cls is None:
                raise CompositeError(f"step {index}: uses {ref}: no stand-in models this "
                                     f"action ({', '.join(STAND_INS)})")
            if sha != cls.sha:
                raise CompositeError(f"step {index}: uses {ref}: the stand-in models "
                                     f"{cls.repo} {cls.version} at {cls.sha}; pin that "
                                     "commit, or model the new one")
            given = {k: sub(v, f"step {index}'s with.{k}", step_env)
                     for k, v in (step.get("with") or {}).items()}
            extra = set(given) - set(cls.inputs)
            if extra:
                raise CompositeError(f"step {index}: {cls.repo} {cls.version} has no input "
                                     f"{sorted(extra)}")
            missing = [k for k in cls.required if not given.get(k, "").strip()]
            if missing:
                raise CompositeError(f"step {index}: {cls.repo} needs {missing}")
            w = {k: given.get(k, d if d is not None else "") for k, d in cls.inputs.items()}
            ctx = UsesContext(workspace, home, cache_dir, say, {}, outputs)
            stand_in = cls()
            ok = stand_in.main(w, ctx)
            if cls.post_if is not None:
                posts.append((stand_in, w, ctx, StepRun(index, f"Post {name}", sid, "post")))
        rec.seconds = time.monotonic() - t0
        rec.outputs = outputs
        rec.outcome = "success" if ok else "failure"
        coe = step.get("continue-on-error", False)
        if not isinstance(coe, bool):
            text = sub(coe, f"step {index}'s continue-on-error").strip().lower()
            if text not in ("true", "false"):
                raise CompositeError(f"step {index}: continue-on-error is {text!r}, not a "
                                     "boolean")
            coe = text == "true"
        rec.conclusion = "success" if ok or coe else "failure"
        if rec.conclusion == "failure":
            failed[0] = True
        if sid:
            steps_ctx[sid] = Strict(f"step {sid}", {
                "outputs": Lenient(outputs), "outcome": rec.outcome,
                "conclusion": rec.conclusion})

    outs = {name: sub(o["value"], f"output {name}") for name, o in
            (doc.get("outputs") or {}).items()}
    done: list[StepRun] = []
    for stand_in, w, ctx, rec in reversed(posts):
        done.append(rec)
        if not condition(stand_in.post_if or "success()", contexts(), functions(failed[0])):
            say(f"--- skipped: {rec.name}")
            continue
        say(f"--- {rec.name}")
        t0 = time.monotonic()
        ok = stand_in.post(w, ctx)
        rec.seconds = time.monotonic() - t0
        rec.outcome = rec.conclusion = "success" if ok else "failure"
    return ActionRun(ok=not failed[0], outputs=outs, summary="".join(summaries), steps=runs,
                     posts=done, log="\n".join(log_lines), annotations=annotations,
                     env=dict(set_env), path=list(prepend), seconds=time.monotonic() - t_start)
