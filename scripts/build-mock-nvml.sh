#!/usr/bin/env bash
# Builds the lab's mock libnvidia-ml.so.1 (tests/mock_nvml/mock_nvml.c; a TEST DOUBLE of NVIDIA's
# driver library, docs/mock-nvml.md), and an empty libcuda.so.1 beside it, with the machine's C compiler. Cached by content under
# $GPUOPS_CACHE/mock-nvml/<hash>/: an unchanged source builds nothing.
#   scripts/build-mock-nvml.sh   -> prints the directory that holds libnvidia-ml.so.1
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
cc=${CC:-cc}
source="$repo/tests/mock_nvml/mock_nvml.c"
hash=$( (sha256sum "$source" "$0"; "$cc" --version | head -n 1) | sha256sum | cut -c1-12)
out="$cache/mock-nvml/$hash"
if [ ! -f "$out/.complete" ]; then
  mkdir -p "$out"
  # The driver's library exports only NVML's symbols and is found by its soname.
  "$cc" -std=c11 -O2 -g0 -Wall -Wextra -Wno-unused-parameter -Werror -fPIC -fvisibility=hidden -shared \
    -Wl,-soname,libnvidia-ml.so.1 -o "$out/libnvidia-ml.so.1.tmp" "$source" -ldl -lpthread
  mv "$out/libnvidia-ml.so.1.tmp" "$out/libnvidia-ml.so.1"
  # An empty libcuda.so.1, also a TEST DOUBLE: a driver installs the CUDA driver library beside NVML, and
  # NVIDIA's CDI generator (nvidia-ctk cdi generate) refuses a driver without it. Nothing calls into it.
  "$cc" -shared -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so.1" -x c /dev/null
  touch "$out/.complete"
  printf '[mock-nvml] built %s\n' "$out/libnvidia-ml.so.1" >&2
fi
echo "$out"
