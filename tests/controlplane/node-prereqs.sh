#!/usr/bin/env bash
# Install what the `node` test backend and scripts/build-images need on a Debian machine, with apt-get:
# containerd, runc, the CNI plugins, iptables, conntrack, socat, iproute2 (the node) and podman and
# mmdebstrap (kcover's images). Does nothing for a package already installed; needs root.
# The list is tests/controlplane/nodehost.py's PACKAGES.
set -euo pipefail
PACKAGES=(containerd runc containernetworking-plugins iptables conntrack socat iproute2 podman mmdebstrap)
log() { echo "[node-prereqs.sh] $*" >&2; }
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "all installed: ${PACKAGES[*]}"
  exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  log "missing ${missing[*]}, and this is not root on a Debian machine: install them yourself"
  exit 1
fi
log "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
# No recommends: podman's (slirp4netns, fuse-overlayfs, buildah, ...) are not needed for root builds
# with --network host, and containerd must not pull in docker's packages.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
log "installed"
