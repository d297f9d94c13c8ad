#!/usr/bin/env bash
# Builds NVIDIA's own device plugin and GPU Feature Discovery (nvidia-device-plugin and
# gpu-feature-discovery, from the github.com/NVIDIA/k8s-device-plugin Go module at a pinned version), so
# the lab can run them beside the collection's daemon on the same simulated GPUs (docs/nvidia-compared.md).
# They load NVML with dlopen, so on a lab node they meet the mock libnvidia-ml.so.1 as on a GPU node.
#
# The module's go.mod has replace directives, so `go install MODULE/cmd@VERSION` refuses it: the module is
# downloaded through the Go module proxy, copied out of the module cache and built in place. Output goes to
# $GPUOPS_CACHE/nvidia-device-plugin-<version>-<key>/bin (key: version, recipe revision, Go version) and is
# reused while that stays the same. Prints that bin directory on stdout; progress goes to stderr.
# The checksum database does not answer for every version of the module, so the script checks the
# download against the h1: checksum pinned below and tells Go not to look it up; the module's own go.sum
# checks its dependencies.
#
# Environment:
#   GPUOPS_NVIDIA_DEVICE_PLUGIN_VERSION   module version (default below)
#   GPUOPS_BUILD_JOBS                     parallel compile jobs (default 2)
set -euo pipefail

version=${GPUOPS_NVIDIA_DEVICE_PLUGIN_VERSION:-v0.19.0}
jobs=${GPUOPS_BUILD_JOBS:-2}
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
go=${GO:-/usr/local/go/bin/go}
module=github.com/NVIDIA/k8s-device-plugin
commands=(nvidia-device-plugin gpu-feature-discovery)
declare -A module_sums=([v0.19.0]="h1:3JBGCsq0moOtpqyYHpevGZNcPKmIJeTiL7qSQ/rC71Q=")
# Bump when the recipe changes in a way that changes the binaries.
recipe_revision=1

log() { printf '[build-nvidia-device-plugin] %s\n' "$*" >&2; }

[ -x "$go" ] || { log "Go not found at $go (set GO=/path/to/go)"; exit 1; }
key=$(printf '%s\n' "$version" "${commands[*]}" "$recipe_revision" "$("$go" env GOVERSION)" | sha256sum | cut -c1-8)
out="$cache/nvidia-device-plugin-$version-$key"

# shellcheck source=scripts/go-module-build.sh
. "$(dirname "$0")/go-module-build.sh"
go_module_start "$out"
go_module_fetch "${module_sums[$version]:-}" "$out/src"

cd "$out/src"
go_module_build "$out/bin" "${commands[@]}"
rm -rf "$out/src"
touch "$out/.complete"
log "built ${commands[*]} into $out/bin"
echo "$out/bin"
