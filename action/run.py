"""The GitHub Action's logic, run as a plain script with GitHub's conventions.

Reads `INPUT_*` (set by `action.yml`), works under `RUNNER_TEMP`, writes its
outputs to `GITHUB_OUTPUT` and a summary to `GITHUB_STEP_SUMMARY`, and uses
`GITHUB_WORKSPACE` as the default checkout. CI runs this very script (GitHub
itself cannot run in CI), so what is tested is what the Action runs.

It starts a signer and the daemon (unless one answers already), runs
`tkbox agent ... --json`, and stops what it started. The patch, the bundle and
the trust file are outputs; the step fails (non-zero exit, an `::error::`
line) when the agent or a door fails, after the bundle is exported. With the
`apply` input (the default), the patch goes through the changes door into the
workspace (`tkbox agent --apply`): `applied-patch` is what the door wrote, and
each held-back file is a `::warning::` and a line of the summary.

Operator settings (the runner's, never the box's), for mirrors and tests:
`TKBOX_DAEMON_ARGS` holds extra `tkbox daemon` flags, e.g. `--egress-hosts F
--egress-permit CIDR --ca-cert PEM`.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

TKBOX = [sys.executable, "-m", "tkbox.cli"]


def command_data(text: str) -> str:
    """`text` as a workflow command's message: one line, GitHub's escapes."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def fail(message: str, code: int = 1) -> None:
    # One line; GitHub turns it into an annotation.
    print(f"::error title=tkbox::{command_data(message)}", flush=True)
    sys.exit(code)


def code_span(text: str) -> str:
    """Text the box had a say in (a file name, an error quoting its patch) as inline
    code in the summary (Markdown): no backtick, no control character, bounded, so it
    cannot end the span or the line, and renders as text, never as a link or image."""
    clean = "".join(c if c.isprintable() and c != "`" else "?" for c in text[:300])
    return f"`{clean}`" + ("…" if len(text) > 300 else "")


def inputs() -> dict[str, str]:
    return {k[len("INPUT_"):].lower(): v for k, v in os.environ.items()
            if k.startswith("INPUT_")}


def split_list(text: str) -> list[str]:
    return [x.strip() for line in text.splitlines() for x in line.split(",") if x.strip()]


def output(**values: str) -> None:
    path = os.environ.get("GITHUB_OUTPUT")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        for k, v in values.items():
            if "\n" in v:
                f.write(f"{k}<<TKBOX_EOF\n{v}\nTKBOX_EOF\n")
            else:
                f.write(f"{k}={v}\n")


def summary(text: str) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text + "\n")


