#!/usr/bin/env bash
# Builds the local Debian 12 image with systemd as PID 1 that molecule scenarios, the device-plugin
# image and the end-to-end node use. No registry is reachable, so the image comes from debootstrap
# and `podman import`. The root filesystem tarball is cached in $GPUOPS_CACHE/images and the image is
# only rebuilt when this script changes.
#   scripts/build-base-image.sh            -> prints the image reference
set -euo pipefail
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
image_repo=localhost/gpuops-debian12
script_hash=$(sha256sum "$0" | cut -c1-12)
tag="$image_repo:$script_hash"
tarball="$cache/images/debian12-$script_hash.tar"
# The Debian mirror: GPUOPS_DEBIAN_MIRROR, else the first one this machine's own apt sources use.
# shellcheck source=scripts/debian-mirror.sh
. "$(dirname "$0")/debian-mirror.sh"
mirror=$(debian_mirror build-base-image.sh)

log() { printf '[base-image] %s\n' "$*" >&2; }

if podman image exists "$tag"; then
  podman tag "$tag" "$image_repo:latest" >/dev/null
  echo "$tag"
  exit 0
fi

mkdir -p "$cache/images"
if [ ! -f "$tarball" ]; then
  root=$(mktemp -d "$cache/images/root.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  log "debootstrap Debian 12 into $root (about a minute)"
  debootstrap --variant=minbase \
    --include=python3,python3-apt,systemd,systemd-sysv,dbus,apt,ca-certificates,sudo,procps,iproute2,gnupg,kmod \
    bookworm "$root" "$mirror" >/dev/null
  # A container needs no getty, and apt needs the non-free sections for NVIDIA's packages.
  rm -f "$root"/etc/systemd/system/getty.target.wants/* 2>/dev/null || true
  printf 'deb %s bookworm main contrib non-free non-free-firmware\ndeb %s bookworm-updates main contrib non-free non-free-firmware\n' \
    "$mirror" "$mirror" > "$root/etc/apt/sources.list"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
fi
log "importing $tarball as $tag"
podman import --change 'CMD ["/sbin/init"]' --change 'STOPSIGNAL SIGRTMIN+3' "$tarball" "$tag" >/dev/null
podman tag "$tag" "$image_repo:latest" >/dev/null
echo "$tag"
