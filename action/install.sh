#!/usr/bin/env bash
# System packages and tkbox, from this action's own checkout, for the composite action.
# KVM where the runner has it (GitHub's Linux runners need a udev rule to open
# /dev/kvm); software emulation, with a notice, where it does not.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
. /etc/os-release
case "${ID:-}" in
  ubuntu) kernel=linux-image-generic ;;
  *) kernel=linux-image-amd64 ;;
esac
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
  qemu-system-x86 "$kernel" squashfs-tools e2fsprogs mmdebstrap ca-certificates kmod \
  binutils git python3 python3-venv
# Ubuntu ships its kernels readable by root only; tkbox boots boxes with the host's kernel.
$SUDO sh -c 'chmod 0644 /boot/vmlinuz-* 2>/dev/null || true'
if [ -e /dev/kvm ]; then
  echo 'KERNEL=="kvm", GROUP="kvm", MODE="0666", OPTIONS+="static_node=kvm"' |
    $SUDO tee /etc/udev/rules.d/99-tkbox-kvm.rules >/dev/null
  $SUDO udevadm control --reload-rules
  $SUDO udevadm trigger --name-match=kvm
  echo "tkbox: KVM available"
else
  echo "::notice title=tkbox::no /dev/kvm on this runner: boxes run under software emulation (TCG), still a separate kernel behind a VMM, but much slower"
fi
python3 -m venv "$RUNNER_TEMP/tkbox-venv"
"$RUNNER_TEMP/tkbox-venv/bin/python" -m pip install -q "$root"
