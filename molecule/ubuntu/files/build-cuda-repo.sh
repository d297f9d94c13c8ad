#!/bin/sh
# Builds a test double of NVIDIA's CUDA apt repository for one Ubuntu release: empty packages in NVIDIA's names for
# driver branch 580 (the branch in each name) and 590 (no branch in the names, nvidia-driver-pinning-590), a flat
# index signed with a throwaway key as NVIDIA signs its InRelease, and that key where the role fetches NVIDIA's
# (3bf863cc.pub, ASCII-armored). Names, versions and dependencies: docs/ubuntu-driver-packages.md. Needs dpkg-deb
# and gpg. Prints the key's fingerprint.
#   build-cuda-repo.sh BASE DIST   -> BASE/DIST/x86_64 (DIST: ubuntu2204, ubuntu2404)
set -eu
repo="$1/$2/x86_64"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$repo"

# One empty package: NAME VERSION [FIELD: VALUE]... [file=PATH] (an empty argument adds nothing)
deb() {
  name=$1 version=$2
  shift 2
  d="$work/pkg/$name"
  mkdir -p "$d/DEBIAN"
  printf 'Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: gpuops test <test@invalid>\n' "$name" "$version" \
    > "$d/DEBIAN/control"
  for field in "$@"; do
    case $field in
      '') ;;
      file=*) mkdir -p "$d/$(dirname "${field#file=}")" && : > "$d/${field#file=}" ;;
      *) printf '%s\n' "$field" >> "$d/DEBIAN/control" ;;
    esac
  done
  printf 'Description: test double of %s\n' "$name" >> "$d/DEBIAN/control"
  dpkg-deb -Zxz --build "$d" "$repo/${name}_${version}_all.deb" >/dev/null
}

# The driver's packages of one branch: SUFFIX is -580 before 590 and empty from 590 on (the guide's renames); the
# old names are replaced as Debian replaces a renamed package (Conflicts and Replaces).
branch() {
  up=$1 ver=$2 fm=$3 s=$4 old=${5:-}
  c() { if [ -n "$old" ]; then printf 'Conflicts: %s\nReplaces: %s' "$1" "$1"; fi; }
  deb "nvidia-kernel-common$s" "$ver" "Provides: nvidia-kernel-common$s-$up" "$(c "nvidia-kernel-common$old")"
  deb "libnvidia-compute$s" "$ver" "$(c "libnvidia-compute$old")"
  deb "nvidia-utils$s" "$ver" "Depends: libnvidia-compute$s (>= $up), nvidia-kernel-common$s-$up" \
    "$(c "nvidia-utils$old")" file=usr/bin/nvidia-smi
  deb "nvidia-compute-utils$s" "$ver" "Depends: libnvidia-compute$s" "$(c "nvidia-compute-utils$old")" \
    file=usr/bin/nvidia-persistenced
  for k in "" -open; do
    # nvidia-dkms-580-open, nvidia-dkms-open: bounded to the driver's version (Canonical bounds it by <= UPSTREAM-1,
    # below 590's revisions 1ubuntu1).
    deb "nvidia-dkms$s$k" "$ver" "Depends: nvidia-kernel-common$s (>= $up), nvidia-kernel-common$s (<= $ver)" \
      "$(c "nvidia-dkms$old$k")"
    deb "nvidia-driver$s$k" "$ver" \
      "Depends: nvidia-dkms$s$k (= $ver), nvidia-utils$s (= $ver), nvidia-compute-utils$s (= $ver), libnvidia-compute$s (= $ver)" \
      "$(c "nvidia-driver$old$k")"
  done
  deb "nvidia-open$s" "$ver" "Depends: nvidia-driver$s-open (= $ver)" "$(c "nvidia-open$old")"
  deb "cuda-drivers$s" "$ver" "Depends: nvidia-driver$s (= $ver)" "$(c "cuda-drivers$old")"
  deb "nvidia-fabricmanager$s" "$fm" "$(c "nvidia-fabricmanager$old")"
}
branch 580.95.05 580.95.05-0ubuntu1 580.95.05-1 -580
branch 590.44.01 590.44.01-1ubuntu1 590.44.01-1 "" -580
deb nvidia-driver-pinning-590 590-1ubuntu1

# The flat index apt reads (Types: deb, Suites: /), without dpkg-dev or apt-utils, and its Release signed inline.
cd "$repo"
for f in *.deb; do
  dpkg-deb -f "$f"
  printf 'Filename: ./%s\nSize: %s\nSHA256: %s\n\n' "$f" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)"
done > Packages
printf 'Origin: gpuops test double of NVIDIA CUDA\nLabel: gpuops test double of NVIDIA CUDA\nDate: %s\nSHA256:\n %s %s Packages\n' \
  "$(LC_ALL=C date -u '+%a, %d %b %Y %H:%M:%S UTC')" "$(sha256sum Packages | cut -d' ' -f1)" "$(stat -c %s Packages)" \
  > Release
export GNUPGHOME="$work/gnupg"
mkdir -m 0700 "$GNUPGHOME"
gpg --batch --passphrase '' --quick-gen-key 'gpuops test double of the CUDA repository <repo@gpuops.invalid>' \
  rsa2048 sign never 2>/dev/null
gpg --batch --yes --clearsign -o InRelease Release 2>/dev/null
gpg --armor --export > 3bf863cc.pub
gpg --with-colons --list-keys 2>/dev/null | awk -F: '$1 == "fpr" { print $10; exit }'
