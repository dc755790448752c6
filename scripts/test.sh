#!/usr/bin/env bash
# Install what the tests need, then run the whole suite (unit, integration,
# fuzz, and e2e tests that boot real VMs). This is what .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -W error -p no:cacheprovider \
  tests/unit tests/integration tests/fuzz tests/e2e "$@"
