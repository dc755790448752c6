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

With the `signer-url` input (and `signer-ca`, `signer-trust`), no signer runs
on the runner: the daemon records into the operator's remote signer, proving
the job by its GitHub id-token (`--signer-token github:AUDIENCE`), and the
bundle is verified against the operator's trust file, pinned in the
repository (`signer-trust`), which becomes the `trust` output; a bundle that
does not verify against it fails the step.

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


def split_allow(text: str) -> list[str]:
    """`allow` entries: comma or newline separated, but a line holding rules (a host,
    a space, then rules) is one entry whatever it holds."""
    out: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and not words[0].endswith(","):  # HOST METHOD... /path
            out.append(line.strip())
        else:
            out.extend(x.strip() for x in line.split(",") if x.strip())
    return out


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


#: the caches the Action restores (action.yml), by the name in TKBOX_CACHE_<NAME>
CACHES = (("venv", "tkbox's Python environment"), ("guest", "guest build"),
          ("templates", "booted templates"), ("images", "pulled images"),
          ("tools", "agent tool disks"))
MAX_PHASES = 24


def cache_states() -> list[tuple[str, str, str]]:
    """(what, state, key) per cache, from the restore steps' `cache-hit` outputs; empty
    when this script runs without the Action's cache steps."""
    if not any(f"TKBOX_CACHE_{n.upper()}_KEY" in os.environ for n, _ in CACHES):
        return []
    out = []
    for name, what in CACHES:
        key = os.environ.get(f"TKBOX_CACHE_{name.upper()}_KEY", "")
        hit = os.environ.get(f"TKBOX_CACHE_{name.upper()}", "")
        state = ("not used" if not key else "hit" if hit == "true" else
                 "restored from an older key" if hit == "false" else
                 "miss: filled by this run, saved when the job succeeds")
        out.append((what, state, key))
    return out


def cache_lines() -> list[str]:
    return [f"tkbox: cache {what}: {state}" + (f" ({key})" if key else "")
            for what, state, key in cache_states()]


def cache_table() -> str:
    rows = cache_states()
    if not rows:
        return ""
    return ("#### Caches\n\n| cache | | key |\n| --- | --- | --- |\n" +
            "".join(f"| {what} | {state} | {code_span(key) if key else ''} |\n"
                    for what, state, key in rows))


def read_marks() -> dict[str, float]:
    """`NAME EPOCH` lines the Action's steps wrote; the last of each name."""
    path = os.environ.get("TKBOX_ACTION_MARKS")
    marks: dict[str, float] = {}
    if not path or not os.path.isfile(path):
        return marks
    with open(path, encoding="ascii", errors="replace") as f:
        for line in f.read(1 << 16).splitlines():
            parts = line.split()
            if len(parts) == 2:
                try:
                    marks[parts[0]] = float(parts[1])
                except ValueError:
                    continue
    return marks


def phase_name(name: object) -> str:
    """A phase's name as a table cell: printable, no `|` or backtick, bounded."""
    text = "".join(c if c.isprintable() and c not in "|`" else "?" for c in str(name)[:40])
    return text or "?"


def timing_rows(phases: object, agent_seconds: float) -> list[tuple[str, float | None]]:
    """Where the time went: what the Action measured (install, the cache restores, the
    guest build) from its marks, then `tkbox agent`'s own phases (its JSON `phases`,
    seconds by name, in its order), then the total. None: did not run."""
    m = read_marks()
    rows: list[tuple[str, float | None]] = []

    def span(a: str, b: str) -> float | None:
        return m[b] - m[a] if a in m and b in m and m[b] >= m[a] else None

    if m:
        rows.append(("install", span("prepared", "install-end")))
        rows.append(("cache restore", span("keyed", "guest-start")))
        rows.append(("guest", span("guest-start", "guest-end")))
    given = [(phase_name(k), float(v)) for k, v in list(
        phases.items() if isinstance(phases, dict) else [])[:MAX_PHASES]
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 1e7]
    rows += given
    # "box: image" and the like are parts of "box": counted once
    rest = agent_seconds - sum(v for k, v in given if ": " not in k)
    rows.append(("tkbox agent, other" if given else "tkbox agent", max(rest, 0.0)))
    if "start" in m:
        rows.append(("total", time.time() - m["start"]))
    return rows


