#!/usr/bin/env bash
# Builds a local, signed APT repository laid out like NVIDIA's container toolkit repository
# (flat: <root>/stable/deb/amd64/ with Packages, Release, InRelease and a gpgkey at <root>/gpgkey),
# so the container_toolkit role can be tested against a real signed repository where NVIDIA's
# servers cannot be reached.
#
# What is real and what is a test double:
#   nvidia-container-toolkit-base  real: nvidia-ctk, nvidia-container-runtime(.cdi/.legacy) and
#                                  nvidia-cdi-hook built from NVIDIA's Go module at the pinned version;
#                                  from 1.18 also the module's own nvidia-cdi-refresh.service/.path units,
#                                  their environment file and the package's postinst, as NVIDIA ships them
#   nvidia-container-toolkit       real: nvidia-container-runtime-hook built the same way (and the
#                                  package's postinst)
#   libnvidia-container1           TEST DOUBLE: empty stand-in (the C library is not built here)
#   libnvidia-container-tools      TEST DOUBLE: nvidia-container-cli stand-in that says so and fails
# Release is signed with a throwaway key made for this repository only.
#
# The module's checksum database entry is not served for every version, so the script checks the module
# against the checksum pinned below (module_sum, the h1: hash `go mod download -json` reports) and tells
# Go not to look it up.
#
# Everything is cached under $GPUOPS_CACHE/toolkit-repo/<version>-<script hash>; the built commands are
# kept in its bin/ (tests run nvidia-ctk from there without installing the packages).
#   scripts/build-toolkit-repo.sh   -> prints the repository root
set -euo pipefail
version=${GPUOPS_TOOLKIT_VERSION:-1.18.1}
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
script_hash=$(sha256sum "$0" | cut -c1-12)
root="$cache/toolkit-repo/$version-$script_hash"
arch=amd64
deb_version="$version-1"
module=github.com/NVIDIA/nvidia-container-toolkit
export PATH="$PATH:/usr/local/go/bin"
export GOMODCACHE="$cache/go-mod" GOCACHE="$cache/go-build" GOFLAGS=-modcacherw GOTOOLCHAIN=local
export GONOSUMDB="$module"
declare -A module_sums=(
  [1.17.8]="h1:ndE23TKvQBicsZT88mzZudygn6JNOe6+UsIgqk6gGvw="
  [1.18.1]="h1:525Y921X2TwKwBvFfMNqyXF3QWlYbsemQfpd8YB2lHs="
)
# nvidia-ctk links a small C shim (dxcore), so cgo stays on.
export CGO_ENABLED=1

log() { printf '[toolkit-repo] %s\n' "$*" >&2; }

if [ -f "$root/.complete" ]; then
  echo "$root"
  exit 0
fi

