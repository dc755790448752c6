"""`action/action.yml` itself, run step by step as GitHub's runner runs a composite
action (`action/testing/composite.py`), so a mistake in the YAML fails CI, not the
first user.

The heavy part is the real daemon API with fake VMs (`sdk_daemon`, as the Action's
script tests use); everything else is the Action's own: `steps.py` decides the guest
kernel and the cache keys on this machine, `install.sh` finds every package present
(a self-hosted runner: it leaves /dev/kvm alone), the guest is built for real by
`tkbox guest build`, and the caches go through a local stand-in of actions/cache
pinned at the commit the Action pins.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from action.testing.composite import ActionRun, CompositeError, run_action
from sdk_daemon import SdkDaemon, checkout

ROOT = Path(__file__).resolve().parents[3]
ACTION = ROOT / "action"


def machine_env(daemon: SdkDaemon) -> dict[str, str]:
    """The runner machine's environment: this tkbox (TKBOX_PYTHON, as a self-hosted
    runner that has it installed), and where its daemon listens."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TKBOX_", "GITHUB_", "RUNNER_", "INPUT_"))}
    env.update({"TKBOX_PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src"),
                "TKBOX_RUNTIME": str(daemon.socket.parent)})
    return env


def run_once(tmp: Path, cache: Path, name: str, action: Path = ACTION,
             **inputs: str) -> tuple[ActionRun, Path, Path]:
    """One job on a fresh runner: the same RUNNER_TEMP path as every run (GitHub's
    hosted runners have one; actions/cache keys its entries by their paths), emptied
    first; a fresh daemon and checkout of its own."""
    runner_temp = tmp / "runner-temp"
    shutil.rmtree(runner_temp, ignore_errors=True)
    job = tmp / name
    job.mkdir()
    daemon = SdkDaemon(job).start()
    try:
        ws = checkout(job)
        given = {"agent": "command", "agent-command": "my-agent --fix", "image": "oci:/x",
                 "prompt": "Make the failing test pass.", **inputs}
        result = run_action(action, given, workspace=ws, runner_temp=runner_temp,
                            cache_dir=cache, os_env=machine_env(daemon),
                            env={"ANTHROPIC_API_KEY": "sk-not-used-by-the-command-agent"},
                            runner_environment="self-hosted", step_timeout=600)
    finally:
        daemon.stop()
    return result, ws, runner_temp


def summary_rows(run: ActionRun, heading: str) -> dict[str, str]:
    """A summary table's rows after `heading`: first cell -> second cell."""
    part = run.summary.split(heading, 1)[1].split("\n\n", 2)[1]
    rows = [line.strip("|").split("|") for line in part.splitlines()[2:]
            if line.startswith("|")]
    return {r[0].strip(): r[1].strip() for r in rows}


def test_the_action_runs_as_github_runs_it_and_the_second_run_starts_warm(tmp_path: Path):
    cache = tmp_path / "cache"
    first, ws, temp = run_once(tmp_path, cache, "first")
    assert first.ok, first.log[-4000:]
    out = first.outputs
    assert Path(out["bundle"]).is_file() and Path(out["trust"]).is_file()
    assert Path(out["patch"]).read_text().startswith("diff --git a/hello.txt")
    assert out["status"] == "0" and out["box"].startswith("agent-") and out["held-back"] == "0"
    assert (ws / "hello.txt").read_text() == "hello\n", "applied through the changes door"
    # every step ran but the venv cache (TKBOX_PYTHON names tkbox's Python) and the
    # tool disks' (the command agent has none)
    assert [(s.id or s.name.split(" (")[0], s.outcome) for s in first.steps] == [
        ("prepare", "success"), ("venv-cache", "skipped"),
        ("Install what is missing", "success"), ("keys", "success"),
        ("guest-cache", "success"), ("templates-cache", "success"),
        ("images-cache", "success"), ("tools-cache", "skipped"),
        ("Build the guest", "success"), ("run", "success"),
        ("Keep the patch, the bundle and the trust file", "success")]
    assert first.step("prepare").outputs["kernel-package"] == "", \
        "this machine has a kernel that boots the guest: none to install"
    assert "tkbox: every system package is present" in first.log
    assert "self-hosted runner, left as it is" in first.log or "cannot open /dev/kvm" in \
        first.log
    assert first.env["TKBOX_KERNEL"] == first.step("keys").outputs["kernel"]
    # the artifact holds the four files, as upload-artifact was given them
    art = cache / "artifacts" / f"tkbox-{out['box']}"
    assert sorted(p.name for p in art.iterdir()) == sorted(
        Path(out[k]).name for k in ("patch", "applied-patch", "bundle", "trust"))
    # the log and the summary say each cache missed, and where the time went
    assert "tkbox: cache guest build: miss" in first.log
    caches = summary_rows(first, "#### Caches")
    assert caches["guest build"].startswith("miss")
    assert caches["tkbox's Python environment"] == "not used"
    assert caches["agent tool disks"] == "not used", "the command agent has no tool disk"
    times = summary_rows(first, "#### Where the time went")
    assert list(times)[:3] == ["install", "cache restore", "guest"]
    assert all(v == "skipped" or float(v) >= 0 for v in times.values())
    assert "total" in times
    # at the end of the job, the guest build was saved under its key
    guest_key = first.step("keys").outputs["guest-key"]
    assert f"Cache saved with key: {guest_key}" in first.log
    built = sorted((temp / "tkbox" / "guest").glob("initramfs-*.cpio"))
    assert len(built) == 1
    built_mtime = built[0].stat().st_mtime_ns

    second, _, temp = run_once(tmp_path, cache, "second")
    assert second.ok, second.log[-4000:]
    assert second.step("guest-cache").outputs == {"cache-hit": "true"}
    assert "tkbox: cache guest build: hit" in second.log
    assert summary_rows(second, "#### Caches")["guest build"] == "hit"
    assert f"Cache hit occurred on the primary key {guest_key}, not saving cache." in \
        second.log
    # warm: the guest the first run built is the one this run used, not rebuilt
    again = sorted((temp / "tkbox" / "guest").glob("initramfs-*.cpio"))
    assert [p.name for p in again] == [p.name for p in built]
    assert again[0].stat().st_mtime_ns == built_mtime
    # each step's time, the post steps (last first) at the end, as the job's log shows them
    names = [n for n, _ in second.timings()]
    assert names[-3:] == ["Post Restore pulled images (cache)",
                          "Post Restore the booted templates (cache)",
                          "Post Restore the guest build (cache)"]
    assert "Run the agent in a box" in names and "Restore tkbox's Python environment " \
        "(cache)" not in names, "a skipped step has no time"
    guest = (first.step("Build the guest").seconds, second.step("Build the guest").seconds)
    print(f"\nguest step: cold {guest[0]:.2f} s, warm {guest[1]:.2f} s; whole action: "
          f"cold {first.seconds:.2f} s, warm {second.seconds:.2f} s")


