"""A trust file or bundle someone hands you, built to hurt the verifier or its reader.

Each test names the attack (found by a review as an attacker) and holds the
rule that stops it: the quorum is evaluated once per group, a name from the
bundle is shown escaped, a record's own time is the signer's, and a trust file
is read only up to its limit.
"""

from __future__ import annotations

import base64
import json
import sys
import unicodedata
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "formats"))

from tkb_kit import Kit  # noqa: E402

from tkbox.formats import FormatError, canonjson, record  # noqa: E402
from tkbox.formats.bundle import MAX_TRUST  # noqa: E402
from tkbox.report import build_report  # noqa: E402
from tkbox.report.timeline import Timeline  # noqa: E402
from tkbox.verify import verify_bundle  # noqa: E402
from tkbox.verify.cli import verify_command  # noqa: E402


def nested_trust(kit: Kit, depth: int) -> bytes:
    """g0 = any(w0), g1 = any(w1), g_k = all(g_{k-1}, g_{k-2}): a group reached by
    Fibonacci(depth) paths. Every line is valid tlog-policy."""
    base = json.loads(kit.trust())["policy"]
    lines = [ln for ln in base.splitlines() if ln.startswith(("log", "witness"))]
    lines += ["group g0 any w0", "group g1 any w1"]
    lines += [f"group g{k} all g{k - 1} g{k - 2}" for k in range(2, depth)]
    lines.append(f"quorum g{depth - 1}")
    text = "\n".join(lines) + "\n"
    return canonjson.dumps({"format": "tkbox-trust/v1", "independent": [],
                            "policy": text}) + b"\n"


@pytest.mark.timeout(30)
def test_a_trust_file_of_pairwise_nested_groups_is_checked_in_time_linear_in_it() -> None:
    """Attack: ~2 KB of groups each naming the two before it; evaluated by recursion
    it takes Fibonacci(80) steps (the review measured 9.7 s at depth 34)."""
    kit = Kit(witnesses=2)
    kit.run("job1")
    rep = verify_bundle(kit.bundle("job1"), nested_trust(kit, 80))
    assert rep.records > 0


@pytest.mark.timeout(30)
def test_an_unmet_nested_quorum_is_described_in_a_bounded_message() -> None:
    """Attack: the same groups, with the quorum unmet (only w0 cosigned): spelled out
    in full, the message was 9.5 million characters at depth 28."""
    kit = Kit(witnesses=2)
    kit.run("job1")
    with pytest.raises(FormatError) as e:
        verify_bundle(kit.bundle("job1", cosigners=["w0"]), nested_trust(kit, 80))
    assert e.value.code == "checkpoint.quorum"
    what = e.value.what
    assert len(what) <= 2100
    assert what.count("group g77 is ") == 1  # each group spelled once, by name after


def test_a_signature_name_with_terminal_controls_is_shown_escaped() -> None:
    """Attack: an extra signature line whose key name carries C1 controls (CSI) and a
    right-to-left override, to rewrite the FAILED line on the reader's terminal."""
    kit = Kit()
    kit.run("job1")
    name = "evil\u009b2J\u009b31mFAKE:\u202eVERIFIED"
    sig = base64.b64encode(b"\x00\x00\x00\x01" + b"x" * 64).decode()
    bundle = kit.bundle("job1") + f"\u2014 {name} {sig}\n".encode()
    with pytest.raises(FormatError) as e:
        verify_bundle(bundle, kit.trust())
    assert e.value.code == "checkpoint.unknown-signature"
    shown = e.value.what
    assert not [c for c in shown if unicodedata.category(c) in ("Cc", "Cf")], shown
    assert "evil" in shown


def test_a_time_in_a_record_body_does_not_replace_the_signers_time() -> None:
    """Attack: a model call whose body says `time`: the report's time column is the
    record's own (the signer's clock), whatever the body holds."""
    kit = Kit()
    kit.append("job1", record.OPEN, {"facts": {}, "isolation": "same-user"})
    kit.append("job1", "tkbox.model.call", {"host": "api.test", "time": "2099-01-01T09:09:09Z"})
    kit.append("job1", "tkbox.approval", {"host": "a.test", "time": "2099-01-01T09:09:09Z"})
    kit.append("job1", record.CLOSE, {})
    outcome = build_report(kit.bundle("job1"), kit.trust())
    assert outcome.error is None and outcome.timeline is not None
    t: Timeline = outcome.timeline
    (call,) = t.model_calls
    (approval,) = t.approvals
    assert call["time"] and "2099" not in call["time"]
    assert approval["time"] and "2099" not in approval["time"]


def test_a_trust_file_larger_than_its_limit_is_refused_before_it_is_read_whole(
        tmp_path: Path) -> None:
    """A trust file is at most MAX_TRUST bytes: a larger one is refused with one line
    and exit 2, read no further than its limit (before: up to 512 MiB)."""
    kit = Kit()
    kit.run("job1")
    b = tmp_path / "b.tkb"
    b.write_bytes(kit.bundle("job1"))
    t = tmp_path / "t.json"
    t.write_bytes(b" " * (MAX_TRUST + 1))
    app = typer.Typer()
    app.command()(verify_command)
    res = CliRunner().invoke(app, [str(b), "--trust", str(t)])
    assert res.exit_code == 2
    assert f"is larger than {MAX_TRUST} bytes" in res.output
