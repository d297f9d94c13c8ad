#!/usr/bin/env bash
# Usage: build-containerd.sh MODULE VERSION
# Builds containerd's daemon from its Go module at a pinned version, for the integration tests of
# gpuops.k8s.nvidia_runtime: Debian 12 only ships containerd 1.6. MODULE is
# github.com/containerd/containerd (1.x: config versions 1 and 2) or
# github.com/containerd/containerd/v2 (2.x: config version 3). The binary is cached under
# $GPUOPS_CACHE keyed by the version, so a second call costs nothing. Prints the path of the binary.
# Build time and log go next to it.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: build-containerd.sh MODULE VERSION" >&2
  exit 2
fi
module=$1
version=$2
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
dest="$cache/containerd-$version"
bin="$dest/bin/containerd"
go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}

if [ -x "$bin" ] && [ -f "$dest/.complete" ]; then
  echo "$bin"
  exit 0
fi
# One build per version at a time (make test's early builds run beside the tiers): a second caller waits
# for the first and takes its binary.
mkdir -p "$cache"
exec 9>"$dest.lock"
flock 9
if [ -x "$bin" ] && [ -f "$dest/.complete" ]; then
  echo "$bin"
  exit 0
fi
if [ ! -x "$go" ]; then
  echo "build-containerd: no Go toolchain (looked for go on PATH and /usr/local/go/bin/go)" >&2
  exit 1
fi

rm -rf "$dest"
mkdir -p "$dest/bin"
start=$(date +%s)
# `go install pkg@version` refuses containerd's module (its go.mod has exclude/replace directives),
# so fetch the module source through the module proxy and build it as the main module, with its own
# go.mod and go.sum. The btrfs snapshotter needs C headers that are not installed here and the tests
# do not use it: CGO is off and the build tags drop the cgo-only pieces. -p 1 keeps the build polite
# on a shared machine. No debug information (-dwarf=false, -s -w): less work, and the compiler flags of
# tests/e2e/build-kubernetes.sh, which builds in the same Go cache, so the packages both use (the standard library
# among them) can be served from it to the second build.
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
if ! src=$(cd "$work" && GOFLAGS=-mod=mod "$go" mod download -json "$module@$version" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') || [ -z "$src" ]; then
  echo "build-containerd: could not fetch $module@$version" >&2
  exit 1
fi
cp -r "$src" "$work/src"
chmod -R u+w "$work/src"
if ! (cd "$work/src" && GOGC=${GPUOPS_BUILD_GOGC:-400} GOFLAGS=-mod=mod CGO_ENABLED=0 timeout 1800 "$go" build -p 1 -trimpath \
  -gcflags all=-dwarf=false -ldflags '-s -w' -tags 'no_btrfs no_devmapper no_zfs no_aufs' -o "$bin" ./cmd/containerd) >"$dest/build.log" 2>&1; then
  echo "build-containerd: go build failed; see $dest/build.log" >&2
  tail -20 "$dest/build.log" >&2
  exit 1
fi
end=$(date +%s)
echo "$((end - start))" >"$dest/build-seconds"
touch "$dest/.complete"
echo "$bin"
