#!/bin/sh
# Builds a flat apt repository of empty doubles of Canonical's NVIDIA driver packages for one driver version.
#   build-repo.sh REPO KERNEL_RELEASE UBUNTU_VERSION DRIVER_VERSION [without-precompiled]
# Names, versions and dependencies follow docs/ubuntu-driver-packages.md.
set -eu
repo=$1 kver=$2 release=$3 drv=$4 mode=${5:-}
flavour=generic
abi=$(echo "$kver" | sed 's/-[a-z].*$//')
ver="$drv-0ubuntu0.$release.1"
work=$(mktemp -d)
deb() { # name version depends [file]
  d="$work/$1"; mkdir -p "$d/DEBIAN"
  printf 'Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: gpuops test <test@invalid>\nDescription: test double of %s\n' \
    "$1" "$2" "$1" > "$d/DEBIAN/control"
  [ -n "$3" ] && printf 'Depends: %s\n' "$3" >> "$d/DEBIAN/control"
  if [ -n "${4:-}" ]; then mkdir -p "$d/$(dirname "$4")"; : > "$d/$4"; fi
  dpkg-deb -Zxz --build "$d" "$repo/${1}_${2}_all.deb" >/dev/null
}
mkdir -p "$repo"
deb "linux-image-$kver" "$abi.45" ""
deb "linux-image-$flavour" "$abi.45" "linux-image-$kver"
for b in 580-server-open 580-server; do
  deb "nvidia-kernel-common-580-server" "$ver" ""
  deb "nvidia-headless-no-dkms-$b" "$ver" "nvidia-kernel-common-580-server (= $ver)"
  deb "nvidia-headless-$b" "$ver" "nvidia-kernel-common-580-server (= $ver)"
done
deb "nvidia-compute-utils-580-server" "$ver" "" "usr/bin/nvidia-persistenced"
deb "nvidia-utils-580-server" "$ver" "nvidia-compute-utils-580-server (= $ver)" "usr/bin/nvidia-smi"
deb "nvidia-fabricmanager-580" "$drv-1" ""
if [ "$mode" != without-precompiled ]; then
  deb "linux-modules-nvidia-580-server-open-$kver" "$abi.45+$drv" \
    "linux-image-$kver, nvidia-kernel-common-580-server (>= $drv)" "lib/modules/$kver/kernel/nvidia-580srv/nvidia.ko"
  deb "linux-modules-nvidia-580-server-open-$flavour" "$abi.45+$drv" "linux-modules-nvidia-580-server-open-$kver (= $abi.45+$drv)"
fi
# The index apt reads (flat repository: deb [trusted=yes] file:REPO ./), without dpkg-dev.
(cd "$repo" && for f in *.deb; do
  dpkg-deb -f "$f"
  printf 'Filename: ./%s\nSize: %s\nSHA256: %s\n\n' "$f" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)"
done > Packages)
rm -rf "$work"