class Services:
    """The signer and the daemon this script started (and only those)."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []

    def tk(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*TKBOX, *args], env=self.env, capture_output=True, text=True,
                              check=check)

    def start(self, name: str, *args: str, sock: Path) -> None:
        with open(self.home / f"{name}.log", "ab") as log:
            p = subprocess.Popen([*TKBOX, *args], env=self.env, stdout=log, stderr=log,
                                 start_new_session=True)
        self.procs.append(p)
        deadline = time.monotonic() + 120
        while not sock.exists():
            if p.poll() is not None or time.monotonic() > deadline:
                tail = (self.home / f"{name}.log").read_text(errors="replace")[-600:]
                last = tail.strip().splitlines()[-1:] or ["no output"]
                fail(f"the tkbox {name} did not start: {last[0]}")
            time.sleep(0.2)

    def up(self, daemon_args: list[str]) -> None:
        run = self.home / "run"
        if self.tk("ls").returncode == 0:
            return  # a daemon answers already (a self-hosted runner's, or a test's)
        if not (self.home / "signer" / "key").exists():
            self.tk("signer", "init", "--dev")
        if not (run / "signer.sock").exists():
            self.start("signer", "signer", "serve", sock=run / "signer.sock")
        self.start("daemon", "daemon", *daemon_args, sock=run / "daemon.sock")
        deadline = time.monotonic() + 60
        while self.tk("ls").returncode != 0:
            if time.monotonic() > deadline:
                fail("the tkbox daemon does not answer; see its log in RUNNER_TEMP")
            time.sleep(0.3)

    def down(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(120)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


def main() -> None:
    i = inputs()
    temp = Path(os.environ.get("RUNNER_TEMP") or "/tmp")
    workspace = i.get("workspace") or os.environ.get("GITHUB_WORKSPACE") or "."
    prompt = i.get("prompt", "")
    if not prompt.strip():
        fail("the prompt input is empty: give the agent its task (with: prompt: ...)", 2)
    env = dict(os.environ)
    env.setdefault("TKBOX_HOME", str(temp / "tkbox"))
    home = Path(env["TKBOX_HOME"])
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    out_dir = temp / "tkbox-out"
    out_dir.mkdir(parents=True, exist_ok=True)
    agent = i.get("agent") or "claude-code"
    argv = [*TKBOX, "agent", agent, "--prompt", prompt, "--workspace", workspace,
            "--output-dir", str(out_dir), "--timeout", i.get("timeout") or "1800",
            "--memory", i.get("memory") or "2048", "--json"]
    if i.get("agent_command"):
        argv += ["--agent-command", i["agent_command"]]
    if i.get("image"):
        argv += ["--image", i["image"]]
    if i.get("model_host"):
        argv += ["--model-host", i["model_host"]]
    if (i.get("apply") or "true").strip().lower() not in ("false", "0", "no"):
        argv += ["--apply"]
    for a in split_list(i.get("allow", "")):
        argv += ["--allow", a]
    for s in (x.strip() for x in i.get("secrets", "").splitlines()):
        if s:
            argv += ["--secret", s]

    services = Services(home, env)
    try:
        services.up(shlex.split(env.get("TKBOX_DAEMON_ARGS", "")))
        if agent not in ("claude-code", "codex", "gemini") and not i.get("image") and \
                services.tk("image", "inspect", "tkbox/default").returncode != 0:
            print("tkbox: building tkbox/default (once)", flush=True)
            if services.tk("image", "build").returncode != 0:
                fail("could not build the tkbox/default image (mmdebstrap); see the log")
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=None, text=True)
    finally:
        services.down()
    try:
        outcome = json.loads(proc.stdout) if proc.stdout.strip() else None
    except ValueError:
        outcome = None
    if isinstance(outcome, dict):
        held = [h for h in outcome.get("held_back") or [] if isinstance(h, dict)]
        applied = outcome.get("applied")
        output(patch=str(outcome.get("patch") or ""), bundle=str(outcome.get("bundle") or ""),
               trust=str(outcome.get("trust") or ""), status=str(outcome.get("status")),
               box=str(outcome.get("box") or ""),
               **{"applied-patch": str(outcome.get("applied_patch") or ""),
                  "held-back": str((applied or {}).get("held back", 0)),
                  "set-apart": str(int(outcome.get("set_apart_count") or 0))})
        lines = [f"- **held back**: {code_span(str(h.get('path')))}: "
                 f"{code_span(str(h.get('reason')))}" if h.get("path")
                 else f"- **held back**: {code_span(str(h.get('reason')))}" for h in held]
        for h in held:
            print(f"::warning title=tkbox held back::{command_data(str(h.get('path')))}: "
                  f"{command_data(str(h.get('reason')))}", flush=True)
        apart = [a for a in outcome.get("set_apart") or [] if isinstance(a, dict)]
        lines += [f"- **set apart** (not in the patch): {code_span(str(a.get('path')))}, "
                  f"{int(a.get('size') or 0)} bytes, sha256 "
                  f"{code_span(str(a.get('sha256') or 'not hashed')[:16])}: "
                  f"{code_span(str(a.get('why')))}" for a in apart]
        more = int(outcome.get("set_apart_count") or 0) - len(apart)
        if more > 0:
            lines.append(f"- **set apart**: {more} more (`tkbox inspect` in the job lists "
                         "the first 1000)")
        for a in apart:
            if a.get("why") != "ignored":
                print(f"::warning title=tkbox set apart::{command_data(str(a.get('path')))} "
                      f"is not in the patch: {command_data(str(a.get('why')))}", flush=True)
        if outcome.get("patch_partial"):
            lines.append("- **partial patch**: only the files that arrived whole were kept")
        counts = ", ".join(f"{v} {k}" for k, v in (applied or {}).items())
        did = "" if not isinstance(applied, dict) else (
            f"- applied to the workspace: {counts or 'nothing to apply'}"
            f" (`{outcome.get('applied_patch')}`)\n")
        summary(f"### tkbox: {agent} in box `{outcome.get('box')}`\n\n"
                f"- exit status: `{outcome.get('status')}`\n"
                f"- patch: `{outcome.get('patch')}` ({outcome.get('patch_bytes')} bytes)\n"
                + did + "".join(f"{line}\n" for line in lines) +
                f"- bundle: `{outcome.get('bundle')}` (verify: `tkbox verify BUNDLE "
                f"--trust TRUST`)\n" + (f"- **failed**: {code_span(str(outcome['error']))}\n"
                                        if outcome.get("error") else ""))
        if outcome.get("error"):
            fail(f"{outcome['error']}; the bundle is {outcome.get('bundle')}", proc.returncode or 1)
    if proc.returncode != 0:
        fail("tkbox agent failed before the box started (see the line above)", proc.returncode)


if __name__ == "__main__":
    main()
