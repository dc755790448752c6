"""The real Codex CLI and Gemini CLI (their npm packages, on their tool disks) in a
real box, through the doors, each against a scripted TLS stand-in of its API on
loopback (`model_stand_ins`): a test CA the daemon trusts with --ca-cert, the API
hosts mapped to 127.0.0.1 with --egress-hosts, loopback reached through
--egress-permit.

Each agent reads the code, edits it, and runs the test with its shell tool; the
patch fixes the code. The stand-in accepts a request only with the real key in the
header its API reads, and checks that the key is nowhere else in the request; the
box held only the placeholder (the shell step writes the key's variable to a file,
which comes back in the patch); the bundle verifies and its model calls carry the
model name and token counts the stand-in answered; the host the shell step tried
(not allowed) is refused and recorded.

The tool disks are fetched ahead of time (`scripts/test.sh`: `tkbox tools pull
codex`, `tkbox tools pull gemini`) into the store this test's daemon shares; the
boxes run `tkbox/default` (Debian with python3, built by setup). One box each.
"""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_stack import REAL_HOME, Stack, bundle_records, fresh_name, make_home, stack_env
from model_stand_ins import GEMINI_USAGE, RESPONSES_USAGE, make_handler

from tkbox.agents.testing import failing_checkout
from tkbox.image.testing import ScratchCA

pytestmark = pytest.mark.timeout(3600)

KEYS = {"openai": "sk-proj-e2eCodexKeyValue-51f0a2", "gemini": "AIzaE2eGeminiKeyValue-93bd7c"}
PROMPT = "Make the failing test in test_calc.py pass. Do not change the test."
HOSTS = {"codex": "api.openai.com", "gemini": "generativelanguage.googleapis.com"}
KEY_ENV = {"codex": "OPENAI_API_KEY", "gemini": "GEMINI_API_KEY"}
API = {"codex": "openai", "gemini": "gemini"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    for agent in ("codex", "gemini"):
        if not list((REAL_HOME / "tools" / "index").glob(f"{agent}@*.json")):
            pytest.fail(f"no {agent} tool disk: run 'tkbox tools pull {agent}' "
                        "(scripts/test.sh does)")
    tmp = tmp_path_factory.mktemp("agents2")
    ca = ScratchCA.create(tmp, [*HOSTS.values(), "other.test"])
    log: list[dict[str, Any]] = []
    port_box = [0]
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), make_handler(log, port_box, KEYS))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(ca.cert_pem, ca.key_pem)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = port_box[0] = httpd.server_address[1]
    hosts = tmp / "hosts"
    hosts.write_text("127.0.0.1 " + " ".join([*HOSTS.values(), "other.test"]) + "\n")
    home = make_home(tmp)
    s = Stack(home, stack_env(home))
    s.env["OPENAI_API_KEY"] = KEYS["openai"]
    s.env["GEMINI_API_KEY"] = KEYS["gemini"]
    s.start_signer()
    s.start_daemon("--egress-permit", "127.0.0.1/32", "--egress-hosts", str(hosts),
                   "--ca-cert", str(ca.ca_pem), "--approval-wait", "1")
    yield {"stack": s, "port": port, "tmp": tmp, "log": log}
    for p in list(s.procs):
        s.stop(p)
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("agent", ["codex", "gemini"])
def test_the_agent_fixes_the_code_through_the_doors(world: dict[str, Any], agent: str) -> None:
    s: Stack = world["stack"]
    ws = failing_checkout(world["tmp"] / f"ws-{fresh_name('w')}")
    out = world["tmp"] / f"{agent}-out"
    out.mkdir()
    since = len(world["log"])
    r = s.tk("agent", agent, "--prompt", PROMPT, "--workspace", str(ws),
             "--image", "tkbox/default", "--model-host", f"{HOSTS[agent]}:{world['port']}",
             "--output-dir", str(out), "--timeout", "1500", "--json",
             check=False, timeout=3600)
    key = KEYS[API[agent]]
    assert key not in r.stdout + r.stderr
    outcome = json.loads(r.stdout)
    calls = world["log"][since:]
    assert r.returncode == 0 and outcome["error"] is None and outcome["status"] == 0, \
        (outcome, calls, r.stderr[-3000:])
    # its program came on its disk, recorded
    assert outcome["tools"]["name"] == agent
    # the patch fixes the code; the test is untouched
    patch = Path(outcome["patch"]).read_text()
    assert "-    return a - b\n+    return a + b" in patch, patch
    assert "test_calc.py" not in patch
    # the box held a placeholder, never the key
    seen = [line for line in patch.splitlines()
            if line.startswith(f"+tkbox_{KEY_ENV[agent]}_")]
    assert len(seen) == 1, patch
    assert key not in patch
    # the stand-in saw the real key in the bound header, and nowhere else; every turn
    turns = [c for c in calls if c.get("turn") is not None]
    assert [c["turn"] for c in turns][-4:] == [0, 1, 2, 3], calls
    assert all(c["key_ok"] and not c["key_elsewhere"] for c in calls), calls
    # it read the file, and its shell tool ran the test (the tool results it sent back)
    assert "return a - b" in turns[-3]["tool_output"], turns[-3]
    assert "TESTS-PASSED" in turns[-1]["tool_output"], turns[-1]
    # its own report: a success
    assert outcome["agent_result"], outcome
    # the bundle verifies, with model calls carrying the model and the token counts
    recs = bundle_records(s, outcome["bundle"])
    text = json.dumps(recs)
    assert key not in text
    opened = next(rec["body"]["facts"] for rec in recs if rec["kind"] == "tkbox.run.open")
    assert opened["tools"]["name"] == agent and opened["tools"]["version"] == \
        outcome["tools"]["version"]
    model = [rec["body"] for rec in recs if rec["kind"] == "tkbox.model.call"
             and rec["body"]["method"] == "POST"]
    assert len(model) >= 4, [rec["kind"] for rec in recs]
    assert all(m["host"] == HOSTS[agent] and m["status"] == 200 for m in model), model
    if agent == "codex":
        want = {"input_tokens": 432, "output_tokens": 65, "total_tokens": 497,
                "cache_read_input_tokens": 0, "reasoning_tokens": 0}
        assert RESPONSES_USAGE["total_tokens"] == want["total_tokens"]
        assert all(m["api"] == "openai.responses" and m.get("model") and m["usage"] == want
                   for m in model), model
    else:
        want = {"input_tokens": 654, "output_tokens": 43, "total_tokens": 697}
        assert GEMINI_USAGE["totalTokenCount"] == want["total_tokens"]
        assert all(m["api"] == "gemini.generate" and m.get("model") and m["usage"] == want
                   for m in model), model
    # the host it was not allowed: refused, and recorded
    refused = [rec for rec in recs if "other.test" in json.dumps(rec["body"])]
    assert any(rec["kind"] == "tkbox.egress.refused" or (
        rec["kind"] == "tkbox.decision" and rec["body"].get("allowed") is False)
        for rec in refused), [rec["kind"] for rec in recs]
    assert not any(rec["kind"] == "tkbox.decision" and rec["body"].get("allowed")
                   for rec in refused), refused
