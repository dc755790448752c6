#!/usr/bin/env bash
# Install what the tests need (the agents' programs included), then run the whole
# suite: lint (ruff, mypy --strict), then unit, integration, fuzz (the short `ci`
# profile) and e2e tests that boot real VMs. This is what .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The agents' programs the agent tests give their boxes (an install step: fetched
# once from their own npm packages, checked against the registry's integrity and
# tkbox's pinned copy, kept as disks; the tests themselves talk to loopback only).
.venv/bin/tkbox tools pull claude-code
.venv/bin/tkbox tools pull codex
.venv/bin/tkbox tools pull gemini
echo "test: ruff"
.venv/bin/ruff check src tests benchmarks
echo "test: mypy --strict"
.venv/bin/mypy --strict src/tkbox
# The benchmarks are not run by the suite: type-checking them is what keeps them
# in step with the code they drive.
echo "test: mypy benchmarks"
.venv/bin/mypy benchmarks
exec .venv/bin/python -m pytest -q -W error -p no:cacheprovider \
  tests/unit tests/integration tests/conformance tests/fuzz tests/e2e "$@"
