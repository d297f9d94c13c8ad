#!/usr/bin/env bash
# Builds containerd 2.x (which reads config version 3) at a pinned version through
# scripts/build-containerd.sh; prints the path of the cached binary.
set -euo pipefail

exec "$(dirname "$0")/build-containerd.sh" github.com/containerd/containerd/v2 "${CONTAINERD2_VERSION:-v2.1.5}"
