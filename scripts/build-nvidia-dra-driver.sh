#!/usr/bin/env bash
# Builds the kubelet plugin of NVIDIA's DRA driver (gpu-kubelet-plugin, from the sigs.k8s.io/dra-driver-nvidia-gpu
# Go module at a pinned version), so the lab can compare its ResourceSlices with the collection's DRA driver on the
# same simulated GPUs (docs/compared-dra.md, "Building NVIDIA's driver"). It loads NVML with dlopen, so on a lab
# node it meets the mock libnvidia-ml.so.1 as on a GPU node.
#
# The module is downloaded through the Go module proxy (its h1: checksum pinned below), copied out of the module
# cache and built in place with two changes to its go.mod, because the proxy serves two of its requirements at no
# version the module names:
#   - k8s.io/kubernetes v1.37.0-rc.0 is not served; v1.37.2 is (checksum pinned below), and the plugin imports
#     only pkg/kubelet/checkpointmanager from it;
#   - github.com/NVIDIA/go-nvfm is not served at any version; it is replaced by a double written for this project
#     (tests/go_nvfm_double: every call answers "not supported"), which only the Fabric Manager partitioning of the
#     Alpha feature gate FabricManagerPartitioning (off by default) reaches.
# Output goes to $GPUOPS_CACHE/nvidia-dra-driver-<version>-<key>/bin (key: version, the kubernetes version, the
# double's files, recipe revision, Go version) and is reused while that stays the same. Prints that bin directory
# on stdout; progress goes to stderr.
#
# Environment:
#   GPUOPS_BUILD_JOBS   parallel compile jobs (default 2)
set -euo pipefail

version=v0.5.0
kubernetes_version=v1.37.2
jobs=${GPUOPS_BUILD_JOBS:-2}
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
go=${GO:-/usr/local/go/bin/go}
module=sigs.k8s.io/dra-driver-nvidia-gpu
commands=(gpu-kubelet-plugin)
module_sum="h1:CjUBJwemlt4kYy5AN+I7Ce4mMp9V4VKR97EBogSoDus="
# go.sum's lines for the kubernetes version: Go checks its download against them. The new version raises no other
# requirement, so these are all the lines the change adds.
kubernetes_sums="k8s.io/kubernetes $kubernetes_version h1:A2VDEiObzkYqFTKhSsn0ZEb0RlLEXpHWj93gi2HqEwE=
k8s.io/kubernetes $kubernetes_version/go.mod h1:zAK7e3i5feyBL/bhucQnA5VRKuyrS8F+ijHJkZzQaWw="
double=$(cd "$(dirname "$0")/../tests/go_nvfm_double" && pwd)
# Bump when the recipe changes in a way that changes the binaries.
recipe_revision=1

log() { printf '[build-nvidia-dra-driver] %s\n' "$*" >&2; }

[ -x "$go" ] || { log "Go not found at $go (set GO=/path/to/go)"; exit 1; }
double_sum=$(cd "$double" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
key=$(printf '%s\n' "$version" "$kubernetes_version" "$double_sum" "${commands[*]}" "$recipe_revision" \
  "$("$go" env GOVERSION)" | sha256sum | cut -c1-8)
out="$cache/nvidia-dra-driver-$version-$key"

# shellcheck source=scripts/go-module-build.sh
. "$(dirname "$0")/go-module-build.sh"
go_module_start "$out"
# go-nvml's loader links with a flag NVIDIA's Makefile allows.
export CGO_LDFLAGS_ALLOW='-Wl,--unresolved-symbols=ignore-in-object-files'
go_module_fetch "$module_sum" "$out/src"
cp -r "$double" "$out/go-nvfm-double"
chmod -R u+w "$out/go-nvfm-double"

cd "$out/src"
"$go" mod edit -require="k8s.io/kubernetes@$kubernetes_version" -replace=github.com/NVIDIA/go-nvfm=../go-nvfm-double
printf '%s\n' "$kubernetes_sums" >>go.sum
go_module_build "$out/bin" "${commands[@]}"
rm -rf "$out/src" "$out/go-nvfm-double"
touch "$out/.complete"
log "built ${commands[*]} into $out/bin"
echo "$out/bin"
