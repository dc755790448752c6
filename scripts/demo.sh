#!/usr/bin/env bash
# Install everything, then run the demo: a signer, a daemon, one box that
# installs a package with pip through the door (from a package mirror the
# operator maps to loopback), waits for a person to approve a
# host (this script approves it), is refused the cloud metadata address, holds
# only a placeholder for a GitHub token that the door swaps in for a loopback
# stand-in of api.github.com, changes a checkout; its patch applied, its
# bundle verified.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
bash scripts/setup.sh
T="$PWD/.venv/bin/tkbox"
export TKBOX_HOME="${TKBOX_HOME:-$HOME/.local/share/tkbox}"
work="$(mktemp -d)"
pids=()
# The daemon first (it stops its boxes and records that), then the signer, then the rest.
cleanup() { for ((i=${#pids[@]}-1; i>=0; i--)); do kill "${pids[$i]}" 2>/dev/null || true
  wait "${pids[$i]}" 2>/dev/null || true; done; }
trap cleanup EXIT

echo "== a checkout with a failing test and a credential file that must not be copied"
mkdir -p "$work/checkout" && cd "$work/checkout"
git init -q . && printf 'def add(a, b):\n    return a - b\n' > calc.py
printf 'from calc import add\nassert add(2, 2) == 4, "add is broken"\nprint("ok")\n' > test_calc.py
echo "API_TOKEN=do-not-copy" > .env
git add calc.py test_calc.py && git -c user.name=demo -c user.email=demo@example.invalid commit -qm init

echo "== stand-ins on loopback: api.github.com, a package mirror, a host nobody allowed"
GH_TOKEN="ghp_demo$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
export GH_TOKEN
"$REPO/.venv/bin/python" "$REPO/scripts/demo_origin.py" "$work/origin" api.github.com mirror.example held.example \
  > "$work/origin.port" & pids+=($!)
for _ in $(seq 100); do [ -s "$work/origin.port" ] && break; sleep 0.1; done
PORT="$(cat "$work/origin.port")"
printf '127.0.0.1 api.github.com mirror.example held.example\n' > "$work/hosts"

echo "== the signer (its own process) and the daemon (which may reach the stand-ins)"
"$T" signer init --dev >/dev/null 2>&1 || true
"$T" signer serve & pids+=($!)
sleep 2
"$T" daemon --egress-permit 127.0.0.1/32 --egress-hosts "$work/hosts" \
  --ca-cert "$work/origin/ca.pem" & pids+=($!)
for _ in $(seq 50); do "$T" ls >/dev/null 2>&1 && break; sleep 0.2; done
"$T" rm --force demo >/dev/null 2>&1 || true

echo "== a box: no network card, a copy of the checkout, \$GH bound to api.github.com"
"$T" run --image tkbox/default --workspace . --name demo --allow "mirror.example:$PORT" \
  --allow "api.github.com:$PORT" --secret GH=env:GH_TOKEN@api.github.com
"$T" exec demo -- sh -c 'uname -r; ls /sys/class/net; ls -a /workspace'

echo "== pip through the door, from the mirror"
"$T" exec demo -- sh -c "python3 -m pip install -q --no-cache-dir --break-system-packages \
  --disable-pip-version-check --index-url https://mirror.example:$PORT/simple/ tkdemo && \
  python3 -c 'import tkdemo; print(\"tkdemo\", tkdemo.VALUE)'"

echo "== \$GH in the box is a placeholder; the door swaps the token in for api.github.com only"
"$T" exec demo -- sh -c 'echo "GH=$GH"'
"$T" exec demo -- sh -c "curl -sS -m 30 -H \"Authorization: Bearer \$GH\" https://api.github.com:$PORT/user"
cat "$work/origin/origin.log"
"$T" exec demo -- sh -c "curl -sS -m 30 -H \"X-Debug: \$GH\" https://api.github.com:$PORT/user" \
  || true
echo "(refused: the placeholder anywhere but the bound header is a leak, blocked and recorded)"

echo "== a host nobody allowed waits for a person; this script approves it"
"$T" exec demo -- curl -sS -m 60 "https://held.example:$PORT/" > "$work/held.out" 2>&1 &
held=$!
id=""
for _ in $(seq 150); do
  id="$("$T" approvals --json | "$REPO/.venv/bin/python" -c \
    'import json,sys; print(next((str(i["id"]) for i in json.load(sys.stdin) if i.get("host") == "held.example"), ""))')"
  [ -n "$id" ] && break; sleep 0.2
done
"$T" approvals
"$T" approve demo "$id"
wait "$held" || true
cat "$work/held.out"

echo "== the cloud metadata address is always refused"
"$T" exec demo -- curl -sS -m 10 http://169.254.169.254/latest/meta-data/ || true
"$T" exec demo -- python3 test_calc.py || echo "(the test fails, as expected)"
"$T" exec demo -- sh -c "sed -i 's/a - b/a + b/' calc.py && python3 test_calc.py"
"$T" exec demo -- curl -sS -m 10 https://example.com || echo "(refused: not on the allowlist)"
"$T" stop demo
"$T" apply demo
git --no-pager diff --stat
echo "== nothing the run left holds the token"
! grep -rqF "$GH_TOKEN" "$TKBOX_HOME/boxes/demo" || { echo "the token leaked"; exit 1; }
"$T" export demo -o "$work/demo.tkb"
"$T" verify "$work/demo.tkb" --trust "$work/demo.trust.json"
"$T" rm demo
echo "== demo done: bundle in $work/demo.tkb"
