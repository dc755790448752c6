#!/usr/bin/env bash
# Install what the tests need (the Claude Code image included), then run the whole
# suite: lint (ruff, mypy --strict), then unit, integration, fuzz (the short `ci`
# profile) and e2e tests that boot real VMs. This is what .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The Claude Code image the agent tests run (an install step: its npm package comes
# from the registry through a box's door, minutes under emulation, once).
.venv/bin/python scripts/build_agent_image.py
# Codex CLI's and Gemini CLI's program disks, fetched from their npm packages and
# checked against their pinned integrity, once: their e2e tests then use only loopback.
.venv/bin/python -m tkbox.cli tools pull codex
.venv/bin/python -m tkbox.cli tools pull gemini
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
