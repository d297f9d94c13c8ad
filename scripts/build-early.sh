#!/usr/bin/env bash
# make test's builds started early: with the first tier, at the priority make test gives them (GPUOPS_BUILD_NICE, which
# each build script's compiler runs at), in two chains side by side:
#   - Kubernetes, then containerd 2.1 and 2.4, NVIDIA's device plugin and NVIDIA's DRA driver: what the integration
#     tier and the lab need, in the order the e2e tier needs them (Kubernetes, the longest at about 18 CPU-minutes,
#     when it starts; NVIDIA's binaries in its later modules);
#   - the CPython of the newer ansible-core versions' sanity and units (the first tiers that need a build) and the
#     newest controller's environment on it (the e2e tier's), then the lab's node image, the lab nodes' containerd 1.7
#     and the device plugin's image (podman builds on the local Debian 12 image, which molecule's first scenario builds
#     in its first minutes). Cold, at a896f80, containerd 1.7 came after Kubernetes in the first chain and was done
#     at minute 31.1, 1.4 minutes after the e2e tier began and waited for it; this chain is done by minute 21.
# One chain left Kubernetes waiting seven minutes for CPython, and ended at minute 46 of a cold run on 2 cores
# (docs/performance.md, "Cold CI"). The second chain was then idle from minute 17 of a cold run while the e2e tier
# built the two images itself in its first modules; built here, they saved that tier about 100 s in each of those
# modules (cold, a896f80). Each build script takes its own lock and caches its output, so the tier that needs a build
# waits for this one, or builds it itself if this one failed (its error is then the tier's). Warm, every call returns
# at once.
# The build scripts run Go's compiler and linker with GOGC=400 (GPUOPS_BUILD_GOGC): `go build std` from an empty
# cache took 88.9 CPU-seconds with it against 98.6 with Go's default of 100 (one run each, on 2 busy cores); the
# Kubernetes build peaked at 2.6 GB at 100, and the machines have 24 GB.
#   scripts/build-early.sh LOG
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
log=${1:-/dev/null}
chain() {
  local build start rc command
  for build in "$@"; do
    start=$(date +%s)
    read -r -a command <<<"$build" # a script and its arguments
    if "$here/${command[0]}" "${command[@]:1}" >/dev/null; then rc=0; else rc=$?; fi
    printf '[build-early] %s: exit %s in %s s (ended at %s s)\n' "$build" "$rc" "$(($(date +%s) - start))" \
      "$(($(date +%s) - begin))"
  done
}
{
  begin=$(date +%s)
  # The Kubernetes build times itself with /usr/bin/time, which the setup tier installs on a machine without it.
  for _ in $(seq 900); do [ -x /usr/bin/time ] && break; sleep 1; done
  chain tests/e2e/build-kubernetes.sh scripts/build-containerd2.sh scripts/build-containerd24.sh \
    scripts/build-nvidia-device-plugin.sh scripts/build-nvidia-dra-driver.sh &
  chain scripts/build-python.sh scripts/e2e-env.sh "tests/e2e/lab.py images" scripts/build-containerd17.sh \
    files/device_plugin/build-image.sh &
  wait
} >>"$log" 2>&1
