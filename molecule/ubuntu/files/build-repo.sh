#!/bin/sh
# Builds a flat apt repository of empty doubles of Canonical's NVIDIA driver packages for one driver version.
#   build-repo.sh REPO KERNEL_RELEASE UBUNTU_VERSION DRIVER_VERSION [without-precompiled] [BRANCH]
# Names, versions and dependencies follow docs/ubuntu-driver-packages.md. The kernel's image double ships
# /boot/vmlinuz-<kernel> and its module tree, as the role reads them (the kernel it boots next); the precompiled
# module's double ships an nvidia.ko that modinfo reads (an ELF file whose .modinfo section holds the driver's
# version) and runs depmod for its kernel, as Canonical's do.
set -eu
repo=$1 kver=$2 release=$3 drv=$4 mode=${5:-} branch=${6:-580}
flavour=generic
abi=$(echo "$kver" | sed 's/-[a-z].*$//')
abinum=$(echo "$abi" | sed 's/^.*-//')
ver="$drv-0ubuntu0.$release.1"
work=$(mktemp -d)
deb() { # name version depends [file] [postinst]
  d="$work/$1"; mkdir -p "$d/DEBIAN"
  printf 'Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: gpuops test <test@invalid>\nDescription: test double of %s\n' \
    "$1" "$2" "$1" > "$d/DEBIAN/control"
  [ -n "$3" ] && printf 'Depends: %s\n' "$3" >> "$d/DEBIAN/control"
  if [ -n "${4:-}" ] && [ ! -e "$d/$4" ]; then mkdir -p "$d/$(dirname "$4")"; : > "$d/$4"; fi
  if [ -n "${5:-}" ]; then printf '#!/bin/sh\nset -e\n%s\n' "$5" > "$d/DEBIAN/postinst"; chmod 0755 "$d/DEBIAN/postinst"; fi
  dpkg-deb -Zxz --build "$d" "$repo/${1}_${2}_all.deb" >/dev/null
}
# A kernel module double: an ELF64 relocatable object with no code, whose .modinfo section is what modinfo reads.
module_double() { # path version
  mkdir -p "$(dirname "$1")"
  python3 - "$1" "$2" <<'PY'
import struct, sys
modinfo = b"version=%s\0license=Dual MIT/GPL\0name=nvidia\0" % sys.argv[2].encode()
names = b"\0.modinfo\0.shstrtab\0"
shoff = (64 + len(modinfo) + len(names) + 7) & ~7
head = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 2)
def section(name, kind, flags, offset, size):
    return struct.pack("<IIQQQQIIQQ", name, kind, flags, 0, offset, size, 0, 0, 1, 0)
body = head + modinfo + names
body += bytes(shoff - len(body)) + bytes(64) + section(1, 1, 2, 64, len(modinfo))
body += section(10, 3, 0, 64 + len(modinfo), len(names))
open(sys.argv[1], "wb").write(body)
PY
}
mkdir -p "$repo"
mkdir -p "$work/linux-image-$kver/boot" "$work/linux-image-$kver/lib/modules/$kver/kernel/drivers"
(cd "$work/linux-image-$kver/lib/modules/$kver" && : > modules.order && : > modules.builtin && : > modules.builtin.modinfo)
: > "$work/linux-image-$kver/boot/vmlinuz-$kver"
deb "linux-image-$kver" "$abi.$abinum" ""
deb "linux-image-$flavour" "$abi.$abinum" "linux-image-$kver"
deb "linux-headers-$kver" "$abi.$abinum" ""
common="nvidia-kernel-common-$branch-server"
for b in "$branch-server-open" "$branch-server"; do
  deb "$common" "$ver" ""
  deb "nvidia-headless-no-dkms-$b" "$ver" "$common (= $ver)"
  deb "nvidia-headless-$b" "$ver" "$common (= $ver)"
done
deb "nvidia-compute-utils-$branch-server" "$ver" "" "usr/bin/nvidia-persistenced"
deb "nvidia-utils-$branch-server" "$ver" "nvidia-compute-utils-$branch-server (= $ver)" "usr/bin/nvidia-smi"
deb "nvidia-fabricmanager-$branch" "$drv-1" ""
if [ "$mode" != without-precompiled ]; then
  ko="lib/modules/$kver/kernel/nvidia-${branch}srv/nvidia.ko"
  module_double "$work/linux-modules-nvidia-$branch-server-open-$kver/$ko" "$drv"
  deb "linux-modules-nvidia-$branch-server-open-$kver" "$abi.$abinum+$drv" \
    "linux-image-$kver, $common (>= $drv)" "$ko" "depmod -a $kver"
  deb "linux-modules-nvidia-$branch-server-open-$flavour" "$abi.$abinum+$drv" \
    "linux-modules-nvidia-$branch-server-open-$kver (= $abi.$abinum+$drv)"
fi
# The index apt reads (flat repository: deb [trusted=yes] file:REPO ./), without dpkg-dev.
(cd "$repo" && for f in *.deb; do
  dpkg-deb -f "$f"
  printf 'Filename: ./%s\nSize: %s\nSHA256: %s\n\n' "$f" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)"
done > Packages)
rm -rf "$work"
