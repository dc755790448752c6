#!/usr/bin/env bash
# Install everything, then run the demo: a signer, a daemon, one box that
# installs a package with pip through the door (from a package mirror the
# operator maps to loopback), waits for a person to approve a host (this
# script approves it), is refused the cloud metadata address, holds only a
# placeholder for a GitHub token that the door swaps in for a loopback
# stand-in of api.github.com, changes a checkout; its patch applied, its
# bundle verified.
#
# Every step checks its own outcome: a step whose outcome does not happen ends
# the demo with a non-zero exit and one line, `demo: FAILED at "STEP": what`.
#
# Settings (for a machine set up already, and for the test that breaks a step):
#   TKBOX_DEMO_SETUP=0       do not run scripts/setup.sh first
#   TKBOX_DEMO_PYTHON=PATH   the Python that runs tkbox (default .venv/bin/python)
#   TKBOX_DEMO_GH_BINDING=H  where the token is bound (default api.github.com:PORT,
#                            the stand-in's address); tests/e2e/test_demo.py binds it
#                            elsewhere to check that the demo then fails
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
step="setup"
fail() { echo "demo: FAILED at \"$step\": $*" >&2; exit 1; }
# Anything that fails unexpectedly names its step too (set -e alone would say nothing).
trap 'fail "exit $? from: ${BASH_COMMAND:0:200}"' ERR
say() { step="$1"; echo "== $1"; }
# The id of the approval waiting for HOST (empty after 30 s without one).
approval_for() {
  for _ in $(seq 150); do
    tk approvals --json | "$PY" -c 'import json, sys
print(next((str(i["id"]) for i in json.load(sys.stdin) if i.get("host") == sys.argv[1]), ""))' \
      "$1" | grep . && return 0
    sleep 0.2
  done
}

