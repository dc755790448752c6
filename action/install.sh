#!/usr/bin/env bash
# What the Action needs on the runner, installing only what is missing:
#
# - system packages, each checked with dpkg-query first, the missing ones in one apt
#   transaction; the kernel package only when `steps.py prepare` found no kernel on
#   the runner that boots tkbox's guest (KERNEL_PACKAGE);
# - /dev/kvm opened to the runner's user where the runner has it (GitHub's Linux
#   runners need a udev rule); software emulation, with a notice, where it does not;
# - tkbox in a virtual environment (VENV), from this action's own checkout, unless
#   it holds this very source already (restored from the cache: its stamp is
#   TKBOX_SOURCE), or TKBOX_PYTHON names a Python that has tkbox.
#
# Marks `install-start`/`install-end` in MARKS for the job summary's timings.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mark() { [ -z "${MARKS:-}" ] || echo "$1 $(date +%s.%N)" >> "$MARKS"; }
mark install-start
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

# tar2sqfs/rdsquashfs (squashfs-tools-ng) build and read root disks, mkfs.ext4
# (e2fsprogs) the workspace's upper disk, cc (gcc, libc6-dev) and strip (binutils) the
# guest's spawn helper, zstd the modules Ubuntu compresses, git the patch checks.
PKGS="qemu-system-x86 squashfs-tools-ng e2fsprogs ca-certificates kmod binutils gcc libc6-dev
      zstd git python3 python3-venv ${KERNEL_PACKAGE:-}"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "tkbox: installing what is missing, in one apt transaction:$missing"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
else
  echo "tkbox: every system package is present ($(echo $PKGS | wc -w) checked), none installed"
fi

if [ -e /dev/kvm ] && [ "${RUNNER_ENVIRONMENT:-github-hosted}" = github-hosted ]; then
  # A GitHub-hosted runner is the job's own: open /dev/kvm to its user.
  rule='KERNEL=="kvm", GROUP="kvm", MODE="0666", OPTIONS+="static_node=kvm"'
  if [ "$(cat /etc/udev/rules.d/99-tkbox-kvm.rules 2>/dev/null)" != "$rule" ]; then
    echo "$rule" | $SUDO tee /etc/udev/rules.d/99-tkbox-kvm.rules >/dev/null
    $SUDO udevadm control --reload-rules
    $SUDO udevadm trigger --name-match=kvm
  fi
  echo "tkbox: KVM available (/dev/kvm)"
elif [ -e /dev/kvm ]; then
  # A self-hosted runner's /dev/kvm is its operator's to open, not this action's.
  if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
    echo "tkbox: KVM available (/dev/kvm; self-hosted runner, left as it is)"
  else
    echo "::notice title=tkbox::this self-hosted runner's user cannot open /dev/kvm: boxes run under software emulation; add the user to the kvm group to use KVM"
  fi
else
  echo "::notice title=tkbox::no /dev/kvm on this runner: boxes run under software emulation (TCG), still a separate kernel behind a VMM, but much slower"
fi

if [ -n "${TKBOX_PYTHON:-}" ]; then
  "$TKBOX_PYTHON" -c 'import tkbox' 2>/dev/null ||
    { echo "::error title=tkbox::TKBOX_PYTHON=$TKBOX_PYTHON cannot import tkbox; install tkbox into it or unset TKBOX_PYTHON"; exit 1; }
  echo "tkbox: using the tkbox of TKBOX_PYTHON ($TKBOX_PYTHON)"
else
  venv="${VENV:?VENV names the folder of the virtual environment}"
  stamp="$venv/.tkbox-source"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${TKBOX_SOURCE:-}" ] &&
      "$venv/bin/python" -c 'import tkbox' 2>/dev/null; then
    echo "tkbox: tkbox (source ${TKBOX_SOURCE:-}) is installed in $venv already, from the cache"
  else
    echo "tkbox: installing tkbox (source ${TKBOX_SOURCE:-}) into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$root"
    echo "${TKBOX_SOURCE:-}" > "$stamp"
  fi
fi
mark install-end