work=$(mktemp -d "$cache/toolkit-repo.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"

download=$(go mod download -json "$module@v$version")
dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$download")
sum=$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p' <<<"$download")
if [ -z "${module_sums[$version]:-}" ] || [ "$sum" != "${module_sums[$version]}" ]; then
  log "$module@v$version has checksum '${sum:-none}', not the one pinned in this script ('${module_sums[$version]:-none}')"
  exit 1
fi
# Built inside a copy of the module, so its own go.sum checks every dependency (`go install MODULE@VERSION`
# asks the checksum database instead, which does not answer for all of them).
cp -r "$dir" "$work/src"
chmod -R u+w "$work/src"
log "building $module commands at v$version (cached in $GOCACHE)"
for cmd in nvidia-ctk nvidia-container-runtime nvidia-container-runtime.cdi \
  nvidia-container-runtime.legacy nvidia-cdi-hook nvidia-container-runtime-hook; do
  (cd "$work/src" && timeout 1200 nice -n "${GPUOPS_BUILD_NICE:-10}" go build -trimpath -buildvcs=false \
    -ldflags "-s -w -X $module/internal/info.version=$version" -o "$work/bin/$cmd" "./cmd/$cmd")
done

# package NAME DESCRIPTION DEPENDS  (files come from $work/pkg/NAME)
package() {
  local name=$1 description=$2 depends=$3 dir="$work/pkg/$1"
  mkdir -p "$dir/DEBIAN" "$dir/usr/share/doc/$name"
  printf 'Built by gpuops.k8s scripts/build-toolkit-repo.sh for tests.\n' > "$dir/usr/share/doc/$name/README.gpuops"
  {
    printf 'Package: %s\nVersion: %s\nArchitecture: %s\n' "$name" "$deb_version" "$arch"
    printf 'Maintainer: gpuops.k8s maintainers <maintainers@example.invalid>\n'
    [ -n "$depends" ] && printf 'Depends: %s\n' "$depends"
    printf 'Section: utils\nPriority: optional\nDescription: %s\n' "$description"
  } > "$dir/DEBIAN/control"
  dpkg-deb --root-owner-group -Zxz --build "$dir" "$work/repo/stable/deb/$arch/${name}_${deb_version}_${arch}.deb" >/dev/null
}
mkdir -p "$work/repo/stable/deb/$arch"

mkdir -p "$work/pkg/nvidia-container-toolkit-base/usr/bin" "$work/pkg/nvidia-container-toolkit-base/etc/nvidia-container-runtime"
cp "$work/bin"/{nvidia-ctk,nvidia-container-runtime,nvidia-container-runtime.cdi,nvidia-container-runtime.legacy,nvidia-cdi-hook} \
  "$work/pkg/nvidia-container-toolkit-base/usr/bin/"
"$work/bin/nvidia-ctk" --quiet config default --output "$work/pkg/nvidia-container-toolkit-base/etc/nvidia-container-runtime/config.toml"
mkdir -p "$work/pkg/nvidia-container-toolkit-base/DEBIAN"
printf '/etc/nvidia-container-runtime/config.toml\n' > "$work/pkg/nvidia-container-toolkit-base/DEBIAN/conffiles"
# Toolkit 1.18 packages the CDI refresh units and enables them in postinst (packaging/debian in the module):
# the same files, from the module, in the same places.
if [ -d "$work/src/deployments/systemd" ]; then
  base="$work/pkg/nvidia-container-toolkit-base"
  mkdir -p "$base/etc/systemd/system" "$base/etc/nvidia-container-toolkit"
  install -m 0644 "$work/src/deployments/systemd/nvidia-cdi-refresh.service" \
    "$work/src/deployments/systemd/nvidia-cdi-refresh.path" "$base/etc/systemd/system/"
  install -m 0644 "$work/src/deployments/systemd/nvidia-cdi-refresh.env" "$base/etc/nvidia-container-toolkit/"
  # debhelper makes every file under /etc a conffile.
  printf '%s\n' /etc/systemd/system/nvidia-cdi-refresh.service /etc/systemd/system/nvidia-cdi-refresh.path \
    /etc/nvidia-container-toolkit/nvidia-cdi-refresh.env >> "$base/DEBIAN/conffiles"
  install -m 0755 "$work/src/packaging/debian/nvidia-container-toolkit-base.postinst" "$base/DEBIAN/postinst"
  sed -i '/^#DEBHELPER#$/d' "$base/DEBIAN/postinst"
fi
package nvidia-container-toolkit-base \
  "NVIDIA container toolkit base (nvidia-ctk, nvidia-container-runtime), built from v$version" ""

mkdir -p "$work/pkg/nvidia-container-toolkit/usr/bin" "$work/pkg/nvidia-container-toolkit/DEBIAN"
cp "$work/bin/nvidia-container-runtime-hook" "$work/pkg/nvidia-container-toolkit/usr/bin/"
# Its postinst links nvidia-container-toolkit to the hook and its postrm removes the link on purge, as NVIDIA's package
# does.
for script in postinst postrm; do
  install -m 0755 "$work/src/packaging/debian/nvidia-container-toolkit.$script" "$work/pkg/nvidia-container-toolkit/DEBIAN/$script"
  sed -i '/^#DEBHELPER#$/d' "$work/pkg/nvidia-container-toolkit/DEBIAN/$script"
done
package nvidia-container-toolkit \
  "NVIDIA container toolkit (nvidia-container-runtime-hook), built from v$version" \
  "nvidia-container-toolkit-base (= $deb_version), libnvidia-container-tools (>= $deb_version), libnvidia-container-tools (<< 2.0.0)"

mkdir -p "$work/pkg/libnvidia-container1/usr/lib/x86_64-linux-gnu"
package libnvidia-container1 \
  "TEST DOUBLE standing in for libnvidia-container1 (the C library is not built for tests)" ""

mkdir -p "$work/pkg/libnvidia-container-tools/usr/bin"
cat > "$work/pkg/libnvidia-container-tools/usr/bin/nvidia-container-cli" <<'CLI'
#!/bin/sh
echo "nvidia-container-cli: test double from gpuops.k8s tests; the real tool is not installed" >&2
exit 1
CLI
chmod 0755 "$work/pkg/libnvidia-container-tools/usr/bin/nvidia-container-cli"
package libnvidia-container-tools \
  "TEST DOUBLE standing in for libnvidia-container-tools (nvidia-container-cli is a stub that fails)" \
  "libnvidia-container1 (>= $deb_version)"

log "indexing and signing with a throwaway key"
export GNUPGHOME="$work/gnupg"
mkdir -m 0700 "$GNUPGHOME"
# No expiry: the repository is cached and reused on later days (a key that expired after a day made a
# warm cache's repository unusable).
gpg --batch --quiet --passphrase '' --quick-gen-key 'gpuops.k8s test repository <test-repo@example.invalid>' ed25519 sign never
gpg --batch --armor --export > "$work/repo/gpgkey"
(
  cd "$work/repo/stable/deb/$arch"
  apt-ftparchive packages . > Packages
  gzip -9kn Packages
  apt-ftparchive -o APT::FTPArchive::Release::Origin=gpuops-test \
    -o APT::FTPArchive::Release::Label=nvidia-container-toolkit-test release . > Release
  gpg --batch --yes --armor --detach-sign --output Release.gpg Release
  gpg --batch --yes --clearsign --output InRelease Release
)
gpgconf --kill all 2>/dev/null || true
rm -rf "$GNUPGHOME"
mv "$work/bin" "$work/repo/bin"
mkdir -p "$(dirname "$root")"
rm -rf "$root"
mv "$work/repo" "$root"
touch "$root/.complete"
log "repository at $root"
echo "$root"