if [ "${TKBOX_DEMO_SETUP:-1}" != 0 ]; then bash scripts/setup.sh; fi
PY="${TKBOX_DEMO_PYTHON:-$REPO/.venv/bin/python}"
tk() { "$PY" -m tkbox.cli "$@"; }
export TKBOX_HOME="${TKBOX_HOME:-$HOME/.local/share/tkbox}"
work="$(mktemp -d)"
pids=()
# The daemon first (it stops its boxes and records that), then the signer, then the rest.
cleanup() { for ((i=${#pids[@]}-1; i>=0; i--)); do kill "${pids[$i]}" 2>/dev/null || true
  wait "${pids[$i]}" 2>/dev/null || true; done; }
trap cleanup EXIT

say "a checkout with a failing test and a credential file that must not be copied"
mkdir -p "$work/checkout" && cd "$work/checkout"
git init -q . && printf 'def add(a, b):\n    return a - b\n' > calc.py
printf 'from calc import add\nassert add(2, 2) == 4, "add is broken"\nprint("ok")\n' > test_calc.py
echo "API_TOKEN=do-not-copy" > .env
git add calc.py test_calc.py && git -c user.name=demo -c user.email=demo@example.invalid commit -qm init

say "stand-ins on loopback: api.github.com, a package mirror, a host nobody allowed"
GH_TOKEN="ghp_demo$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
export GH_TOKEN
"$PY" "$REPO/scripts/demo_origin.py" "$work/origin" api.github.com mirror.example held.example \
  > "$work/origin.port" & pids+=($!)
for _ in $(seq 100); do [ -s "$work/origin.port" ] && break; sleep 0.1; done
PORT="$(cat "$work/origin.port")"
[[ "$PORT" =~ ^[0-9]+$ ]] || fail "the stand-in origin did not start"
printf '127.0.0.1 api.github.com mirror.example held.example\n' > "$work/hosts"
# The token is swapped in only on the port it is bound to: the stand-in's.
GH_BINDING="${TKBOX_DEMO_GH_BINDING:-api.github.com:$PORT}"

say "the signer (its own process) and the daemon (which may reach the stand-ins)"
tk signer init --dev >/dev/null 2>&1 || true
# Started directly, not through tk: $! is then the service itself, which cleanup ends.
"$PY" -m tkbox.cli signer serve & pids+=($!)
for _ in $(seq 100); do tk signer status >/dev/null 2>&1 && break; sleep 0.2; done
tk signer status >/dev/null 2>&1 || fail "the signer does not answer"
"$PY" -m tkbox.cli daemon --egress-permit 127.0.0.1/32 --egress-hosts "$work/hosts" \
  --ca-cert "$work/origin/ca.pem" & pids+=($!)
for _ in $(seq 100); do tk ls >/dev/null 2>&1 && break; sleep 0.2; done
tk ls >/dev/null 2>&1 || fail "the daemon does not answer"
tk rm --force demo >/dev/null 2>&1 || true

say "a box: no network card, a copy of the checkout, \$GH bound to $GH_BINDING"
tk run --image tkbox/default --workspace . --name demo --allow "mirror.example:$PORT" \
  --allow "api.github.com:$PORT" --secret "GH=env:GH_TOKEN@$GH_BINDING"
tk exec demo -- sh -c 'uname -r; ls /sys/class/net; ls -a /workspace' | tee "$work/box.out"
nets="$(tk exec demo -- ls /sys/class/net)"
[ "$nets" = lo ] || fail "the box has network interfaces other than lo: $(echo $nets)"
grep -qx calc.py "$work/box.out" || fail "the checkout is not in /workspace"
! grep -qx .env "$work/box.out" || fail "the credential file .env was copied into the box"

say "pip through the door, from the mirror"
tk exec demo -- sh -c "python3 -m pip install -q --no-cache-dir --break-system-packages \
  --disable-pip-version-check --index-url https://mirror.example:$PORT/simple/ tkdemo && \
  python3 -c 'import tkdemo; print(\"tkdemo\", tkdemo.VALUE)'" | tee "$work/pip.out"
grep -qx "tkdemo 42" "$work/pip.out" || fail "the package from the mirror did not install"

say "\$GH in the box is a placeholder; the door swaps the token in for api.github.com only"
tk exec demo -- sh -c 'echo "GH=$GH"' | tee "$work/gh.out"
grep -q '^GH=tkbox_GH_' "$work/gh.out" || fail "\$GH in the box is not a placeholder"
user="$(tk exec demo -- sh -c "curl -sS -m 30 -H \"Authorization: Bearer \$GH\" \
  https://api.github.com:$PORT/user" || true)"
echo "$user"
cat "$work/origin/origin.log"
grep -q '/user: Authorization held the real token: True' "$work/origin/origin.log" &&
  [ "$user" = '{"login": "demo"}' ] ||
  fail "the token was not swapped in for api.github.com:$PORT (the secret is bound to $GH_BINDING)"
before="$(grep -c /user "$work/origin/origin.log")"
if tk exec demo -- sh -c "curl -sS -f -m 30 -H \"X-Debug: \$GH\" https://api.github.com:$PORT/user"
then fail "the placeholder in another header was let through"; fi
[ "$(grep -c /user "$work/origin/origin.log")" = "$before" ] ||
  fail "the placeholder in another header reached the origin"
echo "(refused: the placeholder anywhere but the bound header is a leak, blocked and recorded)"

say "a host nobody allowed waits for a person; this script approves it"
tk exec demo -- curl -sS -m 60 "https://held.example:$PORT/" > "$work/held.out" 2>&1 &
held=$!
id="$(approval_for held.example)"
[ -n "$id" ] || fail "no approval waits for held.example"
tk approvals
tk approve demo "$id"
wait "$held" || true
cat "$work/held.out"
grep -qx "hello from held.example" "$work/held.out" || fail "the approved connection did not go through"

say "the cloud metadata address is always refused"
meta="$(tk exec demo -- curl -sS -m 10 -w ' (HTTP %{http_code})' \
  http://169.254.169.254/latest/meta-data/ || true)"
echo "$meta"
[[ "$meta" == refused*"cloud metadata service"*"(HTTP 403)" ]] ||
  fail "the cloud metadata address was not refused by the door"

say "the agent's work: the test fails, a fix, the test passes"
if tk exec demo -- python3 test_calc.py; then fail "the test passed before the fix"; fi
echo "(the test fails, as expected)"
tk exec demo -- sh -c "sed -i 's/a - b/a + b/' calc.py && python3 test_calc.py" | tee "$work/fix.out"
grep -qx ok "$work/fix.out" || fail "the test does not pass after the fix"

say "a host not on the allowlist waits for a person too; this time the answer is no"
tk exec demo -- curl -sS -m 60 https://example.com > "$work/denied.out" 2>&1 &
denied=$!
id="$(approval_for example.com)"
[ -n "$id" ] || fail "no approval waits for example.com"
tk deny demo "$id"
if wait "$denied"; then fail "the box reached example.com after the answer no"; fi
cat "$work/denied.out"
echo "(refused: a person said no)"

say "stop the box; apply its patch to the checkout through the changes door"
tk stop demo
tk apply demo
git --no-pager diff --stat
grep -q 'a + b' calc.py || fail "the fix is not in the checkout"

say "nothing the run left holds the token"
! grep -rqF "$GH_TOKEN" "$TKBOX_HOME/boxes/demo" || fail "the token leaked into $TKBOX_HOME/boxes/demo"

say "the bundle: exported, verified offline, with the swap and the blocked leak in it"
tk export demo -o "$work/demo.tkb"
tk verify "$work/demo.tkb" --trust "$work/demo.trust.json" | tee "$work/verify.out"
grep -q '^Integrity: VERIFIED\.' "$work/verify.out" || fail "the bundle does not verify"
grep -Eq 'Secrets: 1 uses?, 1 leaks? blocked' "$work/verify.out" ||
  fail "the bundle does not record one use of the token and one leak blocked"
tk rm demo
echo "== demo done: bundle in $work/demo.tkb"