def test_a_failed_agent_fails_the_action_keeps_the_bundle_and_saves_no_cache(tmp_path: Path):
    """The run step fails: what follows is skipped but the artifact upload (`always()`),
    and the caches' post steps (`post-if: success()`) save nothing."""
    cache = tmp_path / "cache"
    run, ws, _ = run_once(tmp_path, cache, "job", **{"agent-command": "my-agent tkbox-test-fail"})
    assert not run.ok
    assert run.step("run").outcome == "failure"
    assert ("error", "the agent exited with status 7; the bundle is "
            f"{run.outputs['bundle']}") in run.annotations
    assert Path(run.outputs["bundle"]).is_file()
    assert (cache / "artifacts" / f"tkbox-{run.outputs['box']}").is_dir()
    assert all(p.outcome == "skipped" for p in run.posts)
    assert not list(cache.glob("entry-*")), "a failed job saves no cache"
    assert not (ws / "hello.txt").exists()


MISTAKES = [
    # (what is changed in action.yml, to what, what the runner says)
    ("INPUT_AGENT_COMMAND: ${{ inputs.agent-command }}",
     "INPUT_AGENT_COMMAND: ${{ inputs.agent_command }}", "has no 'agent_command'"),
    ("if: inputs.install == 'true'", "if: ${{ inputs.install }} == 'true'",
     "mixes text and ${{ }}"),
    ("key: ${{ steps.keys.outputs.guest-key }}",
     "keys: ${{ steps.keys.outputs.guest-key }}", "has no input ['keys']"),
    ("actions/cache@0057852bfaa89a56745cba8c7296529d2fc39830 # v4.3.0\n      with:\n"
     "        path: ${{ steps.keys.outputs.home }}/images",
     "actions/cache@v4\n      with:\n        path: ${{ steps.keys.outputs.home }}/images",
     "pin that commit"),
    ("TKBOX_HOME: ${{ steps.keys.outputs.home }}\n        MARKS",
     "TKBOX_HOME: ${{ steps.key.outputs.home }}\n        MARKS", "has no 'key'"),
    ("      run: bash \"$ACTION_PATH/install.sh\"", "      run: bash \"$ACTION_PATH/install.sh\"\n"
     "      timeout-minutes: 5", "keys a composite step cannot have"),
    ("if: always() && steps.run.outputs.bundle != ''",
     "if: always() && contains(steps.run.outputs.bundle, '.tkb')", "contains() is not"),
]


@pytest.mark.parametrize(("old", "new", "said"), MISTAKES,
                         ids=["undeclared-input", "if-text", "cache-input", "unpinned",
                              "unknown-step", "step-key", "unknown-function"])
def test_a_mistake_in_the_action_file_fails_the_runner(tmp_path: Path, old: str, new: str,
                                                       said: str):
    broken = tmp_path / "action"
    shutil.copytree(ACTION, broken, ignore=shutil.ignore_patterns("__pycache__"))
    (broken.parent / "src").symlink_to(ROOT / "src")
    (broken.parent / "pyproject.toml").symlink_to(ROOT / "pyproject.toml")
    text = (broken / "action.yml").read_text()
    assert text.count(old) == 1, old
    (broken / "action.yml").write_text(text.replace(old, new))
    with pytest.raises(CompositeError) as e:
        run_once(tmp_path, tmp_path / "cache", "job", action=broken)
    assert said in str(e.value)


def test_install_false_without_tkbox_is_one_error_at_the_first_step(tmp_path: Path):
    """`install: false` on a runner whose python3 has no tkbox and no TKBOX_PYTHON: the
    first step says so in one line; nothing else runs."""
    ws = checkout(tmp_path)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TKBOX_", "GITHUB_", "RUNNER_", "INPUT_", "PYTHON"))}
    env["PATH"] = "/usr/bin:/bin"  # the system's python3, without this checkout's tkbox
    run = run_action(ACTION, {"prompt": "p", "install": "false"}, workspace=ws,
                     runner_temp=tmp_path / "temp", cache_dir=tmp_path / "cache", os_env=env)
    assert not run.ok and run.step("prepare").outcome == "failure"
    assert run.annotations == [("error", "install is false but the runner's python3 has no "
                                "tkbox: set TKBOX_PYTHON to a Python that has it, or "
                                "install: true")]
    assert all(s.outcome == "skipped" for s in run.steps[1:])
