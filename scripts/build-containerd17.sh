#!/usr/bin/env bash
# Builds containerd 1.7 (config version 2, the first with the CRI plugin's CDI keys) at a pinned
# version through scripts/build-containerd.sh; prints the path of the cached binary.
set -euo pipefail

exec "$(dirname "$0")/build-containerd.sh" github.com/containerd/containerd "${CONTAINERD17_VERSION:-v1.7.35}"
