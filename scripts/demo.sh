#!/usr/bin/env bash
# Install everything, then run the demo: a signer, a daemon, one box that
# runs commands and changes a checkout, its patch applied, its bundle verified.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
T="$PWD/.venv/bin/tkbox"
export TKBOX_HOME="${TKBOX_HOME:-$HOME/.local/share/tkbox}"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

echo "== a checkout with a failing test and a credential file that must not be copied"
mkdir -p "$work/checkout" && cd "$work/checkout"
git init -q . && printf 'def add(a, b):\n    return a - b\n' > calc.py
printf 'from calc import add\nassert add(2, 2) == 4, "add is broken"\nprint("ok")\n' > test_calc.py
echo "API_TOKEN=do-not-copy" > .env
git add calc.py test_calc.py && git -c user.name=demo -c user.email=demo@example.invalid commit -qm init

echo "== the signer (its own process) and the daemon"
"$T" signer init --dev >/dev/null 2>&1 || true
"$T" signer serve & pids+=($!)
sleep 2
"$T" daemon & pids+=($!)
for _ in $(seq 50); do "$T" ls >/dev/null 2>&1 && break; sleep 0.2; done
"$T" rm --force demo >/dev/null 2>&1 || true

echo "== a box: no network card, a copy of the checkout"
"$T" run --image tkbox/default --workspace . --name demo
"$T" exec demo -- sh -c 'uname -r; ls /sys/class/net; ls -a /workspace'
"$T" exec demo -- python3 test_calc.py || echo "(the test fails, as expected)"
"$T" exec demo -- sh -c "sed -i 's/a - b/a + b/' calc.py && python3 test_calc.py"
"$T" exec demo -- curl -sS -m 10 https://example.com || echo "(refused: not on the allowlist)"
"$T" stop demo
"$T" apply demo
git --no-pager diff --stat
"$T" export demo -o "$work/demo.tkb"
"$T" verify "$work/demo.tkb" --trust "$work/demo.trust.json"
"$T" rm demo
echo "== demo done: bundle in $work/demo.tkb"