def timing_table(phases: object, agent_seconds: float) -> str:
    rows = timing_rows(phases, agent_seconds)
    print("tkbox: time: " + ", ".join(
        f"{k} {'skipped' if v is None else f'{v:.1f} s'}" for k, v in rows), flush=True)
    return ("#### Where the time went\n\n| phase | seconds |\n| --- | ---: |\n" +
            "".join(f"| {k} | {'skipped' if v is None else f'{v:.1f}'} |\n" for k, v in rows))


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

    def up(self, daemon_args: list[str], remote: bool = False) -> None:
        run = self.home / "run"
        if self.tk("ls").returncode == 0:
            return  # a daemon answers already (a self-hosted runner's, or a test's)
        if not remote and not (self.home / "signer" / "key").exists():
            self.tk("signer", "init", "--dev")
        if not remote and not (run / "signer.sock").exists():
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


def remote_signer(i: dict[str, str]) -> list[str]:
    """`tkbox daemon` flags for the `signer-url` input, or [] without it."""
    url = i.get("signer_url", "").strip()
    if not url:
        return []
    if not url.startswith("https://"):
        fail(f"signer-url {url!r}: a remote signer is https://HOST:PORT", 2)
    for name in ("signer_ca", "signer_trust"):
        if not i.get(name) or not Path(i[name]).is_file():
            fail(f"{name.replace('_', '-')}: with signer-url, give the path of the operator's "
                 f"{'CA certificate' if name == 'signer_ca' else 'trust file'} in the "
                 "repository", 2)
    if not os.environ.get("ACTIONS_ID_TOKEN_REQUEST_URL"):
        fail("signer-url needs the job's id-token: add `permissions: id-token: write` to "
             "the job", 2)
    return ["--signer", url, "--signer-ca", i["signer_ca"],
            "--signer-token", f"github:{i.get('signer_audience') or 'tkbox-signer'}"]


def check_remote_bundle(env: dict[str, str], bundle: str, trust: str) -> list[str]:
    """The bundle against the operator's pinned trust file: its lines, or the step fails."""
    r = subprocess.run([*TKBOX, "verify", bundle, "--trust", trust], env=env,
                       capture_output=True, text=True)
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    if r.returncode != 0:
        fail(f"the bundle does not verify against the operator's trust file {trust}: "
             + " ".join(lines[1:2] or [r.stderr.strip()[-300:]]), r.returncode or 1)
    return [x for x in lines if x.startswith(("Integrity", "isolation", "Workload",
                                              "Assurance"))]


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
    for a in split_allow(i.get("allow", "")):
        argv += ["--allow", a]
    for s in (x.strip() for x in i.get("secrets", "").splitlines()):
        if s:
            argv += ["--secret", s]

    for line in cache_lines():
        print(line, flush=True)
    remote = remote_signer(i)
    services = Services(home, env)
    try:
        services.up([*remote, *shlex.split(env.get("TKBOX_DAEMON_ARGS", ""))], bool(remote))
        started = time.time()
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=None, text=True)
        agent_seconds = time.time() - started
    finally:
        services.down()
    try:
        outcome = json.loads(proc.stdout) if proc.stdout.strip() else None
    except ValueError:
        outcome = None
    if isinstance(outcome, dict) and remote and outcome.get("bundle"):
        outcome["trust"] = i["signer_trust"]  # the operator's, pinned: not the job's
        verified = check_remote_bundle(env, str(outcome["bundle"]), i["signer_trust"])
        summary(f"### tkbox: remote signer `{i['signer_url']}`\n\n" + "".join(
            f"- {code_span(line)}\n" for line in verified))
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
        timings = timing_table(outcome.get("phases"), agent_seconds)
        summary(f"### tkbox: {agent} in box `{outcome.get('box')}`\n\n"
                f"- exit status: `{outcome.get('status')}`\n"
                f"- patch: `{outcome.get('patch')}` ({outcome.get('patch_bytes')} bytes)\n"
                + did + "".join(f"{line}\n" for line in lines) +
                f"- bundle: `{outcome.get('bundle')}` (verify: `tkbox verify BUNDLE "
                f"--trust TRUST`)\n" + (f"- **failed**: {code_span(str(outcome['error']))}\n"
                                        if outcome.get("error") else "")
                + "\n" + timings + "\n" + cache_table())
        if outcome.get("error"):
            fail(f"{outcome['error']}; the bundle is {outcome.get('bundle')}", proc.returncode or 1)
    else:
        summary(f"### tkbox: {agent}: no box ran\n\n"
                + timing_table(None, agent_seconds) + "\n" + cache_table())
    if proc.returncode != 0:
        fail("tkbox agent failed before the box started (see the line above)", proc.returncode)


if __name__ == "__main__":
    main()
